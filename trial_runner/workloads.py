"""Workload specs: what model a trial trains, named in JSON so a worker can rebuild it.

`ZooWorkload` names a model of the example zoo from a fixed allow-list: a request can pick a name,
never a module path, so the service never imports code a caller chose. A graph trains a zoo model only
when that model's parameters are exactly the graph's variables (`workload_for_graph`). `ReplayWorkload` carries a
ModelGraph and trains a synthetic module with the graph's variables and per-layer work, so any
submitted graph can be trialled without the user's code. `FaultWorkload` wraps either and fails on
purpose; it exists to prove (and health-check) that failures come back as outcomes.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stratagem.ir import ModelGraph
from stratagem.ir.graph import OptimizerKind
from stratagem.tracing.optrace import OperatorTrace

ZOO_ALLOW_LIST: dict[str, str] = {
    "resnet50": "stratagem.zoo:resnet50",
    "vgg16": "stratagem.zoo:vgg16",
    "bert_large": "stratagem.zoo:bert_large",
    "gpt": "stratagem.zoo:gpt",
    "dlrm": "stratagem.zoo:dlrm",
}
"""Zoo models a trial may build, name -> `module:function`. The only place import paths appear."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ZooWorkload(_Spec):
    kind: Literal["zoo"] = "zoo"
    name: str
    """A key of ZOO_ALLOW_LIST."""
    size: str = Field(default="small", pattern=r"^[A-Za-z0-9_\-]{1,32}$")
    batch_size: int = Field(default=8, gt=0, le=1 << 20)
    """Samples per replica per step."""
    overrides: dict[str, int | float | bool | str] = Field(default_factory=dict)
    """Keyword arguments for the zoo builder (e.g. `num_layers`), JSON scalars only."""
    optimizer: OptimizerKind = "adam"
    max_grad_norm: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The global gradient norm each step clips to (the graph's `optimizer.max_grad_norm`); None clips nothing."""

    def __init__(self, name: str | None = None, /, **data: Any) -> None:
        if name is not None:
            data["name"] = name
        super().__init__(**data)

    @field_validator("name")
    @classmethod
    def _allowed(cls, name: str) -> str:
        if name not in ZOO_ALLOW_LIST:
            raise ValueError(f"unknown zoo model {name!r}; allowed: {', '.join(sorted(ZOO_ALLOW_LIST))}")
        return name

    @field_validator("overrides")
    @classmethod
    def _identifiers(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        bad = [key for key in overrides if not key.isidentifier() or key.startswith("_")]
        if bad:
            raise ValueError(f"override names must be public identifiers, got {bad}")
        return overrides

    @property
    def label(self) -> str:
        return f"zoo:{self.name}"


class ReplayWorkload(_Spec):
    kind: Literal["replay"] = "replay"
    graph: ModelGraph
    trace: OperatorTrace | None = None
    """The graph's operator trace (the one `graph.trace_id` names): the replay runs its ops. Without
    it the replay burns each layer's recorded work. Defaults to the trace held beside the graph."""

    def __init__(self, graph: ModelGraph | None = None, /, **data: Any) -> None:
        if graph is not None:
            data["graph"] = graph
            if "trace" not in data and graph.trace is not None:
                data["trace"] = graph.trace
        super().__init__(**data)

    @model_validator(mode="after")
    def _attach(self) -> ReplayWorkload:
        if self.trace is not None:
            if self.trace.id != self.graph.trace_id:
                raise ValueError(f"trace: has id {self.trace.id}, but graph.trace_id is {self.graph.trace_id}")
            self.graph.attach_trace(self.trace)
        return self

    @property
    def batch_size(self) -> int:
        return self.graph.batch_size

    @property
    def optimizer(self) -> str:
        return self.graph.optimizer.kind

    @property
    def max_grad_norm(self) -> float | None:
        return self.graph.optimizer.max_grad_norm

    @property
    def label(self) -> str:
        return f"replay:{self.graph.name}"


FaultKind = Literal["raise", "hang", "oom", "exit"]


class FaultWorkload(_Spec):
    kind: Literal["fault"] = "fault"
    inner: Annotated[ZooWorkload | ReplayWorkload, Field(discriminator="kind")]
    """The workload that runs until the fault strikes."""
    fault: FaultKind
    """raise: a RuntimeError; hang: sleep forever; oom: allocate absurdly; exit: the process dies."""
    rank: int | None = Field(default=None, ge=0)
    """The rank that fails; None means every rank."""
    step: int | None = Field(default=0, ge=0)
    """The step (warm-up included) before which it fails; None means while the model is built."""

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    @property
    def optimizer(self) -> str:
        return self.inner.optimizer

    @property
    def max_grad_norm(self) -> float | None:
        return self.inner.max_grad_norm

    @property
    def label(self) -> str:
        return f"fault:{self.fault}:{self.inner.label}"


def workload_for_graph(graph: ModelGraph, *, trace: OperatorTrace | None = None) -> ZooWorkload | ReplayWorkload:
    """The allow-listed zoo model whose parameters are exactly the graph's variables, else a replay of it,
    of its operator trace when there is one (`trace`, else the one held beside the graph).

    The match is decided from the graph's own shapes: each candidate model is built on the meta device
    (nothing allocated) and its parameters' names and shapes compared with the graph's variables.
    Provenance only says which zoo model to compare against first; it never configures what is built
    (no size, no overrides), so a request cannot make a worker build a model larger than its graph."""
    wanted = _graph_signature(graph)
    for name, size in _zoo_candidates(graph):
        if _zoo_signature(name, size) == wanted:
            optimizer = graph.optimizer
            return ZooWorkload(
                name,
                size=size,
                batch_size=graph.batch_size,
                optimizer=optimizer.kind,
                max_grad_norm=optimizer.max_grad_norm,
            )
    return ReplayWorkload(graph, trace=trace) if trace is not None else ReplayWorkload(graph)


Signature = tuple[tuple[str, tuple[int, ...]], ...]


def _graph_signature(graph: ModelGraph) -> Signature:
    return tuple(sorted((v.name, tuple(v.shape)) for v in graph.variables))


def _zoo_candidates(graph: ModelGraph) -> list[tuple[str, str]]:
    """(model, size) pairs worth comparing: the presets of the zoo model the provenance names, if allow-listed."""
    zoo = graph.provenance.get("zoo")
    name = zoo.get("name") if isinstance(zoo, dict) else None
    if not isinstance(name, str) or name not in ZOO_ALLOW_LIST:
        return []
    from stratagem.zoo import SIZES

    hinted = zoo.get("size") if isinstance(zoo, dict) else None
    sizes = sorted(SIZES.get(name, ()), key=lambda size: size != hinted)
    return [(name, size) for size in sizes]


@functools.lru_cache(maxsize=64)
def _zoo_signature(name: str, size: str) -> Signature | None:
    """A zoo preset's parameters by name and shape, built on meta; None when it cannot be built there."""
    from stratagem import zoo

    try:
        module, _ = zoo.build(name, size, device="meta")
    except Exception:  # a preset that does not build on meta is simply not a match
        return None
    return tuple(sorted((n, tuple(p.shape)) for n, p in module.named_parameters()))
