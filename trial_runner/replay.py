"""A synthetic module that replays a ModelGraph: same variables, same work, no user code.

When the graph carries its operator trace (`graph.trace`, attached by capture or by the workload that
brought it), the module runs the trace's ops (`trial_runner.replay_trace`): the model's own kernels
on the recorded shapes, so the step costs what the real one costs. Without a trace it burns each
layer's recorded totals, as described below.

Parameters are registered in nested modules along their dotted names, so `named_parameters()` gives
back exactly the graph's variable names and a strategy written for the graph applies unchanged.
Each layer, in forward order, first folds its variables into a small hidden state (dense ones by a
mean, sparse ones by a real `F.embedding(..., sparse=True)` lookup of the recorded number of rows)
and then burns the recorded work: a matrix multiply sized to the layer's FLOPs, element-wise traffic
sized to its bytes less what its real lookups moved, and an activation tensor of the recorded size
held until backward. Its backward burns the recorded backward FLOPs before the gradient reaches the
layer's variables, so gradients become ready in the graph's backward order, one layer's compute
after the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.errors import InvalidGraphError, Problem
from stratagem.ir import ModelGraph, Variable
from trial_runner.replay_trace import TraceReplay, register_buffers

HIDDEN_WIDTH = 16
MATMUL_EDGE = 1024
"""Largest square operand; bigger layers repeat it, so scratch memory stays at a few MiB."""
TRAFFIC_CHUNK_BYTES = 64 << 20
"""Element-wise traffic runs over a buffer larger than a CPU's last-level cache."""
TOUCH_SCALE = 1e-3
"""Keeps the hidden state small whatever the parameters hold; only the gradient's existence matters."""

_TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


@dataclass
class _LayerPlan:
    name: str
    fwd_flops: float
    bwd_flops: float
    bytes_moved: float
    activation_bytes: float
    dense: list[str] = field(default_factory=list)
    sparse: list[tuple[str, int]] = field(default_factory=list)
    """(variable name, position of its lookup indices among the batch inputs after x)."""


class ReplayModel(nn.Module):
    """Trains like the graph's model at the graph's batch size; the work scales with the rows fed."""

    def __init__(self, graph: ModelGraph) -> None:
        super().__init__()
        self.graph_batch_size = graph.batch_size
        self.compute_dtype = _TORCH_DTYPES.get(graph.dtype.value, torch.float32)
        if not self.compute_dtype.is_floating_point:
            self.compute_dtype = torch.float32
        self.sparse_variables: list[Variable] = [v for v in graph.variables if v.sparse]
        self._homes = {variable.name: _attach(self, variable, index) for index, variable in enumerate(graph.variables)}
        self._plan = _plan(graph, self.sparse_variables)
        self._trace: TraceReplay | None = None
        if graph.trace is not None:
            self._trace = TraceReplay(graph.trace, {v.name: list(v.shape) for v in graph.variables})
            register_buffers(self, self._trace)

    @property
    def replays_trace(self) -> bool:
        return self._trace is not None

    @property
    def notes(self) -> dict[str, str]:
        """Ops of the trace that ran as FLOP burns, with why (empty without a trace)."""
        return self._trace.notes if self._trace is not None else {}

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self._trace is not None:
            return self._trace.run(self._parameter, self.get_buffer, inputs)
        return self._burn(*inputs)

    def _burn(self, x: torch.Tensor, *indices: torch.Tensor) -> torch.Tensor:
        scale = x.shape[0] / self.graph_batch_size
        hidden = x.detach().float().requires_grad_(True)
        for layer in self._plan:
            touched, looked_up = self._touch(layer, indices)
            hidden = hidden + touched
            cost = _Cost(
                layer.fwd_flops * scale,
                layer.bwd_flops * scale,
                max(0.0, layer.bytes_moved * scale - looked_up),
                layer.activation_bytes * scale,
                self.compute_dtype,
            )
            hidden = _Work.apply(hidden, cost)
        return hidden

    def _parameter(self, name: str) -> torch.Tensor:
        """Looked up on every call, so a runtime that swaps a parameter on its module is honoured."""
        module, leaf = self._homes[name]
        return module._parameters[leaf]  # type: ignore[return-value]

    def _touch(self, layer: _LayerPlan, indices: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | float, float]:
        """The layer's variables folded into the hidden state, and the bytes its real lookups moved as
        capture counts a lookup (indices, rows read, rows written): work the layer's burn leaves out."""
        total: torch.Tensor | float = 0.0
        looked_up = 0.0
        for name in layer.dense:
            total = total + self._parameter(name).float().mean()
        for name, position in layer.sparse:
            rows = F.embedding(indices[position], self._parameter(name), sparse=True)
            total = total + rows.float().mean()
            looked_up += (
                indices[position].numel() * indices[position].element_size() + 2 * rows.numel() * rows.element_size()
            )
        return total * TOUCH_SCALE, looked_up


