"""The trainer the service plugs in: documents and measurements in, a scored JSON model out."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

import simulator
from simulator.learned import CostModel
from simulator.learned.training import Trainer, records_from_samples
from stratagem.builders import all_builders
from stratagem.ir import ModelGraph, ResourceSpec, Strategy


@dataclass(frozen=True)
class Sample:
    graph: ModelGraph
    resources: ResourceSpec
    strategy: Strategy
    measured_step_time_s: float
    group: str
    place: str | None = None


def _graph(width: int) -> ModelGraph:
    return ModelGraph.parse(
        {
            "name": f"mlp-{width}",
            "batch_size": 16,
            "layers": [
                {
                    "name": "fc1",
                    "kind": "matmul",
                    "fwd_flops": 2e3 * width * 16,
                    "bwd_flops": 4e3 * width * 16,
                    "variables": ["fc1.weight"],
                },
                {
                    "name": "fc2",
                    "kind": "matmul",
                    "fwd_flops": 2e3 * width * 16,
                    "bwd_flops": 4e3 * width * 16,
                    "inputs": ["fc1"],
                    "variables": ["fc2.weight"],
                },
            ],
            "variables": [
                {"name": "fc1.weight", "shape": [width, 1000], "consumer": "fc1"},
                {"name": "fc2.weight", "shape": [1000, width], "consumer": "fc2"},
            ],
        }
    )


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    resources = ResourceSpec.parse(
        {
            "nodes": [
                {"address": "10.0.0.1", "chief": True, "gpus": [0, 1], "device": "T4"},
                {"address": "10.0.0.2", "gpus": [0, 1], "device": "T4"},
            ]
        }
    )
    out = []
    for width in (64, 256, 1024):
        graph = _graph(width)
        strategies = [builder.build(graph, resources) for builder in all_builders()]
        for strategy, prediction in zip(strategies, simulator.simulate(graph, resources, strategies), strict=True):
            # stand-in measurements with a known bias (the simulator is 1.5x optimistic), not real trials
            out.append(Sample(graph, resources, strategy, 1.5 * prediction.step_time_s, group=f"job-{width}"))
    return out


def test_samples_become_records_grouped_by_job(samples):
    records, skipped = records_from_samples(samples)
    assert skipped == 0 and len(records) == len(samples)
    assert {r.group_id for r in records} == {"job-64", "job-256", "job-1024"}
    assert all(r.simulator_version == simulator.SIMULATOR_VERSION for r in records)


def test_a_strategy_the_simulator_refuses_is_skipped_not_fatal(samples):
    other = _graph(32)
    stale = Sample(other, samples[0].resources, samples[0].strategy, 1.0, group="stale")
    valid = [s for s in samples if s.group == "job-64"][3:6]
    records, skipped = records_from_samples([*valid, stale])
    assert skipped == 1 and len(records) == 3


def test_the_trainer_returns_a_scored_json_model(samples):
    trained = Trainer(n_estimators=60, n_bootstrap=3, n_splits=3).train(samples)
    assert trained.n_train == len(samples) and trained.version.startswith("cm-")
    assert trained.metrics["corrected"]["mape"] < trained.metrics["simulator"]["mape"]
    model = CostModel.from_json(trained.model_json)
    assert model.version_ == trained.version
    assert json.loads(trained.model_json)["metadata"]["metrics"] == trained.metrics
    records, _ = records_from_samples(samples)
    ratio = model.predict(records) / np.array([r.simulated_step_time_s for r in records])
    assert np.allclose(ratio, 1.5, rtol=0.1)
