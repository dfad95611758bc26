"""Capture a Hugging Face model from its config alone: built on the meta device, no weights, no network.

`capture_hf_config(config, batch=1, seq=4096)` takes a config dict, a path to `config.json`, or a
`transformers` config object, builds the model with `transformers` (its language-model head where it
has one, so the step includes the loss; the sequence-classification head where `architectures` names
one, as a GLUE fine-tune trains), and records one training step on `batch × seq` token ids as
a ModelGraph whose `architecture` is the config's shape. Parameters are fp32 whatever the config's
`torch_dtype` says (or the `dtype` asked for): the layout's precision decides the numerics. Attention runs as SDPA (`attn_implementation
="sdpa"`, the default), whose kernels capture counts with the textbook FLOPs where torch's counter has no
formula (`stratagem.tracing.flops`), so attention is never free; flash attention does the same arithmetic,
and the graph records each call (`Layer.attention`) so that a GPU prices it as one fused kernel.
`attn_implementation="eager"` captures the model's own matmuls and softmax instead, for a run that used
them. Architectures transformers has no SDPA path for (BLOOM's ALiBi, DeBERTa-v2's disentangled attention)
run their own eager attention, as they train; `provenance.attn_implementation` says which ran.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from stratagem.architecture import hf_architecture
from stratagem.errors import CaptureError
from stratagem.ir import ModelGraph, OptimizerSpec

HF_EXTRA_HINT = "pip install 'stratagem[hf]'"
DEFAULT_OPTIMIZER = "adamw"
"""What Hugging Face models train with (the same state bytes as Adam)."""
AttnImplementation = Literal["sdpa", "eager"]
ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("sdpa", "eager")
CaptureDType = Literal["float32", "bfloat16", "float16"]
CAPTURE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def capture_hf_config(
    config: Mapping[str, Any] | str | Path | Any,
    *,
    batch: int,
    seq: int,
    optimizer: str = DEFAULT_OPTIMIZER,
    optimizer_implementation: str = "multi-tensor",
    max_grad_norm: float | None = None,
    name: str | None = None,
    attn_implementation: AttnImplementation = "sdpa",
    dtype: CaptureDType = "float32",
) -> ModelGraph:
    """One training step of the model `config` describes, at `batch` sequences of `seq` tokens.

    `attn_implementation` is the attention the training run uses: `sdpa` (one fused kernel per core on
    a GPU) or `eager` (the model's own matmuls and softmax, its s x s scores through memory, as
    transformers before 4.36 and engines with their own attention ran). `dtype` is the dtype the
    model's parameters compute in: `bfloat16` for a run whose weights are cast to bf16 for compute
    (FSDP2's `param_dtype`), so that the graph records the casts to fp32 its norms and loss make.
    `optimizer_implementation` and `max_grad_norm` are as in `stratagem.capture`."""
    for option, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CaptureError(f"{option}: must be a positive integer, got {value!r}")
    if dtype not in CAPTURE_DTYPES:
        raise CaptureError(f"dtype: {dtype!r} is not one of {', '.join(CAPTURE_DTYPES)}")
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise CaptureError(
            f"attn_implementation: {attn_implementation!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}"
        )
    import torch

    from stratagem.tracing import capture

    hf_config = load_config(config)
    model, causal, classifier = _build(hf_config, attn_implementation)
    model = model.to(getattr(torch, dtype))
    positions = getattr(hf_config, "max_position_embeddings", None)
    if isinstance(positions, int) and seq > positions:
        raise CaptureError(f"seq: {seq} is longer than the model's max_position_embeddings({positions})")
    with torch.device("meta"):
        ids = torch.zeros(batch, seq, dtype=torch.long)
        labels = torch.zeros(batch, dtype=torch.long) if classifier else ids
    inputs = {"input_ids": ids, "labels": labels}
    graph = capture(
        model,
        inputs,
        batch_size=batch,
        optimizer=optimizer,
        optimizer_implementation=optimizer_implementation,
        max_grad_norm=max_grad_norm,
        loss_fn=_loss,
        name=name or _name(hf_config),
    )
    graph.architecture = hf_architecture(hf_config, seq=seq, causal=causal)
    if dtype != "float32":
        # The optimizer steps fp32 master weights (FSDP2's sharded parameters, or a bf16 run's master copy).
        graph.optimizer = OptimizerSpec.of(optimizer, 4, optimizer_implementation, max_grad_norm)
    graph.provenance["hf_config"] = json.loads(hf_config.to_json_string(use_diff=True))
    graph.provenance["attn_implementation"] = model.config._attn_implementation
    return graph


def load_config(config: Mapping[str, Any] | str | Path | Any) -> Any:
    """A `transformers` config from a dict, a `config.json` path or a config object."""
    try:
        import transformers
    except ImportError:
        raise CaptureError(f"capturing a Hugging Face config needs transformers: {HF_EXTRA_HINT}") from None

    if isinstance(config, transformers.PretrainedConfig):
        return config
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise CaptureError(f"{path}: no such config file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CaptureError(f"{path}: not a readable config.json ({error})") from None
        return _from_dict(data, where=str(path))
    if isinstance(config, Mapping):
        return _from_dict(dict(config), where="config")
    raise CaptureError(
        f"config: expected a dict, a path to config.json or a transformers config, got {type(config).__name__}"
    )


def _from_dict(data: Any, *, where: str) -> Any:
    from transformers import AutoConfig

    if not isinstance(data, dict):
        raise CaptureError(f"{where}: a config is a JSON object, got {type(data).__name__}")
    fields = dict(data)
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str):
        raise CaptureError(f"{where}: model_type is missing (it names the architecture, e.g. llama or gpt2)")
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as error:
        raise CaptureError(f"{where}: model_type {model_type!r} is not a transformers architecture ({error})") from None


def _build(config: Any, attn_implementation: str = "sdpa") -> tuple[Any, bool, bool]:
    """The model with its training head on meta, whether it is causal and whether its head classifies
    whole sequences: the head `architectures` names (a `...ForSequenceClassification` too), else a
    masked LM for an encoder (a config with a masked-LM head that is not marked `is_decoder`), else a
    causal LM. Attention is SDPA where transformers has it for the architecture, else its eager code."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification

    # Any: transformers types `_model_mapping` as None on the base class the auto classes' types join to.
    heads: list[tuple[Any, bool]] = [(AutoModelForCausalLM, True), (AutoModelForMaskedLM, False)]
    named = " ".join(getattr(config, "architectures", None) or [])
    encoder = type(config) in AutoModelForMaskedLM._model_mapping and not getattr(config, "is_decoder", False)
    if "ForMaskedLM" in named or ("ForCausalLM" not in named and encoder):
        heads.reverse()
    if "ForSequenceClassification" in named:
        heads.insert(0, (AutoModelForSequenceClassification, bool(getattr(config, "is_decoder", False))))
    errors = []
    for auto, causal in heads:
        if type(config) not in auto._model_mapping:
            continue
        try:
            model = _on_meta(auto, config, torch, attn_implementation)
        except (ValueError, TypeError, RuntimeError) as error:
            errors.append(f"{auto.__name__}: {error}")
            continue
        return model, causal, auto is AutoModelForSequenceClassification
    reason = "; ".join(errors) or "it has no causal or masked language-model head in transformers"
    raise CaptureError(f"cannot build {type(config).__name__} for training: {reason}")


def _on_meta(auto: Any, config: Any, torch: Any, attn_implementation: str) -> Any:
    with torch.device("meta"):
        try:
            return auto.from_config(config, attn_implementation=attn_implementation).float()
        except ValueError as error:
            if "scaled_dot_product_attention" not in str(error):
                raise
            return auto.from_config(config, attn_implementation="eager").float()


def _loss(output: Any) -> Any:
    loss = getattr(output, "loss", None)
    if loss is None:
        raise CaptureError("the model returned no loss for labels = input_ids")
    return loss


def _name(config: Any) -> str:
    path = getattr(config, "name_or_path", "") or ""
    return Path(path).name or str(getattr(config, "model_type", "model"))
