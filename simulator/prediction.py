"""Predictions for the few candidates a caller wants explained: numbers plus the bottleneck in words."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.context import SimContext
from simulator.encoding import CandidateBatch, Precision
from simulator.engine import BREAKDOWN_KEYS, BatchResult, simulate_batch, unclippable
from stratagem.ir import PredictedPerformance


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


@dataclass
class Prediction:
    step_time_s: float
    samples_per_s: float
    memory_per_device_bytes: float
    """Peak memory of the fullest replica device."""
    feasible: bool
    infeasible_reason: str | None
    breakdown: dict[str, float]
    """Seconds per component (BREAKDOWN_KEYS); they add up to the step time."""
    bottleneck: str
    ps_load: dict[str, float] = field(default_factory=dict)
    """Seconds of PS work per step on each server node's NIC, by node address (only nodes with load)."""
    ps_bytes: dict[str, float] = field(default_factory=dict)
    """Bytes each node's NIC receives per step for PS traffic, by node address."""

    def to_predicted(self) -> PredictedPerformance:
        return PredictedPerformance(
            step_time_s=self.step_time_s,
            samples_per_s=self.samples_per_s,
            memory_per_device_bytes=self.memory_per_device_bytes,
            feasible=self.feasible,
            infeasible_reason=self.infeasible_reason,
            breakdown=dict(self.breakdown),
            bottleneck=self.bottleneck,
        )


def predictions(
    context: SimContext, batch: CandidateBatch, indices: list[int] | np.ndarray | None = None
) -> list[Prediction]:
    """Explained predictions for `indices` (all when None); re-simulates just those rows with detail."""
    rows = np.arange(len(batch)) if indices is None else np.asarray(indices, dtype=np.intp)
    sub = batch.take(rows)
    result = simulate_batch(context, sub, detail=True)
    return [_prediction(context, sub, result, i) for i in range(len(sub))]


def _prediction(context: SimContext, batch: CandidateBatch, result: BatchResult, i: int) -> Prediction:
    breakdown = {key: float(result.breakdown[i, k]) for k, key in enumerate(BREAKDOWN_KEYS)}
    node_seconds = result.detail["ps_node_seconds"][i]
    node_bytes = result.detail["ps_node_bytes"][i]
    ps_load = {context.node_addresses[j]: float(s) for j, s in enumerate(node_seconds) if s > 0}
    ps_bytes = {context.node_addresses[j]: float(b) for j, b in enumerate(node_bytes) if b > 0}
    reason = None if bool(result.feasible[i]) else _infeasible_reason(context, batch, result, i)
    return Prediction(
        step_time_s=float(result.step_time[i]),
        samples_per_s=float(result.samples_per_s[i]),
        memory_per_device_bytes=float(result.memory[i]),
        feasible=bool(result.feasible[i]),
        infeasible_reason=reason,
        breakdown=breakdown,
        bottleneck=reason or _bottleneck(context, batch, result, i, breakdown),
        ps_load=ps_load,
        ps_bytes=ps_bytes,
    )


def _infeasible_reason(context: SimContext, batch: CandidateBatch, result: BatchResult, i: int) -> str:
    if context.graph.optimizer.max_grad_norm is not None and unclippable(batch.take(np.array([i])))[0]:
        return (
            "the graph clips its gradient (optimizer.max_grad_norm) and asynchronous parameter servers "
            "apply each worker's push alone: no whole gradient to clip (use BSP or SSP)"
        )
    if int(batch.precision[i]) == Precision.FP8:
        kind = context.kinds.specs[_kind(context, batch, i)]
        if "float8" not in kind.peak_flops:
            return f"fp8 needs fp8 tensor cores, which {kind.name} does not have (H100 and later do)"
    over = float(result.server_over[i])
    if over > 0:
        return f"a parameter server's memory is short by {_bytes(over)} for the variables it holds"
    need, room = float(result.memory[i]), float(result.capacity[i])
    kind = context.kinds.specs[_kind(context, batch, i)]
    share, reserved = kind.allocator_overhead or 0.0, kind.reserved_memory_bytes or 0.0
    have = room * (1.0 + share) + reserved
    held = [
        f"{_bytes(need * share)} the caching allocator holds beyond it" if share else "",
        f"{_bytes(reserved)} for the CUDA context and libraries" if reserved else "",
    ]
    total = need * (1.0 + share) + reserved
    needs = f"needs {_bytes(need)} per device"
    if total > need:
        needs += f", {_bytes(total)} with " + " and ".join(part for part in held if part)
    return f"does not fit: {needs}; {_bytes(have)} available ({_bytes(total - have)} over)"


