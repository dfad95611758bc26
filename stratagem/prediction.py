"""`stratagem.predict`: what a layout or strategy costs on a cluster, with no job and no search.

A lazy facade over the simulator: the library never imports `simulator` at module level (the service
and the simulator build on the library, not the other way round), so `predict` imports it when called,
and a client that only talks to the service never loads it. This module is the one place in `stratagem`
that reaches into `simulator` (docs/layouts.md, "Architecture").

Throughput counts what a step trains: a strategy that states its micro-batch size (every one a layout
builds, whose graph is captured at the micro-batch) trains `micro_batch_size × micro-batches × data`
samples per step; any other strategy's graph is already a replica's step (`Strategy.step_samples`). Tokens are samples × the architecture's sequence. MFU is model FLOPs (the captured forward and backward, without the forward that
recomputation repeats; attention counted over the whole score matrix, as PaLM's appendix B does) per
second over the dense peak of every replica's device at the step's matmul precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

from pydantic import Field, PrivateAttr

from stratagem.architecture import architecture_of
from stratagem.errors import InvalidDocumentError, Problem, UnsupportedStrategyError
from stratagem.ir import DeviceSpec, ModelGraph, ResourceSpec, Strategy
from stratagem.ir.document import Strict
from stratagem.layout import Layout, layout_of
from stratagem.layout_build import SharedParts, build_strategy

PEAK_KEYS: dict[str, tuple[str, ...]] = {
    "fp32": ("float32",),
    "tf32": ("tfloat32", "tf32", "float32"),
    "amp-fp16": ("float16",),
    "amp-bf16": ("bfloat16", "float16"),
    "bf16": ("bfloat16", "float16"),
    "fp8": ("float8", "float8_e4m3fn"),
    "fp16": ("float16",),
}
"""The catalog's `peak_flops` keys a precision's matmuls run at, first found wins; a device without
any (fp8 before Hopper) has no MFU for that precision."""

Priceable = Strategy | Layout


class Prediction(Strict):
    """One layout or strategy priced: speed, efficiency, memory, and where the time goes."""

    label: str
    """The layout in short form (`dp=8,tp=4,...`), or the strategy's description."""
    layout: Layout | None = None
    """The layout priced, every degree and batch filled for the cluster and graph, where the strategy has one."""
    strategy_id: str
    devices: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    """Samples per optimizer step over all replicas."""
    step_time_s: float = Field(ge=0)
    samples_per_s: float = Field(ge=0)
    tokens_per_s: float | None = None
    """Samples per second × the sequence length, for a graph with an architecture."""
    model_flops_per_step: float = Field(ge=0)
    mfu: float | None = None
    """Model FLOPs per second over the devices' dense peak at the precision; None without a peak."""
    memory_per_device_bytes: float = Field(ge=0)
    """Peak memory of the fullest device."""
    memory_capacity_bytes: float = Field(ge=0)
    """Memory of the smallest device the strategy runs on."""
    memory_over_bytes: float = Field(default=0.0, ge=0)
    """How far the fullest device is over its memory (0 when it fits)."""
    feasible: bool
    infeasible_reason: str | None = None
    breakdown: dict[str, float] = Field(default_factory=dict)
    """Seconds per component of the step (the simulator's keys); they add up to the step time."""
    bottleneck: str = ""
    _strategy: Strategy | None = PrivateAttr(default=None)

    @property
    def strategy(self) -> Strategy | None:
        """The strategy priced (not serialized: rebuild it from the layout, or fetch it by id)."""
        return self._strategy


@overload
def predict(graph: ModelGraph, resources: ResourceSpec, what: Priceable) -> Prediction: ...
@overload
def predict(graph: ModelGraph, resources: ResourceSpec, what: Sequence[Priceable]) -> list[Prediction]: ...
def predict(
    graph: ModelGraph, resources: ResourceSpec, what: Priceable | Sequence[Priceable]
) -> Prediction | list[Prediction]:
    """Price one layout or strategy (a Prediction), or several in one simulator call (a list).

    Layouts are built for the cluster (`Layout.build`); strategies are checked against the graph and
    cluster. Raises InvalidLayoutError / InvalidStrategyError naming the item (`[2].tensor`), and
    UnsupportedStrategyError for a knob the simulator does not price.
    """
    items: list[Priceable] = [what] if isinstance(what, Strategy | Layout) else list(what)
    single = isinstance(what, Strategy | Layout)
    shared = SharedParts()
    strategies = [_strategy(graph, resources, item, None if single else i, shared) for i, item in enumerate(items)]
    raw = _simulate(graph, resources, strategies, single=single)
    out = [_prediction(graph, resources, item, s, r) for item, s, r in zip(items, strategies, raw, strict=True)]
    return out[0] if single else out


