"""The architecture of each published row: a Hugging Face config built from the row's numbers and its
family's published defaults (each cited), or the zoo's ResNet-50 v1.5, with the optimizer its framework
trains it with, captured at the row's micro-batch and sequence (`benchmarks/lib/published_capture.py`).
No hub download: every field is the row's or a default named here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.published_layouts import pipeline_micro_batch
from benchmarks.lib.published_rows import Row
from stratagem import ModelGraph


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
    attn_implementation: str = "sdpa"
    """The attention the source's run used (`ATTENTION`)."""
    dtype: str = "float32"
    """The dtype the run's parameters compute in (`COMPUTE_DTYPE`)."""

    def key(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "config": self.config,
            "batch": self.batch,
            "seq": self.seq,
            "optimizer": self.optimizer,
            "attn_implementation": self.attn_implementation,
            "dtype": self.dtype,
        }


ATTENTION = {
    "megatron_sc21_table1": "eager",
    "bigscience_bloom176b": "eager",
    "deepspeed_autotuning_hf": "eager",
    "torchtitan_benchmarks": "sdpa",
}
"""The attention each source's runs used: Megatron-LM (2021) and Megatron-DeepSpeed (BLOOM) compute the
scores with batched matmuls through memory (fused scale-mask-softmax, no flash kernel: FlashAttention is
from 2022); transformers 4.12 (DeepSpeed's autotuning runs) had only eager attention; torchtitan's Llama
calls `scaled_dot_product_attention` (a flash kernel on H100)."""
COMPUTE_DTYPE = {"torchtitan_benchmarks": "bfloat16"}
"""Sources whose runs compute with bf16 parameters: torchtitan's FSDP2 casts them for compute
(`MixedPrecisionPolicy(param_dtype=bfloat16)`), so norms and the loss cast activations to fp32 and back
as captured in bf16. Others run autocast over fp32 weights (or Megatron's fp16 copies) and are captured
in fp32, their activations scaled by the precision."""


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
    return ModelSpec(
        "hf",
        row.model,
        config,
        batch,
        row.seq,
        optimizer,
        ATTENTION.get(row.source, "sdpa"),
        COMPUTE_DTYPE.get(row.source, "float32"),
    )


def _megatron_gpt(cfg: dict[str, Any]) -> dict[str, Any]:
    """Megatron's GPT as GPT-2: learned positions over the sequence (`--max-position-embeddings 2048` in
    examples/sc21/CONFIG.sh), tied input and output embeddings (Megatron's default), GeLU, the row's
    ffn (4h) and its padded vocabulary (51200)."""
    return _gpt2(cfg, positions=cfg["seq"], activation="gelu")


def _gpt2(cfg: dict[str, Any], *, positions: int, activation: str) -> dict[str, Any]:
    """The row's shape in transformers' GPT2Config, with its language-model head."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": cfg["layers"],
        "n_embd": cfg["hidden"],
        "n_head": cfg["heads"],
        "n_inner": cfg["ffn"],
        "n_positions": positions,
        "vocab_size": cfg["vocab"],
        "activation_function": activation,
    }


def _bert_named(cfg: dict[str, Any]) -> dict[str, Any]:
    """The row's shape under the field names BERT's config gave its descendants (DeBERTa, Llama)."""
    return {
        "num_hidden_layers": cfg["layers"],
        "hidden_size": cfg["hidden"],
        "num_attention_heads": cfg["heads"],
        "intermediate_size": cfg["ffn"],
        "vocab_size": cfg["vocab"],
    }


def _llama(cfg: dict[str, Any], seq: int) -> dict[str, Any]:
    """Llama 3.1 with grouped-query attention; RoPE has no position table, so `max_position_embeddings`
    is raised to the row's sequence where torchtitan trains longer (its context-parallel runs)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **_bert_named(cfg),
        "num_key_value_heads": cfg["kv_heads"],
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
        return _gpt2(cfg, positions=1024, activation="gelu_new")
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
            **_bert_named(cfg),
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            **head,
        }
    if hf_model == "microsoft/deberta-v2-xxlarge":
        head["architectures"] = ["DebertaV2ForSequenceClassification"] if glue else ["DebertaV2ForMaskedLM"]
        return {
            "model_type": "deberta-v2",
            **_bert_named(cfg),
            **DEBERTA_V2_XXLARGE,
            **head,
        }
    raise ValueError(f"model_config: no Hugging Face mapping for {hf_model!r}")


