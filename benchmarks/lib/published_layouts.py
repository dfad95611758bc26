"""The setting of each published row: its cluster (GPU kind, nodes and links), its `stratagem.Layout`, and
what the IR cannot state.
"""

from __future__ import annotations

from typing import Any

from benchmarks.lib.published_rows import Row
from stratagem import Layout, ResourceSpec
from stratagem.ir.catalog import lookup

# --- the cluster ------------------------------------------------------------------------------

GPU_KINDS = {
    "A100-SXM4-80GB": "A100-80GB",
    "V100-SXM2-16GB": "V100-16GB",
    "V100 (16 in one node; memory unstated)": "V100",
    "H100-SXM 96GB HBM2e (500W cap)": "H100-SXM-96GB-HBM2e",
    "H200": "H200",
}
"""The row's GPU as a catalog kind. DeepSpeed's 16-V100 node is a DGX-2 (the source's notes): V100 SXM3
32 GB on NVSwitch, the catalog's V100 (32 GB, 900 GB/s, NVLink2 at 150 GB/s per direction per GPU,
which NVSwitch gives every pair). torchtitan's H100 is the catalog's 96 GB HBM2e part at its 500 W cap
(`stratagem.ir.catalog.H100_500W_CLOCK`)."""
INFINIBAND_LATENCY_US = 14.0
"""One step of NCCL's Simple-protocol ring through a NIC (NVIDIA/nccl@5067397c src/graph/tuning.cc,
`hwLatencies` for NET), the figure a link's `latency_us` states; LL and LL128 steps scale from it."""
INFINIBAND_EFFICIENCY = 0.95
"""Bus bandwidth NCCL reaches through InfiniBand HCAs over their data rate: 12.2 of 12.5 GB/s through one
100 Gb/s EDR card (sjeaugey in NVIDIA/nccl-tests#29)."""


def proposed_catalog_entries(rows: list[Row]) -> list[dict[str, Any]]:
    """Device kinds these rows name that the catalog lacks (none: every row's GPU is a catalog kind)."""
    return [{"row_gpu": gpu} for gpu in sorted({row.gpu for row in rows}) if lookup(GPU_KINDS.get(gpu, gpu)) is None]


def cluster(row: Row) -> ResourceSpec:
    """The row's GPUs on nodes of `gpus_per_node` (the last node holds what is left), the catalog's
    intra-node link for the kind, and the row's per-node injection bandwidth between nodes."""
    kind = GPU_KINDS.get(row.gpu)
    if kind is None:
        raise ValueError(f"gpu: no catalog kind for {row.gpu!r}; known: {', '.join(GPU_KINDS)}")
    nodes = []
    left, index = row.n_gpus, 0
    while left > 0:
        count = min(row.gpus_per_node, left)
        nodes.append({"address": f"node{index:04d}", "chief": index == 0, "gpus": list(range(count)), "device": kind})
        left -= count
        index += 1
    spec: dict[str, Any] = {"name": f"{row.source}:{kind}x{row.n_gpus}", "nodes": nodes}
    if len(nodes) > 1:
        if row.inter_node_gbps is None:
            raise ValueError(f"inter_node_gbps: {len(nodes)} nodes and no bandwidth between them")
        spec["network"] = {
            "kind": "infiniband",
            "bandwidth_gbps": row.inter_node_gbps,
            "latency_us": INFINIBAND_LATENCY_US,
            "efficiency": INFINIBAND_EFFICIENCY,
        }
    return ResourceSpec.parse(spec)


# --- the layout -------------------------------------------------------------------------------

PRECISIONS = (
    ("bf16 + float8", "fp8"),
    ("amp_fp16", "amp-fp16"),
    ("fp16", "fp16"),
    ("bf16", "amp-bf16"),
    ("fp32", "fp32"),
)
"""Source wording to `Layout.precision`, first prefix wins (after `SIXTEEN_BIT_MODELS` and the Trainer's
own runs). DeepSpeed's `fp16` runs train an fp16 model beside fp32 master weights (`fp16.enabled`: the
engine halves the model and its ZeRO or fp16 optimizer steps fp32 copies); DLPerf's AMP keeps fp32 weights
(amp-fp16); torchtitan's float8 linears beside bf16 are `fp8`."""
AUTOCAST_VARIANTS = ("baseline_hf_ddp",)
"""Runs whose `fp16` is Hugging Face Trainer's `--fp16` without DeepSpeed: native AMP over fp32 weights."""
TORCHTITAN_INTERLEAVED_CHUNKS = 2
"""torchtitan's multi-stage schedules hold 2 stages per rank unless `pipeline_parallel_layers_per_stage`
says otherwise (stratagem/interop/torchtitan.py, MULTI_STAGE)."""


