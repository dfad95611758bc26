"""What the simulator knows about each trainable variable `v` (graph order), as arrays: its bytes on the
wire and in memory, when its gradient is ready, what its update and its sparse rows cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.compression import CompressionTables, VariableFigures, tables
from simulator.devices import UPDATE_PARAM_PASSES, UPDATE_STATE_PASSES, DeviceKinds
from simulator.layers import splits
from simulator.precision import PrecisionTable, precision_table
from stratagem.ir import ModelGraph

SPARSE_INDEX_BYTES = 8.0
"""A sparse gradient's row index is an int64, on the wire and in a coalesce."""
SPARSE_STEP_COALESCES: dict[str, float] = {"sgd": 1.0}
"""What a sparse optimizer step costs beyond its update passes, in coalesces of its rows, by optimizer.
Plain SGD sorts the rows and adds them into the parameter: one (measured 0.8-1.1 on tables of 32 to 256
floats). Others cost `ADAPTIVE_SPARSE_STEP_COALESCES`."""
ADAPTIVE_SPARSE_STEP_COALESCES = 2.0
"""Adagrad sorts the gradient's rows, adds their square into the state, gathers the state back at those
rows (another sort) and adds the step into the parameter. On DLRM's four tables these steps took 5.2 ms
alone on one rank, about two of the coalesces its block's calibration priced at 2.5 ms."""
COALESCE_PROBE_ROW_BYTES = 32 * 4 + SPARSE_INDEX_BYTES
"""A row of the calibration's coalesce probe (`stratagem.calibrate`, rows of 32 floats) and its index:
the bytes its rate is counted in."""


@dataclass(frozen=True)
class VariableArrays:
    """Per trainable variable v, in graph order."""

    variable_names: list[str]
    variable_index: dict[str, int]
    var_bytes: np.ndarray
    var_numel: np.ndarray
    var_rows: np.ndarray
    var_cols: np.ndarray
    var_itemsize: np.ndarray
    var_ps_bytes: np.ndarray
    """Bytes a PS push (or pull) of the variable moves: the rows looked up for sparse ones, capped by the table."""
    var_sparse: np.ndarray
    var_tensor_split: np.ndarray
    var_layer: np.ndarray
    """The layer whose backward makes the gradient ready (the earliest user in forward order)."""
    var_shape: np.ndarray
    """[V, R] the shape padded with 1s, for partition checks."""
    var_update_bytes: np.ndarray
    """[V] bytes an update of the variable streams (3 x parameter + 2 x state: param and state in and
    out, grad in), times the device's large-tensor factor (`DeviceSpec.optimizer_knee_bytes`). A sparse
    variable's gradient holds only the rows looked up, and optimizers that take sparse gradients
    update only those rows, on a replica or on its server alike: its share is the touched rows'."""
    var_coalesce_bytes: np.ndarray
    """[V] bytes of the variable's touched rows, values and int64 index: what one rank's share of a row
    exchange carries (0 for dense variables)."""
    var_coalesce_work: np.ndarray
    """[V] what coalescing those rows costs, in bytes at the device's coalesce rate (`_coalesce_work`)."""
    ps_held_bytes: np.ndarray
    """[V] bytes a PS server holds for the variable (parameters and optimizer state)."""
    var_state_bytes: np.ndarray
    order: np.ndarray
    """Variables in the order their gradients become ready (backward order)."""
    ready_position: np.ndarray
    """[V] position of each variable in `order` (its rank in gradient-ready order)."""
    figures: VariableFigures
    compression: CompressionTables
    var_precision: PrecisionTable
    """Byte scales of activations, gradients and parameters under each precision."""
    update_per_variable: bool
    """A device kind's `optimizer_knee_bytes` (update cost depends on each tensor's size) or a sparse
    variable (only its touched rows update) makes updates differ from parameter and state bytes, so
    they are summed from `var_update_bytes`."""

    @property
    def num_variables(self) -> int:
        return len(self.variable_names)

    def var_axis_length(self, axis: np.ndarray) -> np.ndarray:
        """Length of `axis` for each variable ([N, V] axes in, [N, V] lengths out; 1 beyond the rank)."""
        clipped = np.clip(axis.astype(np.intp), 0, self.var_shape.shape[1] - 1)
        return np.take_along_axis(
            np.broadcast_to(self.var_shape, (*axis.shape, self.var_shape.shape[1])), clipped[..., None], axis=-1
        )[..., 0]


