"""Request and response bodies, one class per direction of data flow.

`XCreate` is what a client sends, `XPublic` what it gets back, `XsPublic` a page of them
(`{data, count}`, where `count` is the total matching the filter, not the page length).
The three IR documents are embedded as themselves, so the OpenAPI schema shows their full structure
and their own validators run on every request.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from models import JobPhase, JobStatus
from stratagem.ir import MeasuredPerformance, ModelGraph, PredictedPerformance, ResourceSpec, Strategy

ContentId = Annotated[
    str, Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$", description="sha256 content id")
]
TrialOutcome = Literal["ok", "oom", "crash", "timeout", "hang", "invalid"]

# Tags of the `resources` union; the validation-error handler drops them from error locations.
RESOURCE_SPEC_TAG = "ResourceSpec"
AUTODIST_YAML_TAG = "autodist_yaml"
UNION_TAGS = frozenset({RESOURCE_SPEC_TAG, AUTODIST_YAML_TAG})


def _resources_kind(value: Any) -> str:
    return AUTODIST_YAML_TAG if isinstance(value, str) else RESOURCE_SPEC_TAG


ResourcesInput = Annotated[
    Annotated[ResourceSpec, Tag(RESOURCE_SPEC_TAG)]
    | Annotated[str, Tag(AUTODIST_YAML_TAG), Field(min_length=1, max_length=1_000_000)],
    Discriminator(_resources_kind),
]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- documents ---------------------------------------------------------------------------------


class DocumentPublic(BaseModel):
    id: str
    name: str
    created_at: datetime
    url: str


class GraphPublic(DocumentPublic):
    batch_size: int
    num_layers: int
    num_variables: int
    num_parameters: int
    total_flops: float


class GraphsPublic(BaseModel):
    data: list[GraphPublic]
    count: int


class ResourceSpecPublic(DocumentPublic):
    num_nodes: int
    num_devices: int


class ResourceSpecsPublic(BaseModel):
    data: list[ResourceSpecPublic]
    count: int


# --- jobs --------------------------------------------------------------------------------------


class SearchOptions(Body):
    time_budget_s: float | None = Field(default=None, gt=0, le=3600)
    """Wall-clock budget of the search; the service's default when omitted."""
    max_candidates: int | None = Field(default=None, ge=1, le=10_000_000)
    """Candidate budget: with a fixed seed, the knob that makes a search reproducible."""
    top_k: int | None = Field(default=None, ge=1, le=50)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    allow_compression: bool = False
    """Lossy gradient compression changes the training math, so it is opt-in."""
    allow_async: bool = False
    """ASP/SSP consistency changes the training math, so it is opt-in."""


class OptimizeRequest(Body):
    graph: ModelGraph | None = None
    graph_id: ContentId | None = None
    resources: ResourcesInput | None = None
    """A ResourceSpec, or the text of an AutoDist resource_spec.yml."""
    resource_id: ContentId | None = None
    device: str = Field(default="T4", min_length=1, max_length=64)
    """GPU kind of the nodes of an AutoDist resource spec, which does not say."""
    max_trials: int | None = Field(default=None, ge=0, le=64)
    """Real trials of the best candidates; 0 answers from the simulator alone."""
    objective: Literal["throughput"] = "throughput"
    search: SearchOptions = Field(default_factory=SearchOptions)

    @model_validator(mode="after")
    def _one_of_each(self) -> Self:
        for document, reference in (("graph", "graph_id"), ("resources", "resource_id")):
            given = [name for name in (document, reference) if getattr(self, name) is not None]
            if len(given) != 1:
                how = "both were given" if given else "neither was given"
                raise ValueError(f"{document}: give exactly one of '{document}' and '{reference}'; {how}")
        return self


class JobProgress(BaseModel):
    candidates_evaluated: int = 0
    best_step_time_s: float | None = None
    trials_done: int = 0
    trials_budget: int = 0
    timings_s: dict[str, float] = Field(default_factory=dict)
    """Seconds spent in each finished phase."""
    notes: list[str] = Field(default_factory=list)


class JobCreated(BaseModel):
    id: uuid.UUID
    url: str
    status: JobStatus


class JobPublic(BaseModel):
    id: uuid.UUID
    url: str
    status: JobStatus
    phase: JobPhase
    progress: JobProgress
    graph_id: str
    resource_id: str
    options: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    cancel_requested: bool
    attempts: int
    worker_id: str | None
    best_strategy_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class CandidatePublic(BaseModel):
    rank: int
    """1 is the best: fastest measured when trials ran, else fastest predicted."""
    strategy_id: str
    source: str
    description: str
    predicted: PredictedPerformance | None
    measured: MeasuredPerformance | None
    strategy: dict[str, Any]
    """The Strategy document, annotated with this job's prediction and measurement."""


class CandidatesPublic(BaseModel):
    data: list[CandidatePublic]
    count: int


# --- trials ------------------------------------------------------------------------------------


class TrialCreate(Body):
    """A run measured elsewhere, recorded so the cost model can learn from it."""

    graph_id: ContentId
    resource_id: ContentId
    strategy: Strategy | None = None
    strategy_id: ContentId | None = None
    job_id: uuid.UUID | None = None
    outcome: TrialOutcome = "ok"
    step_times_s: list[Annotated[float, Field(gt=0, lt=1e6)]] = Field(default_factory=list, max_length=100_000)
    median_s: float | None = Field(default=None, gt=0, lt=1e6)
    p90_s: float | None = Field(default=None, gt=0, lt=1e6)
    samples_per_s: float | None = Field(default=None, ge=0, lt=1e15)
    peak_memory_bytes: float | None = Field(default=None, ge=0, lt=1e18)
    error: str | None = Field(default=None, max_length=100_000)
    backend: str = Field(default="external", min_length=1, max_length=32)
    predicted_step_time_s: float | None = Field(default=None, gt=0, lt=1e6)
    simulator_version: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.strategy is None) == (self.strategy_id is None):
            raise ValueError("strategy: give exactly one of 'strategy' and 'strategy_id'")
        if self.outcome == "ok" and not self.step_times_s and self.median_s is None:
            raise ValueError("step_times_s: an 'ok' trial needs its step times (or median_s)")
        return self


class TrialPublic(BaseModel):
    id: uuid.UUID
    job_id: uuid.UUID | None
    graph_id: str
    resource_id: str
    strategy_id: str
    outcome: str
    step_times_s: list[float]
    median_s: float | None
    p90_s: float | None
    samples_per_s: float | None
    peak_memory_bytes: float | None
    error: str | None
    backend: str
    predicted_step_time_s: float | None
    simulator_version: str | None
    created_at: datetime


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int


# --- cost model and health ---------------------------------------------------------------------


class CostModelVersionPublic(BaseModel):
    id: int
    version: str
    created_at: datetime
    n_train: int
    metrics: dict[str, Any]
    in_use: bool


class CostModelPublic(BaseModel):
    data: list[CostModelVersionPublic]
    count: int
    in_use: int | None
    """Id of the version the service predicts with; None means the simulator alone."""
    trainer_configured: bool


class HealthPublic(BaseModel):
    status: Literal["ok", "degraded"]
    database: str
    workers: int
    version: str


class ValidationProblem(BaseModel):
    loc: list[str | int]
    msg: str


class ErrorPublic(BaseModel):
    detail: str | list[ValidationProblem]
    request_id: str | None = None