HIDDEN_SHARE = 0.05
"""Below this share of the step, what compute leaves exposed is not worth naming."""
RUNNER_UP_LABELS = {
    "tensor_parallel": "tensor-parallel all-reduces",
    "pipeline_bubble": "the pipeline bubble",
    "pipeline_p2p": "pipeline stage transfers",
    "allreduce": "exposed gradient all-reduce",
    "sharded": "the sharded reduce-scatter and all-gather",
    "context_parallel": "ring attention's key/value exchange",
    "ps": "the parameter-server exchange",
    "optimizer_update": "the optimizer update",
}


def _bottleneck(
    context: SimContext, batch: CandidateBatch, result: BatchResult, i: int, breakdown: dict[str, float]
) -> str:
    step = float(result.step_time[i])
    key = max(breakdown, key=lambda k: breakdown[k])
    share = breakdown[key] / step if step > 0 else 0.0
    if key == "ps":
        return _ps_sentence(context, result, i, share)
    if key == "allreduce":
        nbytes = float(result.detail["allreduce_bytes"][i])
        return (
            f"all-reduce of {_bytes(nbytes)} of gradients per step among {int(batch.data[i])} replicas is not hidden "
            f"by backward: {_seconds(breakdown[key])} exposed ({share:.0%} of the step)"
        )
    if key == "sharded":
        return f"sharded (ZeRO) reduce-scatter and parameter all-gather take {_seconds(breakdown[key])} of the step ({share:.0%})"
    if key == "tensor_parallel":
        return (
            f"tensor-parallel all-reduces of activations across {int(batch.tensor[i])} devices sit on the critical path: "
            f"{_seconds(breakdown[key])} ({share:.0%} of the step)"
        )
    if key == "pipeline_bubble":
        p, m = int(batch.pipeline[i]), int(batch.micro_batches[i])
        return (
            f"pipeline bubble: {p} stages with {m} micro-batches leave devices idle {breakdown[key] / step:.0%} "
            "of the step"
        )
    if key == "context_parallel":
        return (
            f"ring attention's key/value exchange across {int(batch.context_parallel[i])} context ranks is not "
            f"hidden by the attention compute: {_seconds(breakdown[key])} ({share:.0%} of the step)"
        )
    if key == "optimizer_update":
        return (
            f"the optimizer update streams parameters and state through memory for {_seconds(breakdown[key])} per step"
        )
    kind = context.kinds.specs[int(_kind(context, batch, i))].name
    head = f"compute-bound: forward and backward take {_seconds(breakdown['compute'])} per step on {kind}"
    runner_up = max((k for k in breakdown if k != "compute"), key=lambda k: breakdown[k], default=None)
    if runner_up is None or breakdown[runner_up] < HIDDEN_SHARE * step:
        return f"{head}; communication is hidden behind it"
    return f"{head}; next comes {RUNNER_UP_LABELS[runner_up]}, {_seconds(breakdown[runner_up])} ({breakdown[runner_up] / step:.0%} of the step)"


def _ps_sentence(context: SimContext, result: BatchResult, i: int, share: float) -> str:
    seconds = result.detail["ps_node_seconds"][i]
    j = int(np.argmax(seconds))
    nbytes = float(result.detail["ps_node_bytes"][i][j])
    where = f"node {j} ({context.node_addresses[j]})"
    if context.num_nodes == 1:
        return (
            f"the PS on {where} takes {_seconds(float(seconds[j]))} per step for pushes, pulls and updates over the "
            f"intra-node link (PS waiting is {share:.0%} of the step)"
        )
    gbps = float(context.nic_gbps[j])
    return (
        f"the PS on {where} receives {_bytes(nbytes)} per step over a {gbps:g} Gbit/s NIC "
        f"({_seconds(float(seconds[j]))} of transfer and updates; PS waiting is {share:.0%} of the step)"
    )


def _kind(context: SimContext, batch: CandidateBatch, i: int) -> int:
    from simulator.topology import topology

    return int(topology(context, batch.take([i])).kind[0])
