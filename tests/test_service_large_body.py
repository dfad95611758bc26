"""A 15 MB, 200,000-layer graph is validated off the event loop: the service keeps answering meanwhile.

A real uvicorn process on SQLite. The exact latency figure is `benchmarks/service_load.py`'s
(`healthz_during_large_post_s`); this test holds the behaviour: the upload succeeds, and `/healthz`
answers all through it instead of stalling for the seconds validation takes.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import Served

LAYERS = 200_000
STALL_S = 1.0
"""Far above a healthy answer (milliseconds) and far below the seconds the validation takes."""


def large_graph_body(layers: int = LAYERS) -> bytes:
    """A valid graph of `layers` chained layers, about 75 bytes each."""
    graph: dict[str, Any] = {
        "name": "large",
        "batch_size": 8,
        "layers": [
            {"name": f"l{i}", "fwd_flops": 1_000_000, "bwd_flops": 2_000_000, "inputs": [f"l{i - 1}"] if i else []}
            | ({"variables": ["w"]} if i == 0 else {})
            for i in range(layers)
        ],
        "variables": [{"name": "w", "shape": [64, 64], "consumer": "l0"}],
    }
    return json.dumps(graph, separators=(",", ":")).encode()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_healthz_keeps_answering_while_a_15_mb_graph_is_validated(sqlite_url: str, tmp_path: Path) -> None:
    body = large_graph_body()
    assert 12e6 < len(body) < 16e6
    served = Served(sqlite_url, tmp_path / "service.log", workers=0)
    try:
        served.wait_healthy()
        upload: dict[str, Any] = {}

        def post() -> None:
            started = time.perf_counter()
            response = httpx.post(
                f"{served.url}/v1/graphs", content=body, headers={"content-type": "application/json"}, timeout=240
            )
            upload.update(status=response.status_code, text=response.text[:300], seconds=time.perf_counter() - started)

        poster = threading.Thread(target=post)
        latencies: list[float] = []
        with httpx.Client(base_url=served.url, timeout=30) as http:
            poster.start()
            while poster.is_alive():
                started = time.perf_counter()
                assert http.get("/healthz").status_code == 200
                latencies.append(time.perf_counter() - started)
                time.sleep(0.02)
        poster.join()
        stored = httpx.get(f"{served.url}/v1/graphs", timeout=30).json()["data"]
    finally:
        served.stop()
    assert upload["status"] == 201, upload
    assert stored[0]["num_layers"] == LAYERS
    assert len(latencies) > 10, latencies
    assert max(latencies) < STALL_S, (
        f"/healthz stalled {max(latencies):.2f} s during a {upload['seconds']:.1f} s upload"
    )
