"""FLOPs and a coarse class for each aten op.

FLOPs come from `torch.utils.flop_counter`'s registry, the same formulas `FlopCounterMode` uses. Attention
kernels the registry has no formula for (the CPU flash kernel that `scaled_dot_product_attention` picks
here, vendor variants) would silently count as zero and make attention look free, so they get the
textbook count instead: two matmuls of `b·h·s_q·s_kv·d` multiply-adds forward, twice that backward.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addbmm", "mv", "addmv", "dot", "linear"})
EMBEDDING_OPS = frozenset({"embedding", "_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"})
_NORM = re.compile(r"(^|_)norm($|_)")


def is_attention(op_name: str) -> bool:
    return "attention" in op_name


def op_flops(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
    """FLOPs of one op call; 0 for ops without arithmetic worth counting (copies, views, elementwise)."""
    formula = flop_registry.get(func._overloadpacket)
    if formula is not None:
        return float(formula(*args, **kwargs, out_val=out))
    name = func._overloadpacket.__name__
    if is_attention(name):
        return attention_flops(args, backward=name.endswith("backward"))
    return 0.0


def attention_flops(args: tuple[Any, ...], *, backward: bool) -> float:
    """`2·B·s_q·s_kv·(d + d_v)` forward (QKᵀ and PV), doubled for backward; B spans batch and heads.

    Forward kernels take (query, key, value, ...), backward ones (grad_out, query, key, value, ...).
    """
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 3]
    offset = 1 if backward else 0
    if len(tensors) < offset + 3:
        return 0.0
    query, key, value = tensors[offset : offset + 3]
    batch = math.prod(query.shape[:-2])
    s_q, d = query.shape[-2], query.shape[-1]
    s_kv, d_v = key.shape[-2], value.shape[-1]
    forward = 2.0 * batch * s_q * s_kv * (d + d_v)
    return 2.0 * forward if backward else forward


def op_category(op_name: str) -> str:
    """Which LayerKind an op argues for; `elementwise` for anything else that touches data."""
    if is_attention(op_name):
        return "attention"
    if "convolution" in op_name or op_name.startswith("conv"):
        return "conv"
    if op_name in MATMUL_OPS:
        return "matmul"
    if op_name in EMBEDDING_OPS:
        return "embedding"
    if _NORM.search(op_name):
        return "norm"
    return "elementwise"
