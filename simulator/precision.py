"""What each precision (`Strategy.precision`, `encoding.Precision`) changes: the peak a layer computes at,
the bytes its activations and gradients take, and the state it keeps per parameter.

A captured graph's FLOPs do not depend on the dtype; its bytes are at the captured dtype
(`graph.dtype`), so every byte figure is rescaled to the precision's. `fp32` and `tf32` run the model
as captured: a graph captured in bfloat16 stays in bfloat16 (no autocast), one captured in float32
computes in IEEE fp32.

| precision | matmul | convolution | attention | activations | gradients reduced | kept per parameter |
|---|---|---|---|---|---|---|
| `fp32` | fp32 | TF32 where the device has it | fp32 | captured | captured | param + grad (captured) + optimizer state |
| `tf32` | TF32 | TF32 | TF32 | captured | captured | as `fp32` |
| `amp-fp16`, `amp-bf16` | fp16 / bf16 | fp16 / bf16 | fp16 / bf16 | 2 B (element-wise kernels: 4 B where autocast keeps fp32) | fp32 | fp32 param + fp32 grad + fp32 state, and the half copies of the weights autocast saves for backward (2 B) |
| `bf16` | bf16 | bf16 | bf16 | 2 B | bf16 | bf16 param + bf16 grad + fp32 master (4 B) + fp32 state |
| `fp8` | fp8 | bf16 | bf16 | 2 B | bf16 | as `bf16` |
| `fp16` | fp16 | fp16 | fp16 | 2 B | fp16 | as `bf16` |

- `fp32` follows PyTorch's defaults: `torch.backends.cuda.matmul.allow_tf32` is False and
  `torch.backends.cudnn.allow_tf32` is True, so matmuls run in IEEE fp32 and convolutions through
  cuDNN in TF32 (https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices;
  on an H200, `stratagem calibrate --gpu` measured fp32 matmul at 49.6 TFLOP/s and convolution at 131).
- `amp-*` is `torch.autocast`: parameters, gradients and optimizer state stay fp32; matmuls cast their
  inputs to half precision and the cast weights are saved for backward; DDP reduces the fp32
  gradients (FSDP2's `MixedPrecisionPolicy(reduce_dtype=float32)` does the same). Autocast's fp32 ops
  and what they feed move 4 B per element in the element-wise kernels (`Layer.autocast_elementwise_bytes`,
  `simulator.kernels`); saved activations are counted at 2 B.
- `bf16` is the engines' 16-bit mixed precision (Megatron-LM `--bf16`, DeepSpeed `bf16.enabled`): 16-bit
  parameters and gradients, fp32 master weights and optimizer state, the "2 + 2 + K" bytes per
  parameter of Rajbhandari et al. 2020 (ZeRO, section 3.1) with K = 4 + the optimizer's state (12 for
  Adam); gradients are reduced in bf16.
- `fp8` is `bf16` with fp8 matmuls (torchao's float8 training, Transformer Engine): per-tensor scaled
  e4m3/e5m2 GEMMs at twice the bf16 tensor rate on H100/H200; attention, convolutions and everything
  else stay bf16. A device without fp8 tensor cores (A100 and older, CPUs) cannot run it: the
  candidate is infeasible.
- `fp16` is `bf16` in fp16 (Megatron-LM `--fp16`, DeepSpeed `fp16.enabled`: the engine halves the model
  and its fp16 or ZeRO optimizer steps fp32 master copies): the 16-bit mode of GPUs without bf16 tensor
  cores (V100, T4), at their fp16 tensor rate.
- `amp-fp16` and `fp16` scale the loss dynamically: at the step each gradient the rank steps is read and
  written once more to unscale it, its overflow checked in the same pass (`UNSCALE_PASSES`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.encoding import Precision
from stratagem.ir import DeviceSpec

PRECISIONS = len(Precision)
HALF_BYTES = 2.0
FP32_BYTES = 4.0
MASTER_BYTES = 4.0
"""The fp32 master copy of each parameter that `bf16` and `fp8` keep with the optimizer state."""
AMP_WEIGHT_COPY_BYTES = 2.0
"""Autocast casts each weight to half precision once per forward and autograd saves the cast for the
input gradient in backward: a half copy of the parameters lives through forward and backward."""

LOSS_SCALED = (Precision.AMP_FP16, Precision.FP16)
"""Precisions that scale the loss dynamically (fp16's narrow exponent)."""
UNSCALE_PASSES = 2.0
"""Unscaling reads and writes each fp32 gradient once, checking for overflow on the way: PyTorch's
`GradScaler` in one multi-tensor kernel (`_amp_foreach_non_finite_check_and_unscale_`), Megatron-LM's
and DeepSpeed's fp16 optimizers over their fp32 main gradients, this runtime as each gradient arrives."""

CAPTURED = {Precision.FP32, Precision.TF32}
"""Precisions that run the model in its captured dtype."""
HALF_GRADIENTS = {Precision.BF16, Precision.FP8, Precision.FP16}
"""Precisions whose gradients are reduced in 16 bits (at the device's `half_reduce_efficiency`)."""


def _bytes(precision: Precision, captured: float | np.ndarray, *, gradient: bool) -> float | np.ndarray:
    if precision in CAPTURED:
        return captured
    if precision in (Precision.AMP_FP16, Precision.AMP_BF16):
        return FP32_BYTES if gradient else HALF_BYTES
    return HALF_BYTES


@dataclass(frozen=True)
class PrecisionTable:
    """Per precision p (index `Precision`): scales of the captured graph's byte figures."""

    activation: np.ndarray
    """[P] activation bytes (and every layer's bytes moved, and activations on the wire) per captured byte."""
    gradient: np.ndarray
    """[P, V] gradient bytes (reduced and held) per captured parameter byte, per variable."""
    parameter: np.ndarray
    """[P, V] parameter bytes held per captured parameter byte, per variable."""
    gathered: np.ndarray
    """[P, V] parameter bytes all-gathered by ZeRO and FSDP per captured parameter byte: the compute dtype
    (FSDP2's `MixedPrecisionPolicy(param_dtype=bfloat16)` gathers half precision under amp; Megatron
    and DeepSpeed gather their 16-bit parameters)."""
    master: np.ndarray
    """[P] fp32 master bytes per parameter kept with the optimizer state (4 for bf16 and fp8)."""
    weight_copy: np.ndarray
    """[P] bytes per parameter of half weight copies saved for backward (autocast)."""
    half_gradients: np.ndarray
    """[P] gradients reduced in 16 bits."""
    graph_gradient: np.ndarray
    """[P] gradient bytes per captured byte at the graph's dtype (an embedding's dense gradient fill)."""


def precision_table(graph_itemsize: float, var_itemsize: np.ndarray) -> PrecisionTable:
    members = list(Precision)
    return PrecisionTable(
        activation=np.array([_bytes(p, graph_itemsize, gradient=False) / graph_itemsize for p in members]),
        gradient=_per_variable(var_itemsize, gradient=True),
        parameter=_per_variable(var_itemsize, gradient=True),
        gathered=_per_variable(var_itemsize, gradient=False),
        master=np.array([MASTER_BYTES if p in HALF_GRADIENTS else 0.0 for p in members]),
        weight_copy=np.array(
            [AMP_WEIGHT_COPY_BYTES if p in (Precision.AMP_FP16, Precision.AMP_BF16) else 0.0 for p in members]
        ),
        half_gradients=np.array([p in HALF_GRADIENTS for p in members]),
        graph_gradient=np.array([_bytes(p, graph_itemsize, gradient=True) / graph_itemsize for p in members]),
    )


def _per_variable(var_itemsize: np.ndarray, *, gradient: bool) -> np.ndarray:
    """[P, V] bytes per captured byte of each variable at each precision."""
    itemsize = np.asarray(var_itemsize, dtype=np.float64)
    return np.stack(
        [np.broadcast_to(_bytes(p, itemsize, gradient=gradient), itemsize.shape) / itemsize for p in Precision]
    )


@dataclass(frozen=True)
class Peaks:
    """Per device kind k and precision p: FLOP/s of each kind of arithmetic (before efficiency)."""

    matmul: np.ndarray
    """[K, P] matrix multiplies (Linear layers)."""
    conv: np.ndarray
    """[K, P] convolutions."""
    attention: np.ndarray
    """[K, P] attention cores (SDPA, flash)."""
    fp8: np.ndarray
    """[K] whether the kind has fp8 tensor cores."""
    matmul_efficiency: np.ndarray
    """[K, P] fraction of that peak matmuls reach: the kind's `fp32_matmul_efficiency` where they run
    IEEE fp32 on CUDA cores, its `fp8_matmul_efficiency` under `fp8`, its (tensor-core)
    `matmul_efficiency` otherwise; each at the power-limited clock (`sustained_matmul`)."""
    conv_efficiency: np.ndarray
    """[K, P] the same for convolutions (the kind's `conv_efficiency` where it states one)."""
    attention_efficiency: np.ndarray
    """[K, P] a fused attention kernel's forward fraction of the attention peak (its own sustained
    figure: the power limit does not slow it)."""
    attention_backward_efficiency: np.ndarray
    """[K, P] its backward's, on 2.5 times the forward FLOPs."""


def peaks(specs: list[DeviceSpec], dtype: str) -> Peaks:
    """The peak each layer kind reaches under each precision (see the module docstring's table), and
    the fraction of it each kind's kernels reach there."""
    matmul, conv, attention = [], [], []
    matmul_eff, conv_eff, attention_eff, attention_bwd = [], [], [], []
    for spec in specs:
        captured = spec.flops_for(dtype)
        tf32 = spec.peak_flops.get("tf32", captured) if dtype == "float32" else captured
        fp16, bf16 = spec.flops_for("float16"), spec.flops_for("bfloat16")
        fp8 = spec.peak_flops.get("float8", bf16)
        matmul.append([captured, tf32, fp16, bf16, bf16, fp8, fp16])
        conv.append([tf32, tf32, fp16, bf16, bf16, bf16, fp16])
        attention.append([captured, tf32, fp16, bf16, bf16, bf16, fp16])
        sustained = spec.sustained_matmul or 1.0
        tensor = spec.matmul_efficiency * sustained
        vector = (spec.fp32_matmul_efficiency or spec.matmul_efficiency) * sustained
        plain = dtype == "float32"
        fp32_matmul = vector if plain else tensor
        tf32_matmul = tensor if "tf32" in spec.peak_flops or not plain else vector
        fp8_matmul = (spec.fp8_matmul_efficiency or spec.matmul_efficiency) * sustained
        matmul_eff.append([fp32_matmul, tf32_matmul, tensor, tensor, tensor, fp8_matmul, tensor])
        conv_eff.append(
            [spec.conv_efficiency or e for e in (tf32_matmul, tf32_matmul, tensor, tensor, tensor, tensor, tensor)]
        )
        forward = spec.attention_efficiency or spec.matmul_efficiency * sustained
        backward = spec.attention_backward_efficiency or spec.attention_efficiency or spec.matmul_efficiency * sustained
        attention_eff.append([fp32_matmul, tf32_matmul, forward, forward, forward, forward, forward])
        attention_bwd.append([fp32_matmul, tf32_matmul, backward, backward, backward, backward, backward])
    shape = (len(specs), PRECISIONS)
    return Peaks(
        matmul=np.array(matmul, dtype=float).reshape(shape),
        conv=np.array(conv, dtype=float).reshape(shape),
        attention=np.array(attention, dtype=float).reshape(shape),
        fp8=np.array(["float8" in spec.peak_flops for spec in specs], dtype=bool),
        matmul_efficiency=np.array(matmul_eff, dtype=float).reshape(shape),
        conv_efficiency=np.array(conv_eff, dtype=float).reshape(shape),
        attention_efficiency=np.array(attention_eff, dtype=float).reshape(shape),
        attention_backward_efficiency=np.array(attention_bwd, dtype=float).reshape(shape),
    )
