"""Accelerate configs (the YAML `accelerate launch --config_file` reads) to and from layouts.

Keys follow `src/accelerate/commands/config/config_args.py`, `commands/config/cluster.py`,
`commands/launch.py` and `parallelism_config.py` at `ENGINE_SOURCES["accelerate"]`. What Accelerate
does, and so what a layout must say:
- `parallelism_config` (`parallelism_config_dp_replicate_size`, `_dp_shard_size`, `_tp_size`, `_cp_size`)
  runs only under FSDP2 (`fsdp_config.fsdp_version: 2`); FSDP shards over dp_shard (× cp) and replicates
  over dp_replicate, so zero 0 beside tensor or context parallelism is dp_shard 1; plain data
  parallelism is `MULTI_GPU` (DDP); zero 1 is DeepSpeed's stage 1 (`deepspeed_config.zero_stage`);
- `fsdp_reshard_after_forward` true is zero 3, false zero 2; `fsdp_activation_checkpointing` is full
  recomputation (nothing selects the attention core); there is no pipeline outside the Megatron-LM
  plugin (export to Megatron-LM for that);
- `mixed_precision` no / fp16 / bf16 is autocast over fp32 weights (amp), fp8 uses torchao's float8
  (`fp8_config.backend: AO`); tensor parallelism is the model's transformers `tp_plan`, without
  Megatron-style sequence parallelism (`sp_size` is DeepSpeed-Ulysses, a different scheme);
- batch sizes live in the training script, except DeepSpeed's `gradient_accumulation_steps`;
- `dynamo_config.dynamo_backend: INDUCTOR` compiles the model (`Layout.compile`; the older top-level
  `dynamo_backend` key reads the same).
"""

from __future__ import annotations

from typing import Any

import yaml

from stratagem.interop.engines import TF32_REASON, config_error, refuse
from stratagem.layout import Layout

ENGINE = "accelerate"
MIXED = {"fp32": "no", "amp-fp16": "fp16", "amp-bf16": "bf16", "fp8": "fp8"}
FROM_MIXED = {"no": "fp32", "fp16": "amp-fp16", "bf16": "amp-bf16", "fp8": "fp8"}
PREFIX = "parallelism_config_"
FSDP1_SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3, "_HYBRID_SHARD_ZERO2": 2}


