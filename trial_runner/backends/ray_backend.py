"""Run a trial on a Ray cluster: one placement group, one bundle and one actor per replica.

Rank 0's actor picks the rendezvous address (its node's IP and a free port there); every actor then
runs the same `run_rank` as a local process would. The placement group is removed and the actors
are killed in `finally`, whatever happened, so a hung trial never holds the cluster. The actors are
owned by the driver (never detached), so Ray kills them when the service's process dies; a trial with
an `owner` also names its actors after it, and `reap(owner)` kills any that a crashed service left. Ray is
imported only when a RayBackend is used: the service and tests that never touch Ray do not pay for it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any

from stratagem.rank_env import MALLOC_SETTINGS, rank_environment
from trial_runner.backends.base import free_port
from trial_runner.backends.local import PACKAGE_ROOT
from trial_runner.result import Outcome, Progress, RankReport, TrialResult
from trial_runner.spec import TrialSpec
from trial_runner.summary import now_utc, summarize
from trial_runner.supervise import Supervisor

ACTOR_NAMESPACE = "stratagem-trials"
"""Ray namespace of every named rank actor."""


def actor_name(owner: str, trial: str, rank: int) -> str:
    return f"{owner}/{trial}/{rank}"


class RankActor:
    """Lives in a Ray worker process; `run` blocks one thread while `progress` answers on another."""

    def __init__(self) -> None:
        self._progress = Progress("start", 0)

    def endpoint(self) -> tuple[str, int]:
        import ray

        address = ray.util.get_node_ip_address()
        return address, free_port("0.0.0.0")

    def progress(self) -> tuple[str, int, float]:
        phase, step, slowest_step_s = self._progress  # a plain tuple over the wire
        return phase, step, slowest_step_s

    def run(self, spec_json: str, rank: int, master_addr: str, master_port: int, threads: int) -> str:
        import torch

        from trial_runner.worker import run_rank

        torch.set_num_threads(threads)
        spec = TrialSpec.parse(spec_json)
        report = run_rank(
            spec, rank=rank, master_addr=master_addr, master_port=master_port, threads=threads, progress=self._record
        )
        return report.model_dump_json()

    def _record(self, progress: Progress) -> None:
        self._progress = progress


def rank_runtime_env() -> dict[str, Any]:
    """A rank actor's allocator settings (`stratagem.rank_env`), the driver's own where it has them; Ray
    merges them with the job's environment variables."""
    env = rank_environment()
    return {"env_vars": {name: env[name] for name in MALLOC_SETTINGS}}


