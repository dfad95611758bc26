"""Where a strategy puts each variable: per layer, per variable and per shard, with bytes.

This is the strategy detail view's model. Bytes come from the graph the strategy was made for
(shape × dtype, split by the partition); without the graph the placement is still shown, without
sizes. A variable used by several layers is listed under its consumer (the layer whose backward
makes its gradient ready), which is also where the simulator schedules its synchronization.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from stratagem.ir import (
    AllReduceSynchronizer,
    Compressor,
    ModelGraph,
    PSSynchronizer,
    Strategy,
    Synchronizer,
    Variable,
    VariableConfig,
    shard_numel,
)

NO_LAYER = "(no layer)"


@dataclass(frozen=True)
class Shard:
    var_name: str
    index: int
    nbytes: float | None
    sync: Synchronizer


@dataclass(frozen=True)
class ShardRow:
    index: int
    nbytes: float | None
    kind: str
    where: str
    compressor: str
    detail: str


@dataclass(frozen=True)
class VariableRow:
    name: str
    shape: list[int] | None
    dtype: str
    nbytes: float | None
    sparse: bool
    kind: str
    where: str
    partition: str
    compressor: str
    detail: str
    shards: list[ShardRow] = field(default_factory=list)
    """One row per shard when the variable is partitioned."""


@dataclass(frozen=True)
class LayerRows:
    name: str
    type: str
    nbytes: float | None
    variables: list[VariableRow]


@dataclass(frozen=True)
class Placement:
    layers: list[LayerRows]
    bytes_by_destination: dict[str, float]
    """Label (a PS server, an all-reduce or sharded group) -> bytes synchronized there per step."""
    bytes_by_kind: dict[str, float]
    total_bytes: float | None


def shards(strategy: Strategy, graph: ModelGraph | None) -> Iterator[Shard]:
    """Every synchronized piece: (variable, shard index, bytes, synchronizer)."""
    variables = {v.name: v for v in graph.variables} if graph is not None else {}
    for config in strategy.variables:
        sizes = _shard_bytes(variables.get(config.var_name), config)
        for index, sync in enumerate(config.synchronizers):
            yield Shard(config.var_name, index, sizes[index] if sizes else None, sync)


def _shard_bytes(variable: Variable | None, config: VariableConfig) -> list[float] | None:
    if variable is None:
        return None
    partition = config.partition
    if partition is not None and partition.axis >= len(variable.shape):
        return None
    return [float(n * variable.dtype.itemsize) for n in shard_numel(variable.shape, partition)]


def destination(sync: Synchronizer) -> str:
    if isinstance(sync, PSSynchronizer):
        return f"PS {sync.reduction_destination}"
    if isinstance(sync, AllReduceSynchronizer):
        return f"all-reduce group {sync.group}"
    return f"sharded group {sync.group}"


def compressor_label(compressor: Compressor) -> str:
    if compressor.kind == "none":
        return "—"
    if compressor.kind == "powersgd":
        return f"powersgd (rank {compressor.rank})"
    if compressor.kind == "topk":
        return f"top-k ({(compressor.ratio or 0) * 100:g}%)"
    return compressor.kind


def _where(sync: Synchronizer) -> str:
    if isinstance(sync, PSSynchronizer):
        return sync.reduction_destination
    if isinstance(sync, AllReduceSynchronizer):
        return f"group {sync.group}, {sync.algorithm}"
    return f"group {sync.group}"


def _detail(sync: Synchronizer) -> str:
    if not isinstance(sync, PSSynchronizer):
        return ""
    parts = ["local replication"] if sync.local_replication else []
    if not sync.sync:
        parts.append("asynchronous")
    elif sync.staleness:
        parts.append(f"staleness {sync.staleness}")
    return ", ".join(parts)


def _compressor(sync: Synchronizer) -> str:
    return compressor_label(sync.compressor) if isinstance(sync, AllReduceSynchronizer) else "—"


def _same(values: list[str]) -> str:
    return values[0] if len(set(values)) == 1 else "per shard"


def _variable_row(config: VariableConfig, variable: Variable | None, pieces: list[Shard]) -> VariableRow:
    syncs = [piece.sync for piece in pieces]
    sizes = [piece.nbytes for piece in pieces]
    shard_rows = (
        [ShardRow(p.index, p.nbytes, p.sync.kind, _where(p.sync), _compressor(p.sync), _detail(p.sync)) for p in pieces]
        if config.partition is not None
        else []
    )
    partition = f"axis {config.partition.axis} × {config.partition.shards}" if config.partition else "—"
    return VariableRow(
        name=config.var_name,
        shape=list(variable.shape) if variable else None,
        dtype=variable.dtype.value if variable else "?",
        nbytes=sum(s for s in sizes if s is not None) if all(s is not None for s in sizes) else None,
        sparse=bool(variable and variable.sparse),
        kind=_same([s.kind for s in syncs]),
        where=_same([_where(s) for s in syncs]),
        partition=partition,
        compressor=_same([_compressor(s) for s in syncs]),
        detail=_same([_detail(s) for s in syncs]),
        shards=shard_rows,
    )


def _frozen_row(variable: Variable) -> VariableRow:
    return VariableRow(
        name=variable.name,
        shape=list(variable.shape),
        dtype=variable.dtype.value,
        nbytes=float(variable.nbytes),
        sparse=variable.sparse,
        kind="not synchronized",
        where="—",
        partition="—",
        compressor="—",
        detail="frozen (not trainable)" if not variable.trainable else "no synchronizer",
    )


def placement(strategy: Strategy, graph: ModelGraph | None) -> Placement:
    variables = {v.name: v for v in graph.variables} if graph is not None else {}
    pieces: dict[str, list[Shard]] = {}
    by_destination: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    for piece in shards(strategy, graph):
        pieces.setdefault(piece.var_name, []).append(piece)
        if piece.nbytes is not None:
            label = destination(piece.sync)
            by_destination[label] = by_destination.get(label, 0.0) + piece.nbytes
            by_kind[piece.sync.kind] = by_kind.get(piece.sync.kind, 0.0) + piece.nbytes
    rows = {
        c.var_name: _variable_row(c, variables.get(c.var_name), pieces.get(c.var_name, [])) for c in strategy.variables
    }
    for variable in variables.values():
        rows.setdefault(variable.name, _frozen_row(variable))
    layers = _group_by_layer(rows, graph)
    total = sum(by_kind.values()) if graph is not None else None
    return Placement(
        layers=layers,
        bytes_by_destination=dict(sorted(by_destination.items())),
        bytes_by_kind=by_kind,
        total_bytes=total,
    )


def _group_by_layer(rows: dict[str, VariableRow], graph: ModelGraph | None) -> list[LayerRows]:
    if graph is None:
        return [LayerRows(name="(the graph is not stored)", type="", nbytes=None, variables=list(rows.values()))]
    owner = graph.variable_layers()
    grouped: dict[str, list[VariableRow]] = {}
    for name, row in rows.items():
        grouped.setdefault(owner.get(name, NO_LAYER), []).append(row)
    types = {layer.name: layer.type for layer in graph.layers}
    order = [layer.name for layer in graph.layers if layer.name in grouped] + (
        [NO_LAYER] if NO_LAYER in grouped else []
    )
    return [
        LayerRows(name=name, type=types.get(name, ""), nbytes=_sum(grouped[name]), variables=grouped[name])
        for name in order
    ]


def _sum(rows: list[VariableRow]) -> float | None:
    sizes = [row.nbytes for row in rows if row.kind != "not synchronized"]
    return sum(s for s in sizes if s is not None) if all(s is not None for s in sizes) else None
