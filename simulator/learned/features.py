"""Records to a numeric matrix with named columns: the only place the cost model's inputs are defined.

Columns are looked up by name, so a model saved with one list of features still predicts after this
module grows new ones (absent columns are missing values, which XGBoost handles). The simulator's
breakdown keys are folded into a fixed set of components by `breakdown_component`, so a simulator
that adds or renames a key changes a component's value, not the matrix shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.learned.records import TrainingRecord
from simulator.learned.summaries import StrategySummary

COMM_KINDS = ("allreduce", "ps", "sharded", "tensor", "pipeline")
"""Kinds of exposed communication the breakdown may report, each its own feature."""

_COMPONENT_RULES: tuple[tuple[str, frozenset[str]], ...] = (
    ("bubble", frozenset({"bubble"})),
    ("server_load", frozenset({"load", "server"})),
    ("update", frozenset({"update", "optimizer"})),
    ("sharded", frozenset({"sharded", "shard", "scatter", "gather", "zero"})),
    ("allreduce", frozenset({"allreduce", "reduce"})),
    ("tensor", frozenset({"tensor", "tp"})),
    ("pipeline", frozenset({"pipeline", "p2p"})),
    ("ps", frozenset({"ps", "push", "pull"})),
    ("compute", frozenset({"compute", "forward", "backward", "fwd", "bwd"})),
)
"""The first rule sharing a word with the key wins, so the order resolves overlaps (`pipeline_bubble` is a
bubble, `reduce_scatter` is sharded). The simulator's keys today: compute, tensor_parallel,
pipeline_bubble, pipeline_p2p, allreduce, sharded, ps, optimizer_update, context_parallel (`other`)."""


def breakdown_component(key: str) -> str:
    """The component a breakdown key belongs to, by the words in it; unknown keys go to `other`."""
    words = set(re.split(r"[^a-z0-9]+", key.lower()))
    for component, vocabulary in _COMPONENT_RULES:
        if words & vocabulary:
            return component
    return "other"


MONOTONE_INCREASING = frozenset({f"exposed_{kind}_s" for kind in COMM_KINDS} | {"server_load_max_s", "bubble_s"})
"""Features the correction may be constrained to grow with (`CostModel(monotone=True)`): a prior that
the simulator under-rates communication, server load and bubbles more the more of them there are.
Physics only says the step time grows with them, and the simulator's own prediction already does."""


def _graph_columns(record: TrainingRecord) -> dict[str, float]:
    g = record.graph
    return {
        "graph_log_params": math.log1p(g.num_parameters),
        "graph_log_flops": math.log1p(g.flops_per_step),
        "graph_log_batch": math.log(g.batch_size),
        "graph_sparse_share": g.sparse_share,
        "graph_log_activation_bytes": math.log1p(g.activation_bytes),
        "graph_layers": g.num_layers,
    }


def _cluster_columns(record: TrainingRecord) -> dict[str, float]:
    c = record.cluster
    return {
        "cluster_devices": c.num_devices,
        "cluster_nodes": c.num_nodes,
        "cluster_log_min_bandwidth": math.log(c.min_bandwidth_bytes_per_s),
        "cluster_log_max_bandwidth": math.log(c.max_bandwidth_bytes_per_s),
        "cluster_device_code": c.device_code,
        "cluster_log_peak_flops": math.log(c.peak_flops),
    }


def _strategy_columns(record: TrainingRecord) -> dict[str, float]:
    columns = {f"strategy_{name}": float(value) for name, value in record.strategy.model_dump().items()}
    strategy, variables = record.strategy, max(record.graph.num_variables, 1.0)
    columns["strategy_groups_per_variable"] = strategy.num_groups / variables
    columns["strategy_shards_per_variable"] = strategy.num_shards / variables
    return columns


def _simulator_columns(record: TrainingRecord) -> dict[str, float]:
    step = record.simulated_step_time_s
    seconds: dict[str, float] = {}
    server_loads = list(record.server_load_s.values())
    for key, value in record.breakdown.items():
        component = breakdown_component(key)
        if component == "server_load":
            server_loads.append(value)
        else:
            seconds[component] = seconds.get(component, 0.0) + value
    exposed = sum(seconds.get(kind, 0.0) for kind in COMM_KINDS)
    columns = {"sim_log_step": math.log(step)}
    columns.update({f"exposed_{kind}_s": seconds.get(kind, 0.0) for kind in COMM_KINDS})
    columns.update({f"exposed_{kind}_share": seconds.get(kind, 0.0) / step for kind in COMM_KINDS})
    columns.update(
        {
            "server_load_max_s": max(server_loads, default=0.0),
            "server_load_sum_s": sum(server_loads),
            "bubble_s": seconds.get("bubble", 0.0),
            "compute_share": seconds.get("compute", 0.0) / step,
            "comm_share": exposed / step,
            "update_share": seconds.get("update", 0.0) / step,
            "other_share": seconds.get("other", 0.0) / step,
            "memory_fraction": record.memory_per_device_bytes / record.cluster.device_memory_bytes,
        }
    )
    return columns


