"""Tensor parallelism (Megatron): split the modules a strategy names across the tensor group, with DTensor.

Each style is one of `torch.distributed.tensor.parallel`'s, so the collectives are PyTorch's own:

- `colwise` — `ColwiseParallel()`: a Linear's weight rows (output features) split; its input is
  replicated and its output stays sharded on the last dimension, ready for a `rowwise` partner;
- `rowwise` — `RowwiseParallel()`: a Linear's weight columns (input features) split; each rank's
  partial output is summed over the group (one all-reduce forward, one for the input gradient backward);
- `vocab` — an Embedding's rows (`RowwiseParallel(input_layouts=Replicate())`: a rank looks up only its
  rows and the partial embeddings are summed), or an output head's rows (`ColwiseParallel(output_layouts=
  Replicate())`: each rank computes its slice of the logits and the slices are gathered);
- `heads` — an attention module: its q/k/v projections `colwise` (a fused [q; k; v] one after reordering
  its rows so each rank's shard holds q, k and v of its own heads), its output projection `rowwise`,
  and its head-count attribute divided by the degree, so each rank runs whole heads.

Sequence parallelism (`Strategy.sequence_parallel`, Korthikanti et al. 2022; torchtitan's Llama plan):
between the transformer blocks (the numbered blocks holding an attention split by heads) the residual
stream is split along the sequence (dimension 1) over the tensor group. The first such block's input
is cut to this rank's piece (no communication) and the last one's output gathered; inside each block the
norms run on their piece (`SequenceParallel`, their weights' gradients summed over the group), an
attention gathers its input once (`PrepareModuleInput`, all-gather) and its output projection, like
every row-wise Linear, reduce-scatters its sums back to pieces (`output_layouts=Shard(1)`) instead of
all-reducing them; a column-wise Linear gathers its input itself (`input_layouts=Shard(1)`). Every other
module of those blocks must be parameter-free and work token by token (dropout, activations): anything
else would see only its piece of the sequence, and is refused.

Which module takes which style, and why, is `stratagem.parallel_rules` — the same rules the search's
plan follows. A weight tied between modules that are all split by vocabulary is split once and stays
tied. Splitting replaces the parameters with DTensor parameters, so the optimizer built on the old ones
is pointed at the new ones (`retarget_optimizer`); that is only sound before its first step.
`gathered_parameters` undoes the splits (and a fused projection's row order) for comparison or saving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.ir import TensorParallelLayer
from stratagem.parallel_rules import (
    HEAD_COUNT_ATTRIBUTES,
    AttentionSplit,
    Projection,
    Refusal,
    attention_split,
    fused_row_order,
    head_attribute,
    style_refusal,
    tie_refusal,
)

ROW_ORDER = "stratagem_row_order"
"""Attribute of a Linear whose weight rows were reordered before the split: new row i is old row order[i]."""


def apply_tensor_parallel(
    model: nn.Module, mesh: DeviceMesh, layers: list[TensorParallelLayer], *, sequence_parallel: bool = False
) -> dict[int, nn.Parameter]:
    """Split `layers` of `model` in place over the 1-D tensor `mesh`; return old parameter id -> new parameter.

    Every rank of the tensor group must call it with the same layers: splitting scatters rank 0's weights.
    """
    degree = mesh.size()
    splits = _collect(model, layers, degree)
    region = _sequence_parallel(model, splits) if sequence_parallel else None
    ties = _check_ties(model, splits.styles)
    for projection, order in splits.reordered:
        _reorder_rows(projection, order)
    before = dict(model.named_parameters())
    parallelize_module(model, mesh, splits.plan)
    _retie(model, ties)
    for module, attribute in splits.heads:
        setattr(module, attribute, getattr(module, attribute) // degree)
    for name in splits.plan:
        model.get_submodule(name).register_forward_hook(_own_output)
    if region is not None:
        first, last = region
        model.get_submodule(first).register_forward_pre_hook(_SequencePieces(mesh))
        model.get_submodule(last).register_forward_hook(_WholeSequence(mesh))
    after = dict(model.named_parameters())
    replaced = {id(before[name]): after[name] for name in before if after[name] is not before[name]}
    for param in replaced.values():
        param.register_post_accumulate_grad_hook(_grad_like_param)
    return replaced


@dataclass
class _Splits:
    """What one strategy's `tensor_parallel` asks of the model, checked before anything changes."""

    plan: dict[str, ParallelStyle] = field(default_factory=dict)
    """Module path -> PyTorch's style for it."""
    styles: dict[str, str] = field(default_factory=dict)
    """Module path -> the strategy's style that split it (`heads` for an attention's projections)."""
    heads: list[tuple[nn.Module, str]] = field(default_factory=list)
    """Attention modules and their head-count attribute, divided by the degree after the split."""
    reordered: list[tuple[nn.Linear, list[int]]] = field(default_factory=list)
    """Fused q/k/v projections and their head-group row order."""


