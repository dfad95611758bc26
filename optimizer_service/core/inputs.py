"""What the core accepts: an optimize submission, a prediction request, a trial measured elsewhere, and a
job's resolved options.

The API's request schemas build on these classes (they add nothing but documentation), so the rules of
a valid submission live here, beside the code that acts on it, and the core never imports the API.
`JobOptions` is the one typed form of a job's options: resolved from a submission and the settings,
stored as its JSON in the `jobs` table, read back by the worker and handed to the pipeline as is.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from optimizer_service.settings import Settings, TrialsBackend
from stratagem.ir import ModelGraph, Precision, ResourceSpec, Strategy
from stratagem.ir.limits import MAX_NAME_CHARS, MAX_YAML_CHARS
from stratagem.layout import Layout
from stratagem.parallel_rules import master_weights_refusal
from trial_runner.result import Outcome

ContentId = Annotated[
    str, Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$", description="sha256 content id")
]

SearchRunner = Literal["stratagem", "engine"]
MAX_GLOBAL_BATCH = 1 << 30

# Tags of the `resources` and `current` unions; the validation-error handler drops them from error locations.
RESOURCE_SPEC_TAG = "ResourceSpec"
AUTODIST_YAML_TAG = "autodist_yaml"
LAYOUT_TAG = "Layout"
LAYOUT_TEXT_TAG = "layout_text"
STRATEGY_TAG = "Strategy"
UNION_TAGS = frozenset({RESOURCE_SPEC_TAG, AUTODIST_YAML_TAG, LAYOUT_TAG, LAYOUT_TEXT_TAG, STRATEGY_TAG})
MAX_LAYOUT_CHARS = 1000
"""The short form of a layout (`dp=8,tp=4,...`) is a line, not a document."""
MAX_PREDICT_ITEMS = 64


def _resources_kind(value: Any) -> str:
    return AUTODIST_YAML_TAG if isinstance(value, str) else RESOURCE_SPEC_TAG


ResourcesInput = Annotated[
    Annotated[ResourceSpec, Tag(RESOURCE_SPEC_TAG)]
    | Annotated[str, Tag(AUTODIST_YAML_TAG), Field(min_length=1, max_length=MAX_YAML_CHARS)],
    Discriminator(_resources_kind),
]
"""A ResourceSpec document, or the text of an AutoDist resource_spec.yml: text, never a path."""


def _document_kind(value: Any) -> str:
    """A Strategy names its replicas and variables; anything else JSON-shaped is a Layout."""
    if isinstance(value, Strategy) or (isinstance(value, dict) and ("replicas" in value or "variables" in value)):
        return STRATEGY_TAG
    return LAYOUT_TAG


def _current_kind(value: Any) -> str:
    return LAYOUT_TEXT_TAG if isinstance(value, str) else _document_kind(value)


CurrentInput = Annotated[
    Annotated[Layout, Tag(LAYOUT_TAG)]
    | Annotated[str, Tag(LAYOUT_TEXT_TAG), Field(min_length=1, max_length=MAX_LAYOUT_CHARS)]
    | Annotated[Strategy, Tag(STRATEGY_TAG)],
    Discriminator(_current_kind),
]
"""A user's present configuration: a Layout document, its short form (`"dp=8,tp=4,mb=1,gbs=512"`), or a Strategy."""

CurrentConfig = Annotated[
    Annotated[Layout, Tag(LAYOUT_TAG)] | Annotated[Strategy, Tag(STRATEGY_TAG)], Discriminator(_document_kind)
]
"""The present configuration as a job stores it: the short form is parsed into its Layout at submission."""


CLIENT_BACKEND = "external"
"""The backend of a trial a client records without naming one: measured on the user's own cluster."""


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    precision: Precision = "fp32"
    """The numerics the model trains in (`Strategy.precision`); every candidate keeps it unless allow_precision."""
    allow_precision: bool = False
    """Another precision changes the training math, so searching it is opt-in."""
    compile: bool = False
    """Whether the user's trainer compiles its blocks (`Strategy.compile`, torchtitan's `[compile]`); every
    candidate keeps it unless allow_compile."""
    allow_compile: bool = False
    """Compiling or not changes the user's training script, so searching it is opt-in."""
    global_batch: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    """Samples per optimizer step over all replicas, fixed: the graph holds one micro-batch, and the search
    chooses the data degree, micro-batch size and count. Omitted: the graph's batch is a replica's step."""
    runner: SearchRunner = "stratagem"
    """Who runs the answer: `stratagem` (stratagem.distribute, the trials) or `engine` (the trainers a
    strategy exports to, torchtitan and Megatron-LM: every layout of the model's blocks, context parallelism)."""

    @model_validator(mode="after")
    def _runner_runs_the_precision(self) -> Self:
        refusal = master_weights_refusal(self.precision) if self.runner != "engine" else None
        if refusal is not None:
            raise ValueError(f"precision: {refusal}")
        return self


