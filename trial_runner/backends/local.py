"""Run a trial's ranks as processes on this machine (gloo on CPUs, NCCL on GPUs).

Each rank is `python -m trial_runner.worker` in its own session, so a hard kill takes its whole
process tree with it, and it dies with the process that started it (`trial_runner.lifeline`), so a
service killed mid-trial leaves no rank running. The spec goes to the ranks as a JSON file; each rank answers with a JSON
report file and announces its progress in another, which is all the supervisor reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trial_runner
from stratagem.rank_env import rank_environment
from trial_runner.backends.base import free_port
from trial_runner.oom import oom_kill_count, oom_killed_since
from trial_runner.result import Outcome, Progress, RankReport, TrialResult
from trial_runner.spec import TrialSpec
from trial_runner.summary import now_utc, summarize
from trial_runner.supervise import Supervisor

LOG_TAIL_CHARS = 2000
PACKAGE_ROOT = Path(trial_runner.__file__).resolve().parents[1]


class LocalBackend:
    name = "local"

    def __init__(
        self,
        *,
        python: str = sys.executable,
        master_addr: str = "127.0.0.1",
        failure_grace_s: float = 3.0,
        poll_interval_s: float = 0.1,
    ) -> None:
        self.python = python
        self.master_addr = master_addr
        self.failure_grace_s = failure_grace_s
        self.poll_interval_s = poll_interval_s
        self.last_pids: list[int] = []
        """Process ids of the latest trial's ranks, so a caller can confirm none outlived it."""

    def reap(self, owner: str) -> int:
        """Nothing to do: a rank dies with the process that started it, so no crash leaves one behind."""
        return 0

    def run(self, spec: TrialSpec) -> TrialResult:
        started = now_utc()
        with tempfile.TemporaryDirectory(prefix="stratagem-trial-") as scratch:
            folder = Path(scratch)
            (folder / "spec.json").write_text(spec.to_json())
            port = free_port(self.master_addr)
            threads = spec.cpu_threads(spec.world_size)
            ranks: list[LocalRank] = []
            oom_kills = oom_kill_count()
            try:
                for rank in range(spec.world_size):
                    ranks.append(
                        LocalRank.start(self, folder, rank=rank, port=port, threads=threads, oom_kills=oom_kills)
                    )
                self.last_pids = [r.process.pid for r in ranks]
                supervisor = Supervisor(
                    spec, poll_interval_s=self.poll_interval_s, failure_grace_s=self.failure_grace_s
                )
                reports = supervisor.watch(ranks)
            except OSError as error:
                reports = [RankReport(rank=0, outcome=Outcome.crash, error=f"could not start the ranks: {error}")]
            finally:
                for rank_process in ranks:
                    rank_process.kill()
        return summarize(spec, reports, backend=self.name, started=started, finished=now_utc())


class LocalRank:
    """One rank's process, as the supervisor sees it."""

    def __init__(self, rank: int, process: subprocess.Popen[bytes], folder: Path, oom_kills: int | None = None) -> None:
        self.rank = rank
        self.oom_kills = oom_kills
        """The kernel's OOM-kill count when the trial started, to tell its OOM killer from any other SIGKILL."""
        self.process = process
        self.result_path = folder / f"rank{rank}.json"
        self.progress_path = folder / f"rank{rank}.progress"
        self.log_path = folder / f"rank{rank}.log"

    @classmethod
    def start(
        cls, backend: LocalBackend, folder: Path, *, rank: int, port: int, threads: int, oom_kills: int | None = None
    ) -> LocalRank:
        env = rank_environment(OMP_NUM_THREADS=str(threads))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
        command = [
            backend.python,
            "-m",
            "trial_runner.worker",
            "--spec",
            str(folder / "spec.json"),
            "--rank",
            str(rank),
            "--master-addr",
            backend.master_addr,
            "--master-port",
            str(port),
            "--threads",
            str(threads),
            "--result",
            str(folder / f"rank{rank}.json"),
            "--progress",
            str(folder / f"rank{rank}.progress"),
            "--parent-pid",
            str(os.getpid()),
        ]
        with open(folder / f"rank{rank}.log", "wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        return cls(rank, process, folder, oom_kills)

    def poll(self) -> RankReport | None:
        code = self.process.poll()
        if code is None:
            return None
        if self.result_path.exists():
            return RankReport.model_validate_json(self.result_path.read_text())
        oom = code == -signal.SIGKILL and oom_killed_since(self.oom_kills)
        outcome = Outcome.oom if oom else Outcome.killed if code == -signal.SIGKILL else Outcome.crash
        return RankReport(
            rank=self.rank,
            outcome=outcome,
            error=f"{describe_exit(code, oom_killed=oom)}\n{self._log_tail()}".strip(),
            phase=(self.progress() or Progress("start", 0)).phase,
            finished_at=time.time(),
        )

    def progress(self) -> Progress | None:
        try:
            data = json.loads(self.progress_path.read_text())
            return Progress(str(data["phase"]), int(data["step"]), float(data["slowest_step_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def kill(self) -> None:
        """Kill the rank's whole session (its own process group), so no child it started survives.

        Only while the leader is unreaped: after that its id may belong to someone else's group.
        """
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL_CHARS:]


def describe_exit(code: int, *, oom_killed: bool = False) -> str:
    if code >= 0:
        return f"the rank exited with status {code} without a report"
    name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
    if oom_killed:
        return f"the rank was killed by {name}: the kernel's out-of-memory killer acted during the trial"
    return f"the rank was killed by {name}"