def _collect(model: nn.Module, layers: list[TensorParallelLayer], degree: int) -> _Splits:
    splits = _Splits()
    for i, layer in enumerate(layers):
        where = f"tensor_parallel[{i}]"
        module = _module(model, layer.name, f"{where}.name")
        if layer.style != "heads":
            splits.plan[layer.name] = _style(module, layer, degree, where)
            splits.styles.setdefault(layer.name, layer.style)
            continue
        attribute, count = _check_heads(module, layer, degree, where)
        split = _attention(module, layer.name, count, degree, where)
        splits.heads.append((module, attribute))
        for name, style in _attention_plan(layer.name, split).items():
            splits.plan[name] = style
            splits.styles.setdefault(name, "heads")
        if split.fused is not None:
            projection = module.get_submodule(split.fused)
            assert isinstance(projection, nn.Linear)  # attention_split names Linear children only
            splits.reordered.append(
                (projection, fused_row_order(count, projection.out_features // (3 * count), degree))
            )
    return splits


NORMS = (nn.LayerNorm, nn.RMSNorm)


def _sequence_parallel(model: nn.Module, splits: _Splits) -> tuple[str, str]:
    """Turn the plan into its sequence-parallel form over the transformer blocks; return the first and
    last block (where the sequence is cut into pieces and gathered again)."""
    from stratagem.runtime.recompute import numbered_blocks

    attentions = [module for module, _ in splits.heads]
    blocks = [b for b in numbered_blocks(model) if any(a in attentions for a in model.get_submodule(b).modules())]
    if not blocks:
        raise UnsupportedStrategyError(
            "sequence_parallel: no numbered block holds an attention split by heads; sequence parallelism splits "
            "the sequence between transformer blocks"
        )
    for block in blocks:
        _sequence_parallel_block(model, block, splits)
    return blocks[0], blocks[-1]


def _sequence_parallel_block(model: nn.Module, block: str, splits: _Splits) -> None:
    attention_names = {name for name, module in model.named_modules() if any(module is a for a, _ in splits.heads)}
    for name, module in model.get_submodule(block).named_modules(prefix=block):
        if name in attention_names:
            splits.plan[name] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            continue
        style = splits.plan.get(name)
        inside_attention = any(name.startswith(a + ".") for a in attention_names)
        if isinstance(style, RowwiseParallel):
            splits.plan[name] = RowwiseParallel(output_layouts=Shard(1))
        elif isinstance(style, ColwiseParallel) and not inside_attention:
            splits.plan[name] = ColwiseParallel(input_layouts=Shard(1))
        elif style is None and isinstance(module, NORMS):
            splits.plan[name] = SequenceParallel()
            splits.styles.setdefault(name, "sequence")
        elif style is None and not inside_attention and any(True for _ in module.parameters(recurse=False)):
            raise UnsupportedStrategyError(
                f"sequence_parallel ({name}): a {type(module).__name__} with parameters inside a transformer block "
                "that tensor_parallel does not split would see only this rank's piece of the sequence; split it, "
                "or leave sequence_parallel off"
            )


class _SequencePieces:
    """Forward pre-hook: the first block's input cut to this rank's piece of the sequence (its gradient is
    gathered again in backward)."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh = mesh

    def __call__(self, module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
        if not args or not isinstance(args[0], torch.Tensor):
            raise UnsupportedStrategyError(
                f"sequence_parallel: {type(module).__name__} takes its hidden states as a keyword; "
                "the first transformer block must take them as its first positional argument"
            )
        whole = DTensor.from_local(args[0], self.mesh, [Replicate()], run_check=False)
        return (whole.redistribute(self.mesh, [Shard(1)]).to_local(), *args[1:])


class _WholeSequence:
    """Forward hook: the last block's output gathered along the sequence (all-gather; its gradient is
    this rank's piece of the replicated gradient)."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh = mesh

    def __call__(self, module: nn.Module, args: object, output: object) -> object:
        if isinstance(output, tuple):
            return (self(module, args, output[0]), *output[1:])
        assert isinstance(output, torch.Tensor)
        piece = DTensor.from_local(output, self.mesh, [Shard(1)], run_check=False)
        return piece.redistribute(self.mesh, [Replicate()]).to_local()


def retarget_optimizer(optimizer: torch.optim.Optimizer, replaced: dict[int, nn.Parameter]) -> None:
    """Point the optimizer's param groups at the split parameters (before it has any state)."""
    if not replaced:
        return
    if any(len(state) for state in optimizer.state.values()):
        raise UnsupportedStrategyError(
            "tensor parallelism replaces the split parameters, but the optimizer already holds state for the old ones; "
            "call distribute() before the first optimizer.step()"
        )
    for group in optimizer.param_groups:
        group["params"] = [replaced.get(id(p), p) for p in group["params"]]


def gathered_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole and in the model's own layout: split ones gathered over the tensor group
    (a collective: every rank of the group must call it) and reordered rows put back."""
    out: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        order = getattr(module, ROW_ORDER, None)
        for name, param in module.named_parameters(recurse=False):
            full = (param.full_tensor() if isinstance(param, DTensor) else param).detach()
            if order is not None:
                full = torch.empty_like(full).index_copy_(0, torch.as_tensor(order), full)
            out[f"{module_name}.{name}" if module_name else name] = full
    return out


def _module(model: nn.Module, name: str, where: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise InvalidStrategyError(
            [Problem(where, f"{name!r} is not a module of the model (model.named_modules())")]
        ) from None


def _style(module: nn.Module, layer: TensorParallelLayer, degree: int, where: str) -> ParallelStyle:
    """The ParallelStyle of a colwise, rowwise or vocab split, after checking the module can take it."""
    refusal = style_refusal(layer.style, type(module).__name__, sparse=bool(getattr(module, "sparse", False)))
    if refusal is not None:
        raise UnsupportedStrategyError(f"{where} ({layer.name}): {refusal}")
    if isinstance(module, nn.Embedding):
        _divides(degree, module.num_embeddings, f"{where}.style", f"the {module.num_embeddings} rows of {layer.name}")
        return RowwiseParallel(input_layouts=Replicate())
    assert isinstance(module, nn.Linear)  # style_refusal admits only these two classes
    if layer.style == "rowwise":
        _divides(
            degree, module.in_features, f"{where}.style", f"the {module.in_features} input features of {layer.name}"
        )
        return RowwiseParallel()
    _divides(
        degree, module.out_features, f"{where}.style", f"the {module.out_features} output features of {layer.name}"
    )
    return ColwiseParallel(output_layouts=Replicate()) if layer.style == "vocab" else ColwiseParallel()


def _check_heads(module: nn.Module, layer: TensorParallelLayer, degree: int, where: str) -> tuple[str, int]:
    """The module's head-count attribute and value, after checking it matches the strategy and splits evenly."""
    found = head_attribute({name: getattr(module, name, None) for name in HEAD_COUNT_ATTRIBUTES})
    if found is None:
        raise UnsupportedStrategyError(
            f"{where} ({layer.name}): the heads style needs the module's head count as an int attribute "
            f"({', '.join(HEAD_COUNT_ATTRIBUTES)}); {type(module).__name__} has none"
        )
    attribute, count = found
    if count != layer.heads:
        raise InvalidStrategyError(
            [Problem(f"{where}.heads", f"{layer.heads} given, but {layer.name}.{attribute} is {count}")]
        )
    _divides(degree, count, f"{where}.heads", f"the {count} heads of {layer.name}")
    return attribute, count


def _attention(module: nn.Module, name: str, heads: int, degree: int, where: str) -> AttentionSplit:
    projections = [
        Projection(child, m.in_features, m.out_features) for child, m in module.named_children() if type(m) is nn.Linear
    ]
    split = attention_split(projections, heads)
    if isinstance(split, Refusal):
        raise UnsupportedStrategyError(f"{where} ({name}): {split}")
    width = cast(nn.Linear, module.get_submodule(split.output)).in_features  # projections are Linear children
    _divides(degree, width, f"{where}.heads", f"the {width} attention features of {name}")
    return split


def _attention_plan(name: str, split: AttentionSplit) -> dict[str, ParallelStyle]:
    """q/k/v projections column-wise and the output projection row-wise, each holding whole heads."""
    plan: dict[str, ParallelStyle] = {f"{name}.{split.output}": RowwiseParallel()}
    for child in (*split.separate, *([split.fused] if split.fused else [])):
        plan[f"{name}.{child}"] = ColwiseParallel()
    return plan


def _grad_like_param(param: nn.Parameter) -> None:
    """Lay a split parameter's gradient out as the parameter: DTensor may propagate another placement
    (a positional embedding's gradient comes back replicated), and the data-parallel synchronizers,
    hooked after this one, work on local shards."""
    grad = param.grad
    if isinstance(grad, DTensor) and isinstance(param, DTensor) and grad.placements != param.placements:
        param.grad = grad.redistribute(param.device_mesh, param.placements)


def _own_output(module: nn.Module, inputs: object, output: torch.Tensor) -> torch.Tensor:
    """A copy of a split module's local output: DTensor hands back a view of its own tensor, which autograd
    forbids modifying in place, and in-place code often follows (`ReLU(inplace=True)`, `out += x`)."""
    return output.clone()


def _reorder_rows(projection: nn.Linear, order: list[int]) -> None:
    """Put a fused projection's rows in head-group order, so contiguous shards hold whole heads' q, k and v."""
    index = torch.as_tensor(order, device=projection.weight.device)
    with torch.no_grad():
        projection.weight.copy_(projection.weight.index_select(0, index))
        if projection.bias is not None:
            projection.bias.copy_(projection.bias.index_select(0, index))
    setattr(projection, ROW_ORDER, order)


def _divides(degree: int, length: int, where: str, what: str) -> None:
    if length % degree:
        raise InvalidStrategyError([Problem(where, f"mesh.tensor({degree}) does not divide {what}")])


def _holders(model: nn.Module) -> dict[int, list[tuple[str, str]]]:
    """Parameter id -> every (module, attribute) that holds it (tied weights have several holders)."""
    holders: dict[int, list[tuple[str, str]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for attribute, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((name, attribute))
    return holders


def _check_ties(model: nn.Module, styles: dict[str, str]) -> list[list[tuple[str, str]]]:
    """Refuse a split that would untie a shared weight; return the tied groups the split keeps tied."""
    kept = []
    for holders in _holders(model).values():
        modules = sorted({module for module, _ in holders})
        if len(modules) < 2 or not any(module in styles for module in modules):
            continue
        refusal = tie_refusal({module: styles.get(module) for module in modules})
        if refusal is not None:
            split, attribute = next(holder for holder in holders if holder[0] in styles)
            other = next(module for module in modules if module != split)
            raise UnsupportedStrategyError(
                f"tensor_parallel ({split}): {split}.{attribute} is tied to {other}; {refusal}"
            )
        kept.append(holders)
    return kept


def _retie(model: nn.Module, ties: list[list[tuple[str, str]]]) -> None:
    """Every holder of a tied weight takes the first holder's split parameter (all hold the same rows)."""
    for holders in ties:
        first_module, first_attribute = holders[0]
        shared = model.get_submodule(first_module)._parameters[first_attribute]
        for module, attribute in holders[1:]:
            model.get_submodule(module)._parameters[attribute] = shared
