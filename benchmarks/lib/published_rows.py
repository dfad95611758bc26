"""Published GPU measurements (`shared/published/gpu_measurements.csv`) as what `stratagem.predict` takes.

Each row becomes a model to capture (a Hugging Face config built from the row's numbers and the family's
published defaults, or the zoo's ResNet-50), a ResourceSpec (the row's GPU, count, node size and links),
a `stratagem.Layout` (degrees, ZeRO, batch, schedule, recomputation, precision), and the reasons the
project cannot express the row yet (torch.compile, async TP, fp8 all-gather), which make it a miss.
Only the public API is used: `stratagem.Layout`, `stratagem.ResourceSpec`, the catalog's `lookup`.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratagem import Layout, ResourceSpec
from stratagem.ir.catalog import lookup

COLUMNS = (
    "source",
    "source_path",
    "model_family",
    "model_config",
    "precision",
    "gpu",
    "n_gpus",
    "gpus_per_node",
    "intra_node_link",
    "inter_node_gbps",
    "global_batch",
    "micro_batch",
    "dp",
    "tp",
    "pp",
    "zero_stage",
    "recompute",
    "other_layout",
    "measured_metric",
    "measured_value",
    "notes",
    "derived_iteration_s",
)
GIB = 1024**3


@dataclass(frozen=True)
class Row:
    """One published measurement, typed; `id` is `source:n`, n counting the source's rows from 1."""

    id: str
    source: str
    source_path: str
    family: str
    config: dict[str, Any]
    precision: str
    gpu: str
    n_gpus: int
    gpus_per_node: int
    intra_node_link: str
    inter_node_gbps: float | None
    global_batch: int
    micro_batch: int
    dp: int
    tp: int
    pp: int
    zero_stage: int
    recompute: str
    other: dict[str, Any]
    measured_metric: str
    measured_value: float
    notes: str
    measured_step_s: float
    """`derived_iteration_s`: seconds per optimizer step, the figure the prediction is compared with."""
    raw: dict[str, str] = field(repr=False, compare=False, default_factory=dict)

    @property
    def model(self) -> str:
        """The model's name: Megatron's and torchtitan's `name`, the Hugging Face model id, or torchvision's."""
        return str(self.config.get("name") or self.config.get("hf_model") or self.config.get("torchvision"))

    @property
    def seq(self) -> int | None:
        return int(self.config["seq"]) if "seq" in self.config else None

    @property
    def measured_memory_bytes(self) -> float | None:
        """Peak memory the source reports in its notes (torchtitan's `Memory 82.4 GiB`), if any."""
        found = re.search(r"Memory (\d+(?:\.\d+)?) GiB", self.notes)
        return float(found.group(1)) * GIB if found else None


