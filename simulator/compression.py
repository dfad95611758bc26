"""Gradient compression: the bytes that travel and the compute it costs. Compression never adds bytes:
every formula is capped at the uncompressed size (a 1-D bias under PowerSGD travels as is, as in
PyTorch's PowerSGD hook).

    none          n
    fp16 / bf16   n · 2 / itemsize
    PowerSGD(r)   (rows + cols) · r · itemsize           values of P and Q (rank r)
    top-k(ρ)      ρ · numel · (itemsize + 4)             values and int32 indices

The compute is what the runtime's reducers do beyond an uncompressed bucket (`stratagem.runtime.
compression`, error feedback on, its default), in bytes b of the gradient streamed through memory:

    fp16 / bf16   casts down, back for the error, back after the all-reduce: 4.5 b at the cast rate;
                  adding the error, scaling, subtracting: 8 b; copying the result back: 2 b
    PowerSGD(r)   P = M·Q, Q = Mᵀ·P, M ≈ P·Qᵀ: 6·rows·cols·r FLOPs, and as rank-r products they stream M
                  from memory: 3 b; adding and keeping the error: 6 b; all 9 b at the low-rank rate;
                  copying the result back: 2 b
    top-k(ρ)      selecting the largest entries: b at the select rate; |g|, adding the error, keeping
                  it, scattering the gathered entries and scaling: 10 b; copying the result back: 2 b

Copying back is the bucket writing its averaged gradient into each parameter's `.grad` (read the
result, write the gradient: `COPY_BACK_PASSES`). An uncompressed bucket pays it inside the link's
fitted bandwidth, since calibration times buckets with their copies; a compressed bucket's wire
carries a fraction of the bytes, so its copy back, at full size, is priced here (a vector under
PowerSGD travels uncompressed with P and is covered by the link).

Plain bytes go at the device's `stream_efficiency` (an add or a copy over a bucket, about a copy's
speed), casts at its `cast_efficiency`, selection at its `select_efficiency` and PowerSGD's passes at
its `lowrank_efficiency` of memory bandwidth (on a CPU the last three are far below a copy's rate,
which is what makes compression a loss there). The element-wise rate is an activation's (GELU), which
on a CPU is under half a copy's, so it would overprice these passes.

Each formula is `unit[kind, v] · scale` with scale = r or ρ for PowerSGD and top-k (1 otherwise), so
the per-variable units are tabulated once per graph (`CompressionTables`) and a batch costs a gather.
Under tensor parallelism every figure is per slice (divided by the tensor degree).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

INDEX_BYTES = 4.0
COPY_BACK_PASSES = 2.0
"""Bytes streamed per gradient byte to write a compressed bucket's result into `.grad`: read and write."""
HALF_BYTES = 2.0
SCALED = np.array([False, False, False, True, True])
"""Compressor kinds whose parameter (rank, ratio) multiplies the unit."""


@dataclass(frozen=True)
class VariableFigures:
    """Per-variable sizes the compression formulas read, in one order (graph order or ready order)."""

    nbytes: np.ndarray
    numel: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    itemsize: np.ndarray

    def take(self, order: np.ndarray) -> VariableFigures:
        return VariableFigures(*(getattr(self, f)[order] for f in ("nbytes", "numel", "rows", "cols", "itemsize")))