class ProblemInput(Body):
    """The model and the cluster a request is about, each given inline or by the id of a stored one."""

    graph: ModelGraph | None = None
    graph_id: ContentId | None = None
    resources: ResourcesInput | None = None
    """A ResourceSpec, or the text of an AutoDist resource_spec.yml."""
    resource_id: ContentId | None = None
    device: str = Field(default="T4", min_length=1, max_length=64)
    """GPU kind of the nodes of an AutoDist resource spec, which does not say."""

    @model_validator(mode="after")
    def _one_of_each(self) -> Self:
        for document, reference in (("graph", "graph_id"), ("resources", "resource_id")):
            given = [name for name in (document, reference) if getattr(self, name) is not None]
            if len(given) != 1:
                how = "both were given" if given else "neither was given"
                raise ValueError(f"{document}: give exactly one of '{document}' and '{reference}'; {how}")
        return self


class OptimizeInput(ProblemInput):
    max_trials: int | None = Field(default=None, ge=0, le=64)
    """Real trials of the best candidates; 0 answers from the simulator alone."""
    objective: Literal["throughput"] = "throughput"
    search: SearchOptions = Field(default_factory=SearchOptions)
    current: CurrentInput | None = None
    """The configuration the user runs today (a Layout, its short form, or a Strategy): priced beside the
    answer, which states its predicted speed-up over it. Checked against the graph and cluster at submission."""


def _layout_text(value: Any) -> Any:
    return Layout.from_string(value) if isinstance(value, str) else value


LayoutInput = Annotated[Layout, BeforeValidator(_layout_text)]


class PredictInput(ProblemInput):
    """Up to 64 layouts or strategies to price on one cluster, synchronously, storing nothing."""

    layouts: list[LayoutInput] = Field(default_factory=list, max_length=MAX_PREDICT_ITEMS)
    """Layout documents, or their short form `"dp=8,tp=4,pp=2,mb=1,gbs=512,precision=amp-bf16"`."""
    strategies: list[Strategy] = Field(default_factory=list, max_length=MAX_PREDICT_ITEMS)

    @model_validator(mode="after")
    def _check(self) -> Self:
        count = len(self.layouts) + len(self.strategies)
        if not 1 <= count <= MAX_PREDICT_ITEMS:
            raise ValueError(f"layouts: give 1 to {MAX_PREDICT_ITEMS} layouts and strategies in all, got {count}")
        return self


class TrialInput(Body):
    """A run measured elsewhere, recorded so the cost model can learn from it."""

    graph_id: ContentId
    resource_id: ContentId
    strategy: Strategy | None = None
    strategy_id: ContentId | None = None
    job_id: uuid.UUID | None = None
    outcome: Outcome = Outcome.ok
    step_times_s: list[Annotated[float, Field(gt=0, lt=1e6)]] = Field(default_factory=list, max_length=100_000)
    median_s: float | None = Field(default=None, gt=0, lt=1e6)
    p90_s: float | None = Field(default=None, gt=0, lt=1e6)
    samples_per_s: float | None = Field(default=None, ge=0, lt=1e15)
    peak_memory_bytes: float | None = Field(default=None, ge=0, lt=1e18)
    error: str | None = Field(default=None, max_length=100_000)
    backend: str = Field(default=CLIENT_BACKEND, min_length=1, max_length=32)
    predicted_step_time_s: float | None = Field(default=None, gt=0, lt=1e6)
    simulator_version: str | None = Field(default=None, max_length=MAX_NAME_CHARS)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.strategy is None) == (self.strategy_id is None):
            raise ValueError("strategy: give exactly one of 'strategy' and 'strategy_id'")
        if self.outcome == Outcome.ok and not self.step_times_s and self.median_s is None:
            raise ValueError("step_times_s: an 'ok' trial needs its step times (or median_s)")
        return self


class SearchBudget(BaseModel):
    """A job's search budgets with the service's defaults filled in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time_budget_s: float = Field(gt=0)
    max_candidates: int = Field(ge=1)
    top_k: int = Field(ge=1)
    seed: int = Field(default=0, ge=0)
    allow_compression: bool = False
    allow_async: bool = False
    precision: Precision = "fp32"
    allow_precision: bool = False
    compile: bool = False
    allow_compile: bool = False
    global_batch: int | None = Field(default=None, ge=1)
    runner: SearchRunner = "stratagem"


class JobOptions(BaseModel):
    """What a job runs with, resolved once at submission so it states exactly that even if defaults change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    objective: Literal["throughput"] = "throughput"
    max_trials: int = Field(ge=0)
    trials_backend: TrialsBackend = "none"
    search: SearchBudget
    current: CurrentConfig | None = None
    """The user's present configuration, priced beside the answer."""

    @classmethod
    def resolve(
        cls, request: OptimizeInput, settings: Settings, *, current: Layout | Strategy | None = None
    ) -> JobOptions:
        """`current` is the request's configuration as checked at submission (its short form parsed)."""
        search = request.search
        return cls(
            objective=request.objective,
            current=current,
            max_trials=settings.max_trials if request.max_trials is None else request.max_trials,
            trials_backend=settings.effective_trials_backend,
            search=SearchBudget(
                time_budget_s=search.time_budget_s or settings.search_time_budget_s,
                max_candidates=search.max_candidates or settings.search_max_candidates,
                top_k=search.top_k or settings.search_top_k,
                seed=settings.search_seed if search.seed is None else search.seed,
                allow_compression=search.allow_compression,
                allow_async=search.allow_async,
                precision=search.precision,
                allow_precision=search.allow_precision,
                compile=search.compile,
                allow_compile=search.allow_compile,
                global_batch=search.global_batch,
                runner=search.runner,
            ),
        )
