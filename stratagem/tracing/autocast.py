"""What a layer's element-wise kernels move when the model trains under `torch.autocast` on CUDA.

Autocast runs matmuls, convolutions and attention in half precision, but a list of ops in fp32
(softmax, layer norm, `pow`, `exp`, `sum`, the losses: "CUDA Ops that can autocast to float32" in
https://pytorch.org/docs/stable/amp.html), casting their half inputs up first. What such an op returns
stays fp32 through the element-wise ops after it (type promotion: an op with an fp32 input of one or
more dimensions returns fp32), until a matmul casts it down again. Parameters and buffers stay fp32, so
an embedding's output and an element-wise op on a parameter (`weight * x` in an RMSNorm) are fp32 too;
a normalization kernel (batch norm) returns its input's dtype.

So where capture counts an element-wise op's inputs and outputs at the captured dtype, under autocast
each moves 2 bytes per element when half and 4 when fp32, plus the casts: 2 read and 4 written per
element for a half input of an fp32 op, 4 read and 2 written for an fp32 activation entering a matmul
(weights' casts are priced apart: `simulator.compute.AUTOCAST_CAST_BYTES`).

Casts the model's own code makes (`attn.type(value.dtype)` after a softmax) are no-ops in an fp32
capture and are not seen: such a tensor is counted fp32 until its next matmul, which overstates what a
model that casts early moves.
"""

from __future__ import annotations

import torch

from stratagem.tracing.fake import storage_key

HALF = 2
FP32 = 4

FP32_OPS = frozenset(
    {
        "_softmax",
        "softmax",
        "_log_softmax",
        "log_softmax",
        "native_layer_norm",
        "layer_norm",
        "native_group_norm",
        "group_norm",
        "pow",
        "exp",
        "expm1",
        "log",
        "log1p",
        "log2",
        "log10",
        "rsqrt",
        "reciprocal",
        "sum",
        "prod",
        "cumsum",
        "cumprod",
        "norm",
        "linalg_vector_norm",
        "nll_loss_forward",
        "nll_loss2d_forward",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "binary_cross_entropy_with_logits",
        "kl_div",
        "softplus",
        "acos",
        "asin",
        "cosh",
        "sinh",
        "tan",
        "erfinv",
        "_cdist_forward",
        "dist",
        "renorm",
    }
)
"""Autocast's fp32 ops as the aten ops capture sees below autograd."""


class AutocastWidths:
    """Follows which tensors autocast keeps in fp32, and prices each op's element-wise traffic under it."""

    def __init__(self, state_storages: set[int]) -> None:
        self._state = state_storages
        """Parameters' and buffers' storages: fp32 under autocast, cast for matmuls apart."""
        self._wide: dict[int, torch.Tensor] = {}
        """fp32 activations by storage (each kept alive, so that its address is not reused)."""

    def arithmetic(self, category: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
        """A matmul, convolution, attention or lookup: the casts of its fp32 activations to half precision."""
        if category == "embedding":
            self._mark(outputs)
            return 0.0
        return float(sum((FP32 + HALF) * t.numel() for t in inputs if self._activation(t) and self._is_wide(t)))

    def elementwise(self, name: str, category: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
        """Bytes an element-wise or normalization op moves under autocast, its input casts included."""
        read_wide = [self._is_wide(t) for t in inputs]
        floating = [(t, w) for t, w in zip(inputs, read_wide, strict=True) if t.is_floating_point()]
        casts = 0
        if name in FP32_OPS:
            wide = True
            casts = sum((HALF + FP32) * t.numel() for t, w in floating if t.dim() > 0 and not w)
            read_wide = [True] * len(inputs)
        elif category == "norm":
            wide = bool(floating) and floating[0][1]
        else:
            wide = any(w for t, w in floating if t.dim() > 0)
        moved = sum(self._size(t, wide=w) for t, w in zip(inputs, read_wide, strict=True))
        moved += sum(self._size(t, wide=wide) for t in outputs)
        if wide:
            self._mark(outputs)
        return float(moved + casts)

    def _is_wide(self, tensor: torch.Tensor) -> bool:
        key = storage_key(tensor)
        return key in self._wide or key in self._state

    def _activation(self, tensor: torch.Tensor) -> bool:
        return tensor.is_floating_point() and storage_key(tensor) not in self._state

    def _mark(self, tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            if tensor.is_floating_point():
                self._wide[storage_key(tensor)] = tensor

    @staticmethod
    def _size(tensor: torch.Tensor, *, wide: bool) -> int:
        if not tensor.is_floating_point():
            return tensor.numel() * tensor.element_size()
        return tensor.numel() * (FP32 if wide else HALF)