def layout_to_accelerate(layout: Layout, *, machines: int | None = None, clip: float | None = None) -> str:
    """`clip` (`engines.graph_clip`) has no config key: the training script clips with
    `accelerator.clip_grad_norm_`, which a comment says; so does DDP's bucket cap (`bucket_mb`), which
    `DistributedDataParallelKwargs` sets."""
    tensor, context = layout.tensor or 1, layout.context or 1
    refuse(ENGINE, _refusals(layout, tensor, context))
    data = layout.data or 1
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": _distributed_type(layout, tensor, context),
        "mixed_precision": MIXED[layout.precision],
        "num_processes": data * tensor * context,
    }
    if machines is not None:
        config |= {"num_machines": machines, "machine_rank": 0}
    kind = config["distributed_type"]
    if kind == "FSDP":
        shard = (layout.shard_group or data) if layout.zero >= 2 else 1
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": layout.zero == 3,
            "fsdp_activation_checkpointing": layout.recompute == "full",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
        config["parallelism_config"] = {
            PREFIX + "dp_replicate_size": data // shard,
            PREFIX + "dp_shard_size": shard,
            PREFIX + "tp_size": tensor,
            PREFIX + "cp_size": context,
        }
    elif kind == "DEEPSPEED":
        config["deepspeed_config"] = {"zero_stage": 1, "gradient_accumulation_steps": _accumulation(layout)}
    if layout.precision == "fp8":
        config["fp8_config"] = {"backend": "AO"}
    if layout.compile:
        config["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    config["main_training_function"] = "main"
    config["use_cpu"] = False
    text = yaml.safe_dump(config, sort_keys=False)
    if clip:
        text = f"# clip in the training script: accelerator.clip_grad_norm_(model.parameters(), {clip})\n" + text
    if layout.bucket_mb is not None and kind == "MULTI_GPU":
        text = (
            "# DDP's buckets in the training script: Accelerator(kwargs_handlers=["
            f"DistributedDataParallelKwargs(bucket_cap_mb={layout.bucket_mb})])\n" + text
        )
    return text


def _refusals(layout: Layout, tensor: int, context: int) -> list[str]:
    reasons = []
    if layout.precision == "tf32":
        reasons.append(TF32_REASON)
    if layout.precision == "bf16":
        reasons.append("bf16 without fp32 weights: mixed_precision bf16 is autocast over fp32 weights (amp-bf16)")
    if layout.precision == "fp16":
        reasons.append("an fp16 model: mixed_precision fp16 is autocast over fp32 weights (amp-fp16)")
    if (layout.pipeline or 1) > 1:
        reasons.append("pipeline parallelism: only through the Megatron-LM plugin; export to Megatron-LM instead")
    if layout.recompute in ("selective", "selective-op"):
        reasons.append(f"{layout.recompute} recomputation: fsdp_activation_checkpointing recomputes whole blocks")
    if layout.sequence_parallel:
        reasons.append("sequence parallelism: the transformers tp_plan splits no norms along the sequence")
    if layout.fp8_all_gather:
        reasons.append(
            "fp8_all_gather: no config key; torchao's Float8LinearConfig(enable_fsdp_float8_all_gather=True) "
            "goes in the training script"
        )
    if layout.zero == 1 and (tensor > 1 or context > 1 or layout.shard_group is not None):
        reasons.append(
            "zero 1 beside tensor or context parallelism or a shard group: zero 1 is DeepSpeed's stage 1 here"
        )
    if layout.zero == 1 and layout.overlap_grad_reduce:
        reasons.append(
            "zero 1 overlapped with backward: the DeepSpeed plugin writes no overlap_comm, so stage 1 reduces "
            "after backward; state overlap_grad_reduce false"
        )
    if layout.zero != 1 and not layout.overlap_grad_reduce:
        reasons.append("reducing after backward: DDP and FSDP reduce gradients during backward")
    if layout.zero == 1 and layout.recompute == "full":
        reasons.append("full recomputation under DeepSpeed: the model's code checkpoints, not the Accelerate config")
    if layout.data is None:
        reasons.append("data: the config states its process count; resolve the layout for a device count first")
    return reasons


def _distributed_type(layout: Layout, tensor: int, context: int) -> str:
    if layout.zero == 1:
        return "DEEPSPEED"
    if layout.zero >= 2 or tensor > 1 or context > 1 or layout.recompute == "full":
        return "FSDP"
    return "MULTI_GPU" if (layout.data or 1) > 1 else "NO"


def _accumulation(layout: Layout) -> int:
    if layout.micro_batches is not None:
        return layout.micro_batches
    if layout.global_batch and layout.micro_batch and layout.data:
        return layout.global_batch // (layout.micro_batch * layout.data)
    return 1


def layout_from_accelerate(yaml_text: str) -> Layout:
    try:
        config = yaml.safe_load(yaml_text)
    except yaml.YAMLError as error:
        raise config_error(ENGINE, "", f"not YAML: {error}") from None
    if not isinstance(config, dict):
        raise config_error(ENGINE, "", f"must be a mapping, got {type(config).__name__}")
    kind = str(config.get("distributed_type", "NO"))
    mixed = str(config.get("mixed_precision") or "no")
    if mixed not in FROM_MIXED:
        raise config_error(ENGINE, "mixed_precision", f"must be one of {', '.join(FROM_MIXED)}, got {mixed!r}")
    processes = config.get("num_processes")
    fields: dict[str, Any] = {"precision": FROM_MIXED[mixed]}
    if kind in ("NO", "MULTI_GPU", "MULTI_CPU"):
        fields["data"] = processes if isinstance(processes, int) and processes > 0 else None
    elif kind == "DEEPSPEED":
        deepspeed = _table(config, "deepspeed_config")
        fields |= {
            "data": processes if isinstance(processes, int) else None,
            "zero": deepspeed.get("zero_stage", 0),
            "overlap_grad_reduce": deepspeed.get("zero_stage", 0) == 3,
        }
        steps = deepspeed.get("gradient_accumulation_steps")
        fields["micro_batches"] = steps if isinstance(steps, int) else None
    elif kind == "FSDP":
        fields |= _fsdp(config, processes)
    else:
        raise config_error(ENGINE, "distributed_type", f"{kind} has no layout (NO, MULTI_GPU, FSDP or DEEPSPEED)")
    fields["compile"] = _compiled(config)
    return Layout.parse(fields)


def _compiled(config: dict[str, Any]) -> bool:
    """Whether the config compiles the model with inductor (`dynamo_config`, or the older `dynamo_backend`)."""
    dynamo = config.get("dynamo_config")
    backend = dynamo.get("dynamo_backend") if isinstance(dynamo, dict) else config.get("dynamo_backend")
    return str(backend or "NO").upper() == "INDUCTOR"


def _fsdp(config: dict[str, Any], processes: Any) -> dict[str, Any]:
    fsdp = _table(config, "fsdp_config")
    par = {key.removeprefix(PREFIX): value for key, value in _table(config, "parallelism_config").items()}
    tensor, context = par.get("tp_size") or 1, par.get("cp_size") or 1
    replicate, shard = par.get("dp_replicate_size"), par.get("dp_shard_size")
    if shard is None and isinstance(processes, int):
        shard = processes // ((replicate or 1) * tensor * context)
    replicate = replicate or 1
    if fsdp.get("fsdp_version", 1) == 1:
        zero = FSDP1_SHARDING.get(str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")), 3)
    else:
        zero = 3 if fsdp.get("fsdp_reshard_after_forward", True) else 2
    if not shard or shard == 1:
        zero = 0
    return {
        "data": replicate * shard if shard else None,
        "tensor": tensor,
        "context": context,
        "zero": zero,
        "shard_group": shard if zero and replicate > 1 else None,
        "recompute": "full" if fsdp.get("fsdp_activation_checkpointing") else "none",
    }


def _table(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key) or {}
    if not isinstance(value, dict):
        raise config_error(ENGINE, key, "must be a mapping")
    return value
