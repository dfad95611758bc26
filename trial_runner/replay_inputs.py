"""The batch, buffers and constants of a trace replay: random values of the recorded shapes that every
op reading them accepts.

Integer tensors that index something (token ids, class targets, embedding rows) stay below the size
of what they index: the trace is read for every op that indexes, and the bound is carried back
through the ops that only move values (views, slices, copies, concatenations, padding) to the tensor
the step starts from. Embedding-bag offsets are evenly spaced over the lookups. An integer tensor
nothing indexes with is all ones (a mask that keeps everything), a boolean one all true.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stratagem.tracing.optrace import TRACE_DTYPES, OperatorTrace, TraceOp, TraceTensor, tensor_refs

DEFAULT_BOUND = 1
"""An integer input nothing indexes with is all ones: a mask that keeps everything."""

DTYPES = {name: getattr(torch, name) for name in sorted(TRACE_DTYPES) if hasattr(torch, name)}


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES.get(name, torch.float32)


@dataclass(frozen=True)
class Bound:
    """What an integer tensor's values must respect: below `high`, or evenly spaced offsets into `span` rows."""

    high: int | None = None
    offsets_of: int | None = None


_INDEXING: dict[str, tuple[tuple[int, int | None, str], ...]] = {
    # op -> (index argument, argument it indexes (None: self), how the bound is read)
    "aten::embedding.default": ((1, 0, "rows"),),
    "aten::_embedding_bag.default": ((1, 0, "rows"),),
    "aten::_embedding_bag_forward_only.default": ((1, 0, "rows"),),
    "aten::embedding_bag.padding_idx": ((1, 0, "rows"),),
    "aten::nll_loss_forward.default": ((1, 0, "classes"),),
    "aten::nll_loss2d_forward.default": ((1, 0, "classes"),),
    "aten::index_select.default": ((2, 0, "dim"),),
    "aten::gather.default": ((2, 0, "dim"),),
    "aten::scatter.src": ((2, 0, "dim"),),
    "aten::scatter.value": ((2, 0, "dim"),),
    "aten::scatter_.src": ((2, 0, "dim"),),
    "aten::scatter_add.default": ((2, 0, "dim"),),
    "aten::scatter_add_.default": ((2, 0, "dim"),),
    "aten::take.default": ((1, 0, "numel"),),
}
_VALUE_PRESERVING = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "select",
        "slice",
        "expand",
        "unsqueeze",
        "squeeze",
        "t",
        "transpose",
        "permute",
        "clone",
        "_to_copy",
        "alias",
        "detach",
        "unbind",
        "split",
        "split_with_sizes",
        "narrow",
        "cat",
        "stack",
        "repeat",
        "lift_fresh",
        "lift_fresh_copy",
        "contiguous",
        "flatten",
        "as_strided",
        "_reshape_alias",
        "index_select",
        "gather",
        "constant_pad_nd",
    }
)
"""Ops whose output values are some of their (integer) input values: a bound on the output binds the inputs."""


def input_bounds(trace: OperatorTrace) -> dict[int, Bound]:
    """Bounds for the integer tensors no op produces (inputs, buffers, constants), from what indexes with them."""
    bounds: dict[int, Bound] = {}
    producer: dict[int, TraceOp] = {}
    for op in trace.forward:
        for use in _INDEXING.get(op.op, ()):
            _bind_index_use(trace, op, use, bounds)
        if op.op.startswith("aten::index.") or op.op.startswith("aten::index_put"):
            _bind_advanced_index(trace, op, bounds)
        if op.op.startswith(("aten::_embedding_bag", "aten::embedding_bag")) and len(op.args) > 2:
            offsets, indices = _ref(op.args[2]), _ref(op.args[1])
            if offsets is not None and indices is not None:
                bounds[offsets] = Bound(offsets_of=trace.tensors[indices].numel)
        for ref in tensor_refs(op.out):
            producer.setdefault(ref, op)
    return _propagate(trace, bounds, producer)


def _ref(value: Any) -> int | None:
    return value["t"] if isinstance(value, dict) and "t" in value else None