def read_rows(path: str | Path) -> list[Row]:
    """Every row of the CSV, in file order; a malformed row raises ValueError naming its line and column."""
    with Path(path).open(newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(stream)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        counts: dict[str, int] = {}
        rows = []
        for line, raw in enumerate(reader, start=2):
            counts[raw["source"]] = counts.get(raw["source"], 0) + 1
            try:
                rows.append(_row(raw, f"{raw['source']}:{counts[raw['source']]}"))
            except (KeyError, ValueError, TypeError) as error:
                raise ValueError(f"{path}:{line}: {error}") from None
    return rows


def _row(raw: dict[str, str], ident: str) -> Row:
    def integer(name: str) -> int:
        return int(raw[name])

    gbps = raw["inter_node_gbps"].strip()
    return Row(
        id=ident,
        source=raw["source"],
        source_path=raw["source_path"],
        family=raw["model_family"],
        config=json.loads(raw["model_config"]),
        precision=raw["precision"],
        gpu=raw["gpu"],
        n_gpus=integer("n_gpus"),
        gpus_per_node=integer("gpus_per_node"),
        intra_node_link=raw["intra_node_link"],
        inter_node_gbps=float(gbps) if gbps else None,
        global_batch=integer("global_batch"),
        micro_batch=integer("micro_batch"),
        dp=integer("dp"),
        tp=integer("tp"),
        pp=integer("pp"),
        zero_stage=integer("zero_stage"),
        recompute=raw["recompute"],
        other=json.loads(raw["other_layout"] or "{}"),
        measured_metric=raw["measured_metric"],
        measured_value=float(raw["measured_value"]),
        notes=raw["notes"],
        measured_step_s=float(raw["derived_iteration_s"]),
        raw=dict(raw),
    )


# --- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """What to capture: a Hugging Face config dict (`kind="hf"`) or a zoo model (`kind="zoo"`), at the
    row's micro-batch (and sequence), with the optimizer the row's framework trains it with."""

    kind: str
    name: str
    config: dict[str, Any]
    batch: int
    seq: int | None
    optimizer: str

    def key(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "config": self.config,
            "batch": self.batch,
            "seq": self.seq,
            "optimizer": self.optimizer,
        }


GLUE_HEAD = {"num_labels": 3, "problem_type": "single_label_classification"}
"""MNLI has three classes; `problem_type` is what Hugging Face's sequence classifiers infer for integer
labels, stated so that DeBERTa-v2's loss takes the cross-entropy path (its other path indexes labels by value)."""
LLAMA3_ROPE = {
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}
"""meta-llama/Llama-3.1-8B (and 70B, 405B) config.json: RoPE with Llama-3 scaling, RMSNorm, untied head."""
DEBERTA_V2_XXLARGE = {
    "relative_attention": True,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": "p2c|c2p",
    "conv_kernel_size": 3,
    "conv_act": "gelu",
    "layer_norm_eps": 1e-7,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "type_vocab_size": 0,
    "max_position_embeddings": 512,
}
"""microsoft/deberta-v2-xxlarge config.json beyond the row's numbers: disentangled relative attention
over 256 position buckets with shared keys, the convolution layer beside the first block."""


def model_spec(row: Row) -> ModelSpec:
    """The architecture of a row, from its numbers and its family's published defaults; ValueError for a
    family this benchmark does not know."""
    cfg = row.config
    if "torchvision" in cfg:
        if cfg["torchvision"] != "resnet50":
            raise ValueError(f"model_config: only torchvision's resnet50 is mapped, got {cfg['torchvision']!r}")
        # NVIDIA DeepLearningExamples RN50 trains with SGD and momentum 0.875: one state slot.
        return ModelSpec("zoo", "resnet50", {"zoo": "resnet50", "size": "full"}, row.micro_batch, None, "momentum")
    hf_model = str(cfg.get("hf_model", ""))
    if row.source == "megatron_sc21_table1":
        config = _megatron_gpt(cfg)
        optimizer = "adam"
    elif row.family == "llama":
        config = _llama(cfg, row.seq or 0)
        optimizer = "adamw"
    elif cfg.get("pos") == "alibi" or "bloom" in str(cfg.get("name", "")):
        config = _bloom(cfg)
        optimizer = "adam"
    elif hf_model:
        config = _hugging_face(cfg, hf_model)
        optimizer = "adamw"
    else:
        raise ValueError(f"model_config: no mapping for family {row.family!r} ({row.model})")
    batch, _ = pipeline_micro_batch(row)
    return ModelSpec("hf", row.model, config, batch, row.seq, optimizer)


def _megatron_gpt(cfg: dict[str, Any]) -> dict[str, Any]:
    """Megatron's GPT as GPT-2: learned positions over the sequence (`--max-position-embeddings 2048` in
    examples/sc21/CONFIG.sh), tied input and output embeddings (Megatron's default), GeLU, the row's
    ffn (4h) and its padded vocabulary (51200)."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": cfg["layers"],
        "n_embd": cfg["hidden"],
        "n_head": cfg["heads"],
        "n_inner": cfg["ffn"],
        "n_positions": cfg["seq"],
        "vocab_size": cfg["vocab"],
        "activation_function": "gelu",
    }


def _llama(cfg: dict[str, Any], seq: int) -> dict[str, Any]:
    """Llama 3.1 with grouped-query attention; RoPE has no position table, so `max_position_embeddings`
    is raised to the row's sequence where torchtitan trains longer (its context-parallel runs)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": cfg["layers"],
        "hidden_size": cfg["hidden"],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "intermediate_size": cfg["ffn"],
        "vocab_size": cfg["vocab"],
        **LLAMA3_ROPE,
        "max_position_embeddings": max(LLAMA3_ROPE["max_position_embeddings"], seq),
    }


