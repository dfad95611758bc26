"""What each layer's forward kernels move, split the way a GPU runs them.

Capture counts every op's inputs and outputs into `bytes_moved`. On a GPU that total hides three
different kernels, which this module tells apart as the forward ops go by:

- matmuls, convolutions and lookups stream their operands (`Layer.arithmetic_bytes`);
- element-wise and normalization ops run as kernels of their own, one after the other, each streaming its
  inputs and outputs through memory (`Layer.elementwise_bytes`); dropout is one kernel on a GPU (PyTorch's
  fused dropout reads the input and writes the output and a one-byte mask), where a CPU draws the mask,
  scales and multiplies in three;
- a compiler (`torch.compile`'s inductor) fuses each chain of them between two arithmetic kernels (matmul,
  convolution, attention, lookup) into one kernel: a tensor made and used inside the chain stays in
  registers, so the chain reads what comes from outside it once and writes only what a later kernel or
  backward reads (`Layer.fused_elementwise_bytes`);
- under `torch.autocast` the same element-wise kernels move half-precision tensors, except where autocast
  keeps a tensor in fp32 (`stratagem.tracing.autocast`: `Layer.autocast_elementwise_bytes`);
- a `scaled_dot_product_attention` call runs as one fused kernel on a GPU (FlashAttention), whatever
  this CPU capture decomposes it into (the math path materializes the s x s scores when there is
  dropout): its FLOPs, the bytes its traced ops moved and the bytes a fused kernel streams are kept
  apart (`Layer.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stratagem.tracing.autocast import AutocastWidths
from stratagem.tracing.fake import storage_key

ARITHMETIC = frozenset({"matmul", "conv", "attention", "embedding"})
"""Op classes (`flops.op_category`) that run their own kernels and end a fusible element-wise chain."""


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class _Made:
    """A tensor an element-wise op produced: in which chain, by which layer, and whether it reaches memory."""

    region: int
    layer: Any
    size: int
    tensor: torch.Tensor
    """Kept alive, so that its storage's address is not reused while it is remembered."""
    written: bool = False


@dataclass
class AttentionCall:
    """Running totals of one layer's fused attention calls."""

    flops: float = 0.0
    traced_bytes: float = 0.0
    io_bytes: float = 0.0
    causal: bool = False


class KernelTraffic:
    """Splits forward traffic per layer into element-wise bytes (eager and fused) and attention calls."""

    def __init__(self, state_storages: set[int]) -> None:
        self.autocast = AutocastWidths(state_storages)
        self.region = 0
        """Index of the current fusible chain: every arithmetic op ends one."""
        self._made: dict[object, _Made] = {}
        self._attention: tuple[Any, float, float] | None = None
        self._dropout: tuple[Any, torch.Tensor, float] | None = None

    def op(
        self,
        layer: Any,
        name: str,
        category: str,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        moved: float,
    ) -> None:
        """One forward op `name` of `layer` that moved `moved` bytes (its inputs and outputs as capture counts them)."""
        if self._attention is not None or self._dropout is not None:
            return
        if category in ARITHMETIC:
            layer.arithmetic_bytes += moved
            layer.autocast_elementwise_bytes += self.autocast.arithmetic(category, inputs, outputs)
            for tensor in inputs:
                self._reaches_memory(tensor)
            self.region += 1
            return
        autocast = self.autocast.elementwise(name, category, inputs, outputs)
        self._elementwise(layer, inputs, outputs, moved, autocast=autocast)

    def _elementwise(
        self,
        layer: Any,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        moved: float,
        *,
        autocast: float,
        extra: float = 0.0,
    ) -> None:
        """An element-wise kernel that moves `autocast` bytes under autocast; `extra` bytes it writes beyond
        `outputs` (a dropout mask) always reach memory."""
        layer.elementwise_bytes += moved
        layer.fused_elementwise_bytes += extra
        layer.autocast_elementwise_bytes += autocast + extra
        read = 0
        for tensor in inputs:
            made = self._made.get(storage_key(tensor))
            if made is not None and made.region == self.region:
                continue
            self._reaches_memory(tensor)
            read += nbytes(tensor)
        layer.fused_elementwise_bytes += read
        for tensor in outputs:
            self._made[storage_key(tensor)] = _Made(self.region, layer, nbytes(tensor), tensor)

    def saved(self, tensor: torch.Tensor) -> None:
        """Autograd keeps `tensor` for backward: a fused chain must write it out."""
        self._reaches_memory(tensor)

    def _reaches_memory(self, tensor: torch.Tensor) -> None:
        made = self._made.get(storage_key(tensor))
        if made is not None and not made.written:
            made.written = True
            made.layer.fused_elementwise_bytes += made.size

    # -- dropout: one kernel on a GPU --------------------------------------------------------------------

    def begin_dropout(self, layer: Any, tensor: Any) -> None:
        """An `F.dropout` call on `tensor` starts: its decomposition's ops are not counted one by one."""
        if self._attention is None and self._dropout is None and isinstance(tensor, torch.Tensor):
            self._dropout = (layer, tensor, layer.activation_bytes)

    def end_dropout(self, output: Any) -> None:
        """The call returned: one fused kernel read the input, wrote the output and a one-byte mask, which
        is all it keeps for backward (where the CPU's decomposition kept its noise tensor)."""
        if self._dropout is None:
            return
        layer, tensor, saved = self._dropout
        self._dropout = None
        if not isinstance(output, torch.Tensor) or output is tensor:
            return
        mask = float(output.numel())
        autocast = self.autocast.elementwise("dropout", "elementwise", [tensor], [output])
        self._elementwise(
            layer, [tensor], [output], nbytes(tensor) + nbytes(output) + mask, autocast=autocast, extra=mask
        )
        layer.gpu_saved_excess += max(layer.activation_bytes - saved - mask, 0.0)

    # -- fused attention ------------------------------------------------------------------------------

    def begin_attention(self, layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A `scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, ...)` call starts."""
        for tensor in _qkv(args, kwargs):
            self._reaches_memory(tensor)
        self.region += 1
        self._attention = (layer, layer.fwd_flops, layer.bytes_moved)
        call = layer.attention or AttentionCall()
        call.io_bytes += sum(nbytes(t) for t in _qkv(args, kwargs))
        layer.autocast_elementwise_bytes += self.autocast.arithmetic("attention", _qkv(args, kwargs), [])
        causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
        call.causal = bool(causal) and kwargs.get("attn_mask", args[3] if len(args) > 3 else None) is None
        layer.attention = call

    def end_attention(self, output: Any) -> None:
        """The call returned `output`: its FLOPs and traced bytes are the layer's growth since it started."""
        if self._attention is None:
            return
        layer, flops, moved = self._attention
        self._attention = None
        call = layer.attention
        call.flops += layer.fwd_flops - flops
        call.traced_bytes += layer.bytes_moved - moved
        if isinstance(output, torch.Tensor):
            call.io_bytes += nbytes(output)
        self.region += 1


def _qkv(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    named = [kwargs.get(name) for name in ("query", "key", "value")]
    tensors = [a for a in args[:3] if isinstance(a, torch.Tensor)] + [t for t in named if isinstance(t, torch.Tensor)]
    return tensors[:3]