@dataclass(frozen=True)
class CompressionTables:
    full: np.ndarray
    """[V] uncompressed bytes (the cap)."""
    unit: np.ndarray
    """[5, V] wire bytes per unit of the compressor's parameter (per variable for unscaled kinds)."""
    byte_passes: np.ndarray
    """[5, V] bytes streamed through memory by plain passes (the stream rate) to compress and decompress."""
    cast_bytes: np.ndarray
    """[5, V] bytes streamed through dtype conversions."""
    select_bytes: np.ndarray
    """[5, V] bytes top-k selection consumes."""
    lowrank_bytes: np.ndarray
    """[5, V] bytes PowerSGD streams through its products and error feedback."""
    flops: np.ndarray
    """[5, V] FLOPs per unit of the parameter (PowerSGD's projections)."""

    def with_lowrank_scale(self, scale: np.ndarray) -> CompressionTables:
        """PowerSGD's passes over a matrix beyond the caches cost more per byte: [V] `scale` is the
        device's `1 + bytes / lowrank_knee_bytes`."""
        return replace(self, lowrank_bytes=self.lowrank_bytes * scale)

    def with_streaming_scale(self, scale: np.ndarray) -> CompressionTables:
        """Passes over a tensor larger than the caches cost more per byte, as the optimizer's do: [V]
        `scale` (the device's `1 + bytes / optimizer_knee_bytes`) multiplies the streamed and cast bytes.
        Selection keeps its rate (its probe already runs on a tensor beyond the caches); PowerSGD has a
        law of its own (`with_lowrank_scale`)."""
        return replace(self, byte_passes=self.byte_passes * scale, cast_bytes=self.cast_bytes * scale)


def tables(var: VariableFigures) -> CompressionTables:
    half = var.nbytes * np.minimum(1.0, HALF_BYTES / var.itemsize)
    unit = np.stack(
        [var.nbytes, half, half, (var.rows + var.cols) * var.itemsize, var.numel * (var.itemsize + INDEX_BYTES)]
    )
    zero = np.zeros_like(var.nbytes)
    b = var.nbytes
    matrix = (var.rows > 1) & (var.cols > 1)
    return CompressionTables(
        full=b,
        unit=unit,
        byte_passes=np.stack([zero, 8 * b, 8 * b, zero, 10 * b])
        + COPY_BACK_PASSES * np.stack([zero, b, b, np.where(matrix, b, zero), b]),
        cast_bytes=np.stack([zero, 4.5 * b, 4.5 * b, zero, zero]),
        select_bytes=np.stack([zero, zero, zero, zero, b]),
        lowrank_bytes=np.stack([zero, zero, zero, np.where(matrix, 9 * b, zero), zero]),
        flops=np.stack([zero, zero, zero, np.where(matrix, 6.0 * var.rows * var.cols, zero), zero]),
    )


def _scale(compressor: np.ndarray, param: np.ndarray) -> np.ndarray:
    return np.where(SCALED.take(compressor.astype(np.intp)), param, 1.0)


def wire_bytes(
    t: CompressionTables, compressor: np.ndarray, param: np.ndarray, var: np.ndarray, tensor_div: np.ndarray
) -> np.ndarray:
    """Bytes on the wire for (compressor, parameter, variable index) triples, per tensor slice."""
    V = t.full.size
    unit = t.unit.ravel().take(compressor.astype(np.intp) * V + var)
    return np.minimum(unit * _scale(compressor, param), t.full.take(var)) / tensor_div


@dataclass(frozen=True)
class Rates:
    """A device's rates for compression work, per entry: bytes/s streamed, converted, selected, through
    PowerSGD's passes; FLOP/s."""

    byte: np.ndarray
    cast: np.ndarray
    select: np.ndarray
    lowrank: np.ndarray
    flop: np.ndarray


def compute_seconds(
    t: CompressionTables,
    compressor: np.ndarray,
    param: np.ndarray,
    var: np.ndarray,
    tensor_div: np.ndarray,
    rates: Rates,
) -> np.ndarray:
    """Seconds of device work to compress and decompress."""
    V = t.full.size
    flat = compressor.astype(np.intp) * V + var
    seconds = (
        t.byte_passes.ravel().take(flat) / rates.byte
        + t.cast_bytes.ravel().take(flat) / rates.cast
        + t.select_bytes.ravel().take(flat) / rates.select
        + t.lowrank_bytes.ravel().take(flat) / rates.lowrank
        + t.flops.ravel().take(flat) * param / rates.flop
    )
    return seconds / tensor_div
