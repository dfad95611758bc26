"""Stratagem strategies to and from AutoDist's strategy protobuf text format.

AutoDist (TensorFlow) names variables by tensor, `dense/kernel:0`; on import the `:0` suffix is
stripped so names match the graph's, and on export it is added back (pass `tf_names=False` to
keep Stratagem's names as they are). A partitioned variable's shards are written as AutoDist's
builders write them: a `partitioner` like "4,1" (shards per axis) and one `part_config` per shard,
named `<name>/part_<i>:0`.

AutoDist expresses consistency only through each PS synchronizer's `sync` and `staleness` flags;
Stratagem has one consistency model per strategy, so on import all PS synchronizers must agree.

What AutoDist cannot express is refused with UnsupportedStrategyError, naming the variable and
the reason: the sharded (ZeRO) synchronizer, tensor or pipeline parallelism, tree and hierarchical
all-reduce, bf16 and top-k compression, PowerSGD with another rank than AutoDist's fixed 1 or
without error feedback, and asp/ssp consistency in a strategy with no PS synchronizer to carry it.
AutoDist's SFB synchronizer and per-node SFB/Horovod compressors have no Stratagem equivalent either.
"""

from __future__ import annotations

from typing import Any

from stratagem.builders.base import AnySynchronizer, canonical_config
from stratagem.builders.vocabulary import (
    ALGORITHM_TO_SPEC,
    COMPRESSORS,
    POWERSGD_RANK,
    SPEC_TO_ALGORITHM,
    compressor_for,
    compressor_name,
)
from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.interop.autodist_schema import decode
from stratagem.interop.textproto import Enum, TextFormatError, WriteValue, parse, render
from stratagem.ir import (
    AllReduceSynchronizer,
    Consistency,
    ModelGraph,
    Partition,
    Provenance,
    PSSynchronizer,
    ShardedSynchronizer,
    Strategy,
    VariableConfig,
)

TF_SUFFIX = ":0"


# --- export --------------------------------------------------------------------------------------


def strategy_to_autodist(strategy: Strategy, *, graph: ModelGraph | None = None, tf_names: bool = True) -> str:
    """AutoDist's `Strategy` message in protobuf text format.

    With `graph`, partitioner strings list every axis of the variable ("4,1" for a matrix split
    along axis 0), as AutoDist's partitioner needs; without it they stop at the split axis ("4").
    """
    reasons = unsupported_reasons(strategy)
    if reasons:
        shown = "; ".join(reasons[:10]) + (f" (and {len(reasons) - 10} more)" if len(reasons) > 10 else "")
        raise UnsupportedStrategyError(f"AutoDist cannot express this strategy: {shown}")
    fields: list[tuple[str, WriteValue]] = [("id", str(strategy.id))]
    for index, config in enumerate(strategy.variables):
        fields.append(("node_config", _node(config, index, graph, tf_names)))
    fields.append(("graph_config", [("replicas", device) for device in strategy.replicas]))
    return render(fields)


def unsupported_reasons(strategy: Strategy) -> list[str]:
    """Why AutoDist cannot express `strategy`, one line per variable or setting; empty if it can."""
    reasons = []
    mesh = strategy.effective_mesh
    if mesh.tensor > 1 or mesh.pipeline > 1 or strategy.pipeline is not None:
        reasons.append(f"mesh {mesh.describe()}: AutoDist runs data parallelism only (tensor and pipeline must be 1)")
    has_ps = False
    for index, config in enumerate(strategy.variables):
        where = f"variables[{index}] ({config.var_name!r})"
        for shard, sync in enumerate(config.synchronizers):
            has_ps = has_ps or isinstance(sync, PSSynchronizer)
            reason = _synchronizer_problem(sync)
            if reason:
                shard_note = f" shard {shard}" if config.num_shards > 1 else ""
                reasons.append(f"{where}{shard_note}: {reason}")
                break
    if strategy.consistency.kind != "bsp" and not has_ps:
        reasons.append(
            f"consistency {strategy.consistency.kind}: AutoDist carries it only in PS synchronizers' "
            "sync/staleness flags, and this strategy has no PS synchronizer"
        )
    return reasons


def _synchronizer_problem(sync: AnySynchronizer) -> str | None:
    if isinstance(sync, ShardedSynchronizer):
        return "the sharded (ZeRO) synchronizer has no AutoDist equivalent"
    if not isinstance(sync, AllReduceSynchronizer):
        return None
    if sync.algorithm not in ALGORITHM_TO_SPEC:
        return f"all-reduce algorithm {sync.algorithm!r} has no AutoDist spec (AUTO, NCCL, RING)"
    compressor = sync.compressor
    if compressor_name(compressor) is not None:
        return None
    if compressor.kind == "powersgd" and compressor.rank != POWERSGD_RANK:
        return f"PowerSGD rank {compressor.rank}: AutoDist's PowerSGDCompressor has a fixed rank of {POWERSGD_RANK}"
    if compressor.kind == "powersgd":
        return "PowerSGD without error feedback: AutoDist's PowerSGDCompressor always feeds the error back"
    return f"AutoDist has no {compressor.kind} compressor (it has {', '.join(COMPRESSORS)})"


