"""`stratagem.trial` inside a user's own process group: every rank agrees on the report, rank 0 records it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from runtime_helpers import run_ranks
from sample_documents import make_cpu_cluster
from service_helpers import served
from torch import nn

import stratagem
from stratagem.builders import DataParallel
from stratagem.errors import InvalidDocumentError, UnsupportedStrategyError

STEPS, WARMUP, BATCH = 4, 1, 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))


def _make_batch(batch_size: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch_size, 6),)


def trial_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from stratagem.ir import ModelGraph, ResourceSpec, Strategy
    from stratagem.tracing.optrace import OperatorTrace

    graph = ModelGraph.parse(payload["graph"]).attach_trace(OperatorTrace.parse(payload["trace"]))
    client = stratagem.Client(payload["url"]) if payload.get("url") else None
    report = stratagem.trial(
        _model(),
        _make_batch,
        Strategy.parse(payload["strategy"]),
        steps=STEPS,
        warmup=WARMUP,
        batch_size=BATCH,
        graph=graph,
        resources=ResourceSpec.parse(payload["resources"]),
        record_to=client,
    )
    return {**{k: v for k, v in report.__dict__.items() if k != "recorded"}, "recorded": report.recorded}


@pytest.mark.slow
def test_two_ranks_agree_on_the_slowest_step_times_and_rank_zero_records_them(tmp_path) -> None:
    resources = make_cpu_cluster(2)
    graph = stratagem.capture(_model(), _make_batch(BATCH), batch_size=BATCH)
    strategy = DataParallel().build(graph, resources)
    with served(f"sqlite:///{tmp_path / 'service.db'}") as url:
        payload = {
            "url": url,
            "graph": graph.model_dump(mode="json"),
            "trace": graph.trace.model_dump(mode="json"),
            "resources": resources.model_dump(mode="json"),
            "strategy": strategy.model_dump(mode="json"),
        }
        first, second = run_ranks("test_sdk_trial:trial_worker", 2, payload)
        with stratagem.Client(url) as client:
            rows = client.trials(graph_id=graph.id)
            stored_trace = client.graph_trace(graph.id)
    assert first["step_times_s"] == second["step_times_s"] and len(first["step_times_s"]) == STEPS
    assert first["world_size"] == 2 and first["batch_size"] == BATCH and first["warmup"] == WARMUP
    assert first["p90_s"] >= first["median_s"] > 0
    assert first["samples_per_s"] == pytest.approx(2 * BATCH / first["median_s"])
    assert first["peak_memory_bytes"] == second["peak_memory_bytes"] > 50e6
    assert first["recorded"] is not None and second["recorded"] is None
    assert len(rows) == 1 and rows[0]["backend"] == "sdk" and rows[0]["outcome"] == "ok"
    assert rows[0]["step_times_s"] == first["step_times_s"] and rows[0]["strategy_id"] == strategy.id
    assert stored_trace.id == graph.trace_id  # the graph went up with its trace


def test_arguments_are_checked_before_anything_runs() -> None:
    resources = make_cpu_cluster(2)
    graph = stratagem.capture(_model(), _make_batch(BATCH), batch_size=BATCH, trace=False)
    strategy = DataParallel().build(graph, resources)
    with pytest.raises(InvalidDocumentError, match="steps: must be a positive integer"):
        stratagem.trial(_model(), _make_batch, strategy, steps=0, batch_size=2)
    with pytest.raises(InvalidDocumentError, match="batch_size: is required"):
        stratagem.trial(_model(), _make_batch, strategy)
    with pytest.raises(InvalidDocumentError, match="resources: is needed to record the trial"):
        stratagem.trial(_model(), _make_batch, strategy, graph=graph, record_to=stratagem.Client())
    pipelined = strategy.model_dump(mode="json", exclude={"id"})
    pipelined["mesh"] = {"pipeline": 2}
    with pytest.raises((UnsupportedStrategyError, InvalidDocumentError)):
        stratagem.trial(_model(), _make_batch, stratagem.Strategy.parse(pipelined), batch_size=2)
