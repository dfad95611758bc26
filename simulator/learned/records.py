"""One record per measured trial: what the cost model learns from, as JSON.

A record keeps summaries rather than the full documents, so a file of records can be shared without
shipping users' graphs (`stratagem trials export/import` does ship them: it moves trials, not records),
and stays small. A record whose `measured_step_time_s` is None is a query: a candidate the model is
asked about.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from simulator.learned.summaries import (
    ClusterSummary,
    GraphSummary,
    StrategySummary,
    summarize_graph,
    summarize_resources,
    summarize_strategy,
)
from stratagem.errors import InvalidDocumentError, Problem
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.ir.document import problems_from_validation_error

RECORD_SCHEMA_VERSION = "1"


class SimulatedStep(Protocol):
    """What a record needs from the simulator: `simulator.Prediction` and `PredictedPerformance` both fit.

    `memory_per_device_bytes` and `ps_load` (seconds per server) are read when present.
    """

    @property
    def step_time_s(self) -> float: ...
    @property
    def breakdown(self) -> Mapping[str, float]: ...


class InvalidRecordError(InvalidDocumentError):
    def __init__(self, problems: list[Problem] | str) -> None:
        super().__init__(problems, document="training record")


class TrainingRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: str = RECORD_SCHEMA_VERSION
    group_id: str = Field(min_length=1)
    """The job the trial belongs to; cross-validation never splits a group between train and test."""
    strategy_id: str | None = None
    graph_id: str | None = None
    resources_id: str | None = None
    graph: GraphSummary
    cluster: ClusterSummary
    strategy: StrategySummary
    simulated_step_time_s: float = Field(gt=0)
    """The analytic simulator's step time: the model's starting point (its base margin)."""
    breakdown: dict[str, float] = Field(default_factory=dict)
    """The simulator's seconds per component, as `Prediction.breakdown` gives them."""
    server_load_s: dict[str, float] = Field(default_factory=dict)
    """Seconds of parameter-server traffic per step on each server's NIC (`Prediction.ps_load`)."""
    memory_per_device_bytes: float = Field(default=0.0, ge=0)
    """The simulator's peak memory of the fullest device (0 when unknown)."""
    measured_step_time_s: float | None = Field(default=None, gt=0)
    """Median measured step time; None for a candidate that has not run."""
    simulator_version: str | None = None
    source: str | None = None
    """Where the measurement came from (a job id, `benchmarks/trials.py`, an import)."""

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value != RECORD_SCHEMA_VERSION:
            raise ValueError(f"{value!r} is not supported (this library reads {RECORD_SCHEMA_VERSION!r})")
        return value

    @field_validator("simulated_step_time_s", "measured_step_time_s")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"must be finite, got {value}")
        return value

    @field_validator("breakdown", "server_load_s")
    @classmethod
    def _finite_breakdown(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [key for key, seconds in value.items() if not math.isfinite(seconds)]
        if bad:
            raise ValueError(f"component(s) {bad[:5]} are not finite")
        return value

    @property
    def measured(self) -> bool:
        return self.measured_step_time_s is not None

    @classmethod
    def parse(cls, data: Mapping[str, Any] | str) -> TrainingRecord:
        """Validate, raising InvalidRecordError whose problems name each bad field."""
        try:
            if isinstance(data, str):
                return cls.model_validate_json(data)
            return cls.model_validate(data)
        except ValidationError as error:
            raise InvalidRecordError(problems_from_validation_error(error)) from None


def default_group_id(graph: ModelGraph, resources: ResourceSpec) -> str:
    """A job is one (graph, cluster) pair: its strategies compete with each other."""
    return f"{str(graph.id)[:16]}@{str(resources.id)[:16]}"


def make_record(
    graph: ModelGraph,
    resources: ResourceSpec,
    strategy: Strategy,
    simulated: SimulatedStep,
    *,
    measured_step_time_s: float | None = None,
    group_id: str | None = None,
    simulator_version: str | None = None,
    source: str | None = None,
) -> TrainingRecord:
    """A record for a trial (with a measurement) or a query (without)."""
    return TrainingRecord(
        group_id=group_id or default_group_id(graph, resources),
        strategy_id=strategy.id,
        graph_id=graph.id,
        resources_id=resources.id,
        graph=summarize_graph(graph),
        cluster=summarize_resources(resources),
        strategy=summarize_strategy(strategy, graph),
        simulated_step_time_s=float(simulated.step_time_s),
        breakdown={str(k): float(v) for k, v in simulated.breakdown.items()},
        server_load_s={str(k): float(v) for k, v in (getattr(simulated, "ps_load", None) or {}).items()},
        memory_per_device_bytes=float(getattr(simulated, "memory_per_device_bytes", 0.0) or 0.0),
        measured_step_time_s=measured_step_time_s,
        simulator_version=simulator_version,
        source=source,
    )


def write_jsonl(records: Iterable[TrainingRecord], path: str | Path) -> int:
    """Write one record per line; returns how many were written."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as out:
        for record in records:
            out.write(record.model_dump_json() + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[TrainingRecord]:
    """Read records, naming the line and field of anything that does not validate; blank lines are skipped."""
    records, problems = [], []
    with Path(path).open(encoding="utf-8") as source:
        for number, line in enumerate(source, start=1):
            if not line.strip():
                continue
            try:
                records.append(TrainingRecord.parse(json.loads(line)))
            except json.JSONDecodeError as error:
                problems.append(Problem(f"line {number}", f"not JSON: {error.msg} at column {error.colno}"))
            except InvalidRecordError as error:
                problems.extend(Problem(f"line {number}: {p.path}", p.reason) for p in error.problems)
    if problems:
        raise InvalidRecordError(problems)
    return records
