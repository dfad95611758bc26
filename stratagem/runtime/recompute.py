"""Activation recomputation: each numbered block runs its forward again in backward instead of keeping
its activations (torch.utils.checkpoint, non-reentrant, so it composes with DTensor and pipelining).

A block is the outermost module whose name ends in a number: `blocks.3` of a ModuleList, or `2` of an
nn.Sequential — the same units the simulator recomputes and the search cuts pipelines between.
Only the block's input stays alive through the forward; its backward first repeats its forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from stratagem.errors import UnsupportedStrategyError


def numbered_blocks(model: nn.Module) -> list[str]:
    """Names of the outermost modules whose last name component is a number."""
    blocks: list[str] = []
    for name, _ in model.named_modules():
        if name and name.rsplit(".", 1)[-1].isdigit() and not any(name.startswith(b + ".") for b in blocks):
            blocks.append(name)
    return blocks


def apply_recomputation(model: nn.Module) -> list[str]:
    """Wrap every numbered block's forward in a checkpoint; return the blocks' names."""
    blocks = numbered_blocks(model)
    if not blocks:
        raise UnsupportedStrategyError(
            "recompute: the model has no numbered blocks (children of an nn.ModuleList or nn.Sequential) to recompute"
        )
    for name in blocks:
        module = model.get_submodule(name)
        # An instance attribute shadows the class's forward; nn.Module.__call__ then runs the checkpoint.
        module.__dict__["forward"] = functools.partial(_recomputed, module.forward)
    return blocks


def _recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