SIXTEEN_BIT_MODELS = ("megatron_sc21_table1", "bigscience_bloom176b", "torchtitan_benchmarks")
"""Sources whose engine trains a 16-bit model beside fp32 main weights and optimizer state, with no
autocast: Megatron-LM's `--fp16` (Float16Module, fp16 gradients all-reduced by its local DDP), the IR's
`fp16`, and Megatron-DeepSpeed's `--bf16` (BLOOM), priced as the IR's `bf16` (`simulator.precision`).
torchtitan's FSDP2 (`mixed_precision_param = "bfloat16"`) gathers its fp32 shards as bf16 and computes
in bf16, without autocast (torchtitan's `maybe_enable_amp` leaves mixed precision to FSDP), so it is
`bf16` too, except that it reduce-scatters gradients in fp32 (`mixed_precision_reduce`) where `bf16`
reduces in bf16."""


def precision(row: Row) -> str:
    text = row.precision.strip().lower()
    if row.source in SIXTEEN_BIT_MODELS and text in ("fp16", "bf16"):
        return text
    if text.startswith("fp16") and row.other.get("variant") in AUTOCAST_VARIANTS:
        return "amp-fp16"
    for prefix, name in PRECISIONS:
        if text.startswith(prefix):
            return name
    raise ValueError(f"precision: no Layout precision for {row.precision!r}")


def recompute(row: Row) -> str:
    """torchtitan's "selective (op)" and its llama3_8b.toml default (`selective_ac_option = "op"`) are
    per-op checkpointing (`selective-op`); Megatron's selective is the attention core's."""
    text = row.recompute.strip().lower()
    if row.source == "torchtitan_benchmarks" and text.startswith("selective"):
        return "selective-op"
    for name in ("none", "selective", "full"):
        if text.startswith(name):
            return name
    raise ValueError(f"recompute: no Layout recomputation for {row.recompute!r}")


def schedule(row: Row) -> tuple[str, int]:
    """(schedule, virtual stages): Megatron's `virtual_pipeline_chunks`, torchtitan's `pp_schedule`."""
    if row.pp == 1:
        return "1f1b", 1
    named = str(row.other.get("pp_schedule", "")).lower()
    chunks = int(row.other.get("virtual_pipeline_chunks", 1))
    if named.startswith("interleaved"):
        chunks = max(chunks, TORCHTITAN_INTERLEAVED_CHUNKS)
    if named and named not in ("1f1b", "interleaved1f1b"):
        raise ValueError(f"other_layout.pp_schedule: no Layout schedule for {named!r}")
    return ("interleaved-1f1b", chunks) if chunks > 1 else ("1f1b", 1)


def pipeline_micro_batch(row: Row) -> tuple[int, int]:
    """(samples per micro-batch, micro-batches per replica per step). torchtitan's `local_batch_size` is a
    replica's step, split into as many pipeline micro-batches as stages by default; Megatron's and
    DeepSpeed's micro-batch is the micro-batch."""
    if row.pp > 1 and str(row.other.get("pp_microbatches", "")).startswith("default"):
        count = row.pp
        if row.micro_batch % count:
            raise ValueError(f"micro_batch: {row.micro_batch} does not split into {count} pipeline micro-batches")
        return row.micro_batch // count, count
    per_step = row.micro_batch * row.dp
    if row.global_batch % per_step:
        raise ValueError(f"global_batch({row.global_batch}) is not a multiple of micro_batch*dp({per_step})")
    count = row.global_batch // per_step
    stated = row.other.get("microbatches_per_pipeline")
    if stated is not None and int(stated) != count:
        raise ValueError(f"other_layout.microbatches_per_pipeline({stated}) != global_batch/(micro_batch*dp)({count})")
    return row.micro_batch, count


