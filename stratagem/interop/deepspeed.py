"""DeepSpeed configs (`ds_config`) to and from layouts.

Key names follow `deepspeed/runtime/constants.py`, `runtime/config.py`, `runtime/zero/config.py`,
`runtime/tensor_parallel/config.py`, `runtime/activation_checkpointing/config.py` and
`runtime/pipe/engine.py` at `ENGINE_SOURCES["deepspeed"]`. What DeepSpeed does, and so what a layout
must say:
- `train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel
  size`; the data degree is the world size over tensor × pipeline, which the config does not state,
  so an imported layout leaves it unset; with a pipeline the accumulation steps are its micro-batches;
- `zero_optimization.stage` 0–3; hybrid sharding is MiCS (`mics_shard_size`, stage 3 only);
  the pipeline engine refuses stages 2 and 3;
- `fp16.enabled` trains an fp16 model with fp32 master weights (`fp16`), and is the nearest key to
  autocast's `amp-fp16`, which exports to it too; `bf16.enabled` stands for `amp-bf16`; neither pure bf16
  nor fp8 nor TF32 has a key;
- tensor parallelism is AutoTP training (`tensor_parallel.autotp_size`), without sequence parallelism;
  the pipeline runs DeepSpeed's own 1F1B schedule (`pipeline.stages`); context parallelism has no key
  (DeepSpeed-Ulysses is a different scheme);
- recomputation is whatever the model checkpoints with `deepspeed.checkpointing`: the config's
  `activation_checkpointing` section (and the pipeline's `activation_checkpoint_interval`) stands for
  full recomputation of every block; a selective granularity has no key;
- compiling is `engine.compile()` in the training script: the config has no key for it;
- gradients are reduced after backward at stage 0 (`engine.allreduce_gradients`) and in the pipeline
  engine (its `ReduceGrads` step), and at stages 1 and 2 unless `zero_optimization.overlap_comm`, which
  defaults to true only at stage 3: `Layout.overlap_grad_reduce`.
"""

from __future__ import annotations

import json
from typing import Any

from stratagem.interop.engines import TF32_REASON, config_error, positive_int, refuse
from stratagem.layout import Layout

ENGINE = "deepspeed"
CHECKPOINTING = {
    "partition_activations": False,
    "contiguous_memory_optimization": False,
    "cpu_checkpointing": False,
    "number_checkpoints": None,
    "synchronize_checkpoint_boundary": False,
    "profile": False,
}
"""DeepSpeed's activation checkpointing defaults (`activation_checkpointing/config.py`), written out."""


def layout_to_deepspeed(layout: Layout, *, clip: float | None = None) -> dict[str, Any]:
    """`clip` is the graph's global clip norm (`engines.graph_clip`; 0 turns DeepSpeed's clipping off)."""
    tensor, pipeline = layout.tensor or 1, layout.pipeline or 1
    refuse(ENGINE, _refusals(layout, tensor, pipeline))
    config: dict[str, Any] = {}
    micro, data, count = layout.micro_batch, layout.data, layout.micro_batches
    if count is None:
        count = layout.global_batch // (micro * data) if layout.global_batch and micro and data else None
    global_batch = layout.global_batch
    if global_batch is None and micro is not None and data is not None:
        global_batch = micro * (count or 1) * data
    if global_batch is not None:
        config["train_batch_size"] = global_batch
    if micro is not None:
        config["train_micro_batch_size_per_gpu"] = micro
    if count is not None or layout.global_batch is None:
        config["gradient_accumulation_steps"] = count or 1
    zero: dict[str, Any] = {"stage": layout.zero}
    if layout.zero in (1, 2):
        zero["overlap_comm"] = layout.overlap_grad_reduce
    if layout.shard_group is not None:
        zero["mics_shard_size"] = layout.shard_group
    config["zero_optimization"] = zero
    config["bf16"] = {"enabled": layout.precision == "amp-bf16"}
    config["fp16"] = {"enabled": layout.precision in ("amp-fp16", "fp16")}
    if tensor > 1:
        config["tensor_parallel"] = {"autotp_size": tensor}
    if pipeline > 1:
        config["pipeline"] = {
            "stages": pipeline,
            "activation_checkpoint_interval": 1 if layout.recompute == "full" else 0,
        }
    if layout.recompute == "full":
        config["activation_checkpointing"] = dict(CHECKPOINTING)
    if clip is not None:
        config["gradient_clipping"] = clip
    return config


