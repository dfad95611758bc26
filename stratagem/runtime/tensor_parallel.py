"""Tensor parallelism (Megatron): split the modules a strategy names across the tensor group, with DTensor.

Each style is one of `torch.distributed.tensor.parallel`'s, so the collectives are PyTorch's own:

- `colwise` — `ColwiseParallel()`: a Linear's weight rows (output features) split; its input is
  replicated and its output stays sharded on the last dimension, ready for a `rowwise` partner;
- `rowwise` — `RowwiseParallel()`: a Linear's weight columns (input features) split; each rank's
  partial output is summed over the group (one all-reduce forward, one for the input gradient backward);
- `vocab` — an Embedding's rows (`RowwiseParallel(input_layouts=Replicate())`: a rank looks up only its
  rows and the partial embeddings are summed), or an output head's rows (`ColwiseParallel(output_layouts=
  Replicate())`: each rank computes its slice of the logits and the slices are gathered);
- `heads` — an attention module: its q/k/v projections `colwise`, its output projection `rowwise`, and
  its head-count attribute divided by the degree, so each rank runs whole heads. The module's forward
  must size its views from that attribute and the local tensors (`view(b, s, self.heads, -1)`), as
  Megatron-style attention does.

Splitting replaces the parameters with DTensor parameters, so the optimizer built on the old ones is
pointed at the new ones (`retarget_optimizer`); that is only sound before its first step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.ir import TensorParallelLayer

HEAD_COUNT_ATTRIBUTES = ("heads", "num_heads", "n_heads", "n_head", "num_attention_heads")
"""Where an attention module keeps its number of heads (the `heads` style divides it)."""
OUTPUT_PROJECTIONS = ("out", "o", "o_proj", "out_proj", "wo", "c_proj", "dense", "proj")
"""Names of an attention module's output projection; its other Linear children project into heads."""


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, layers: list[TensorParallelLayer]) -> dict[int, nn.Parameter]:
    """Split `layers` of `model` in place over the 1-D tensor `mesh`; return old parameter id -> new parameter.

    Every rank of the tensor group must call it with the same layers: splitting scatters rank 0's weights.
    """
    degree = mesh.size()
    shared = _shared_parameters(model)
    plan: dict[str, ParallelStyle] = {}
    heads: list[tuple[nn.Module, str, int]] = []
    for i, layer in enumerate(layers):
        module = _module(model, layer.name, f"tensor_parallel[{i}].name")
        if layer.style == "heads":
            attribute = _check_heads(module, layer, degree, f"tensor_parallel[{i}]")
            heads.append((module, attribute, degree))
            plan.update(_attention_plan(module, layer.name, degree, f"tensor_parallel[{i}]"))
        else:
            plan[layer.name] = _style(module, layer, degree, f"tensor_parallel[{i}]")
    for name in plan:
        _check_untied(model.get_submodule(name), name, shared)
    before = dict(model.named_parameters())
    parallelize_module(model, mesh, plan)
    for module, attribute, degree in heads:
        setattr(module, attribute, getattr(module, attribute) // degree)
    after = dict(model.named_parameters())
    return {id(before[name]): after[name] for name in before if after[name] is not before[name]}


def retarget_optimizer(optimizer: torch.optim.Optimizer, replaced: dict[int, nn.Parameter]) -> None:
    """Point the optimizer's param groups at the split parameters (before it has any state)."""
    if not replaced:
        return
    if any(len(state) for state in optimizer.state.values()):
        raise UnsupportedStrategyError(
            "tensor parallelism replaces the split parameters, but the optimizer already holds state for the old ones; "
            "call distribute() before the first optimizer.step()")
    for group in optimizer.param_groups:
        group["params"] = [replaced.get(id(p), p) for p in group["params"]]


def _module(model: nn.Module, name: str, where: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise InvalidStrategyError([Problem(where, f"{name!r} is not a module of the model (model.named_modules())")]) from None


def _style(module: nn.Module, layer: TensorParallelLayer, degree: int, where: str) -> ParallelStyle:
    """The ParallelStyle of a colwise, rowwise or vocab split, after checking the module can take it."""
    if isinstance(module, nn.Embedding) and layer.style == "vocab":
        if module.sparse:
            raise UnsupportedStrategyError(f"{where} ({layer.name}): a sparse-gradient Embedding cannot be split by vocabulary")
        _divides(degree, module.num_embeddings, f"{where}.style", f"the {module.num_embeddings} rows of {layer.name}")
        return RowwiseParallel(input_layouts=Replicate())
    if not isinstance(module, nn.Linear):
        kinds = "an Embedding or a Linear" if layer.style == "vocab" else "a Linear"
        raise UnsupportedStrategyError(f"{where} ({layer.name}): the {layer.style} style splits {kinds}, not {type(module).__name__}")
    if layer.style == "rowwise":
        _divides(degree, module.in_features, f"{where}.style", f"the {module.in_features} input features of {layer.name}")
        return RowwiseParallel()
    _divides(degree, module.out_features, f"{where}.style", f"the {module.out_features} output features of {layer.name}")
    return ColwiseParallel(output_layouts=Replicate()) if layer.style == "vocab" else ColwiseParallel()


def _check_heads(module: nn.Module, layer: TensorParallelLayer, degree: int, where: str) -> str:
    """The module's head-count attribute, after checking it matches the strategy and splits evenly."""
    attribute = next((a for a in HEAD_COUNT_ATTRIBUTES if isinstance(getattr(module, a, None), int)), None)
    if attribute is None:
        raise UnsupportedStrategyError(
            f"{where} ({layer.name}): the heads style needs the module's head count as an int attribute "
            f"({', '.join(HEAD_COUNT_ATTRIBUTES)}); {type(module).__name__} has none")
    count = getattr(module, attribute)
    if count != layer.heads:
        raise InvalidStrategyError([Problem(f"{where}.heads", f"{layer.heads} given, but {layer.name}.{attribute} is {count}")])
    _divides(degree, count, f"{where}.heads", f"the {count} heads of {layer.name}")
    return attribute


def _attention_plan(module: nn.Module, name: str, degree: int, where: str) -> dict[str, ParallelStyle]:
    """q/k/v projections column-wise and the output projection row-wise, each holding whole heads."""
    linears = {child: m for child, m in module.named_children() if isinstance(m, nn.Linear)}
    outputs = [child for child in linears if child in OUTPUT_PROJECTIONS]
    if len(outputs) != 1 or len(linears) < 2:
        raise UnsupportedStrategyError(
            f"{where} ({name}): the heads style needs Linear children projecting into heads and exactly one output "
            f"projection named one of {', '.join(OUTPUT_PROJECTIONS)}; found Linear children {sorted(linears)}")
    out = linears[outputs[0]]
    plan: dict[str, ParallelStyle] = {f"{name}.{outputs[0]}": RowwiseParallel()}
    for child, projection in linears.items():
        if child == outputs[0]:
            continue
        if projection.out_features != out.in_features:
            raise UnsupportedStrategyError(
                f"{where} ({name}.{child}): {projection.out_features} output features for {out.in_features} attention "
                "features looks like fused q/k/v; contiguous column shards would mix q, k and v, so split it into "
                "separate projections")
        plan[f"{name}.{child}"] = ColwiseParallel()
    _divides(degree, out.in_features, f"{where}.heads", f"the {out.in_features} attention features of {name}")
    return plan


def _divides(degree: int, length: int, where: str, what: str) -> None:
    if length % degree:
        raise InvalidStrategyError([Problem(where, f"mesh.tensor({degree}) does not divide {what}")])


def _shared_parameters(model: nn.Module) -> dict[int, list[str]]:
    """Parameter id -> every module that owns it (tied weights have several owners)."""
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param in module._parameters.values():
            if param is not None:
                owners.setdefault(id(param), []).append(name)
    return owners


def _check_untied(module: nn.Module, name: str, owners: dict[int, list[str]]) -> None:
    for param_name, param in module.named_parameters(recurse=False):
        others = [o for o in owners.get(id(param), []) if o != name]
        if others:
            raise UnsupportedStrategyError(
                f"tensor_parallel ({name}): {name}.{param_name} is tied to {others[0]}; splitting would untie them, "
                "so untie the weights or leave this module unsplit")
