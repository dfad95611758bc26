"""Gradient compression: the bytes that travel and the compute it costs. Compression never adds bytes:
every formula is capped at the uncompressed size (a 1-D bias under PowerSGD travels as is, as in
PyTorch's PowerSGD hook).

    none          n
    fp16 / bf16   n · 2 / itemsize                      cast down and back up: 2 passes over the gradient
    PowerSGD(r)   (rows + cols) · r · itemsize           P = M·Q and Q = Mᵀ·P: 4·rows·cols·r FLOPs, plus a pass
    top-k(ρ)      ρ · numel · (itemsize + 4)             values and int32 indices; selection ≈ 2 passes

Each formula is `unit[kind, v] · scale` with scale = r or ρ for PowerSGD and top-k (1 otherwise), so
the per-variable units are tabulated once per graph (`CompressionTables`) and a batch costs a gather.
Under tensor parallelism every figure is per slice (divided by the tensor degree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INDEX_BYTES = 4.0
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
    """[5, V] bytes streamed through memory to compress and decompress."""
    flops: np.ndarray
    """[5, V] FLOPs per unit of the parameter (PowerSGD's projections)."""


def tables(var: VariableFigures) -> CompressionTables:
    half = var.nbytes * np.minimum(1.0, HALF_BYTES / var.itemsize)
    unit = np.stack([var.nbytes, half, half, (var.rows + var.cols) * var.itemsize, var.numel * (var.itemsize + INDEX_BYTES)])
    zero = np.zeros_like(var.nbytes)
    byte_passes = np.stack([zero, 2 * var.nbytes, 2 * var.nbytes, var.nbytes, 2 * var.nbytes])
    flops = np.stack([zero, zero, zero, 4.0 * var.rows * var.cols, zero])
    return CompressionTables(full=var.nbytes, unit=unit, byte_passes=byte_passes, flops=flops)


def _scale(compressor: np.ndarray, param: np.ndarray) -> np.ndarray:
    return np.where(SCALED.take(compressor.astype(np.intp)), param, 1.0)


def wire_bytes(t: CompressionTables, compressor: np.ndarray, param: np.ndarray, var: np.ndarray, tensor_div: np.ndarray) -> np.ndarray:
    """Bytes on the wire for (compressor, parameter, variable index) triples, per tensor slice."""
    V = t.full.size
    unit = t.unit.ravel().take(compressor.astype(np.intp) * V + var)
    return np.minimum(unit * _scale(compressor, param), t.full.take(var)) / tensor_div


def compute_seconds(
    t: CompressionTables, compressor: np.ndarray, param: np.ndarray, var: np.ndarray, tensor_div: np.ndarray,
    byte_rate: np.ndarray, flop_rate: np.ndarray,
) -> np.ndarray:
    """Seconds of device work to compress and decompress; `byte_rate`/`flop_rate` are the device's
    streaming bytes/s and matmul FLOP/s."""
    V = t.full.size
    flat = compressor.astype(np.intp) * V + var
    return (t.byte_passes.ravel().take(flat) / byte_rate + t.flops.ravel().take(flat) * param / flop_rate) / tensor_div