def _refusals(layout: Layout, tensor: int, pipeline: int) -> list[str]:
    reasons = []
    precision = layout.precision
    if precision == "tf32":
        reasons.append(TF32_REASON)
    if precision == "bf16":
        reasons.append(
            "bf16 without fp32 master weights: DeepSpeed's bf16 keeps fp32 master weights (that is amp-bf16)"
        )
    if precision == "fp8":
        reasons.append("fp8: no ds_config key (fp8 comes from Transformer Engine in the model code)")
    if layout.zero == 0 and layout.overlap_grad_reduce:
        reasons.append(
            "zero 0 overlapped with backward: DeepSpeed's stage 0 all-reduces the gradients after backward "
            "(engine.allreduce_gradients); state overlap_grad_reduce false, or zero 1 or 2 (overlap_comm)"
        )
    if pipeline > 1 and layout.overlap_grad_reduce:
        reasons.append(
            "a pipeline overlapped with backward: DeepSpeed's pipeline engine reduces the gradients after the "
            "schedule (ReduceGrads); state overlap_grad_reduce false"
        )
    if layout.recompute in ("selective", "selective-op"):
        reasons.append(
            f"{layout.recompute} recomputation: DeepSpeed recomputes what the model checkpoints; the config has no "
            "granularity"
        )
    if layout.sequence_parallel:
        reasons.append("sequence parallelism: AutoTP training splits no norms along the sequence")
    if layout.async_tensor_parallel:
        reasons.append("async tensor parallelism: no ds_config key overlaps tensor-parallel collectives with GEMMs")
    if layout.compile:
        reasons.append("compile: no ds_config key (the training script calls engine.compile())")
    if (layout.context or 1) > 1:
        reasons.append(
            "context parallelism: no ds_config key (DeepSpeed-Ulysses splits heads, not a ring over the sequence)"
        )
    if pipeline > 1 and layout.schedule != "1f1b":
        reasons.append(f"the {layout.schedule} schedule: DeepSpeed's pipeline engine runs its own 1F1B schedule")
    if pipeline > 1 and layout.zero >= 2:
        reasons.append(f"zero {layout.zero} with a pipeline: DeepSpeed's pipeline engine accepts ZeRO stages 0 and 1")
    if layout.shard_group is not None and layout.zero != 3:
        reasons.append("a shard group below zero 3: hybrid sharding is MiCS (mics_shard_size), a ZeRO-3 feature")
    return reasons


def layout_from_deepspeed(config: str | dict[str, Any]) -> Layout:
    """The layout a ds_config runs; the data degree is left unset (the config does not state it)."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as error:
            raise config_error(ENGINE, "", f"not JSON: {error}") from None
    if not isinstance(config, dict):
        raise config_error(ENGINE, "", f"must be a JSON object, got {type(config).__name__}")
    zero_config = _table(config, "zero_optimization")
    zero = zero_config.get("stage", 0)
    if zero not in (0, 1, 2, 3):
        raise config_error(ENGINE, "zero_optimization.stage", f"must be 0, 1, 2 or 3, got {zero!r}")
    mics = zero_config.get("mics_shard_size", -1)
    pipe = _table(config, "pipeline")
    stages = pipe.get("stages", 1)
    pipeline = 1 if stages == "auto" else positive_int(ENGINE, "pipeline.stages", stages)
    tensor = _table(config, "tensor_parallel").get("autotp_size", 0) or 1
    checkpointing = "activation_checkpointing" in config or (pipe.get("activation_checkpoint_interval") or 0) > 0
    fields: dict[str, Any] = {
        "data": None,
        "tensor": positive_int(ENGINE, "tensor_parallel.autotp_size", tensor),
        "pipeline": pipeline,
        "micro_batch": _known(config, "train_micro_batch_size_per_gpu"),
        "global_batch": _known(config, "train_batch_size"),
        "micro_batches": _known(config, "gradient_accumulation_steps"),
        "zero": zero,
        "shard_group": positive_int(ENGINE, "zero_optimization.mics_shard_size", mics)
        if mics not in (-1, 0, None)
        else None,
        "recompute": "full" if checkpointing else "none",
        "precision": _precision(config),
        "overlap_grad_reduce": _overlap(zero_config, zero) and pipeline == 1,
    }
    return Layout.parse(fields)


def _overlap(zero_config: dict[str, Any], zero: int) -> bool:
    """Stage 0 all-reduces after backward; stages 1 and 2 reduce during it with `overlap_comm`, which
    DeepSpeed turns on by default only at stage 3 (`DeepSpeedZeroConfig.overlap_comm_valid`)."""
    if zero == 0:
        return False
    value = zero_config.get("overlap_comm", zero == 3)
    if not isinstance(value, bool):
        raise config_error(ENGINE, "zero_optimization.overlap_comm", f"must be true or false, got {value!r}")
    return value or zero == 3


def _table(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise config_error(ENGINE, key, "must be an object")
    return value


def _known(config: dict[str, Any], key: str) -> int | None:
    """A batch figure, or None where the config leaves it to DeepSpeed (`"auto"`, as HF's Trainer writes)."""
    value = config.get(key)
    return None if value in (None, "auto") else positive_int(ENGINE, key, value)


def _precision(config: dict[str, Any]) -> str:
    enabled: dict[str, bool] = {}
    for name, keys in (("bf16", ("bf16", "bfloat16")), ("fp16", ("fp16",))):
        section: Any = next((config[key] for key in keys if key in config), {})
        value = section.get("enabled", False) if isinstance(section, dict) else False
        if value == "auto":
            raise config_error(
                ENGINE,
                f"{name}.enabled",
                "'auto' leaves the precision to the Hugging Face Trainer's arguments; state true or false",
            )
        enabled[name] = value is True
    if enabled["bf16"]:
        return "amp-bf16"
    return "fp16" if enabled["fp16"] else "fp32"