def replay_batch_maker(graph: ModelGraph) -> Any:
    """`make_batch(batch_size)` for a ReplayModel: the trace's inputs, or a small dense input and each
    sparse lookup's rows."""
    if graph.trace is not None:
        return TraceReplay(graph.trace, {v.name: list(v.shape) for v in graph.variables}).make_batch
    sparse = [v for v in graph.variables if v.sparse]

    def make_batch(batch_size: int) -> tuple[torch.Tensor, ...]:
        x = torch.randn(batch_size, HIDDEN_WIDTH)
        lookups = []
        for variable in sparse:
            per_sample = max(1, round((variable.lookups_per_step or 0) / graph.batch_size))
            lookups.append(torch.randint(0, variable.shape[0], (batch_size, per_sample)))
        return (x, *lookups)

    return make_batch


def replay_loss(output: torch.Tensor) -> torch.Tensor:
    """A trace replay returns the step's own loss (a scalar); the burn's hidden state is reduced to one."""
    if output.dim() == 0:
        return output
    return output.square().mean()


def _attach(root: nn.Module, variable: Variable, index: int) -> tuple[nn.Module, str]:
    """Register the variable as a parameter at its dotted path, creating container modules on the way.

    Writes the registries directly, as `setattr` in a model's `__init__` does, so names that shadow a
    Module attribute (`half`, `float`) work as they do in real models. A sparse 2-D `<path>.weight`
    becomes a real `nn.Embedding(sparse=True)`, so a runtime that recognises sparse gradients by
    their module (as stratagem.runtime does) treats it as it would the real model's embedding.
    """
    *path, leaf = variable.name.split(".")
    problem = "an empty name part" if "" in (*path, leaf) else None
    module = root
    for depth, part in enumerate(path):
        if problem is not None:
            break
        if part in module._parameters:
            problem = f"{part!r} is already a parameter, so it cannot also hold sub-modules"
        elif part not in module._modules and depth == len(path) - 1 and _is_embedding(variable, leaf):
            embedding = _embedding(variable)
            module._modules[part] = embedding
            return embedding, leaf
        else:
            module = module._modules.setdefault(part, nn.Module())  # type: ignore[assignment]
    if problem is None and (leaf in module._modules or leaf in module._parameters):
        problem = f"{leaf!r} already names a module or parameter there"
    if problem is not None:
        raise InvalidGraphError(
            [Problem(f"variables[{index}].name", f"{variable.name!r} cannot be a parameter name: {problem}")]
        )
    module._parameters[leaf] = _parameter(variable)
    return module, leaf


def _is_embedding(variable: Variable, leaf: str) -> bool:
    return (
        variable.sparse
        and variable.trainable
        and leaf == "weight"
        and len(variable.shape) == 2
        and variable.dtype.is_floating
    )


def _embedding(variable: Variable) -> nn.Embedding:
    rows, dim = variable.shape
    return nn.Embedding(rows, dim, sparse=True, _weight=_parameter(variable).data)


def _parameter(variable: Variable) -> nn.Parameter:
    dtype = _TORCH_DTYPES.get(variable.dtype.value, torch.float32)
    trainable = variable.trainable and dtype.is_floating_point
    data = torch.empty(variable.shape, dtype=dtype)
    if dtype.is_floating_point:
        nn.init.normal_(data, std=0.02)
    else:
        data.zero_()
    return nn.Parameter(data, requires_grad=trainable)


