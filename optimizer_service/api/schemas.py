"""Request and response bodies, one class per direction of data flow.

`XCreate` is what a client sends, `XPublic` what it gets back, `XsPublic` a page of them
(`{data, count}`, where `count` is the total matching the filter, not the page length).
The three IR documents are embedded as themselves, so the OpenAPI schema shows their full structure
and their own validators run on every request.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from models import JobPhase, JobStatus
from optimizer_service.core.inputs import OptimizeInput, PredictInput, TrialInput
from stratagem.ir import MeasuredPerformance, PredictedPerformance
from trial_runner.result import Outcome

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


class OptimizeRequest(OptimizeInput):
    """What `POST /v1/optimize` takes: a graph and a cluster (each inline or by id), a trial budget,
    search budgets, and optionally the configuration the user runs today (`current`), priced beside the
    answer. The rules are the core's (`optimizer_service.core.inputs.OptimizeInput`)."""


class PredictRequest(PredictInput):
    """What `POST /v1/predict` takes: a graph and a cluster (each inline or by id) and 1 to 64 layouts
    or strategies. The rules are the core's (`optimizer_service.core.inputs.PredictInput`)."""


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


class VariantPublic(BaseModel):
    step_time_s: float
    """The variant's predicted step time (within 0.1% of its representative's)."""
    differs: list[dict[str, str]]
    """The small variables it places differently: `{variable, representative, variant}`, in words."""


class CandidatePublic(BaseModel):
    rank: int
    """1 is the answer (`result.decision` says which rule chose it); then measured, then predicted."""
    strategy_id: str
    source: str
    """`search`, the builder that made it, or `current` (the configuration the user runs today)."""
    description: str
    predicted: PredictedPerformance | None
    measured: MeasuredPerformance | None
    relevelled_step_time_s: float | None = None
    """The prediction re-levelled by the job's first trial when that one measured far from its own."""
    variant_count: int = 0
    """Near-copies this candidate stands for: within 0.1%, differing only in where small variables live."""
    variants: list[VariantPublic] = Field(default_factory=list)
    """The first few of them."""
    variant_key: str | None = None
    """What the candidate and its variants share (a hash of everything but the small variables' placement)."""
    strategy: dict[str, Any]
    """The Strategy document, annotated with this job's prediction and measurement."""


class CandidatesPublic(BaseModel):
    data: list[CandidatePublic]
    count: int


# --- trials ------------------------------------------------------------------------------------


class TrialCreate(TrialInput):
    """A run measured elsewhere, recorded so the cost model can learn from it."""


class TrialPublic(BaseModel):
    id: uuid.UUID
    job_id: uuid.UUID | None
    graph_id: str
    resource_id: str
    strategy_id: str
    outcome: Outcome
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
