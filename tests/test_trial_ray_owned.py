"""Ray trial actors belong to their job: they die with the service's driver, and a resumed job reaps leftovers.

A real local Ray (2 CPUs), started by this test's process; a second driver process stands in for the
service and is killed with SIGKILL mid-trial.
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

from stratagem.builders import DataParallel
from trial_runner import FaultWorkload, Outcome, RayBackend, ReplayWorkload, run_trial
from trial_runner.backends.ray_backend import ACTOR_NAMESPACE

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _owned(ray, owner: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == ACTOR_NAMESPACE and entry["name"].startswith(f"{owner}/")
    ]


def _wait_until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _hang():  # type: ignore[no-untyped-def]
    graph, resources = make_mlp_graph(batch_size=4, widths=(8, 8, 2)), make_cpu_cluster(2)
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="hang", rank=None, step=0)
    return workload, resources, DataParallel().build(graph, resources)


@pytest.mark.timeout(300)
def test_a_resumed_job_reaps_the_actors_an_earlier_attempt_left(ray_backend) -> None:
    backend, ray = ray_backend
    workload, resources, strategy = _hang()
    results: list = []  # type: ignore[type-arg]
    trial = threading.Thread(
        target=lambda: results.append(
            run_trial(workload, resources, strategy, backend=backend, timeout=200, warmup=0, steps=1, owner="job-a")
        )
    )
    trial.start()
    assert _wait_until(lambda: len(_owned(ray, "job-a")) == 2, 120), "the trial's actors never appeared"
    assert RayBackend().reap("job-b") == 0
    assert RayBackend().reap("job-a") == 2
    trial.join(timeout=60)
    assert not trial.is_alive() and results[0].outcome == Outcome.crash, results
    assert _owned(ray, "job-a") == []


DRIVER = textwrap.dedent(
    """
    import sys
    from sample_documents import make_cpu_cluster, make_mlp_graph
    from stratagem.builders import DataParallel
    from trial_runner import FaultWorkload, RayBackend, ReplayWorkload, run_trial
    graph, resources = make_mlp_graph(batch_size=4, widths=(8, 8, 2)), make_cpu_cluster(2)
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="hang", rank=None, step=0)
    backend = RayBackend(sys.argv[1], init_kwargs={"runtime_env": {"env_vars": {"PYTHONPATH": sys.argv[2]}}})
    run_trial(workload, resources, DataParallel().build(graph, resources), backend=backend, timeout=300, owner="job-c")
    """
)


@pytest.mark.timeout(300)
def test_actors_die_with_the_driver_that_owns_them(ray_backend) -> None:
    _, ray = ray_backend
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, address, str(ROOT)], env=env, cwd=ROOT)
    try:
        assert _wait_until(lambda: len(_owned(ray, "job-c")) == 2, 150), "the driver's actors never appeared"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert _wait_until(lambda: _owned(ray, "job-c") == [], 60), _owned(ray, "job-c")
