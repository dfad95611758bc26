"""A 15 MB, 200,000-layer graph is validated off the event loop: the service keeps answering meanwhile.

A real uvicorn process on SQLite. The exact latency figure is `benchmarks/service_load.py`'s
(`healthz_during_large_post_s`); this test holds the behaviour: the upload succeeds, and `/healthz`
answers all through it instead of stalling for the seconds validation takes.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from served import Served
from service_helpers import LAYERS, STALL_S, large_graph_body


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_healthz_keeps_answering_while_a_15_mb_graph_is_validated(sqlite_url: str, tmp_path: Path) -> None:
    body = large_graph_body()
    assert 12e6 < len(body) < 16e6
    served = Served(sqlite_url, tmp_path / "service.log", workers=0)
    try:
        served.wait_healthy()
        upload, seconds, latencies = served.post_watching_health("/v1/graphs", body)
        stored = httpx.get(f"{served.url}/v1/graphs", timeout=30).json()["data"]
    finally:
        served.stop()
    assert upload.status_code == 201, upload.text[:300]
    assert stored[0]["num_layers"] == LAYERS
    assert len(latencies) > 10, latencies
    assert max(latencies) < STALL_S, f"/healthz stalled {max(latencies):.2f} s during a {seconds:.1f} s upload"
