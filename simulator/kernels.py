"""A layer's work as the kernels a GPU runs it in.

On a CPU a layer is one roofline (`simulator.compute`). On a GPU its ops are separate kernels that run
one after another, so their times add (Williams et al. 2009's roofline holds per kernel, not per module):

    time = max(GEMM FLOPs / (peak · efficiency · waves), arithmetic kernels' bytes / bandwidth)
         + element-wise bytes / bandwidth
         + fused attention

- GEMMs reach the kind's `matmul_efficiency` of the precision's peak (`fp32_matmul_efficiency` for IEEE
  fp32 on CUDA cores, `fp8_matmul_efficiency` for scaled fp8) at the clock the board's power limit holds
  (`sustained_matmul`: a burst figure times MSMF / MAMF, applied in `simulator.precision.peaks`; attention
  is not slowed by it), times the wave utilisation of their output tiles over the SMs: a GEMM whose
  M x N output is `t` tiles of 128 x 128 runs in ceil(t / SMs) waves, and the last wave's idle SMs and
  the tiles' padding are lost (NVIDIA, Matrix Multiplication Background User's Guide, "Tile
  Quantization", "Wave Quantization"; cuBLAS's common half-precision tile is 128 x 128). M, N and K come
  from the layer's FLOPs, its output and its weight (`gemm_dims`); tensor parallelism narrows N
  (column-parallel) or K (row-parallel), micro-batches and context parallelism shorten M. Backward's two
  GEMMs (dX: M x K, dW: N x K) take the harmonic mean of their utilisations.
- Element-wise and normalization kernels stream `Layer.elementwise_bytes` (captured per layer) at the
  kind's element-wise (or norm) efficiency of the memory bandwidth; under `torch.compile` each chain of
  them between two arithmetic kernels is one kernel and moves `Layer.fused_elementwise_bytes`. Eager
  under `amp-*` they move `Layer.autocast_elementwise_bytes`: half-precision tensors except those
  autocast keeps in fp32 (softmax, norms, `pow`, what those feed), and the casts between.
- A fused attention call (`Layer.attention`, `scaled_dot_product_attention`) runs as one
  FlashAttention-style kernel: its forward FLOPs (half of them when causal: the tiles above the
  diagonal are skipped) at the kind's `attention_efficiency` of the half-precision peak, its backward
  at 2.5 times those FLOPs (it recomputes the scores: Dao 2023) at `attention_backward_efficiency`,
  each at least its q, k, v and output bytes through memory. What capture's decomposition of the call
  moved (`FusedAttention.traced_bytes`: the s x s passes of the math path) is not priced.

- Under `fp8` each weighted GEMM scales its operands per tensor at run time (torchao's tensorwise float8
  training): a pass that finds the operand's absolute maximum, then a cast to fp8, for the input and
  the weight in forward and the output's gradient in backward, whose two GEMMs also take transposed
  fp8 copies of the input and of that gradient (`fp8_scaling_bytes`). Compiled, the maximum fuses into
  the cast's pass.

- A 3 x 3 stride-1 convolution in IEEE fp32 (CUDA cores: fp32 on a GPU without TF32) runs cuDNN's fused
  Winograd kernel F(2 x 2, 3 x 3), forward and for its input gradient: 16 multiplies of transformed tiles
  make four outputs where the direct method takes 36 (Lavin & Gray 2016, "Fast Algorithms for
  Convolutional Neural Networks", section 4), so those passes do `WINOGRAD_MULTIPLY_SHARE` of the FLOPs the
  graph counts; the transforms stay in registers. The weight gradient's Winograd is cuDNN's unfused kind,
  which stages its transforms through memory, and is not counted on.
- A convolution on tensor cores (half precision, or TF32 where the kind has it) of PyTorch's default NCHW
  tensors pays cuDNN's transposes to and from NHWC: its traffic twice more (`compute.NCHW_TRANSPOSE_PASSES`).
- Under `amp-*` autocast casts every weighted layer's fp32 weight to half precision in each micro-batch's
  forward (`compute.AUTOCAST_CAST_BYTES`: 4 read + 2 written per weight element).

Graphs captured before these fields existed have no element-wise split and no attention record: their
layers price as one roofline, as on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from stratagem.ir import Layer, LayerKind, ModelGraph, Variable

TILE = 128
"""Side of the output tile a half-precision cuBLAS GEMM computes per thread block (the guide's 128 x 128)."""
FLASH_BACKWARD_FLOPS = 2.5
"""A fused attention backward's FLOPs per forward FLOP: five matmuls to the forward's two (Dao 2023)."""
K_STEP = 32
"""Depth of one main-loop step of a half-precision tile (32 along K): the least a split-K part can take."""
CAUSAL_SHARE = 0.5
"""Share of the score matrix a causal fused kernel computes."""
WINOGRAD_MULTIPLY_SHARE = 16.0 / 36.0
"""Multiplies of Winograd's F(2 x 2, 3 x 3) per multiply of the direct 3 x 3 convolution: a 4 x 4 tile
of transformed input times the transformed filter, element-wise, gives a 2 x 2 output tile (Lavin & Gray 2016)."""


@dataclass(frozen=True)
class KernelArrays:
    """Per layer l: the kernel-level figures capture recorded (zeros where it did not)."""

    arithmetic_bytes: np.ndarray
    """[L] bytes of the matmul, convolution and lookup kernels."""
    elementwise_bytes: np.ndarray
    """[L] bytes of the element-wise and normalization kernels, eager."""
    fused_bytes: np.ndarray
    """[L] the same with each chain fused (the eager figure where capture recorded none)."""
    autocast_bytes: np.ndarray
    """[L] the eager kernels' bytes under autocast, absolute; NaN where capture recorded none."""
    attention_flops: np.ndarray
    """[L] forward FLOPs of fused attention calls over the full score matrix."""
    attention_traced_bytes: np.ndarray
    """[L] bytes the traced decomposition of those calls moved (part of `bytes_moved`)."""
    attention_io_bytes: np.ndarray
    """[L] q, k, v and output bytes of those calls."""
    attention_causal: np.ndarray
    """[L] whether the calls are causal."""
    gemm: np.ndarray
    """[L, 3] M, N, K of a layer's GEMM (a matmul or convolution with a weight); 0 where unknown."""
    winograd: np.ndarray
    """[L] 3 x 3 stride-1 convolutions, which cuDNN runs as Winograd in IEEE fp32 (`winograd_eligible`)."""
    split: bool
    """Whether capture recorded the split (else GPU layers price as one roofline each)."""


def kernel_arrays(graph: ModelGraph) -> KernelArrays:
    layers = graph.layers
    elementwise = np.array([layer.elementwise_bytes for layer in layers], dtype=float)
    fused = np.array(
        [
            layer.elementwise_bytes if layer.fused_elementwise_bytes is None else layer.fused_elementwise_bytes
            for layer in layers
        ],
        dtype=float,
    )
    calls = [layer.attention for layer in layers]
    variables = graph.variables_by_name()
    outputs = {layer.name: layer.output_bytes for layer in layers}
    return KernelArrays(
        arithmetic_bytes=np.array(
            [
                layer.bytes_moved - layer.elementwise_bytes - (layer.attention.traced_bytes if layer.attention else 0.0)
                if layer.arithmetic_bytes is None
                else layer.arithmetic_bytes
                for layer in layers
            ],
            dtype=float,
        ),
        elementwise_bytes=elementwise,
        fused_bytes=fused,
        autocast_bytes=np.array(
            [
                math.nan if layer.autocast_elementwise_bytes is None else layer.autocast_elementwise_bytes
                for layer in layers
            ],
            dtype=float,
        ),
        attention_flops=np.array([c.flops if c else 0.0 for c in calls], dtype=float),
        attention_traced_bytes=np.array([c.traced_bytes if c else 0.0 for c in calls], dtype=float),
        attention_io_bytes=np.array([c.io_bytes if c else 0.0 for c in calls], dtype=float),
        attention_causal=np.array([bool(c and c.causal) for c in calls], dtype=bool),
        gemm=np.array([gemm_dims(graph, i, variables) for i in range(len(layers))], dtype=float).reshape(
            len(layers), 3
        ),
        winograd=np.array([winograd_eligible(layer, variables, outputs) for layer in layers], dtype=bool),
        split=any(layer.arithmetic_bytes is not None for layer in layers),
    )


FP8_CAST_BYTES = 5.0
"""Bytes per element of a bf16 operand's dynamic fp8 scaling: read for its maximum (2), read again to cast
(2), write the fp8 copy (1)."""
FP8_FUSED_CAST_BYTES = 3.0
"""The same compiled: the maximum and the cast read the operand once between them (2), then write (1)."""
FP8_TRANSPOSE_BYTES = 2.0
"""Bytes per element of a transposed fp8 copy (read 1, write 1)."""


def fp8_scaling_bytes(m: np.ndarray, n: np.ndarray, k: np.ndarray, *, compiled: bool) -> tuple[np.ndarray, np.ndarray]:
    """Bytes the fp8 scaling of one GEMM moves in forward (input M x K, weight N x K) and backward (output
    gradient M x N, transposed copies of the input and of that gradient)."""
    cast = FP8_FUSED_CAST_BYTES if compiled else FP8_CAST_BYTES
    forward = cast * (m * k + n * k)
    backward = cast * m * n + FP8_TRANSPOSE_BYTES * (m * k + m * n)
    return forward, backward


def gemm_dims(graph: ModelGraph, index: int, variables: Mapping[str, Variable]) -> tuple[float, float, float]:
    """(M, N, K) of a matmul or convolution layer's GEMM (a convolution as its implicit GEMM), from
    `2·M·N·K` = its forward FLOPs, `M·N` = its output's elements and `N·K` = its weight's (the largest
    variable of rank 2 or more); zeros when any is missing."""
    layer = graph.layers[index]
    if layer.kind not in (LayerKind.matmul, LayerKind.conv) or layer.attention is not None:
        return 0.0, 0.0, 0.0
    weights = [variables[name].numel for name in layer.variables if len(variables[name].shape) >= 2]
    outputs = layer.output_bytes / graph.dtype.itemsize
    if not weights or outputs < 1 or layer.fwd_flops <= 0:
        return 0.0, 0.0, 0.0
    k = layer.fwd_flops / (2.0 * outputs)
    n = max(weights) / k if k > 0 else 0.0
    m = outputs / n if n > 0 else 0.0
    if min(m, n, k) < 1:
        return 0.0, 0.0, 0.0
    return m, n, k


def winograd_eligible(layer: Layer, variables: Mapping[str, Variable], outputs: Mapping[str, float]) -> bool:
    """A convolution with one 3 x 3 filter bank whose output keeps its input's spatial size (stride 1): the
    elements per channel of the one layer it reads equal its own. Grouped filters fail the check (their
    weight's second dimension is not the input's channels), as they fail cuDNN's Winograd."""
    if layer.kind != LayerKind.conv or len(layer.inputs) != 1 or layer.inputs[0] not in outputs:
        return False
    filters = [variables[name].shape for name in layer.variables if len(variables[name].shape) == 4]
    if len(filters) != 1 or filters[0][2:] != [3, 3]:
        return False
    c_out, c_in = filters[0][0], filters[0][1]
    per_channel_in, per_channel_out = outputs[layer.inputs[0]] / c_in, layer.output_bytes / c_out
    return per_channel_out > 0 and math.isclose(per_channel_in, per_channel_out, rel_tol=1e-9)


def wave_utilisation(rows: np.ndarray, cols: np.ndarray, depth: np.ndarray, sms: float) -> np.ndarray:
    """Useful share of the tile-waves a `rows x cols` GEMM output of reduction `depth` takes on `sms` SMs
    (1 where unknown). Tiles are padded to 128 x 128; an output of fewer tiles than SMs is split along
    K (cuBLAS's split-K) into as many parts as fill the SMs, each at least one main-loop step deep."""
    if not sms or not math.isfinite(sms):
        return np.ones_like(rows)
    known = (rows >= 1) & (cols >= 1) & (depth >= 1)
    r, c, d = np.maximum(rows, 1.0), np.maximum(cols, 1.0), np.maximum(depth, 1.0)
    tiles = np.ceil(r / TILE) * np.ceil(c / TILE)
    splits = np.maximum(np.minimum(np.floor(sms / tiles), np.floor(d / K_STEP)), 1.0)
    blocks = tiles * splits
    padding = r * c / (tiles * TILE * TILE)
    waves = blocks / (np.ceil(blocks / sms) * sms)
    return np.where(known, padding * waves, 1.0)
