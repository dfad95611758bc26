"""Writing the OperatorTrace while capture runs: each op the dispatch mode sees, its tensors numbered once.

Tensors are known by the identity of their Python object, which is also what autograd hands the
saved-tensor hooks and the backward ops, so a backward op reading an activation refers to the forward
op's output by the same number. The recorder holds tensors only weakly: a reference of its own would
change the step it records (autograd copies a gradient someone else still holds instead of keeping
it), and a dead tensor's identity, once reused, is told apart by its weak reference.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from stratagem.tracing.fake import storage_key
from stratagem.tracing.optrace import MAX_CONSTANT_ELEMENTS, OperatorTrace, Phase, Source, TraceOp, TraceTensor

SKIPPED_NAMESPACES = frozenset({"prim", "profiler"})
"""Metadata queries and profiler markers: no work, nothing to replay."""
OPTIMIZER_LAYER = "<optimizer>"
_LAYOUTS = {torch.strided: "strided", torch.sparse_coo: "sparse_coo", torch.sparse_csr: "sparse_csr"}


def op_name(func: torch._ops.OpOverload) -> str:
    return f"{func.namespace}::{func._opname}.{func._overloadname}"


class TraceRecorder:
    """Numbers tensors, encodes arguments and collects ops per phase."""

    def __init__(self, *, graph_name: str, batch_size: int, optimizer: str) -> None:
        self.graph_name = graph_name
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.paused = False
        self.tensors: list[dict[str, Any]] = []
        self.inputs: list[int] = []
        self.ops: dict[Phase, list[dict[str, Any]]] = {"forward": [], "backward": [], "optimizer": []}
        self.notes: list[str] = []
        self.gradients: dict[str, int] = {}
        self.loss: int | None = None
        self._ids: dict[int, tuple[int, weakref.ref[torch.Tensor]]] = {}
        self._storages: dict[int, tuple[int, list[weakref.ref[torch.Tensor]]]] = {}
        self._storage_count = 0
        self._layers: dict[str, int] = {}
        self._started = time.perf_counter()

    # -- tensors ------------------------------------------------------------------------------------

    def register(self, tensor: torch.Tensor, *, source: Source, name: str | None = None) -> int:
        """The tensor's number; a tensor seen for the first time is added with its metadata."""
        index = self.known(tensor)
        if index is not None:
            return index
        index = len(self.tensors)
        self._ids[id(tensor)] = (index, weakref.ref(tensor))
        entry: dict[str, Any] = {
            "shape": list(tensor.shape),
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "layout": _LAYOUTS.get(tensor.layout, "other"),
            "source": source,
        }
        if tensor.layout == torch.strided:
            entry["stride"] = list(tensor.stride())
            entry["offset"] = tensor.storage_offset()
            entry["storage"] = self._storage(tensor)
        if name is not None:
            entry["name"] = name
        if tensor.requires_grad:
            entry["requires_grad"] = True
        if source == "constant":
            data = _constant_values(tensor)
            if data is not None:
                entry["data"] = data
        self.tensors.append(entry)
        return index

    def _storage(self, tensor: torch.Tensor) -> int:
        """Tensors sharing a live storage share its number; a storage address reused after every tensor
        on it died is a new storage (numbering by address alone would depend on the allocator)."""
        try:
            key = storage_key(tensor)
        except (RuntimeError, NotImplementedError):
            return -1
        entry = self._storages.get(key)
        if entry is not None and any(ref() is not None for ref in entry[1]):
            entry[1].append(weakref.ref(tensor))
            return entry[0]
        index = self._storage_count
        self._storage_count += 1
        self._storages[key] = (index, [weakref.ref(tensor)])
        return index

    def known(self, tensor: torch.Tensor) -> int | None:
        entry = self._ids.get(id(tensor))
        if entry is None or entry[1]() is not tensor:
            return None
        return entry[0]

    def mark_saved(self, tensor: torch.Tensor) -> None:
        """Autograd saved this tensor for backward: an activation, unless it is the model's own state."""
        index = self.known(tensor)
        if index is not None and self.tensors[index]["source"] in ("op", "input"):
            self.tensors[index]["saved"] = True

    # -- encoding -----------------------------------------------------------------------------------

    def encode(self, value: Any, *, fresh: Source = "constant") -> Any:
        """An argument or output as JSON; tensors not seen before are numbered as `fresh`."""
        if isinstance(value, torch.Tensor):
            return {"t": self.register(value, source=fresh)}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"float": str(value)}
        if isinstance(value, (list, tuple)):
            return [self.encode(item, fresh=fresh) for item in value]
        return _special(value)

    def layer_index(self, name: str) -> int:
        return self._layers.setdefault(name, len(self._layers))

    # -- ops ----------------------------------------------------------------------------------------

    def record(
        self,
        phase: Phase,
        func: torch._ops.OpOverload,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        *,
        layer: str,
        flops: float,
    ) -> None:
        if self.paused or func.namespace in SKIPPED_NAMESPACES:
            return
        entry: dict[str, Any] = {"op": op_name(func), "args": self.encode(list(args))}
        if kwargs:
            entry["kwargs"] = {key: self.encode(value) for key, value in kwargs.items()}
        encoded_out = self.encode(out, fresh="op")
        if encoded_out is not None:
            entry["out"] = encoded_out
        index = self.layer_index(layer)
        if index:
            entry["layer"] = index
        if phase == "forward" and not torch.is_grad_enabled():
            entry["grad"] = False
        if flops:
            entry["flops"] = flops
        self.ops[phase].append(entry)

    def add_inputs(self, leaves: list[Any]) -> None:
        for position, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                self.inputs.append(self.register(leaf, source="input", name=str(position)))

    def build(self, *, provenance: dict[str, Any]) -> OperatorTrace:
        """The trace document, put together without re-validating what this recorder wrote itself (on a
        7B decoder that takes longer than recording); its id is computed exactly as parsing computes it."""
        trace = OperatorTrace.model_construct(
            graph_name=self.graph_name,
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            layers=list(self._layers),
            tensors=[TraceTensor.model_construct(**entry) for entry in self.tensors],
            inputs=self.inputs,
            loss=self.loss,
            forward=[TraceOp.model_construct(**op) for op in self.ops["forward"]],
            backward=[TraceOp.model_construct(**op) for op in self.ops["backward"]],
            optimizer_step=[TraceOp.model_construct(**op) for op in self.ops["optimizer"]],
            gradients=self.gradients,
            notes=self.notes,
            provenance={**provenance, "recording_seconds": round(time.perf_counter() - self._started, 3)},
        )
        object.__setattr__(trace, "id", trace.compute_id())
        return trace


