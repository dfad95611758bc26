"""From recorded trials (full documents plus a measurement) to a trained, scored, serialized cost model.

This is what the service's retrain endpoint plugs in (`CostModelTrainer` there: `train(samples)` with
samples carrying graph, resources, strategy, measured time and a group); it lives here so that the
service only stores JSON and never needs to know how features are made.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import simulator
from simulator.learned.features import build_features
from simulator.learned.metrics import cross_validate
from simulator.learned.model import CostModel
from simulator.learned.records import TrainingRecord, make_record
from stratagem.ir import ModelGraph, ResourceSpec, Strategy


class TrialSampleLike(Protocol):
    @property
    def graph(self) -> ModelGraph: ...
    @property
    def resources(self) -> ResourceSpec: ...
    @property
    def strategy(self) -> Strategy: ...
    @property
    def measured_step_time_s(self) -> float: ...
    @property
    def group(self) -> str: ...
    @property
    def place(self) -> str | None:
        """Where the measurement was made (a published source, this service's trial backend); None when unknown."""
        ...


@dataclass(frozen=True)
class TrainedModel:
    model_json: str
    """`CostModel.to_json()`: every booster as XGBoost JSON, never a pickle."""
    n_train: int
    version: str
    metrics: dict[str, Any] = field(default_factory=dict)
    """Cross-validated by job (simulator alone and corrected); empty with fewer than two jobs."""
    skipped: int = 0
    """Samples the simulator refused (a strategy that no longer matches its graph or cluster)."""


def records_from_samples(samples: Sequence[TrialSampleLike]) -> tuple[list[TrainingRecord], int]:
    """Simulate every sample (batched per graph and cluster) and pair it with its measurement; a record's
    source is the sample's place, so trials from several places each keep their own level (`CostModel`)."""
    by_pair: dict[tuple[str, str], list[TrialSampleLike]] = defaultdict(list)
    for sample in samples:
        by_pair[(str(sample.graph.id), str(sample.resources.id))].append(sample)
    records, skipped = [], 0
    for group in by_pair.values():
        graph, resources = group[0].graph, group[0].resources
        for sample, prediction in zip(
            group, simulator.simulate_each(graph, resources, [s.strategy for s in group]), strict=True
        ):
            if prediction is None or sample.measured_step_time_s <= 0:
                skipped += 1
                continue
            records.append(
                make_record(
                    graph,
                    resources,
                    sample.strategy,
                    prediction,
                    measured_step_time_s=sample.measured_step_time_s,
                    group_id=sample.group,
                    simulator_version=simulator.SIMULATOR_VERSION,
                    source=sample.place,
                )
            )
    return records, skipped


class Trainer:
    """Fits a CostModel on recorded trials and scores it by job; matches the service's CostModelTrainer."""

    def __init__(self, *, n_splits: int = 5, **params: Any) -> None:
        self.n_splits = n_splits
        self.params = params
        """Hyper-parameters for every CostModel this trainer fits (see `CostModel.__init__`)."""

    def train(self, samples: Sequence[TrialSampleLike]) -> TrainedModel:
        records, skipped = records_from_samples(samples)
        model = CostModel(**self.params).fit(records)
        metrics: dict[str, Any] = {}
        if len({r.group_id for r in records}) >= 2:
            metrics = cross_validate(
                lambda: CostModel(**self.params), build_features(records), n_splits=self.n_splits
            ).to_dict()
        model.metadata_["metrics"] = metrics
        model.metadata_["skipped"] = skipped
        return TrainedModel(
            model_json=model.to_json(), n_train=len(records), version=model.version_, metrics=metrics, skipped=skipped
        )
