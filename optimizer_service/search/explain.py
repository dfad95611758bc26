"""Say in words what a candidate does and why it is predicted to beat the baselines.

The words come from the candidate's arrays (which variables go where) and from the simulator's
breakdown (which part of the step shrank), so they stay true to what was actually evaluated.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np

from optimizer_service.search.difference import difference
from optimizer_service.search.space import Space
from simulator import Prediction
from simulator.encoding import Algorithm, CandidateBatch, CompressorKind, ConsistencyKind, Schedule, SyncKind

MB = 1e6
GB = 1e9
LABELS = {
    "compute": "compute",
    "tensor_parallel": "tensor-parallel communication",
    "pipeline_bubble": "pipeline bubble",
    "pipeline_p2p": "pipeline transfers",
    "allreduce": "exposed all-reduce",
    "sharded": "sharded (ZeRO) communication",
    "ps": "parameter-server waiting",
    "optimizer_update": "optimizer update",
}


def composition(space: Space, batch: CandidateBatch, i: int) -> dict[str, Any]:
    """Counts and bytes per synchronizer kind, in a form JSON and people can both read."""
    context = space.context
    kind = batch.kind[i]
    out: dict[str, Any] = {}
    ar = kind == SyncKind.ALLREDUCE
    if ar.any():
        out["allreduce"] = {
            "variables": int(ar.sum()),
            "bytes": float(context.var_bytes[ar].sum()),
            "fusion_groups": len(np.unique(batch.group[i][ar])),
            "algorithms": _counts(batch.algorithm[i][ar], Algorithm),
            "compressors": _counts(batch.compressor[i][ar], CompressorKind),
        }
    ps = kind == SyncKind.PS
    if ps.any():
        servers = batch.server[i][ps]
        out["ps"] = {
            "variables": int(ps.sum()),
            "sparse_variables": int((ps & context.var_sparse).sum()),
            "bytes": float(context.var_bytes[ps].sum()),
            "bytes_moved_per_step": float(context.var_ps_bytes[ps].sum()),
            "servers": len(np.unique(servers[servers >= 0])),
            "partitioned_variables": int((batch.shards[i][ps] > 1).sum()),
            "local_replication": int(batch.local_replication[i][ps].sum()),
        }
    sharded = kind == SyncKind.SHARDED
    if sharded.any():
        out["sharded"] = {
            "variables": int(sharded.sum()),
            "bytes": float(context.var_bytes[sharded].sum()),
            "fusion_groups": len(np.unique(batch.group[i][sharded])),
        }
    out["consistency"] = _consistency(batch, i)
    out["mesh"] = _mesh(batch, i)
    out["difference"] = difference(space, batch, i)
    return out


SCHEDULE_NAMES = {
    Schedule.ONE_F_ONE_B: "1f1b",
    Schedule.GPIPE: "gpipe",
    Schedule.INTERLEAVED: "interleaved-1f1b",
    Schedule.ZERO_BUBBLE: "zero-bubble",
}


def _mesh(batch: CandidateBatch, i: int) -> dict[str, Any]:
    pipeline = int(batch.pipeline[i])
    virtual = max(1, int(batch.virtual_stages[i]))
    chunks = pipeline * virtual
    stages = np.bincount(batch.layer_stage[i].astype(np.intp), minlength=chunks)[:chunks] if pipeline > 1 else None
    return {
        "data": int(batch.data[i]),
        "tensor": int(batch.tensor[i]),
        "pipeline": pipeline,
        "context": max(1, int(batch.context_parallel[i])),
        "virtual_stages": virtual,
        "micro_batches": int(batch.micro_batches[i]),
        "schedule": SCHEDULE_NAMES[Schedule(int(batch.schedule[i]))],
        "recompute": _recompute_mode(batch, i),
        "sequence_parallel": bool(batch.sequence_parallel[i]),
        "async_tensor_parallel": bool(batch.async_tp[i]),
        "compile": bool(batch.compile[i]),
        "fp8_all_gather": bool(batch.fp8_gather[i]),
        "micro_batch_size": int(batch.micro_batch_size[i]),
        **({"layers_per_stage": [int(n) for n in stages]} if stages is not None else {}),
    }


def _recompute_mode(batch: CandidateBatch, i: int) -> str:
    flags = (("full", batch.recompute), ("selective", batch.selective), ("selective-op", batch.selective_op))
    return next((mode for mode, flag in flags if bool(flag[i])), "none")


def describe_mesh(mesh: dict[str, Any]) -> str:
    """The layout in words, or '' for plain data parallelism."""
    recompute = mesh["recompute"]
    recompute = "full" if recompute is True else "none" if recompute is False else recompute
    context = mesh.get("context", 1)
    plain = mesh["tensor"] == 1 and mesh["pipeline"] == 1 and context == 1 and mesh["micro_batches"] == 1
    if plain and recompute == "none" and not mesh.get("compile") and not mesh.get("fp8_all_gather"):
        return ""
    mesh_text = f"data({mesh['data']}) × tensor({mesh['tensor']}) × pipeline({mesh['pipeline']})"
    parts = [mesh_text + (f" × context({context})" if context > 1 else "")]
    if mesh["tensor"] > 1:
        sequence = ", norms and dropout on 1/tensor of the sequence" if mesh.get("sequence_parallel") else ""
        pipelined = (
            ", their collectives pipelined with the matmuls (async)" if mesh.get("async_tensor_parallel") else ""
        )
        parts.append(f"each layer's matmuls split over {mesh['tensor']} devices of a node{sequence}{pipelined}")
    if context > 1:
        parts.append(f"each sequence split over {context} devices, attention as a ring")
    if mesh["pipeline"] > 1:
        sizes = mesh["layers_per_stage"]
        virtual = mesh.get("virtual_stages", 1)
        chunks = (
            f"{mesh['pipeline'] * virtual} chunks ({virtual} per stage)"
            if virtual > 1
            else f"{mesh['pipeline']} stages"
        )
        parts.append(
            f"{chunks} of {min(sizes)}–{max(sizes)} layers, {mesh['micro_batches']} micro-batches {mesh['schedule']}"
        )
    elif mesh["micro_batches"] > 1:
        parts.append(f"{mesh['micro_batches']} micro-batches accumulated per step")
    if recompute == "full":
        parts.append("activations recomputed block by block in backward")
    elif recompute == "selective":
        parts.append("the attention core recomputed in backward")
    elif recompute == "selective-op":
        parts.append("each block checkpointed per op (matmul and attention outputs kept, the rest recomputed)")
    if mesh.get("compile"):
        parts.append("each block compiled (element-wise chains fused)")
    if mesh.get("fp8_all_gather"):
        parts.append("FSDP gathering the fp8 weights in fp8")
    return ", ".join(parts)


def describe(mix: dict[str, Any]) -> str:
    """One sentence on where the variables go."""
    parts = []
    if "ps" in mix:
        ps = mix["ps"]
        sparse = f", {ps['sparse_variables']} of them sparse" if ps["sparse_variables"] else ""
        moved = (
            f", moving {_size(ps['bytes_moved_per_step'])} per step" if ps["bytes_moved_per_step"] < ps["bytes"] else ""
        )
        split = f" ({ps['partitioned_variables']} partitioned)" if ps["partitioned_variables"] else ""
        replicated = " with local replication" if ps["local_replication"] else ""
        parts.append(
            f"{ps['variables']} variables ({_size(ps['bytes'])}{sparse}) on {ps['servers']} parameter server(s){split}{replicated}{moved}"
        )
    if "allreduce" in mix:
        ar = mix["allreduce"]
        algorithms = "/".join(sorted(ar["algorithms"]))
        compressed = {k: n for k, n in ar["compressors"].items() if k != "none"}
        squeeze = f", compressed ({', '.join(sorted(compressed))})" if compressed else ""
        parts.append(
            f"{ar['variables']} all-reduced ({_size(ar['bytes'])}) in {ar['fusion_groups']} fusion group(s) [{algorithms}]{squeeze}"
        )
    if "sharded" in mix:
        sh = mix["sharded"]
        parts.append(
            f"{sh['variables']} sharded ZeRO-style ({_size(sh['bytes'])}, optimizer state split across replicas)"
        )
    text = "; ".join(parts) or "nothing on any synchronizer (no trainable variables)"
    layout = describe_mesh(mix["mesh"]) if "mesh" in mix else ""
    if layout:
        text = f"the replicas in a {layout}, and {text}"
    if mix["consistency"] != "bsp":
        text += f"; {mix['consistency']} consistency"
    return text


def why(
    prediction: Prediction,
    mix: dict[str, Any],
    *,
    data_parallel: Prediction | None,
    best_builder: tuple[str, Prediction] | None,
    builder_name: str | None,
) -> str:
    """Why this candidate is worth running, against plain data parallel and the best AutoDist builder."""
    step = prediction.step_time_s
    sentences = []
    if builder_name is not None:
        sentences.append(f"The pre-built {builder_name} strategy, unchanged.")
    same_batch = (
        "mesh" not in mix
        or not describe_mesh(mix["mesh"])
        or mix["mesh"]["tensor"] * mix["mesh"]["pipeline"] == 1
        or bool(mix["mesh"].get("micro_batch_size"))
    )
    if data_parallel is not None and data_parallel.feasible and same_batch:
        sentences.append(
            f"Predicted {data_parallel.step_time_s / step:.2f}× the speed of plain data parallel "
            f"({_ms(step)} vs {_ms(data_parallel.step_time_s)} per step)."
        )
    elif data_parallel is not None and data_parallel.feasible:
        sentences.append(
            f"Predicted {prediction.samples_per_s / data_parallel.samples_per_s:.2f}× the throughput of plain data parallel "
            f"({prediction.samples_per_s:.1f} vs {data_parallel.samples_per_s:.1f} samples/s; fewer replicas take a smaller "
            "global batch per step)."
        )
    elif data_parallel is not None:
        reason = (data_parallel.infeasible_reason or "").removeprefix("does not fit: ")
        sentences.append(f"Plain data parallel does not fit: {reason}.")
    if best_builder is not None and builder_name != best_builder[0] and best_builder[1].feasible:
        name, pred = best_builder
        sentences.append(
            f"{prediction.samples_per_s / pred.samples_per_s:.2f}× the throughput of the best AutoDist builder, {name} "
            f"({pred.samples_per_s:.1f} samples/s)."
        )
    sentences.append(f"It puts {describe(mix)}.")
    if mix.get("difference"):
        sentences.append(mix["difference"]["sentence"])
    if data_parallel is not None and data_parallel.feasible:
        change = _biggest_change(prediction, data_parallel)
        if change:
            sentences.append(change)
    sentences.append(f"Now: {prediction.bottleneck}.")
    return " ".join(sentences)


def placement(space: Space, batch: CandidateBatch, i: int, v: int) -> str:
    """Where one variable of row i lives, in words (its synchronizer, fusion partners, servers, shards)."""
    context = space.context
    kind = SyncKind(int(batch.kind[i, v]))
    shards = int(batch.shards[i, v])
    split = f" in {shards} shards" if shards > 1 else ""
    if kind == SyncKind.PS:
        servers = sorted({context.devices[int(s)] for s in batch.server[i, v, :shards] if s >= 0})
        replicated = ", replicated locally" if batch.local_replication[i, v] else ""
        return f"parameter server {', '.join(servers)}{split}{replicated}"
    mates = np.flatnonzero((batch.group[i] == batch.group[i, v]) & (batch.kind[i] == batch.kind[i, v]))
    names = [context.variable_names[int(m)] for m in mates if m != v]
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    partners = f", fused with {names[0]}{more}" if names else ", in a fusion group of its own"
    if kind == SyncKind.SHARDED:
        return f"sharded{split}{partners}"
    algorithm = Algorithm(int(batch.algorithm[i, v])).name.lower()
    compressor = CompressorKind(int(batch.compressor[i, v]))
    squeeze = f", compressed {compressor.name.lower()}" if compressor != CompressorKind.NONE else ""
    return f"all-reduce ({algorithm}){split}{partners}{squeeze}"


def differences(
    space: Space, batch: CandidateBatch, i: int, j: int, *, among: np.ndarray, limit: int
) -> list[dict[str, str]]:
    """The variables of `among` (a [V] mask) placed differently in rows i and j: name, i's placement, j's
    (at most `limit`)."""
    out = []
    for v in np.flatnonzero(among):
        here, there = placement(space, batch, i, int(v)), placement(space, batch, j, int(v))
        if here != there:
            out.append({"variable": space.context.variable_names[int(v)], "representative": here, "variant": there})
            if len(out) == limit:
                break
    return out


def _biggest_change(prediction: Prediction, baseline: Prediction) -> str:
    deltas = {k: baseline.breakdown.get(k, 0.0) - v for k, v in prediction.breakdown.items()}
    key = max(deltas, key=lambda k: deltas[k])
    if deltas[key] <= 0:
        return ""
    return (
        f"Against data parallel, {LABELS.get(key, key)} falls from {_ms(baseline.breakdown.get(key, 0.0))} "
        f"to {_ms(prediction.breakdown[key])} per step."
    )


def _consistency(batch: CandidateBatch, i: int) -> str:
    kind = ConsistencyKind(int(batch.consistency[i]))
    if kind == ConsistencyKind.SSP:
        return f"ssp(staleness={int(batch.staleness[i])})"
    return kind.name.lower()


def _counts(values: np.ndarray, names: type[IntEnum]) -> dict[str, int]:
    found, counts = np.unique(values, return_counts=True)
    return {names(int(v)).name.lower(): int(n) for v, n in zip(found, counts, strict=True)}


def _size(nbytes: float) -> str:
    return f"{nbytes / GB:.2f} GB" if nbytes >= 0.1 * GB else f"{nbytes / MB:.1f} MB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