def _strategy(
    graph: ModelGraph, resources: ResourceSpec, item: Any, index: int | None, shared: SharedParts
) -> Strategy:
    try:
        if isinstance(item, Layout):
            return build_strategy(item, graph, resources, check=False, shared=shared)
        if isinstance(item, Strategy):
            return item.validate_for(graph, resources)
    except InvalidDocumentError as error:
        if index is None:
            raise
        raise type(error)(
            [Problem(f"[{index}].{p.path}" if p.path else f"[{index}]", p.reason) for p in error.problems]
        ) from None
    where = f"[{index}]: " if index is not None else ""
    raise TypeError(f"{where}expected a Layout or a Strategy, got {type(item).__name__}")


def _simulate(graph: ModelGraph, resources: ResourceSpec, strategies: list[Strategy], *, single: bool) -> list[Any]:
    from simulator import simulate  # the lazy facade: see the module docstring

    rows = list(range(len(strategies)))
    try:
        return list(simulate(graph, resources, strategies))
    except InvalidDocumentError as error:
        raise _renamed(error, rows, single=single) from None
    except UnsupportedStrategyError as error:
        raise _refused(simulate, graph, resources, strategies, rows, error, single=single) from None


def _renamed(error: InvalidDocumentError, rows: list[int], *, single: bool) -> InvalidDocumentError:
    """The simulator names a strategy of its batch `strategies[j]`; predict names it by its place here."""
    problems = []
    for problem in error.problems:
        head, sep, rest = problem.path.partition("]")
        if sep and head.startswith("strategies[") and head[len("strategies[") :].isdigit():
            index = rows[int(head[len("strategies[") :])]
            path = rest.lstrip(".") if single else f"[{index}]{rest}"
            problems.append(Problem(path, problem.reason))
        else:
            problems.append(problem)
    return type(error)(problems)


def _refused(
    simulate: Any,
    graph: ModelGraph,
    resources: ResourceSpec,
    batch: list[Strategy],
    rows: list[int],
    error: UnsupportedStrategyError,
    *,
    single: bool,
) -> UnsupportedStrategyError:
    """The refusal, naming the first strategy the simulator refuses by its place in the request."""
    if single:
        return error
    for i, strategy in zip(rows, batch, strict=True):
        try:
            simulate(graph, resources, [strategy])
        except UnsupportedStrategyError as refused:
            return UnsupportedStrategyError(f"[{i}]: {refused}")
    return error


def _prediction(graph: ModelGraph, resources: ResourceSpec, item: Any, strategy: Strategy, raw: Any) -> Prediction:
    mesh = strategy.effective_mesh
    step_samples = strategy.step_samples(graph.batch_size)
    global_batch = step_samples * mesh.data
    step = float(raw.step_time_s)
    samples = global_batch / step if step > 0 else 0.0
    arch = architecture_of(graph)
    model_flops = graph.total_flops * step_samples / graph.batch_size * mesh.data
    specs = [_device_spec(resources, device) for device in strategy.replicas]
    peaks = [_dense_peak(spec, strategy.precision) for spec in specs]
    peak = None if any(p is None for p in peaks) else sum(p for p in peaks if p is not None)
    capacity = min(spec.memory_bytes for spec in specs)
    memory = float(raw.memory_per_device_bytes)
    if isinstance(item, Layout):
        batch = {
            "micro_batch": strategy.micro_batch_size or graph.batch_size,
            "global_batch": global_batch,
            "micro_batches": None,
        }
        layout: Layout | None = Layout.parse(
            {**item.resolved(len(strategy.replicas)).model_dump(mode="json", exclude={"id"}), **batch}
        )
    else:
        layout = _layout_or_none(strategy, graph)
    prediction = Prediction(
        label=str(layout) if layout is not None else _describe(strategy),
        layout=layout,
        strategy_id=str(strategy.id),
        devices=len(strategy.replicas),
        global_batch=global_batch,
        step_time_s=step,
        samples_per_s=samples,
        tokens_per_s=samples * arch.seq if arch is not None else None,
        model_flops_per_step=model_flops,
        mfu=model_flops / step / peak if peak and step > 0 else None,
        memory_per_device_bytes=memory,
        memory_capacity_bytes=capacity,
        memory_over_bytes=max(memory - capacity, 0.0) if not raw.feasible else 0.0,
        feasible=bool(raw.feasible),
        infeasible_reason=raw.infeasible_reason,
        breakdown=dict(raw.breakdown),
        bottleneck=raw.bottleneck,
    )
    prediction._strategy = strategy
    return prediction


def _device_spec(resources: ResourceSpec, device: str) -> DeviceSpec:
    return resources.node_device_spec(resources.node_of(device))


def _dense_peak(spec: DeviceSpec, precision: str) -> float | None:
    for key in PEAK_KEYS[precision]:
        if key in spec.peak_flops:
            return spec.peak_flops[key]
    return None


def _layout_or_none(strategy: Strategy, graph: ModelGraph) -> Layout | None:
    try:
        return layout_of(strategy, graph)
    except UnsupportedStrategyError:
        return None


def _describe(strategy: Strategy) -> str:
    builder = strategy.provenance.builder
    return f"{builder}: {strategy.describe()}" if builder else strategy.describe()