def _node(config: VariableConfig, index: int, graph: ModelGraph | None, tf_names: bool) -> list[tuple[str, WriteValue]]:
    """A one-shard partition is written unpartitioned: AutoDist refuses a partitioner that splits nothing."""
    suffix = TF_SUFFIX if tf_names else ""
    fields: list[tuple[str, WriteValue]] = [("var_name", config.var_name + suffix)]
    partition = config.partition
    if partition is None or partition.shards == 1:
        fields.append(_synchronizer_field(config.shard_synchronizer(0)))
        return fields
    fields.append(("partitioner", _partitioner(config.var_name, partition, index, graph)))
    for shard in range(partition.shards):
        part = [
            ("var_name", f"{config.var_name}/part_{shard}{suffix}"),
            _synchronizer_field(config.shard_synchronizer(shard)),
        ]
        fields.append(("part_config", part))
    return fields


def _partitioner(var_name: str, partition: Partition, index: int, graph: ModelGraph | None) -> str:
    rank = partition.axis + 1
    if graph is not None:
        try:
            rank = len(graph.variable(var_name).shape)
        except KeyError:
            raise InvalidStrategyError(
                [Problem(f"variables[{index}].var_name", f"{var_name!r} is not a variable of the graph")]
            ) from None
        if partition.axis >= rank:
            raise InvalidStrategyError(
                [
                    Problem(
                        f"variables[{index}].partition.axis",
                        f"axis {partition.axis} does not exist in a {rank}-d variable",
                    )
                ]
            )
    counts = [1] * rank
    counts[partition.axis] = partition.shards
    return ",".join(str(count) for count in counts)


def _synchronizer_field(sync: AnySynchronizer) -> tuple[str, WriteValue]:
    """proto3 text format leaves fields at their default out, as AutoDist's own output does."""
    if isinstance(sync, PSSynchronizer):
        ps: list[tuple[str, WriteValue]] = [("reduction_destination", sync.reduction_destination)]
        if sync.local_replication:
            ps.append(("local_replication", True))
        if sync.sync:
            ps.append(("sync", True))
        if sync.staleness:
            ps.append(("staleness", sync.staleness))
        return "PSSynchronizer", ps
    if not isinstance(sync, AllReduceSynchronizer):
        raise UnsupportedStrategyError(f"{sync.kind} synchronizer has no AutoDist equivalent")
    ar: list[tuple[str, WriteValue]] = []
    spec = ALGORITHM_TO_SPEC[sync.algorithm]
    if spec != "AUTO":
        ar.append(("spec", Enum(spec)))
    name = compressor_name(sync.compressor)
    if name != "NoneCompressor":
        ar.append(("compressor", Enum(str(name))))
    if sync.group:
        ar.append(("group", sync.group))
    return "AllReduceSynchronizer", ar


# --- import --------------------------------------------------------------------------------------


def strategy_from_autodist(text: str, *, graph_id: str | None = None, resources_id: str | None = None) -> Strategy:
    """A Strategy from AutoDist's text format; `graph_id`/`resources_id` say what it was made for.

    Malformed text raises InvalidStrategyError naming the line and field path; what Stratagem cannot
    express raises UnsupportedStrategyError naming the variable.
    """
    try:
        tree = parse(text)
    except TextFormatError as error:
        raise InvalidStrategyError([Problem("", f"not AutoDist strategy text: {error}")]) from None
    root = decode(tree, "Strategy")
    graph_config = root["graph_config"] or {"replicas": []}
    if not graph_config["replicas"]:
        raise InvalidStrategyError([Problem("graph_config.replicas", "AutoDist strategy lists no replicas")])
    configs = [_variable_config(node, f"node_config[{i}]") for i, node in enumerate(root["node_config"])]
    note = f"imported from AutoDist strategy {root['id']!r}" if root["id"] else "imported from AutoDist"
    return Strategy.parse(
        {
            "graph_id": graph_id,
            "resources_id": resources_id,
            "replicas": graph_config["replicas"],
            "consistency": _consistency(configs).model_dump(mode="json"),
            "variables": [config.model_dump(mode="json") for config in configs],
            "provenance": Provenance(notes=[note]).model_dump(mode="json"),
        }
    )


