"""The real thing: `python -m optimizer_service` under uvicorn, driven by the client SDK over HTTP."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sample_documents import make_mlp_graph, make_t4_cluster

import stratagem
from benchmarks.lib.serving import service_environment, wait_healthy
from stratagem.errors import NotFoundError
from stratagem.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_served_app_answers_the_sdk_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    env = service_environment(
        DATABASE_URL=f"sqlite:///{tmp_path / 'served.db'}",
        STRATAGEM_WORKERS="1",
        STRATAGEM_SEARCH_TIME_BUDGET_S="0.5",
        STRATAGEM_MAX_TRIALS="0",
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "optimizer_service", "--port", str(port), "--log-level", "info"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server)
        graph, resources = make_mlp_graph(), make_t4_cluster(2)
        with stratagem.Client(url) as client:
            job = client.optimize(graph, resources, max_trials=0).wait(timeout=60)
            best = job.best()
            assert best.validate_for(graph, resources).id == job.data["best_strategy_id"]
            assert len(job.strategies()) >= 1
            with pytest.raises(NotFoundError):
                client.job("00000000-0000-4000-8000-000000000000")
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal so the exit status tells why.
    assert server.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output, output
    assert "Traceback" not in output, output