FUSED_OPTIMIZER_SOURCES = ("megatron_sc21_table1", "bigscience_bloom176b")
"""Sources whose engine steps a fused Adam: Megatron-LM's `--optimizer adam` is apex's `FusedAdam`, and
Megatron-DeepSpeed's (BLOOM) is DeepSpeed's or apex's."""
TORCHTITAN_FUSED_FROM_YEAR = 2025
"""torchtitan's optimizer was `foreach` unless `--optimizer.fused` (default off) until its
`optimizer.implementation` arrived with `fused` the default (pytorch/torchtitan, torchtitan/config_manager.py,
December 2024 against June 2025): its 2024-12 benchmark ran foreach, its 2025-06 ones fused."""


def optimizer_implementation(row: Row) -> str:
    """How the row's framework steps its optimizer (`OptimizerSpec.implementation`). Hugging Face's Trainer
    4.12 (the DeepSpeed source's runs) builds transformers' own `AdamW`, a loop over the parameters
    (transformers/optimization.py): run without DeepSpeed, or by DeepSpeed without ZeRO in fp32 (which
    steps the client optimizer over the model's parameters), it steps one tensor at a time; DeepSpeed's
    fp16 and ZeRO optimizers step it over flat buffers (the DeepSpeed configs name no optimizer, so the
    client's is used), unfused. NVIDIA's ResNet-50 recipe steps `torch.optim.SGD` of PyTorch 1.5 (NGC 20.03),
    which has no multi-tensor path."""
    if row.source in FUSED_OPTIMIZER_SOURCES:
        return "fused"
    if row.source == "torchtitan_benchmarks":
        dated = re.search(r"_(\d{4})-?\d{2}_", row.source_path)
        fused = dated is not None and int(dated.group(1)) >= TORCHTITAN_FUSED_FROM_YEAR
        return "fused" if fused else "multi-tensor"
    if row.source == "dlperf_ngc_pytorch_resnet50":
        return "for-loop"
    plain = row.other.get("variant") == "baseline_hf_ddp"
    unsharded_fp32 = row.zero_stage == 0 and row.precision.startswith("fp32")
    return "for-loop" if plain or unsharded_fp32 else "multi-tensor"


CLIPPING_SOURCES = ("megatron_sc21_table1", "bigscience_bloom176b", "torchtitan_benchmarks")
"""Sources whose runs clip the gradient to a global norm of 1.0: Megatron-LM's SC21 script passes
`--clip-grad 1.0` (examples/sc21/run_table_1.sh), Megatron-DeepSpeed (BLOOM) keeps Megatron's default of
1.0, torchtitan's Llama 3.1 configs set `max_norm = 1.0` (train_configs/llama3_*.toml)."""


def max_grad_norm(row: Row) -> float | None:
    """The global norm the row's run clips its gradient to (`OptimizerSpec.max_grad_norm`). Hugging Face's
    Trainer 4.12 clips at its `max_grad_norm` default of 1.0 when it steps the optimizer itself; under
    DeepSpeed it leaves clipping to the engine, whose `gradient_clipping` the source's configs do not set
    (4.12 fills it from the Trainer only where a config says "auto"). NVIDIA's ResNet-50 recipe does not clip."""
    if row.source in CLIPPING_SOURCES:
        return 1.0
    if row.source == "deepspeed_autotuning_hf" and row.other.get("variant") == "baseline_hf_ddp":
        return 1.0
    return None


def training_graph(graph: ModelGraph, row: Row) -> ModelGraph:
    """The captured graph with the optimizer the row's framework runs: its implementation and clipping."""
    update = {"implementation": optimizer_implementation(row), "max_grad_norm": max_grad_norm(row)}
    if all(getattr(graph.optimizer, key) == value for key, value in update.items()):
        return graph
    return graph.replace(optimizer=graph.optimizer.model_copy(update=update))
