"""Trial workers never outlive their supervisor, and a SIGKILL is `oom` only when the kernel says so.

Real processes: a stand-in supervisor process starts a real rank and is killed with SIGKILL; real
rank processes killed from outside; a real local Ray whose actors are named for their job and reaped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sample_documents import make_cpu_cluster, make_mlp_graph

from optimizer_service.jobs.trials import record_from_result
from stratagem.builders import DataParallel
from trial_runner import FaultWorkload, LocalBackend, Outcome, ReplayWorkload, run_trial
from trial_runner.backends import local
from trial_runner.build import strike
from trial_runner.oom import oom_kill_count
from trial_runner.worker import classify

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


SUPERVISOR = textwrap.dedent(
    """
    import subprocess, sys, time
    from trial_runner.lifeline import die_with_parent
    import os
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time; from trial_runner.lifeline import die_with_parent; "
         "die_with_parent(int(sys.argv[1])); print('armed', flush=True); time.sleep(600)", str(os.getpid())],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    assert child.stdout.readline().strip() == "armed"
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_a_rank_dies_when_its_supervisor_is_killed_with_sigkill() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert supervisor.stdout is not None
        rank = int(supervisor.stdout.readline())
        assert _alive(rank)
    finally:
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
    assert _wait_until(lambda: not _alive(rank), 5.0), f"rank {rank} outlived its supervisor"


def _hang_trial(backend: LocalBackend, results: list) -> threading.Thread:  # type: ignore[type-arg]
    graph, resources = make_mlp_graph(batch_size=4, widths=(8, 8, 2)), make_cpu_cluster(2)
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="hang", rank=None, step=0)
    strategy = DataParallel().build(graph, resources)

    def run() -> None:
        results.append(run_trial(workload, resources, strategy, backend=backend, timeout=120, warmup=0, steps=1))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("kernel_counted_an_oom_kill", [False, True])
def test_a_rank_killed_by_sigkill_is_oom_only_when_the_kernel_counted_an_oom_kill(
    monkeypatch: pytest.MonkeyPatch, kernel_counted_an_oom_kill: bool
) -> None:
    """The kernel's counter is read for real; only its answer is fixed, since no test may run the machine out of memory."""
    monkeypatch.setattr(local, "oom_killed_since", lambda before: kernel_counted_an_oom_kill)
    backend, results = LocalBackend(failure_grace_s=1.0), []
    thread = _hang_trial(backend, results)
    assert _wait_until(lambda: len(backend.last_pids) == 2, 60)
    time.sleep(1.0)
    os.kill(backend.last_pids[0], signal.SIGKILL)
    thread.join(timeout=120)
    result = results[0]
    expected = Outcome.oom if kernel_counted_an_oom_kill else Outcome.killed
    assert result.outcome == expected, result.error
    assert result.failed_rank == 0
    assert ("out-of-memory killer" in (result.error or "")) == kernel_counted_an_oom_kill


def test_the_kernel_oom_counter_is_readable_here() -> None:
    if not Path("/proc/vmstat").exists():
        pytest.skip("no /proc/vmstat")
    assert isinstance(oom_kill_count(), int)


def test_a_trial_error_shown_to_clients_names_files_not_server_paths() -> None:
    try:
        strike("raise")
    except RuntimeError as error:
        outcome, text = classify(error)
    assert str(ROOT) in text  # the rank's own report keeps the traceback with its paths
    graph, resources = make_mlp_graph(batch_size=4, widths=(8, 8, 2)), make_cpu_cluster(2)
    strategy = DataParallel().build(graph, resources)
    from trial_runner import fake_result
    from trial_runner.spec import TrialSpec

    spec = TrialSpec(workload=ReplayWorkload(graph), resources=resources, strategy=strategy)
    result = fake_result(spec, outcome=outcome).model_copy(update={"error": f"rank 0: {text}"})
    record = record_from_result(result, strategy, simulator_version=None)
    assert record.error is not None and "build.py" in record.error
    assert str(ROOT) not in record.error and "/work/" not in record.error
    assert str(ROOT) not in str(record.details)