def _special(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    return {"unsupported": type(value).__name__}


def _constant_values(tensor: torch.Tensor) -> list[Any] | None:
    """A small real tensor's values (a table built in `forward` from Python data); None when unknown."""
    if isinstance(tensor, FakeTensor) or tensor.device.type == "meta" or tensor.layout != torch.strided:
        return None
    if tensor.numel() > MAX_CONSTANT_ELEMENTS:
        return None
    with unset_fake_temporarily(), torch._C._DisableTorchDispatch():
        values = tensor.detach().reshape(-1).tolist()
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        return None
    if any(isinstance(v, complex) for v in values):
        return None
    return values


def optimizer_for(kind: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The torch optimizer a trial trains with for this kind (`lamb` has none in torch; AdamW stands in)."""
    makers: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "sgd": lambda: torch.optim.SGD(params, lr=1e-3),
        "momentum": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
        "adagrad": lambda: torch.optim.Adagrad(params, lr=1e-3),
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=1e-3),
        "adam": lambda: torch.optim.Adam(params, lr=1e-3),
        "adamw": lambda: torch.optim.AdamW(params, lr=1e-3),
        "lamb": lambda: torch.optim.AdamW(params, lr=1e-3),
    }
    return makers[kind]()


class _OptimizerOps(TorchDispatchMode):
    """Writes the update's ops into the trace; nothing else runs during the optimizer step."""

    def __init__(self, tracer: TraceRecorder) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if isinstance(func, torch._ops.OpOverload):
            self.tracer.record("optimizer", func, args, kwargs, out, layer=OPTIMIZER_LAYER, flops=0.0)
        return out


def record_optimizer_step(
    tracer: TraceRecorder, params: dict[str, torch.Tensor], kind: str, loss: torch.Tensor
) -> None:
    """Record one steady-state update (call under the capture's fake mode, after backward): a first step,
    not recorded, creates the optimizer's state, as a trained model's has; the second is traced.

    The update never changes what capture measured, so whatever fails here becomes a note of the trace.
    """
    tracer.loss = tracer.known(loss)
    with_grad = {name: p for name, p in params.items() if p.grad is not None}
    for name, param in with_grad.items():
        index = tracer.known(param.grad)  # type: ignore[arg-type]
        if index is not None:
            tracer.gradients[name] = index
    sparse = [name for name, p in with_grad.items() if p.grad is not None and p.grad.layout != torch.strided]
    if sparse and kind in ("adam", "adamw", "lamb"):
        tracer.notes.append(
            f"the optimizer step leaves out {len(sparse)} sparse tables ({', '.join(sparse[:3])}): "
            "SparseAdam's update size depends on the rows looked up, which capture does not know"
        )
        with_grad = {name: p for name, p in with_grad.items() if name not in sparse}
    if not with_grad:
        return
    try:
        optimizer = optimizer_for(kind, list(with_grad.values()))
        optimizer.step()
        names = {id(p): name for name, p in with_grad.items()}
        for param, state in optimizer.state.items():
            for slot, value in state.items():
                if isinstance(value, torch.Tensor):
                    tracer.register(value, source="state", name=f"{names[id(param)]}:{slot}")
        with _OptimizerOps(tracer):
            optimizer.step()
    except Exception as error:  # the update is an extra of the trace: capture goes on without it
        tracer.ops["optimizer"].clear()
        tracer.notes.append(f"the optimizer step could not be traced: {type(error).__name__}: {error}"[:500])
