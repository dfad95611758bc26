"""Per-layer compute time: a roofline with launch overhead.

    time = max(flops / (peak · efficiency), bytes / (memory bandwidth · elementwise efficiency)) + launch

Matmul and attention layers compute at the device kind's `matmul_efficiency` of peak, convolutions
at its `conv_efficiency` (the same unless calibration measured otherwise), other layers at its
`elementwise_efficiency`; the memory term uses `elementwise_efficiency` of the
memory bandwidth (what streaming kernels reach), `norm_efficiency` for normalization layers. Backward reads and
writes about twice what forward does (input and weight gradients), so its memory term uses
2 x `bytes_moved`. An embedding lookup is a gather: it reads the rows looked up (what capture counts,
not the table) and writes them out, at the kind's `stream_efficiency`, a copy's rate; its backward
has no input gradient, only the rows' gradient, so it moves 1 x `bytes_moved`. A table with dense
gradients also writes a table-sized gradient in backward (zeros, then the rows added in), at the same
rate, in every micro-batch whatever its size. Tensor parallelism divides the work of split layers,
and of element-wise layers on sharded activations (a GELU between a column- and a row-parallel
matmul), by the tensor degree (launches stay); a micro-batch does 1/m of the work and pays every
launch again.

The step's knobs (`Knobs`) change this per layer: the precision picks the peak of matmuls,
convolutions and attention cores and scales every byte (`simulator.precision`); context parallelism
gives each rank 1/c of every layer's tokens (ring attention with causal load balancing gives each rank
1/c of the attention work too: Liu et al. 2023; torchtitan's `context_parallel` shards the sequence
round-robin for that); sequence parallelism gives each tensor rank 1/t of the sequence in the layers
tensor parallelism leaves whole (norms, dropout, residual adds: Korthikanti et al. 2022).

On a GPU the host only queues kernels, and the device runs them while the host queues the next
layer's: a layer's kernels start once the host has issued them and the device has finished the layers
before. A step is the two-stage pipeline of the forward layers, then the backward layers in reverse,
each a host stage (`launch`) and a device stage (the roofline): a model of small layers is bound by
its launches, one of large layers by its arithmetic, and neither pays both (`queued_ahead`). On a
CPU the same cores dispatch and compute, so the two add.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.context import SimContext
from simulator.encoding import Precision
from simulator.kernels import (
    CAUSAL_SHARE,
    FLASH_BACKWARD_FLOPS,
    WINOGRAD_MULTIPLY_SHARE,
    fp8_scaling_bytes,
    wave_utilisation,
)

NCHW_TRANSPOSE_PASSES = 2.0
"""A tensor-core convolution of NCHW tensors (PyTorch's default memory format) reads and writes its input
and output once more to transpose them to and from the NHWC layout the kernels need (NVIDIA, Convolutional
Layers User's Guide, "Tensor Layouts In Memory: NCHW vs NHWC"): twice the convolution's own traffic."""
AUTOCAST = (Precision.AMP_FP16, Precision.AMP_BF16)
AUTOCAST_CAST_BYTES = 6.0
"""Bytes per weight element autocast moves in each micro-batch's forward: it reads the fp32 weight and
writes the half-precision copy the matmul (and its backward) uses."""
BACKWARD_BYTES_FACTOR = 2.0
"""Backward bytes moved relative to forward (gradients of inputs and of weights)."""


@dataclass(frozen=True)
class Knobs:
    """The step-wide knobs that change each layer's work (see the module docstring)."""

    precision: int = 0
    context_parallel: int = 1
    sequence_parallel: bool = False
    compile: bool = False
    """`torch.compile`: each chain of element-wise kernels runs fused (`simulator.kernels`)."""


PLAIN = Knobs()


def layer_times(
    context: SimContext, kind: int, tensor: int, micro_batches: int, knobs: Knobs = PLAIN
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of each layer for one micro-batch, on device kind `kind`; cached."""
    key = (kind, tensor, micro_batches) if knobs == PLAIN else (kind, tensor, micro_batches, knobs)
    cached = context._layer_time_cache.get(key)
    if cached is not None:
        return cached
    k = context.kinds
    p = knobs.precision
    efficiency = np.where(context.layer_matmul, k.peaks.matmul_efficiency[kind, p], k.elementwise_efficiency[kind])
    efficiency = np.where(context.layer_conv, k.peaks.conv_efficiency[kind, p], efficiency)
    peak = np.where(context.layer_matmul, k.peaks.matmul[kind, p], k.peak_flops[kind])
    peak = np.where(context.layer_conv, k.peaks.conv[kind, p], peak)
    peak = np.where(context.layer_attention, k.peaks.attention[kind, p], peak)
    flop_rate = peak * efficiency
    stream_rate = k.memory_bandwidth[kind] * k.stream_efficiency[kind]
    byte_rate = k.memory_bandwidth[kind] * np.where(
        context.layer_norm, k.norm_efficiency[kind], k.elementwise_efficiency[kind]
    )
    byte_rate = np.where(context.layer_embedding, stream_rate, byte_rate)
    divided = context.layer_tensor_split | context.layer_sharded_input
    if knobs.sequence_parallel:
        divided = divided | ~context.layer_embedding
    share = np.where(divided, 1.0 / tensor, 1.0) / micro_batches
    if knobs.context_parallel > 1:
        share = share / knobs.context_parallel
    moved = context.bytes_moved
    fill_bytes = context.layer_grad_fill_bytes
    if p:
        moved = moved * context.var_precision.activation[p]
        fill_bytes = fill_bytes * context.var_precision.graph_gradient[p]
    launch = k.launch_overhead_s[kind]
    fill = fill_bytes * np.where(context.layer_tensor_split, 1.0 / tensor, 1.0) / stream_rate
    if k.specs[kind].is_gpu and context.kernels.split:
        fwd, bwd = gpu_kernels(context, kind, tensor, micro_batches, knobs, share=share, byte_rate=byte_rate)
        if knobs.compile:
            launches = np.where(context.compile_fused, 0.0, launch)
            result = queued_ahead(fwd, bwd + fill, launches)
        else:
            result = queued_ahead(fwd, bwd + fill, launch)
        context._layer_time_cache[key] = result
        return result
    fwd = np.maximum(context.fwd_flops * share / flop_rate, moved * share / byte_rate)
    bwd_bytes = np.where(context.layer_embedding, 1.0, BACKWARD_BYTES_FACTOR) * moved * share / byte_rate
    bwd = np.maximum(context.bwd_flops * share / flop_rate, bwd_bytes) + fill
    result = queued_ahead(fwd, bwd, launch) if k.specs[kind].is_gpu else (fwd + launch, bwd + launch)
    context._layer_time_cache[key] = result
    return result


def gpu_kernels(
    context: SimContext,
    kind: int,
    tensor: int,
    micro_batches: int,
    knobs: Knobs,
    *,
    share: np.ndarray,
    byte_rate: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of each layer's kernels on a GPU, one after another
    (`simulator.kernels`), before launches and the dense-gradient fill."""
    k, kernels, p = context.kinds, context.kernels, knobs.precision
    peaks = k.peaks
    peak = np.where(context.layer_matmul, peaks.matmul[kind, p], k.peak_flops[kind])
    peak = np.where(context.layer_conv, peaks.conv[kind, p], peak)
    peak = np.where(context.layer_attention, peaks.attention[kind, p], peak)
    efficiency = np.where(context.layer_matmul, peaks.matmul_efficiency[kind, p], k.elementwise_efficiency[kind])
    efficiency = np.where(context.layer_conv, peaks.conv_efficiency[kind, p], efficiency)
    forward_waves, backward_waves, dims = _waves(context, kind, tensor, micro_batches, knobs)
    scale = float(context.var_precision.activation[p]) if p else 1.0
    elementwise = (kernels.fused_bytes if knobs.compile else kernels.elementwise_bytes) * scale
    if p in AUTOCAST and not knobs.compile:
        elementwise = np.where(np.isnan(kernels.autocast_bytes), elementwise, kernels.autocast_bytes)
    arithmetic = np.maximum(kernels.arithmetic_bytes, 0.0) * scale
    streamed = k.memory_bandwidth[kind] * np.where(
        context.layer_norm, k.norm_efficiency[kind], k.elementwise_efficiency[kind]
    )
    backward_bytes = np.where(context.layer_embedding, 1.0, BACKWARD_BYTES_FACTOR)
    attention = kernels.attention_flops
    rate = peak * efficiency
    fwd_flops, bwd_flops = context.fwd_flops, context.bwd_flops
    if kernels.winograd.any() and peaks.conv[kind, p] <= k.specs[kind].flops_for("float32"):
        # IEEE fp32 convolutions: Winograd forward and for the input gradient (half of backward's FLOPs).
        fwd_flops = np.where(kernels.winograd, fwd_flops * WINOGRAD_MULTIPLY_SHARE, fwd_flops)
        bwd_flops = np.where(kernels.winograd, bwd_flops * (1.0 + WINOGRAD_MULTIPLY_SHARE) / 2.0, bwd_flops)
    fwd = np.maximum((fwd_flops - attention) * share / (rate * forward_waves), arithmetic * share / byte_rate)
    bwd = np.maximum(
        np.maximum(bwd_flops - 2.0 * attention, 0.0) * share / (rate * backward_waves),
        backward_bytes * arithmetic * share / byte_rate,
    )
    fwd = fwd + elementwise * share / streamed
    bwd = bwd + backward_bytes * elementwise * share / streamed
    if context.layer_conv.any() and peaks.conv[kind, p] > k.specs[kind].flops_for("float32"):
        # Tensor-core convolutions of PyTorch's default NCHW tensors: cuDNN transposes input and output.
        transposes = NCHW_TRANSPOSE_PASSES * arithmetic * share * context.layer_conv / streamed
        fwd, bwd = fwd + transposes, bwd + backward_bytes * transposes
    if p in AUTOCAST and dims is not None:
        fwd = fwd + np.where(context.layer_weight_grad, AUTOCAST_CAST_BYTES * dims[1] * dims[2], 0.0) / streamed
    if p == Precision.FP8 and dims is not None:
        cast_fwd, cast_bwd = fp8_scaling_bytes(*dims, compiled=knobs.compile)
        weighted = context.layer_weight_grad
        fwd = fwd + np.where(weighted, cast_fwd, 0.0) / streamed
        bwd = bwd + np.where(weighted, cast_bwd, 0.0) / streamed
    if attention.any():
        work = attention * np.where(kernels.attention_causal, CAUSAL_SHARE, 1.0) * share
        io = kernels.attention_io_bytes * scale * share / (k.memory_bandwidth[kind] * k.stream_efficiency[kind])
        half = peaks.attention[kind, p]
        fwd = fwd + np.where(attention > 0, np.maximum(work / (half * peaks.attention_efficiency[kind, p]), io), 0.0)
        bwd = bwd + np.where(
            attention > 0,
            np.maximum(
                FLASH_BACKWARD_FLOPS * work / (half * peaks.attention_backward_efficiency[kind, p]),
                BACKWARD_BYTES_FACTOR * io,
            ),
            0.0,
        )
    return fwd, bwd


def _waves(
    context: SimContext, kind: int, tensor: int, micro_batches: int, knobs: Knobs
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """[L] wave utilisation of each layer's forward GEMM and of its backward pair (1 where unknown), and
    the GEMMs' M, N, K on one rank for one micro-batch (None where the graph records none)."""
    sms = context.kinds.specs[kind].sm_count
    gemm = context.kernels.gemm
    if not gemm.any():
        ones = np.ones(context.num_layers)
        return ones, ones, None
    split = context.layer_tensor_split & context.layer_matmul
    row = context.layer_tp_allreduce
    m = gemm[:, 0] / (micro_batches * knobs.context_parallel)
    n = gemm[:, 1] / np.where(split & ~row, tensor, 1)
    depth = gemm[:, 2] / np.where(split & row, tensor, 1)
    if not sms:
        ones = np.ones(context.num_layers)
        return ones, ones, (m, n, depth)
    forward = wave_utilisation(m, n, depth, sms)
    inputs = wave_utilisation(m, depth, n, sms)
    weights = wave_utilisation(n, depth, m, sms)
    return forward, 2.0 / (1.0 / inputs + 1.0 / weights), (m, n, depth)


def queued_ahead(fwd: np.ndarray, bwd: np.ndarray, launch: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of each layer when a host issuing each layer's kernels in `launch`
    seconds (one figure, or one per layer) runs ahead of the device that runs them (`fwd`, `bwd`): each
    layer's share of the time until its kernels are done. The device finishes the i-th pass of the
    sequence (forward in order, backward in reverse) at `max over j <= i of (issued_j + device work of
    passes j..i)`."""
    device = np.concatenate([fwd, bwd[::-1]])
    if isinstance(launch, np.ndarray) and launch.ndim:
        issued = np.cumsum(np.concatenate([launch, launch[::-1]]))
    else:
        issued = launch * np.arange(1, device.size + 1)
    work = np.cumsum(device)
    done = np.maximum.accumulate(issued - (work - device)) + work
    each = np.diff(done, prepend=0.0)
    return each[: fwd.size], each[fwd.size :][::-1]


def update_seconds(context: SimContext, kind: np.ndarray, update_bytes: np.ndarray, tensors: np.ndarray) -> np.ndarray:
    """Optimizer update: streaming param, grad and state through memory at the kind's optimizer
    efficiency, plus its per-tensor cost for each tensor stepped."""
    k = context.kinds
    return (
        update_bytes / (k.memory_bandwidth[kind] * k.optimizer_efficiency[kind]) + tensors * k.optimizer_tensor_s[kind]
    )
