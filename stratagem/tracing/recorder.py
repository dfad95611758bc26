"""Bookkeeping of one captured step: which layer is running, what it computed, read, saved and produced.

A layer is one call of a leaf module, or a pseudo-layer: a run of ops a non-leaf module executes between
its children's calls (residual adds, functional attention, reshapes). Pseudo-layers end at each child
call so that every layer reads only from earlier ones. Ops outside the model (the loss) form `<loss>`.
Backward ops are attributed through the autograd node running them, which forward tagged with the layer
that created it, so a layer's backward FLOPs are its own even when backward runs in reverse order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from stratagem.tracing.fake import storage_key
from stratagem.tracing.kernels import AttentionCall, KernelTraffic

ROOT_NAME = "<root>"
LOSS_NAME = "<loss>"
NODE_TAG = "stratagem_layer"


class Phase(Enum):
    forward = "forward"
    backward = "backward"


@dataclass
class LayerRecord:
    name: str
    type: str
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    bytes_moved: float = 0.0
    activation_bytes: float = 0.0
    output_bytes: float = 0.0
    inputs: dict[str, None] = field(default_factory=dict)
    """Ordered set of producer layer names."""
    variables: dict[str, None] = field(default_factory=dict)
    categories: set[str] = field(default_factory=set)
    """Classes (flops.op_category) of the forward ops that touched data."""
    arithmetic_bytes: float = 0.0
    gpu_saved_excess: float = 0.0
    """Of `activation_bytes`, what a CPU keeps and a GPU's fused kernels do not (dropout's noise beyond
    its one-byte mask)."""
    elementwise_bytes: float = 0.0
    fused_elementwise_bytes: float = 0.0
    autocast_elementwise_bytes: float = 0.0
    attention: AttentionCall | None = None
    """The layer's fused attention calls (`stratagem.tracing.kernels`)."""


@dataclass
class Frame:
    """One module call on the stack; `layer` is where its next op goes (None: open a new pseudo-layer)."""

    call_name: str
    type: str
    layer: LayerRecord | None = None
    pseudo_layers: int = 0
    module_id: int = 0

    def next_pseudo_name(self) -> str:
        index = self.pseudo_layers
        self.pseudo_layers += 1
        if self.call_name == LOSS_NAME:
            return LOSS_NAME if index == 0 else f"{LOSS_NAME}#{index}"
        return f"{self.call_name}/ops{index}"


