"""`stratagem serve` runs the trials a request asks for: on the Ray named by RAY_ADDRESS, on one it starts
itself over this machine's devices when nothing says where, or nowhere with `--trials-backend none`,
and says which at start-up."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sample_documents import make_cpu_cluster, make_mlp_graph
from service_helpers import QUICK_SEARCH

import stratagem
from benchmarks.lib.serving import service_environment, start_serve, wait_healthy
from optimizer_service.cli.serve import trials_note, with_embedded_trials
from optimizer_service.jobs.trials import make_trial_executor
from optimizer_service.settings import Settings
from stratagem.runtime.launch import free_port


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("STRATAGEM_") or key in ("DATABASE_URL", "RAY_ADDRESS"):
            monkeypatch.delenv(key)


def test_with_nothing_said_trials_run_on_a_ray_started_here(clean_environment) -> None:
    settings = with_embedded_trials(Settings())
    assert settings.effective_trials_backend == "ray" and settings.ray_address is None
    executor = make_trial_executor(settings)
    assert executor is not None and executor.backend == "ray" and executor._backend.address is None
    note = trials_note(settings)
    assert note.startswith("trials: on a Ray started here over this machine's devices (")
    assert "--trials-backend none turns them off" in note


def test_a_backend_or_a_ray_address_that_is_given_is_kept(clean_environment, monkeypatch) -> None:
    off = with_embedded_trials(Settings(trials_backend="none"))
    assert off.effective_trials_backend == "none" and make_trial_executor(off) is None
    assert trials_note(off).startswith("trials: off (--trials-backend none)")
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.0.0.9:10001")
    cluster = with_embedded_trials(Settings())
    assert (
        cluster.trials_backend is None and trials_note(cluster) == "trials: on the Ray cluster at ray://10.0.0.9:10001"
    )
    assert trials_note(Settings(trials_backend="local")).startswith("trials: local processes")


@pytest.mark.slow
def test_serve_with_no_flags_says_where_trials_run_and_runs_them(tmp_path: Path) -> None:
    port = free_port()
    marker = str(port)
    server = start_serve(
        port,
        f"sqlite:///{tmp_path / 's.db'}",
        env=service_environment(SERVE_TRIALS_TEST=marker),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server, timeout_s=120)
        with stratagem.Client(f"http://127.0.0.1:{port}") as client:
            job = client.optimize(make_mlp_graph(), make_cpu_cluster(2), max_trials=1, search=QUICK_SEARCH).wait(600)
            assert job.status == "succeeded", job.data
            assert job.data["progress"]["trials_done"] == 1
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=120)
    assert "trials: on a Ray started here over this machine's devices" in output
    assert "Application shutdown complete" in output and "Traceback" not in output
    time.sleep(5)
    assert _processes_marked(marker) == [], "the Ray the service started outlived it"


def _processes_marked(marker: str) -> list[int]:
    """Processes (the server's Ray among them) whose environment carries this test's marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SERVE_TRIALS_TEST={marker}".encode() in environ:
            found.append(int(entry.name))
    return found