def _bind_index_use(trace: OperatorTrace, op: TraceOp, use: tuple[int, int | None, str], bounds: dict) -> None:
    index_arg, target_arg, how = use
    if index_arg >= len(op.args) or target_arg is None or target_arg >= len(op.args):
        return
    index, target = _ref(op.args[index_arg]), _ref(op.args[target_arg])
    if index is None or target is None:
        return
    shape = trace.tensors[target].shape
    if how == "rows":
        high = shape[0] if shape else 1
    elif how == "classes":
        high = shape[1] if len(shape) > 1 else (shape[0] if shape else 1)
    elif how == "numel":
        high = trace.tensors[target].numel
    else:
        dim = op.args[1] if len(op.args) > 1 and isinstance(op.args[1], int) else 0
        high = shape[dim] if shape and -len(shape) <= dim < len(shape) else 1
    _tighten(bounds, index, high)


def _bind_advanced_index(trace: OperatorTrace, op: TraceOp, bounds: dict[int, Bound]) -> None:
    target = _ref(op.args[0]) if op.args else None
    if target is None or len(op.args) < 2 or not isinstance(op.args[1], list):
        return
    shape = trace.tensors[target].shape
    for dim, item in enumerate(op.args[1]):
        index = _ref(item)
        if index is not None and dim < len(shape) and trace.tensors[index].dtype != "bool":
            _tighten(bounds, index, shape[dim])


def _tighten(bounds: dict[int, Bound], index: int, high: int) -> None:
    current = bounds.get(index)
    if current is None or current.high is None or high < current.high:
        bounds[index] = Bound(high=max(1, high))


def _propagate(trace: OperatorTrace, bounds: dict[int, Bound], producer: dict[int, TraceOp]) -> dict[int, Bound]:
    """Carry each bound back through value-preserving ops to the tensors the step starts from."""
    roots: dict[int, Bound] = {}
    pending = list(bounds.items())
    tightest: dict[int, int] = {}
    while pending:
        index, bound = pending.pop()
        if bound.high is not None:
            if tightest.get(index, bound.high + 1) <= bound.high:
                continue
            tightest[index] = bound.high
        op = producer.get(index)
        if op is None:
            if trace.tensors[index].source != "op":
                _merge(roots, index, bound)
            continue
        packet = op.op.partition("::")[2].partition(".")[0]
        if packet not in _VALUE_PRESERVING or bound.high is None:
            continue
        for source in tensor_refs(op.args[:1] if packet in ("index_select", "gather") else op.args):
            if not trace.tensors[source].dtype.startswith(("float", "bfloat", "complex", "bool")):
                pending.append((source, bound))
    return roots


def _merge(roots: dict[int, Bound], index: int, bound: Bound) -> None:
    current = roots.get(index)
    if current is None or (bound.high is not None and (current.high is None or bound.high < current.high)):
        roots[index] = bound


def make_tensor(meta: TraceTensor, bound: Bound | None, device: torch.device, *, ones: bool = False) -> torch.Tensor:
    """A tensor with the recorded shape, dtype and strides, holding values its readers accept."""
    dtype = torch_dtype(meta.dtype)
    if meta.data is not None:
        values = torch.tensor(meta.data, dtype=dtype, device=device).reshape(meta.shape)
        return _strided(values, meta)
    if dtype == torch.bool:
        values = torch.ones(meta.shape, dtype=dtype, device=device)
    elif dtype.is_floating_point or dtype.is_complex:
        filler = torch.ones if ones else torch.randn
        values = filler(meta.shape, device=device).to(dtype)
    elif bound is not None and bound.offsets_of is not None:
        count = max(1, meta.numel)
        values = (torch.arange(count, device=device) * (bound.offsets_of // count)).to(dtype).reshape(meta.shape)
    elif bound is not None and bound.high is not None:
        values = torch.randint(0, max(1, bound.high), meta.shape, device=device, dtype=dtype)
    else:
        values = torch.full(meta.shape, DEFAULT_BOUND, dtype=dtype, device=device)
    return _strided(values, meta)


def _strided(values: torch.Tensor, meta: TraceTensor) -> torch.Tensor:
    """The values laid out with the recorded strides (a channels-last image stays channels-last)."""
    if meta.layout != "strided" or list(values.stride()) == meta.stride or values.numel() <= 1:
        return values
    if any(s < 0 for s in meta.stride) or _span(meta) < values.numel():
        return values
    laid_out = torch.empty_strided(meta.shape, meta.stride, dtype=values.dtype, device=values.device)
    return laid_out.copy_(values)


def _span(meta: TraceTensor) -> int:
    return 1 + sum((d - 1) * s for d, s in zip(meta.shape, meta.stride, strict=True)) if all(meta.shape) else 0