class Recorder:
    """State shared by the module hooks, the dispatch mode, the node tagger and the saved-tensor hooks."""

    def __init__(self, model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> None:
        self.phase = Phase.forward
        self.layers: list[LayerRecord] = []
        self._by_name: dict[str, LayerRecord] = {}
        self._module_names = {id(m): name for name, m in model.named_modules()}
        self._leaf_ids = {id(m) for m in model.modules() if next(m.children(), None) is None}
        self._calls: Counter[str] = Counter()
        self._frames = [Frame(LOSS_NAME, "Loss")]
        self.param_names = {id(t): name for name, t in params.items()}
        self._state_storages = {storage_key(t) for t in (*params.values(), *buffers.values())}
        self._producer: dict[int, LayerRecord] = {}
        self._keep_alive: list[torch.Tensor] = []
        """Tensors whose id or storage address is remembered stay alive, so neither is reused."""
        self._exported: set[tuple[str, int]] = set()
        """(producer, storage) pairs already counted as outputs: views of one output count once."""
        self._saved: set[int] = set()
        self.consumers: dict[str, str] = {}
        self.lookups: Counter[str] = Counter()
        self.backward_layer: str | None = None
        self.kernels = KernelTraffic(self._state_storages)

    # -- where are we -------------------------------------------------------------------------------

    def location(self) -> str:
        """The module path and class (forward) or the layer (backward) running, for error messages."""
        if self.phase is Phase.backward:
            return f"{self.backward_layer or '<backward>'!r}"
        frame = self._frames[-1]
        return f"{frame.call_name!r} ({frame.type})"

    def current_layer(self) -> LayerRecord:
        frame = self._frames[-1]
        if frame.layer is None:
            frame.layer = self._new_layer(frame.next_pseudo_name(), frame.type)
        return frame.layer

    def layer_for_backward(self) -> LayerRecord:
        """The layer whose forward created the autograd node now running; the last layer if untagged."""
        node = torch._C._current_autograd_node()
        name = _metadata(node).get(NODE_TAG) if node is not None else None
        self.backward_layer = name
        if name is None:
            return self.layers[-1]
        return self._by_name[name]

    def _new_layer(self, name: str, type_name: str) -> LayerRecord:
        layer = LayerRecord(name=name, type=type_name)
        self.layers.append(layer)
        self._by_name[name] = layer
        return layer

    # -- module calls -------------------------------------------------------------------------------

    def enter_module(self, module: nn.Module, args: tuple[object, ...]) -> None:
        name = self._module_names.get(id(module))
        if name is None or self.phase is not Phase.forward:
            return
        name = name or ROOT_NAME
        count = self._calls[name]
        self._calls[name] += 1
        frame = Frame(name if count == 0 else f"{name}#{count}", type(module).__name__, module_id=id(module))
        self._frames[-1].layer = None
        self._frames.append(frame)
        if id(module) in self._leaf_ids:
            frame.layer = self._new_layer(frame.call_name, frame.type)
            for tensor in tensors_in(args):
                self.read(frame.layer, tensor)

    def exit_module(self, module: nn.Module, output: object) -> None:
        if id(module) not in self._module_names or self.phase is not Phase.forward:
            return
        index = next((i for i in range(len(self._frames) - 1, 0, -1) if self._frames[i].module_id == id(module)), None)
        if index is None:
            return
        frame = self._frames[index]
        del self._frames[index:]
        if id(module) in self._leaf_ids and frame.layer is not None:
            for tensor in tensors_in(output):
                self._produced(frame.layer, tensor)
        self._frames[-1].layer = None

    # -- tensors ------------------------------------------------------------------------------------

    def read(self, layer: LayerRecord, tensor: torch.Tensor) -> None:
        """Record that `layer` reads `tensor`: a variable it uses, or an earlier layer's output."""
        param = self.param_names.get(id(tensor))
        if param is not None:
            layer.variables.setdefault(param)
            self.consumers.setdefault(param, layer.name)
            return
        producer = self._producer.get(id(tensor))
        if producer is None or producer is layer:
            return
        layer.inputs.setdefault(producer.name)
        key = (producer.name, storage_key(tensor))
        if key not in self._exported:
            self._exported.add(key)
            producer.output_bytes += tensor.numel() * tensor.element_size()

    def _produced(self, layer: LayerRecord, tensor: torch.Tensor) -> None:
        if id(tensor) not in self._producer:
            self._keep_alive.append(tensor)
        self._producer[id(tensor)] = layer

    def produced(self, layer: LayerRecord, out: object) -> None:
        for tensor in tensors_in(out):
            self._produced(layer, tensor)

    def saved_for_backward(self, tensor: torch.Tensor) -> None:
        """Attribute a tensor autograd keeps for backward to the running layer, once per storage."""
        if self.phase is not Phase.forward or not isinstance(tensor, torch.Tensor):
            return
        key = storage_key(tensor)
        if key in self._state_storages or key in self._saved:
            return
        self.kernels.saved(tensor)
        self._saved.add(key)
        self._keep_alive.append(tensor)
        self.current_layer().activation_bytes += tensor.untyped_storage().nbytes()

    def tag_nodes(self, tensors: list[torch.Tensor]) -> None:
        """Mark autograd nodes created since the last call as belonging to the running layer."""
        stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
        name: str | None = None
        while stack:
            node = stack.pop()
            metadata = _metadata(node)
            if NODE_TAG in metadata:
                continue
            if name is None:
                name = self.current_layer().name
            metadata[NODE_TAG] = name
            stack.extend(n for n, _ in node.next_functions if n is not None)


def tensors_in(value: object) -> list[torch.Tensor]:
    return [x for x in tree_leaves(value) if isinstance(x, torch.Tensor)]


def _metadata(node: Any) -> dict[str, Any]:
    """An autograd node's metadata dict (torch's stubs type the attribute as the method that makes it)."""
    metadata: dict[str, Any] = node.metadata
    return metadata