def _bloom(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers' BloomConfig (bigscience/bloom config.json): ALiBi, no position table, an MLP of 4h."""
    if cfg["ffn"] != 4 * cfg["hidden"]:
        raise ValueError(f"model_config: BLOOM's MLP is 4*hidden({4 * cfg['hidden']}), the row says {cfg['ffn']}")
    return {
        "model_type": "bloom",
        "architectures": ["BloomForCausalLM"],
        "n_layer": cfg["layers"],
        "hidden_size": cfg["hidden"],
        "n_head": cfg["heads"],
        "vocab_size": cfg["vocab"],
    }


def _hugging_face(cfg: dict[str, Any], hf_model: str) -> dict[str, Any]:
    """DeepSpeedExamples' autotuning models by their Hugging Face config fields: GLUE MNLI fine-tunes train
    the sequence-classification head; `run_clm` trains GPT-2's language-model head."""
    glue = "GLUE" in str(cfg.get("task", ""))
    if hf_model.startswith("gpt2"):
        # openai-community/gpt2* config.json: learned positions over 1024 tokens, gelu_new, tied embeddings.
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_layer": cfg["layers"],
            "n_embd": cfg["hidden"],
            "n_head": cfg["heads"],
            "n_inner": cfg["ffn"],
            "n_positions": 1024,
            "vocab_size": cfg["vocab"],
            "activation_function": "gelu_new",
        }
    head = {"architectures": [], **GLUE_HEAD} if glue else {}
    if hf_model.startswith("distilbert"):
        # distilbert/distilbert-base-uncased config.json: 512 positions, sinusoidal off, GeLU.
        head["architectures"] = ["DistilBertForSequenceClassification"] if glue else ["DistilBertForMaskedLM"]
        return {
            "model_type": "distilbert",
            "n_layers": cfg["layers"],
            "dim": cfg["hidden"],
            "n_heads": cfg["heads"],
            "hidden_dim": cfg["ffn"],
            "vocab_size": cfg["vocab"],
            "max_position_embeddings": 512,
            **head,
        }
    if hf_model.startswith("bert-"):
        # google-bert/bert-base-cased, bert-large-uncased config.json: 512 positions, 2 token types, GeLU.
        head["architectures"] = ["BertForSequenceClassification"] if glue else ["BertForMaskedLM"]
        return {
            "model_type": "bert",
            "num_hidden_layers": cfg["layers"],
            "hidden_size": cfg["hidden"],
            "num_attention_heads": cfg["heads"],
            "intermediate_size": cfg["ffn"],
            "vocab_size": cfg["vocab"],
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            **head,
        }
    if hf_model == "microsoft/deberta-v2-xxlarge":
        head["architectures"] = ["DebertaV2ForSequenceClassification"] if glue else ["DebertaV2ForMaskedLM"]
        return {
            "model_type": "deberta-v2",
            "num_hidden_layers": cfg["layers"],
            "hidden_size": cfg["hidden"],
            "num_attention_heads": cfg["heads"],
            "intermediate_size": cfg["ffn"],
            "vocab_size": cfg["vocab"],
            **DEBERTA_V2_XXLARGE,
            **head,
        }
    raise ValueError(f"model_config: no Hugging Face mapping for {hf_model!r}")


# --- the cluster ------------------------------------------------------------------------------

GPU_KINDS = {
    "A100-SXM4-80GB": "A100-80GB",
    "V100-SXM2-16GB": "V100-16GB",
    "V100 (16 in one node; memory unstated)": "V100",
    "H100-SXM 96GB HBM2e (500W cap)": "H100",
    "H200": "H200",
}
"""The row's GPU as a catalog kind. DeepSpeed's 16-V100 node is a DGX-2 (the source's notes): V100 SXM3
32 GB on NVSwitch, the catalog's V100 (32 GB, 900 GB/s, NVLink2 at 150 GB/s per direction per GPU,
which NVSwitch gives every pair). torchtitan's H100 is overridden below."""
H100_96GB = "H100-SXM 96GB HBM2e (500W cap)"
INFINIBAND_LATENCY_US = 5.0
"""One RDMA hop between nodes: the project's worked example (docs/layouts.md); NCCL's own tuning model
puts a network step at 2.7-14 us by protocol (NVIDIA/nccl src/graph/tuning.cc, hwLat for NET)."""


def device_overrides(row: Row) -> dict[str, Any]:
    """`ResourceSpec.devices` entries for parts the catalog lacks, keyed by the catalog kind they replace
    (so the kind keeps its NVLink default and its feature code); each figure with its source."""
    if row.gpu != H100_96GB:
        return {}
    base = lookup("H100")
    assert base is not None
    flops = dict(base.peak_flops)
    # NVIDIA H100 SXM data sheet: 1,979 TFLOP/s dense FP8 (3,958 with sparsity); the catalog may lack it.
    flops.setdefault("float8", 1979e12)
    spec = base.model_copy(
        update={
            "name": "H100-SXM-96GB-HBM2e",
            # pytorch/torchtitan docs/performance.md (Grand Teton): "96GB HBM2e with 2.4 TB/sec peak memory
            # bandwidth", run at the default 500 W power limit (the 700 W SXM data sheet's peak FLOP/s is kept:
            # no figure at 500 W is published).
            "memory_bytes": 96e9,
            "memory_bandwidth": 2.4e12,
            "peak_flops": flops,
        }
    )
    return {"H100": spec.model_dump(mode="json")}


