"""Service under load: 50 concurrent optimize requests against a real uvicorn server; prints one JSON object.

The server is `stratagem serve` in its own process (SQLite, no trials, 2 job worker threads). The
50 submissions go out at once; then each of the 50 clients polls `GET /v1/jobs/{id}/best` until
its answer is there (409 until the job succeeds) -- the read latency *under load*, while the
workers search. After all jobs end, one client reading alone gives the latency of a request with no
queue, and 50 clients reading at once the throughput (their latency is mostly queueing). Integrity is checked
through the API: every submission got a distinct job id, the database holds exactly those jobs
(none lost, none duplicated), every job succeeded and answered for its own graph; `server_errors_5xx`
counts every 5xx answer of the whole run. Last, a 15 MB graph of 200,000 layers is uploaded while one
client polls `/healthz`: `healthz_during_large_post_s` is that latency (the upload is validated off the
event loop, so it should stay in milliseconds).

    python benchmarks/service_load.py [--jobs 50] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stratagem
from benchmarks.lib.serving import service_environment, start_serve, wait_healthy
from stratagem.ir import ModelGraph
from stratagem.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[1]
SEARCH = {"time_budget_s": 0.2, "max_candidates": 300, "top_k": 3, "seed": 0}
"""A small search budget: the benchmark measures the service, not the search."""
POLL_S = 0.1
READS_AT_REST = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2, help="job worker threads in the server")
    args = parser.parse_args()
    graphs = [small_graph(batch) for batch in range(1, args.jobs + 1)]
    cluster = stratagem.ResourceSpec.from_autodist_yaml(ROOT / "examples" / "specs" / "4x_t4.yml", device="T4")
    with tempfile.TemporaryDirectory(prefix="stratagem-load-") as directory:
        port = free_port()
        server = start_serve(
            port,
            f"sqlite:///{Path(directory) / 'load.db'}",
            "--workers",
            str(args.workers),
            "--trials-backend",
            "none",
            "--log-level",
            "warning",
            env=service_environment(STRATAGEM_POLL_INTERVAL_S="0.05", STRATAGEM_PROGRESS_INTERVAL_S="0.2"),
            stdout=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, server)
            report = asyncio.run(run_load(url, graphs, cluster))
            report["healthz_during_large_post_s"] = asyncio.run(healthz_during_large_post(url))
        finally:
            server.terminate()
            server.wait(timeout=60)
    report.update(
        {
            "benchmark": "service_load",
            "server": {"workers": args.workers, "database": "sqlite", "trials": "none", "search": SEARCH},
        }
    )
    print(json.dumps(report, indent=2))


def small_graph(batch: int) -> ModelGraph:
    """A captured two-layer MLP; the batch size makes each of the graphs distinct."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return stratagem.capture(model, (torch.randn(batch, 64),), batch_size=batch, name=f"mlp-b{batch}")


async def run_load(url: str, graphs: list[ModelGraph], cluster: stratagem.ResourceSpec) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=len(graphs) * 2, max_keepalive_connections=len(graphs) * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        started = time.monotonic()
        submissions = await asyncio.gather(*(submit(http, graph, cluster) for graph in graphs))
        submit_wall = time.monotonic() - started
        job_ids = [job_id for job_id, _ in submissions if job_id is not None]
        polls = await asyncio.gather(*(poll_best(http, job_id) for job_id in job_ids))
        all_done = time.monotonic() - started
        sequential = [latency for job_id in job_ids for latency in await read_best(http, job_id, reads=1)]
        burst_started = time.monotonic()
        at_rest = await asyncio.gather(*(read_best(http, job_id) for job_id in job_ids))
        burst_wall = time.monotonic() - burst_started
        integrity = await check_integrity(http, graphs, job_ids)
    under_load = [latency for job_polls in polls for latency, _ in job_polls]
    statuses = Counter(status for job_polls in polls for _, status in job_polls)
    every_status = [status for _, (_, status) in submissions] + list(statuses.elements())
    return {
        "jobs": len(graphs),
        "submitted": len(job_ids),
        "submit_statuses": dict(Counter(str(status) for _, (_, status) in submissions)),
        "submit_latency_s": summary([latency for _, (latency, _) in submissions]),
        "submit_wall_s": round(submit_wall, 3),
        "all_jobs_done_s": round(all_done, 3),
        "best_latency_under_load_s": {**summary(under_load), "statuses": {str(k): v for k, v in statuses.items()}},
        "best_latency_one_client_s": summary(sequential),
        "best_latency_at_rest_50_clients_s": summary([latency for reads in at_rest for latency in reads]),
        "best_reads_per_s_at_rest": round(sum(len(reads) for reads in at_rest) / burst_wall, 1),
        "server_errors_5xx": sum(1 for status in every_status if status >= 500),
        **integrity,
    }