def variable_arrays(graph: ModelGraph, layer_index: dict[str, int], kinds: DeviceKinds) -> VariableArrays:
    layer_names = graph.variable_layers()
    trainable = graph.trainable_variables
    rank = max([len(v.shape) for v in trainable] + [1])
    shape = np.ones((len(trainable), rank), dtype=np.int64)
    for i, var in enumerate(trainable):
        shape[i, : len(var.shape)] = var.shape
    layer_of = np.array(
        [layer_index[layer_names[v.name]] if v.name in layer_names else 0 for v in trainable], dtype=np.intp
    )
    nbytes = np.array([v.nbytes for v in trainable], dtype=float)
    numel = np.array([v.numel for v in trainable], dtype=float)
    itemsize = np.array([v.dtype.itemsize for v in trainable], dtype=float)
    rows = np.array([v.shape[0] if v.shape else 1 for v in trainable], dtype=float)
    ps_bytes = np.array(
        [min(v.nbytes, (v.lookups_per_step or 0) * v.row_bytes) if v.sparse else v.nbytes for v in trainable],
        dtype=float,
    )
    split = np.array([bool(graph.layers) and splits(graph.layers[int(li)], graph) for li in layer_of], dtype=bool)
    state = numel * graph.optimizer.state_bytes_per_param
    sparse = np.array([v.sparse for v in trainable], dtype=bool)
    # Backward runs layers in reverse; a stable sort on -layer keeps graph order among a layer's variables.
    order = np.argsort(-layer_of, kind="stable")
    coalesce_bytes = np.where(sparse, ps_bytes * (1.0 + SPARSE_INDEX_BYTES * rows / nbytes), 0.0)
    coalesce_work = _coalesce_work(coalesce_bytes, nbytes / rows, kinds)
    update = (UPDATE_PARAM_PASSES * nbytes + UPDATE_STATE_PASSES * state) * ps_bytes / nbytes
    update = update * _update_scale(kinds, ps_bytes) + coalesce_work * _coalesce_in_update_bytes(
        kinds, graph.optimizer.kind
    )
    figures = VariableFigures(nbytes, numel, rows, numel / rows, itemsize)
    lowrank_knees = [spec.lowrank_knee_bytes for spec in kinds.specs if spec.lowrank_knee_bytes]
    compression = (
        tables(VariableFigures(nbytes, numel, rows, numel / rows, itemsize))
        .with_streaming_scale(_update_scale(kinds, nbytes))
        .with_lowrank_scale(_size_scale(lowrank_knees, nbytes))
    )
    names = [v.name for v in trainable]
    return VariableArrays(
        variable_names=names,
        variable_index={n: i for i, n in enumerate(names)},
        var_bytes=nbytes,
        var_numel=numel,
        var_rows=rows,
        var_cols=numel / rows,
        var_itemsize=itemsize,
        var_ps_bytes=ps_bytes,
        var_sparse=sparse,
        var_tensor_split=split,
        var_layer=layer_of,
        var_shape=shape,
        var_update_bytes=update,
        var_coalesce_bytes=coalesce_bytes,
        var_coalesce_work=coalesce_work,
        ps_held_bytes=nbytes + state,
        var_state_bytes=state,
        order=order,
        ready_position=np.argsort(order).astype(np.int32),
        figures=figures,
        compression=compression,
        var_precision=precision_table(float(graph.dtype.itemsize), itemsize),
        update_per_variable=any(spec.optimizer_knee_bytes for spec in kinds.specs) or bool(sparse.any()),
    )


def _coalesce_in_update_bytes(kinds: DeviceKinds, optimizer: str) -> float:
    """Update bytes that cost as much as a sparse optimizer step's work per coalesced byte of its rows
    (`SPARSE_STEP_COALESCES`), priced at the update's rate as `var_update_bytes` is; with several
    kinds, the largest ratio."""
    coalesces = SPARSE_STEP_COALESCES.get(optimizer, ADAPTIVE_SPARSE_STEP_COALESCES)
    return coalesces * float((kinds.optimizer_efficiency / kinds.coalesce_efficiency).max())


def _coalesce_work(nbytes: np.ndarray, row_bytes: np.ndarray, kinds: DeviceKinds) -> np.ndarray:
    """[V] bytes at the coalesce rate that coalescing each variable's touched rows (`nbytes` of values and
    indices) costs. A coalesce sorts one index per row and moves the row's values; on the probe's narrow
    rows the sort is most of the time, so wider rows pay their extra bytes at the element-wise rate, not
    the probe's (an embedding of 256 floats coalesced 4096 rows in 0.92 ms, rows of 32 in 0.34 ms).
    With several kinds, the largest share of a byte's cost (`coalesce / elementwise`)."""
    share = float(np.clip((kinds.coalesce_efficiency / kinds.elementwise_efficiency).max(), 0.0, 1.0))
    rows = nbytes / (row_bytes + SPARSE_INDEX_BYTES)
    return rows * (COALESCE_PROBE_ROW_BYTES * (1.0 - share) + (row_bytes + SPARSE_INDEX_BYTES) * share)


def _update_scale(kinds: DeviceKinds, nbytes: np.ndarray) -> np.ndarray:
    """[V] how much more an update costs per byte for each variable than for a small tensor,
    `1 + bytes / optimizer_knee_bytes` (a sparse variable's server updates only the rows pushed, so
    PS updates pass their pushed bytes); with several device kinds, the largest (kinds mix rarely, and
    the slowest paces the step)."""
    return _size_scale([spec.optimizer_knee_bytes for spec in kinds.specs if spec.optimizer_knee_bytes], nbytes)


def _size_scale(knees: list[float], nbytes: np.ndarray) -> np.ndarray:
    """[V] `1 + bytes / knee` with the smallest knee of the kinds that have one (1 when none has)."""
    if not knees:
        return np.ones_like(nbytes)
    return 1.0 + nbytes / min(knees)