class RayRank:
    """One actor as the supervisor sees it; progress is asked for at most every `progress_interval_s`."""

    def __init__(self, rank: int, actor: Any, result: Any, progress_interval_s: float) -> None:
        self.rank = rank
        self.actor = actor
        self.result = result
        self.progress_interval_s = progress_interval_s
        self._progress: Progress | None = None
        self._pending: Any = None
        self._asked_at = 0.0

    def poll(self) -> RankReport | None:
        import ray

        ready, _ = ray.wait([self.result], timeout=0)
        if not ready:
            return None
        try:
            return RankReport.model_validate_json(ray.get(self.result))
        except ray.exceptions.OutOfMemoryError as error:
            return RankReport(rank=self.rank, outcome=Outcome.oom, error=str(error)[-2000:], finished_at=time.time())
        except ray.exceptions.RayError as error:
            return RankReport(
                rank=self.rank,
                outcome=Outcome.crash,
                error=f"the actor died: {str(error)[-2000:]}",
                finished_at=time.time(),
            )

    def progress(self) -> Progress | None:
        import ray

        if self._pending is not None:
            ready, _ = ray.wait([self._pending], timeout=0)
            if ready:
                with contextlib.suppress(ray.exceptions.RayError):
                    self._progress = Progress(*ray.get(self._pending))
                self._pending = None
        now = time.monotonic()
        if self._pending is None and now - self._asked_at >= self.progress_interval_s:
            self._pending = self.actor.progress.remote()
            self._asked_at = now
        return self._progress

    def kill(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


class RayBackend:
    """Trials on Ray: `address` or `RAY_ADDRESS` names a cluster, otherwise a local Ray is started.

    Use it as a context manager (or call `close()`) to shut down a Ray it started itself.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        init_kwargs: dict[str, Any] | None = None,
        placement_strategy: str = "PACK",
        cpus_per_rank: int = 1,
        failure_grace_s: float = 3.0,
        poll_interval_s: float = 0.2,
        progress_interval_s: float = 0.5,
    ) -> None:
        self.address = address
        self.init_kwargs = dict(init_kwargs or {})
        self.placement_strategy = placement_strategy
        self.cpus_per_rank = cpus_per_rank
        self.failure_grace_s = failure_grace_s
        self.poll_interval_s = poll_interval_s
        self.progress_interval_s = progress_interval_s
        self._started_ray = False
        self.last_actors: list[Any] = []
        """Handles of the latest trial's actors (all killed by then), so a caller can confirm it."""

    def __enter__(self) -> RayBackend:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        import ray

        if ray.is_initialized():
            return
        address = self.address or os.environ.get("RAY_ADDRESS")
        kwargs = {"include_dashboard": False, **self.init_kwargs}
        if address:
            ray.init(address=address, **kwargs)
        else:
            # Workers of a Ray we start ourselves import trial_runner from this checkout, wherever it is.
            kwargs.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": str(PACKAGE_ROOT)}})
            ray.init(**kwargs)
            self._started_ray = True

    def close(self) -> None:
        import ray

        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    def reap(self, owner: str) -> int:
        """Kill every rank actor named for `owner` (left by a service that died mid-trial); how many."""
        import ray

        self.connect()
        # Every handle first: killing one rank makes its trial kill the others, which would then be gone.
        handles = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry.get("namespace") != ACTOR_NAMESPACE or not str(entry.get("name", "")).startswith(f"{owner}/"):
                continue
            try:
                handles.append(ray.get_actor(entry["name"], namespace=ACTOR_NAMESPACE))
            except ValueError:  # it ended between the listing and now
                continue
        for handle in handles:
            ray.kill(handle, no_restart=True)
        return len(handles)

    def run(self, spec: TrialSpec) -> TrialResult:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        self.connect()
        started, clock_start = now_utc(), time.monotonic()
        bundles = [self._bundle(device) for device in spec.strategy.replicas]
        group = placement_group(bundles, strategy=self.placement_strategy)
        actors: list[Any] = []
        self.last_actors = actors
        try:
            reports = self._run_in(spec, group, bundles, actors, clock_start)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)
            remove_placement_group(group)
        return summarize(spec, reports, backend=self.name, started=started, finished=now_utc())

    def _run_in(
        self, spec: TrialSpec, group: Any, bundles: list[dict[str, float]], actors: list[Any], clock_start: float
    ) -> list[RankReport]:
        """Everything between reserving the bundles and releasing them; Ray's own failures become outcomes."""
        import ray

        try:
            ray.get(group.ready(), timeout=spec.timeout_s)
        except ray.exceptions.GetTimeoutError:
            reason = (
                f"the placement group {bundles} was not scheduled within {spec.timeout_s:g} s; "
                f"the cluster has {ray.available_resources()} available"
            )
            return [
                RankReport(rank=r, outcome=Outcome.timeout, error=reason, killed=True) for r in range(spec.world_size)
            ]
        try:
            handles = self._start_ranks(spec, group, bundles, actors)
        except ray.exceptions.GetTimeoutError:
            reason = f"rank 0's actor did not start within {spec.timeout_s:g} s"
            return [
                RankReport(rank=r, outcome=Outcome.timeout, error=reason, killed=True) for r in range(spec.world_size)
            ]
        except ray.exceptions.RayError as error:
            return [RankReport(rank=0, outcome=Outcome.crash, error=f"could not start the actors: {error}")]
        supervisor = Supervisor(spec, poll_interval_s=self.poll_interval_s, failure_grace_s=self.failure_grace_s)
        return supervisor.watch(handles, started=clock_start)

    def _bundle(self, device: str) -> dict[str, float]:
        return {"GPU": 1.0} if ":GPU:" in device else {"CPU": float(self.cpus_per_rank)}

    def _start_ranks(
        self, spec: TrialSpec, group: Any, bundles: list[dict[str, float]], actors: list[Any]
    ) -> list[RayRank]:
        """Create the actors (into `actors`, so the caller can kill them whatever happens) and start them."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote_class = ray.remote(RankActor)
        trial = uuid.uuid4().hex[:12]
        for rank, bundle in enumerate(bundles):
            placement = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=rank)
            named = {"name": actor_name(spec.owner, trial, rank), "namespace": ACTOR_NAMESPACE} if spec.owner else {}
            actors.append(
                remote_class.options(
                    num_cpus=bundle.get("CPU", 0.0),
                    num_gpus=bundle.get("GPU", 0.0),
                    max_concurrency=2,
                    scheduling_strategy=placement,
                    runtime_env=rank_runtime_env(),
                    **named,
                ).remote()
            )
        threads = spec.threads_per_rank or self.cpus_per_rank
        master_addr, master_port = ray.get(actors[0].endpoint.remote(), timeout=spec.timeout_s)
        spec_json = spec.to_json()
        return [
            RayRank(
                rank,
                actor,
                actor.run.remote(spec_json, rank, master_addr, master_port, threads),
                self.progress_interval_s,
            )
            for rank, actor in enumerate(actors)
        ]
