"""Worker threads inside the service that claim and run jobs from the database.

Each pool has a unique worker id, `N` job threads and one keeper thread. The keeper refreshes the
heartbeat of the jobs this pool runs and, in every replica, looks for running jobs whose heartbeat
went stale (their worker died with its process) to requeue or fail them. Stopping the pool hands
running jobs back to the queue, so a restarted or scaled-down service loses no work.

After each job a worker retrains the cost model when enough new trials have arrived
(`cost_model_retrain_every`): here, not in a request handler, so no request waits on training. A
failed retraining is logged and the service carries on with the version it had.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

from optimizer_service.core.cost_model import CostModelTrainer, InUseCostModel, retrain_if_due
from optimizer_service.jobs import queue
from optimizer_service.jobs.runner import JobContext, Pipeline, execute_job
from optimizer_service.jobs.search_adapter import SearchFn
from optimizer_service.jobs.types import TrialExecutor
from optimizer_service.settings import Settings

log = logging.getLogger(__name__)


def new_worker_id() -> str:
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class WorkerPool:
    def __init__(
        self,
        factory: queue.Factory,
        settings: Settings,
        *,
        pipeline: Pipeline | None = None,
        search: SearchFn | None = None,
        trials: TrialExecutor | None = None,
        cost_model_trainer: CostModelTrainer | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.worker_id = worker_id or new_worker_id()
        self._settings = settings
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._running: set[uuid.UUID] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.processed: deque[uuid.UUID] = deque(maxlen=10_000)
        """The latest jobs this pool ended, in order (for operators and tests)."""
        self._context = JobContext(
            factory=factory,
            worker_id=self.worker_id,
            stopping=self._stopping,
            job_timeout_s=settings.job_timeout_s,
            progress_interval_s=settings.progress_interval_s,
            search=search,
            trials=trials,
            cost_models=InUseCostModel(factory) if settings.cost_model_enabled else None,
        )
        self._trainer = cost_model_trainer if settings.cost_model_enabled else None
        self._retraining = threading.Lock()
        if pipeline is not None:
            self._context.pipeline = pipeline

    @property
    def size(self) -> int:
        return self._settings.workers

    def start(self) -> None:
        self._keep()
        for index in range(self._settings.workers):
            self._spawn(self._work, f"stratagem-worker-{index}")
        self._spawn(self._keeper, "stratagem-keeper")

    def notify(self) -> None:
        """Wake idle workers now (a job was just queued) instead of at their next poll."""
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask running jobs to go back to the queue at their next check, and wait up to `timeout_s` in all."""
        self._stopping.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    def running_jobs(self) -> list[uuid.UUID]:
        with self._lock:
            return list(self._running)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _work(self) -> None:
        while not self._stopping.is_set():
            try:
                claim = queue.claim_next(self._context.factory, self.worker_id)
            except Exception:  # the database is unreachable for a moment: retry after a poll interval
                log.exception("worker %s could not claim a job", self.worker_id)
                claim = None
            if claim is None:
                self._wake.wait(self._settings.poll_interval_s)
                self._wake.clear()
                continue
            self._run(claim)

    def _run(self, claim: queue.Claim) -> None:
        with self._lock:
            self._running.add(claim.job_id)
        try:
            status = execute_job(self._context, claim.job_id)
            log.info("job %s ended: %s", claim.job_id, status.value if status else "taken over")
            self.processed.append(claim.job_id)
        except Exception:
            log.exception("worker %s crashed on job %s", self.worker_id, claim.job_id)
        finally:
            with self._lock:
                self._running.discard(claim.job_id)
        self.retrain_if_due()

    def retrain_if_due(self) -> None:
        """Retrain when enough trials arrived; one retraining at a time per pool, failures only logged."""
        if self._trainer is None or self._stopping.is_set() or not self._retraining.acquire(blocking=False):
            return
        try:
            with self._context.factory() as session:
                version = retrain_if_due(session, self._trainer, every=self._settings.cost_model_retrain_every)
            if version is not None:
                log.info(
                    "cost model %s (id %d) trained on %d trials is now in use",
                    version.version,
                    version.id,
                    version.n_train,
                )
        except Exception:  # a failed retraining must not stop the worker: the version in use stays
            log.exception("worker %s: retraining the cost model failed", self.worker_id)
        finally:
            self._retraining.release()

    def _keeper(self) -> None:
        while not self._stopping.wait(self._settings.heartbeat_interval_s):
            self._keep()

    def _keep(self) -> None:
        try:
            queue.heartbeat(self._context.factory, self.running_jobs(), self.worker_id)
            counts = queue.recover_stale(
                self._context.factory,
                stale_after_s=self._settings.stale_after_s,
                max_attempts=self._settings.max_attempts,
            )
            if counts["requeued"]:
                self._wake.set()
        except Exception:
            log.exception("worker %s: heartbeat or stale-job recovery failed", self.worker_id)