def _variable_config(node: dict[str, Any], path: str) -> VariableConfig:
    name = _strip(node["var_name"])
    if not name:
        raise InvalidStrategyError([Problem(f"{path}.var_name", "is empty")])
    where = f"{path} ({name!r})"
    if node["compressor"] is not None and node["compressor"]["type"] != "NoneCompressor":
        raise UnsupportedStrategyError(
            f"{where}: AutoDist's per-node {node['compressor']['type']} has no Stratagem equivalent"
        )
    if not node["partitioner"]:
        if node["part_config"]:
            raise InvalidStrategyError([Problem(f"{path}.part_config", "given without a partitioner")])
        return VariableConfig(var_name=name, synchronizer=_synchronizer(node, path, where))
    partition = _partition(node["partitioner"], f"{path}.partitioner")
    parts = node["part_config"]
    if not parts:
        syncs = [_synchronizer(node, path, where)] * partition.shards
    elif len(parts) != partition.shards:
        raise InvalidStrategyError(
            [
                Problem(
                    f"{path}.part_config", f"{len(parts)} parts for {partition.shards} shards ({node['partitioner']!r})"
                )
            ]
        )
    else:
        for i, part in enumerate(parts):
            if part["partitioner"] or part["part_config"]:
                raise InvalidStrategyError([Problem(f"{path}.part_config[{i}]", "a shard cannot be partitioned again")])
        syncs = [_synchronizer(part, f"{path}.part_config[{i}]", f"{where} shard {i}") for i, part in enumerate(parts)]
    return canonical_config(name, syncs, partition)


def _strip(var_name: str) -> str:
    return var_name.removesuffix(TF_SUFFIX)


def _partition(text: str, path: str) -> Partition:
    """AutoDist's partitioner string, shards per axis ("1,4" = 4 shards along axis 1); one axis only."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise InvalidStrategyError([Problem(path, f"{text!r} is not a comma-separated list of shard counts")]) from None
    if any(count < 1 for count in counts):
        raise InvalidStrategyError([Problem(path, f"{text!r}: every axis needs at least 1 shard")])
    split = [axis for axis, count in enumerate(counts) if count > 1]
    if len(split) != 1:
        reason = "splits nothing" if not split else f"splits {len(split)} axes; AutoDist partitions along one axis only"
        raise InvalidStrategyError([Problem(path, f"{text!r} {reason}")])
    return Partition(axis=split[0], shards=counts[split[0]])


def _synchronizer(node: dict[str, Any], path: str, where: str) -> AnySynchronizer:
    if node["SFBSynchronizer"] is not None:
        raise UnsupportedStrategyError(
            f"{where}: AutoDist's SFBSynchronizer (sufficient-factor broadcasting) has no Stratagem equivalent"
        )
    ps, ar = node["PSSynchronizer"], node["AllReduceSynchronizer"]
    if ps is not None:
        if not ps["reduction_destination"]:
            raise InvalidStrategyError([Problem(f"{path}.PSSynchronizer.reduction_destination", "is empty")])
        return PSSynchronizer(
            reduction_destination=ps["reduction_destination"],
            local_replication=ps["local_replication"],
            sync=ps["sync"],
            staleness=_non_negative(ps["staleness"], f"{path}.PSSynchronizer.staleness"),
        )
    if ar is not None:
        return AllReduceSynchronizer(
            algorithm=SPEC_TO_ALGORITHM[ar["spec"]],
            group=_non_negative(ar["group"], f"{path}.AllReduceSynchronizer.group"),
            compressor=compressor_for(ar["compressor"]),
        )
    raise InvalidStrategyError([Problem(path, "has no synchronizer (PSSynchronizer or AllReduceSynchronizer)")])


def _non_negative(value: int, path: str) -> int:
    if value < 0:
        raise InvalidStrategyError([Problem(path, f"must be >= 0, got {value}")])
    return value


def _consistency(configs: list[VariableConfig]) -> Consistency:
    """One consistency model from the PS synchronizers' flags, which must agree; bsp without any."""
    flags = [
        (config.var_name, sync.sync, sync.staleness)
        for config in configs
        for sync in config.synchronizers
        if isinstance(sync, PSSynchronizer)
    ]
    if not flags:
        return Consistency(kind="bsp")
    first_name, first_sync, first_staleness = flags[0]
    for name, sync, staleness in flags[1:]:
        if sync != first_sync or (sync and staleness != first_staleness):
            raise UnsupportedStrategyError(
                f"{name!r}: PSSynchronizer sync={sync}, staleness={staleness} differs from {first_name!r} "
                f"(sync={first_sync}, staleness={first_staleness}); Stratagem has one consistency model per strategy"
            )
    if not first_sync:
        return Consistency(kind="asp")
    if first_staleness > 0:
        return Consistency(kind="ssp", staleness=first_staleness)
    return Consistency(kind="bsp")
