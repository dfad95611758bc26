"""The interception points of capture, all feeding one Recorder.

- module hooks (global, so the user's module is not touched) track which module call is running;
- a TorchDispatchMode sees every aten op forward and backward: FLOPs, bytes, reads, lookups;
- a TorchFunctionMode tags the autograd nodes each forward call creates with the running layer;
- saved-tensor hooks see what autograd keeps for backward (the activations).

With a TraceRecorder, the dispatch mode also writes every forward and backward op into the operator
trace (`trace_recorder.record_optimizer_step` adds the update's afterwards).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from stratagem.tracing.flops import EMBEDDING_OPS, op_category, op_flops
from stratagem.tracing.recorder import LayerRecord, Phase, Recorder, tensors_in
from stratagem.tracing.trace_recorder import TraceRecorder

_NO_TRAFFIC = frozenset({"_unsafe_view", "empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like"})


class OpRecorder(TorchDispatchMode):
    """Counts each aten op against the running layer (forward) or the node's layer (backward)."""

    def __init__(self, recorder: Recorder, trace: TraceRecorder | None = None) -> None:
        super().__init__()
        self.recorder = recorder
        self.trace = trace

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(func, torch._ops.OpOverload) or func.namespace == "prim":
            return out
        phase = self.recorder.phase
        flops = op_flops(func, args, kwargs, out)
        if phase is Phase.forward:
            layer = self._forward_op(func, args, kwargs, out, flops).name
        else:
            record = self.recorder.layer_for_backward()
            record.bwd_flops += flops
            layer = record.name
        if self.trace is not None:
            self.trace.record(phase.value, func, args, kwargs, out, layer=layer, flops=flops)
        return out

    def _forward_op(
        self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, flops: float
    ) -> LayerRecord:
        recorder = self.recorder
        layer = recorder.current_layer()
        inputs = tensors_in((args, kwargs))
        outputs = tensors_in(out)
        for tensor in inputs:
            recorder.read(layer, tensor)
        recorder.produced(layer, outputs)
        layer.fwd_flops += flops
        name = func._overloadpacket.__name__
        if name in EMBEDDING_OPS:
            self._count_lookups(layer, args)
        if outputs and not func.is_view and name not in _NO_TRAFFIC:
            moved = _traffic(name, args, inputs, outputs)
            category = op_category(name)
            layer.bytes_moved += moved
            layer.categories.add(category)
            recorder.kernels.op(layer, name, category, inputs, outputs, moved)
        return layer

    def _count_lookups(self, layer: LayerRecord, args: tuple[Any, ...]) -> None:
        """Embedding ops take (weight, indices, ...): every index is one row looked up this step."""
        weight, indices = args[0], args[1]
        variable = self.recorder.param_names.get(id(weight))
        if variable is not None and isinstance(indices, torch.Tensor):
            self.recorder.lookups[variable] += indices.numel()


def _traffic(name: str, args: tuple[Any, ...], inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
    """Bytes an op streams: its inputs and outputs, except that an embedding lookup reads the rows it
    looks up, not its table. Counting the table priced a 244 MiB table's lookups at 112 ms a step
    where they take 0.4 ms (`benchmarks/embedding_lookups.py`)."""

    def size(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    if name in EMBEDDING_OPS and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor):
        weight, indices = args[0], args[1]
        row_bytes = size(weight) // max(1, weight.shape[0])
        rest = [t for t in inputs if t is not weight]
        return indices.numel() * row_bytes + sum(size(t) for t in (*rest, *outputs))
    return sum(size(t) for t in (*inputs, *outputs))


class NodeTagger(TorchFunctionMode):
    """After each forward torch call, tags the autograd nodes it created (reachable from its tensors).

    It also marks layers calling `scaled_dot_product_attention` as attention: on CPU that call may
    lower to plain matmuls (the math kernel, with dropout), which would hide what it is.
    """

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        forward = self.recorder.phase is Phase.forward
        fused = func is F.scaled_dot_product_attention and forward
        dropout = func is F.dropout and forward and _drops(args, kwargs)
        if fused:
            self.recorder.kernels.begin_attention(self.recorder.current_layer(), args, kwargs)
        if dropout:
            self.recorder.kernels.begin_dropout(self.recorder.current_layer(), args[0] if args else kwargs.get("input"))
        out = func(*args, **kwargs)
        if fused:
            self.recorder.kernels.end_attention(out)
        if dropout:
            self.recorder.kernels.end_dropout(out)
        if self.recorder.phase is Phase.forward:
            if fused:
                self.recorder.current_layer().categories.add("attention")
            # Arguments too: an in-place op (x[i] = y) rewires its input's grad_fn and returns None.
            tensors = tensors_in((out, args, kwargs))
            if tensors:
                self.recorder.tag_nodes(tensors)
        return out


def _drops(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an `F.dropout(input, p, training, inplace)` call drops anything (training, p > 0, out of place)."""
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", True)
    inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
    return bool(training) and not inplace and isinstance(p, (int, float)) and p > 0


@contextmanager
def recording(recorder: Recorder, trace: TraceRecorder | None = None) -> Iterator[None]:
    """All interception points on, for the duration of one forward and backward (and optimizer step)."""

    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        recorder.enter_module(module, args)

    def post_hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        recorder.exit_module(module, output)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        recorder.saved_for_backward(tensor)
        if trace is not None and recorder.phase is Phase.forward:
            trace.mark_saved(tensor)
        return tensor

    with ExitStack() as stack:
        stack.callback(register_module_forward_pre_hook(pre_hook).remove)
        stack.callback(register_module_forward_hook(post_hook).remove)
        stack.enter_context(saved_tensors_hooks(pack, _unpack))
        stack.enter_context(OpRecorder(recorder, trace))
        stack.enter_context(NodeTagger(recorder))
        yield


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