def layout(row: Row) -> Layout:
    """The row's layout: every degree, ZeRO, the batch, schedule, recomputation, precision, sequence
    parallelism (Megatron's explicit flag; torchtitan always splits norms along the sequence under TP),
    async tensor parallelism and fp8 FSDP gathers (torchtitan's `async_tp`, `fsdp_float8_all_gather`)."""
    context = int(row.other.get("cp", 1))
    if row.dp * row.tp * row.pp * context != row.n_gpus:
        raise ValueError(f"dp*tp*pp*cp = {row.dp * row.tp * row.pp * context} != n_gpus({row.n_gpus})")
    sched, chunks = schedule(row)
    micro, count = pipeline_micro_batch(row)
    sequence_parallel = bool(row.other.get("seq_parallel", False))
    if row.source == "torchtitan_benchmarks" and row.tp > 1:
        sequence_parallel = True
    fused = bool(row.other.get("compile", False)) or row.source in FUSED_KERNELS
    return Layout(
        async_tensor_parallel=row.other.get("async_tp") is True,
        fp8_all_gather=row.other.get("fsdp_float8_all_gather") is True,
        data=row.dp,
        tensor=row.tp,
        pipeline=row.pp,
        context=context,
        micro_batch=micro,
        micro_batches=count,
        global_batch=row.global_batch,
        schedule=sched,
        virtual_stages=chunks,
        zero=row.zero_stage,
        recompute=recompute(row),
        precision=precision(row),
        sequence_parallel=sequence_parallel,
        compile=fused,
        bucket_mb=DDP_BUCKET_MB.get(row.source) if row.zero_stage == 0 else None,
        overlap_grad_reduce=overlap_grad_reduce(row),
    )


REDUCE_AFTER_BACKWARD = ("megatron_sc21_table1", "bigscience_bloom176b")
"""Sources whose engine reduces gradients after backward. Megatron-LM at the SC'21 scripts' commit
(6985e58, `megatron/training.py`'s `train_step`) all-reduces its local DDP's gradient buffers once the
forward-backward schedule returns; BLOOM's Megatron-DeepSpeed steps through DeepSpeed's pipeline engine,
which reduces them after the schedule (`ReduceGrads`)."""


def overlap_grad_reduce(row: Row) -> bool:
    """False where the engine reduces gradients after backward: `REDUCE_AFTER_BACKWARD`, and the DeepSpeed
    source's DeepSpeed runs below stage 3. DeepSpeed at the examples' commit (9caa74e) all-reduces stage 0's
    gradients after backward (`engine.allreduce_gradients`) and reduces stages 1 and 2 during it only with
    `overlap_comm`, which defaults to false below stage 3 (`zero/constants.py`) and which the examples'
    ds_configs do not set. Hugging Face's own runs (`AUTOCAST_VARIANTS`) overlap, as torch's DDP does."""
    if row.source in REDUCE_AFTER_BACKWARD:
        return False
    if row.source == "deepspeed_autotuning_hf" and row.other.get("variant") not in AUTOCAST_VARIANTS:
        return row.zero_stage == 3
    return True


DDP_BUCKET_MB = {"dlperf_ngc_pytorch_resnet50": 38}
"""Sources whose data parallelism buckets gradients other than torch DDP's 25 MiB. DLPerf ran NVIDIA
DeepLearningExamples' ResNet-50 at 5cc03caa (its README), whose `image_classification/training.py` wraps
the model in apex's `DistributedDataParallel`, not torch's as the CSV's note says, at its default
`message_size` of 10M elements: 38 MiB of fp32 gradients (under apex's O1 the weights, and so the
gradients, stay fp32 with AMP too). Apex's first bucket is as large as the rest, where a layout's closes at
DDP's 1 MiB: the last layer's gradients start one bucket early."""


FUSED_KERNELS = ("megatron_sc21_table1", "bigscience_bloom176b")
"""Sources whose engine runs each element-wise chain of a block as one hand-written kernel, which is what
`Layout.compile` prices: Megatron-LM's `--masked-softmax-fusion`, `--bias-gelu-fusion` and
`--bias-dropout-fusion` (on by default; the authors' examples/sc21 scripts do not turn them off) with apex's
fused LayerNorm, and Megatron-DeepSpeed's same kernels for BLOOM. torchtitan states `compile` per row."""
UNEXPRESSED: tuple[tuple[str, str], ...] = ()
"""`other_layout` flags that change the step time and that no Layout or Strategy field states."""


def expressibility_misses(row: Row) -> list[str]:
    """Why the project cannot state this row yet (empty when it can)."""
    return [reason for key, reason in UNEXPRESSED if row.other.get(key) is True]