def _plan(graph: ModelGraph, sparse_variables: list[Variable]) -> list[_LayerPlan]:
    """Each variable joins at the first layer that lists it, else its consumer, else the last layer."""
    if not graph.layers:
        raise InvalidGraphError([Problem("layers", "a graph needs at least one layer to be replayed")])
    plans = [
        _LayerPlan(layer.name, layer.fwd_flops, layer.bwd_flops, layer.bytes_moved, layer.activation_bytes)
        for layer in graph.layers
    ]
    by_name = {plan.name: plan for plan in plans}
    home: dict[str, _LayerPlan] = {}
    for layer in graph.layers:
        for name in layer.variables:
            home.setdefault(name, by_name[layer.name])
    sparse_position = {v.name: i for i, v in enumerate(sparse_variables)}
    for variable in graph.variables:
        plan = home.get(variable.name) or by_name.get(variable.consumer or "") or plans[-1]
        if variable.name in sparse_position:
            plan.sparse.append((variable.name, sparse_position[variable.name]))
        else:
            plan.dense.append(variable.name)
    return plans


class _Work(torch.autograd.Function):
    """Identity on the hidden state that costs what the recorded layer cost, forward and backward."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, cost: _Cost) -> torch.Tensor:
        matmul_bytes = burn_flops(hidden.device, cost.dtype, cost.fwd_flops)
        ctx.activation = _materialize(hidden.device, cost.activation_bytes)
        burn_bytes(hidden.device, cost.bytes_moved - cost.activation_bytes - matmul_bytes)
        ctx.cost = cost
        return hidden.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cost: _Cost = ctx.cost
        matmul_bytes = burn_flops(grad.device, cost.dtype, cost.bwd_flops)
        burn_bytes(grad.device, cost.bytes_moved - matmul_bytes)
        ctx.activation = None
        return grad, None


@dataclass(frozen=True)
class _Cost:
    fwd_flops: float
    bwd_flops: float
    bytes_moved: float
    activation_bytes: float
    dtype: torch.dtype


_SCRATCH: dict[tuple[str, torch.dtype, str], torch.Tensor] = {}


def _scratch(device: torch.device, dtype: torch.dtype, kind: str, numel: int) -> torch.Tensor:
    """One reusable buffer per device, dtype and purpose, grown on demand."""
    key = (str(device), dtype, kind)
    buffer = _SCRATCH.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = torch.rand(numel, device=device).to(dtype)
        _SCRATCH[key] = buffer
    return buffer[:numel]


def burn_flops(device: torch.device, dtype: torch.dtype, flops: float) -> float:
    """Multiply matrices totalling `flops` (2·n³ each); returns the bytes those multiplies touched."""
    smallest = 2.0 * 8**3
    if flops < smallest:
        return 0.0
    full = MATMUL_EDGE
    whole, rest = divmod(flops, 2.0 * full**3)
    operand = _scratch(device, dtype, "matmul", full * full).view(full, full)
    itemsize = operand.element_size()
    for _ in range(int(whole)):
        torch.mm(operand, operand)
    touched = whole * 3 * full * full * itemsize
    if rest >= smallest:
        edge = max(8, round((rest / 2.0) ** (1.0 / 3.0)))
        small = operand[:edge, :edge]
        torch.mm(small, small)
        touched += 3 * edge * edge * itemsize
    return touched


def burn_bytes(device: torch.device, nbytes: float) -> None:
    """Read and write `nbytes` in total through memory, at most TRAFFIC_CHUNK_BYTES per pass."""
    if nbytes < 4096:
        return
    whole, rest = divmod(nbytes, TRAFFIC_CHUNK_BYTES)
    per_pass = min(nbytes, TRAFFIC_CHUNK_BYTES)
    buffer = _scratch(device, torch.float32, "traffic", int(per_pass // 8))
    for _ in range(int(whole)):
        buffer.mul_(1.0)
    if rest >= 4096:
        buffer[: int(rest // 8)].mul_(1.0)


def _materialize(device: torch.device, nbytes: float) -> torch.Tensor | None:
    """An activation of `nbytes`, written so that it really occupies memory until backward frees it."""
    if nbytes < 4:
        return None
    return torch.ones(int(nbytes // 4), device=device)