def feature_row(record: TrainingRecord) -> dict[str, float]:
    """Every feature of one record, by name."""
    row = _simulator_columns(record)
    row.update(_strategy_columns(record))
    row.update(_graph_columns(record))
    row.update(_cluster_columns(record))
    return row


def default_feature_names() -> list[str]:
    """The features this version builds, in a stable order."""
    return list(_FEATURE_NAMES)


@dataclass(frozen=True)
class FeatureMatrix:
    """Rows of features plus what the model needs beside them: the base margin and the target."""

    X: np.ndarray
    """[n, f] float64; NaN where a record lacks a named feature."""
    names: list[str]
    simulated_s: np.ndarray
    """[n] the simulator's step time, exp of the base margin."""
    measured_s: np.ndarray
    """[n] measured step time, NaN for queries."""
    groups: list[str]
    sources: list[str | None] | None = None
    """Where each row was measured (a published source, another deployment), where known."""

    def __len__(self) -> int:
        return int(self.X.shape[0])

    @property
    def log_ratio(self) -> np.ndarray:
        """The target: log(measured / simulated)."""
        return np.log(self.measured_s / self.simulated_s)

    def take(self, indices: Sequence[int] | np.ndarray) -> FeatureMatrix:
        index = np.asarray(indices, dtype=np.int64)
        return FeatureMatrix(
            X=self.X[index],
            names=self.names,
            simulated_s=self.simulated_s[index],
            measured_s=self.measured_s[index],
            groups=[self.groups[i] for i in index],
            sources=[self.sources[i] for i in index] if self.sources is not None else None,
        )


def build_features(records: Sequence[TrainingRecord], names: Sequence[str] | None = None) -> FeatureMatrix:
    """The matrix for `records`, with columns `names` (default: every feature this version builds)."""
    columns = list(names) if names is not None else default_feature_names()
    rows = [feature_row(record) for record in records]
    X = np.array([[row.get(name, math.nan) for name in columns] for row in rows], dtype=np.float64)
    return FeatureMatrix(
        X=X.reshape(len(rows), len(columns)),
        names=columns,
        simulated_s=np.array([r.simulated_step_time_s for r in records], dtype=np.float64),
        measured_s=np.array(
            [r.measured_step_time_s if r.measured_step_time_s is not None else math.nan for r in records],
            dtype=np.float64,
        ),
        groups=[r.group_id for r in records],
        sources=[r.source for r in records],
    )


def monotone_constraints(names: Sequence[str]) -> tuple[int, ...]:
    return tuple(1 if name in MONOTONE_INCREASING else 0 for name in names)


def _names_from_layout() -> tuple[str, ...]:
    sim = [
        "sim_log_step",
        *(f"exposed_{kind}_s" for kind in COMM_KINDS),
        *(f"exposed_{kind}_share" for kind in COMM_KINDS),
        "server_load_max_s",
        "server_load_sum_s",
        "bubble_s",
        "compute_share",
        "comm_share",
        "update_share",
        "other_share",
        "memory_fraction",
    ]
    strategy = [f"strategy_{name}" for name in StrategySummary.model_fields]
    strategy += ["strategy_groups_per_variable", "strategy_shards_per_variable"]
    graph = [
        "graph_log_params",
        "graph_log_flops",
        "graph_log_batch",
        "graph_sparse_share",
        "graph_log_activation_bytes",
        "graph_layers",
    ]
    cluster = [
        "cluster_devices",
        "cluster_nodes",
        "cluster_log_min_bandwidth",
        "cluster_log_max_bandwidth",
        "cluster_device_code",
        "cluster_log_peak_flops",
    ]
    return (*sim, *strategy, *graph, *cluster)


_FEATURE_NAMES = _names_from_layout()


def describe_features(names: Sequence[str]) -> Mapping[str, str]:
    """Which family each feature belongs to, for documentation and the dashboard."""
    families = {}
    for name in names:
        prefix = name.split("_", 1)[0]
        families[name] = {"strategy": "strategy", "graph": "graph", "cluster": "cluster"}.get(prefix, "simulator")
    return families