def proposed_catalog_entries(rows: list[Row]) -> list[dict[str, Any]]:
    """The device overrides these rows needed, once each, as entries the catalog could take."""
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        for kind, spec in device_overrides(row).items():
            seen.setdefault(
                spec["name"],
                {
                    "replaces_kind": kind,
                    "row_gpu": row.gpu,
                    "spec": spec,
                    "sources": [
                        "memory and bandwidth: pytorch/torchtitan docs/performance.md (96GB HBM2e, 2.4 TB/s, 500 W)",
                        "float8 peak: NVIDIA H100 SXM data sheet (1,979 TFLOP/s dense)",
                        "other peaks: the catalog's H100 (700 W SXM data sheet)",
                    ],
                },
            )
    return list(seen.values())


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
        }
    overrides = device_overrides(row)
    if overrides:
        spec["devices"] = overrides
    return ResourceSpec.parse(spec)


# --- the layout -------------------------------------------------------------------------------

PRECISIONS = (
    ("bf16 + float8", "fp8"),
    ("amp_fp16", "amp-fp16"),
    ("fp16", "amp-fp16"),
    ("bf16", "amp-bf16"),
    ("fp32", "fp32"),
)
"""Source wording to `Layout.precision`, first prefix wins. Megatron's and DeepSpeed's `--fp16`/`fp16`
and Hugging Face's AMP keep fp32 main weights (amp-fp16); BLOOM's BF16_Optimizer and torchtitan's FSDP2
(`mixed_precision_param = "bfloat16"` over fp32 shards) likewise (amp-bf16); torchtitan's float8 linears
beside bf16 are `fp8`."""
TORCHTITAN_INTERLEAVED_CHUNKS = 2
"""torchtitan's multi-stage schedules hold 2 stages per rank unless `pipeline_parallel_layers_per_stage`
says otherwise (stratagem/interop/torchtitan.py, MULTI_STAGE)."""


def precision(row: Row) -> str:
    text = row.precision.strip().lower()
    for prefix, name in PRECISIONS:
        if text.startswith(prefix):
            return name
    raise ValueError(f"precision: no Layout precision for {row.precision!r}")


def recompute(row: Row) -> str:
    text = row.recompute.strip().lower()
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
    """The row's layout: every degree, ZeRO, the batch, schedule, recomputation, precision and sequence
    parallelism (Megatron's explicit flag; torchtitan always splits norms along the sequence under TP)."""
    context = int(row.other.get("cp", 1))
    if row.dp * row.tp * row.pp * context != row.n_gpus:
        raise ValueError(f"dp*tp*pp*cp = {row.dp * row.tp * row.pp * context} != n_gpus({row.n_gpus})")
    sched, chunks = schedule(row)
    micro, count = pipeline_micro_batch(row)
    sequence_parallel = bool(row.other.get("seq_parallel", False))
    if row.source == "torchtitan_benchmarks" and row.tp > 1:
        sequence_parallel = True
    return Layout(
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
    )


UNEXPRESSED = (
    ("compile", "torch.compile: the IR has no compile knob (fused kernels, fewer launches)"),
    ("async_tp", "async tensor parallelism: the IR has no knob overlapping TP collectives with the matmuls"),
    ("fsdp_float8_all_gather", "float8 all-gather: FSDP gathers fp8 weights; the IR has no knob for the gather dtype"),
)
"""`other_layout` flags that change the step time and that no Layout or Strategy field states."""


def expressibility_misses(row: Row) -> list[str]:
    """Why the project cannot state this row yet (empty when it can)."""
    return [reason for key, reason in UNEXPRESSED if row.other.get(key) is True]


# --- groups -----------------------------------------------------------------------------------


def cluster_key(row: Row) -> str:
    """One model on one cluster kind: what Kendall tau compares within."""
    return f"{row.source}|{row.model}|{row.gpu}"


SERIES_FLAGS = ("variant", "cp", "compile", "float8", "async_tp", "fsdp_float8_all_gather", "virtual_pipeline_chunks")
"""`other_layout` keys that make two runs different configurations (the rest describe the same run)."""


def series_key(row: Row) -> str:
    """Rows that differ only in GPU count (and the data degree and global batch that follow it)."""
    flags = ",".join(f"{k}={row.other[k]}" for k in SERIES_FLAGS if k in row.other)
    layout = f"mb={row.micro_batch},seq={row.seq},tp={row.tp},pp={row.pp},zero={row.zero_stage},{row.recompute}"
    return "|".join([row.source, row.model, row.gpu, row.precision, layout, flags])


def samples_per_s(row: Row) -> float:
    return row.global_batch / row.measured_step_s if row.measured_step_s > 0 else math.nan
