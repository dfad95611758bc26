"""Activation recomputation of every numbered block (torch.utils.checkpoint, non-reentrant, so it
composes with DTensor, FSDP2 and pipelining).

A block is the outermost module whose name ends in a number: `blocks.3` of a ModuleList, or `2` of an
nn.Sequential — the same units the simulator recomputes and the search cuts pipelines between.

- `full`: only the block's input stays alive through the forward; its backward first repeats its forward.
- `selective`: only the attention core is dropped and recomputed (Korthikanti et al. 2022, Megatron's
  `--recompute-granularity selective`): every `F.scaled_dot_product_attention` call inside a block runs
  under its own checkpoint, so its inputs (q, k, v) are kept and its output, and the scores of an
  unfused kernel, are computed again in backward; everything else in the block keeps its activations.
  The calls are found by a torch function mode around the block's forward, so any model that calls
  SDPA (the zoo's transformers, Hugging Face's `sdpa` attention) is covered, as torchtitan's op-level
  selective checkpointing covers the ops it lists. A block that computes attention by hand (Hugging
  Face's `eager` attention) or holds none (an embedding stage) keeps all its activations.
- `selective-op`: per-op selective checkpointing of each block, torchtitan's `selective_ac_option = "op"`
  (pytorch/torchtitan `distributed/activation_checkpoint.py`): the outputs of fused attention and of every
  other `mm` are saved, every other op is recomputed in backward (`create_selective_checkpoint_contexts`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from stratagem.errors import UnsupportedStrategyError


def numbered_blocks(model: nn.Module) -> list[str]:
    """Names of the outermost modules whose last name component is a number."""
    blocks: list[str] = []
    for name, _ in model.named_modules():
        if name and name.rsplit(".", 1)[-1].isdigit() and not any(name.startswith(b + ".") for b in blocks):
            blocks.append(name)
    return blocks


def apply_recomputation(model: nn.Module, mode: str = "full") -> list[str]:
    """Wrap every numbered block's forward for `full`, `selective` or `selective-op` recomputation; return the
    blocks' names."""
    blocks = numbered_blocks(model)
    if not blocks:
        raise UnsupportedStrategyError(
            "recompute: the model has no numbered blocks (children of an nn.ModuleList or nn.Sequential) to recompute"
        )
    _disable_kv_cache(model)
    for name in blocks:
        module = model.get_submodule(name)
        # An instance attribute shadows the class's forward; nn.Module.__call__ then runs the wrapper.
        wrapper = {"full": _recomputed, "selective-op": _op_recomputed}.get(mode, _attention_recomputed)
        module.__dict__["forward"] = functools.partial(wrapper, module.forward)
    return blocks


def _disable_kv_cache(model: nn.Module) -> None:
    """A Hugging Face model left with `use_cache=True` appends each block's keys and values to a cache
    in forward, so a block replayed in backward runs other ops than it recorded (per-op checkpointing
    refuses the replay; full recomputation replays on the filled cache). Training needs no cache: turn
    it off, as Hugging Face's own gradient checkpointing does."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", False) is True:
            config.use_cache = False


def _recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


SAVED_OPS = (
    "aten.mm.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
)
"""Ops whose outputs per-op checkpointing keeps (torchtitan's save list; every second `mm` excepted)."""


def _op_recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, context_fn=_op_policy, **kwargs)


def _op_policy() -> tuple[Any, Any]:
    saved = {op for op in (_aten(name) for name in SAVED_OPS) if op is not None}
    matmul = torch.ops.aten.mm.default
    counts: dict[bool, int] = {False: 0, True: 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == matmul:
            counts[ctx.is_recompute] += 1
        keep = func in saved and not (func == matmul and counts[ctx.is_recompute] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _aten(name: str) -> Any:
    """`aten.mm.default` as an op overload, None where this torch build lacks it."""
    _, packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet, None), overload, None)


def _attention_recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with _CheckpointAttention():
        return forward(*args, **kwargs)


class _CheckpointAttention(TorchFunctionMode):
    """Runs each scaled-dot-product attention under its own non-reentrant checkpoint."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return checkpoint(func, *args, use_reentrant=False, **kwargs)
        return func(*args, **kwargs)