async def submit(
    http: httpx.AsyncClient, graph: ModelGraph, cluster: stratagem.ResourceSpec
) -> tuple[str | None, tuple[float, int]]:
    body = {
        "graph": graph.model_dump(mode="json"),
        "resources": cluster.model_dump(mode="json"),
        "max_trials": 0,
        "search": SEARCH,
    }
    clock = time.monotonic()
    response = await http.post("/v1/optimize", json=body)
    latency = time.monotonic() - clock
    job_id = response.json()["id"] if response.status_code == 202 else None
    return job_id, (latency, response.status_code)


async def poll_best(http: httpx.AsyncClient, job_id: str, timeout_s: float = 600.0) -> list[tuple[float, int]]:
    """GET /best until it answers 200 (409 while the job runs); every request's latency and status."""
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        clock = time.monotonic()
        response = await http.get(f"/v1/jobs/{job_id}/best")
        samples.append((time.monotonic() - clock, response.status_code))
        if response.status_code == 200:
            return samples
        if response.status_code != 409:
            raise SystemExit(f"GET /best of {job_id}: {response.status_code} {response.text[:300]}")
        await asyncio.sleep(POLL_S)
    raise SystemExit(f"job {job_id} did not finish within {timeout_s:.0f} s")


async def read_best(http: httpx.AsyncClient, job_id: str, *, reads: int = READS_AT_REST) -> list[float]:
    latencies = []
    for _ in range(reads):
        clock = time.monotonic()
        response = await http.get(f"/v1/jobs/{job_id}/best")
        latencies.append(time.monotonic() - clock)
        response.raise_for_status()
    return latencies


async def check_integrity(http: httpx.AsyncClient, graphs: list[ModelGraph], job_ids: list[str]) -> dict[str, Any]:
    """What the database says, through the API: every job present once, succeeded, for its own graph."""
    listing = (await http.get("/v1/jobs", params={"limit": 500})).json()
    listed = [job["id"] for job in listing["data"]]
    jobs = {job["id"]: job for job in listing["data"]}
    answered_for_own_graph = 0
    for graph, job_id in zip(graphs, job_ids, strict=False):
        best = (await http.get(f"/v1/jobs/{job_id}/best")).json()
        answered_for_own_graph += best.get("graph_id") == graph.id and jobs.get(job_id, {}).get("graph_id") == graph.id
    return {
        "unique_job_ids": len(set(job_ids)),
        "jobs_in_db": listing["count"],
        "lost": len(set(job_ids) - set(listed)),
        "duplicated": listing["count"] - len(set(job_ids) & set(listed)),
        "succeeded": sum(job["status"] == "succeeded" for job in listing["data"]),
        "answered_for_own_graph": answered_for_own_graph,
        "all_ok": (
            len(set(job_ids)) == len(graphs) == listing["count"] == len(set(listed))
            and set(listed) == set(job_ids)
            and answered_for_own_graph == len(graphs)
        ),
    }


def large_graph_body(layers: int = 200_000) -> bytes:
    """A valid graph of `layers` chained layers, about 15 MB of JSON."""
    graph: dict[str, Any] = {
        "name": "large",
        "batch_size": 8,
        "layers": [
            {"name": f"l{i}", "fwd_flops": 1_000_000, "bwd_flops": 2_000_000, "inputs": [f"l{i - 1}"] if i else []}
            for i in range(layers)
        ],
        "variables": [{"name": "w", "shape": [64, 64], "consumer": "l0"}],
    }
    graph["layers"][0]["variables"] = ["w"]
    return json.dumps(graph, separators=(",", ":")).encode()


async def healthz_during_large_post(url: str) -> dict[str, Any]:
    """`/healthz` latency, polled every 20 ms while a 15 MB, 200,000-layer graph is uploaded."""
    body = large_graph_body()
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        clock = time.monotonic()
        upload = asyncio.create_task(
            http.post("/v1/graphs", content=body, headers={"content-type": "application/json"})
        )
        latencies = []
        while not upload.done():
            started = time.monotonic()
            await http.get("/healthz")
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.02)
        response = await upload
    return {
        **summary(latencies),
        "body_mb": round(len(body) / 1e6, 1),
        "upload_status": response.status_code,
        "upload_s": round(time.monotonic() - clock, 3),
    }


def summary(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"n": 0}
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 4),
        "p95": round(p95, 4),
        "max": round(ordered[-1], 4),
    }


if __name__ == "__main__":
    main()
