"""torchtitan job configs (TOML) to and from layouts.

Key names and rules follow torchtitan's `torchtitan/config/job_config.py`, `distributed/parallel_dims.py`,
`distributed/pipeline_parallel.py`, `distributed/utils.py` and `models/llama3/infra/parallelize.py` at
`ENGINE_SOURCES["torchtitan"]`, the last version read from TOML (later ones are Python configs with the
same section and field names). What that version does, and so what a layout must say:
- data parallelism is `data_parallel_replicate_degree` × `data_parallel_shard_degree`: shard > 1 is
  FSDP2 (zero 3, or 2 with `fsdp_reshard_after_forward = "never"`), both > 1 is HSDP (the shard degree is
  the shard group), shard 1 is DDP, which torchtitan runs only as the sole parallelism, in buckets of
  100 MiB (`apply_ddp`'s `bucket_cap_mb`, which no config key changes; an imported DDP states it);
- tensor parallelism always comes with sequence parallelism (norms as `SequenceParallel`);
- mixed precision (`mixed_precision_param`, bfloat16 or float32) acts through FSDP, or through autocast
  under DDP or on one device: with TP or PP and no FSDP or CP the step runs in fp32; `training.dtype =
  "bfloat16"` trains everything in bf16; fp8 is the `quantize.linear.float8` converter (torchao);
- `local_batch_size` is the samples per data-parallel rank per pipeline step, cut into micro-batches of
  `pipeline_parallel_microbatch_size`; `global_batch_size` beyond `local × dp` is gradient accumulation;
- schedules are torch.distributed.pipelining's names; multi-stage ones default to 2 stages per rank,
  others need `pipeline_parallel_layers_per_stage`;
- async tensor parallelism is `parallelism.enable_async_tensor_parallel`, which torchtitan runs only with
  `[compile] enable` and "model" among its components (`maybe_enable_async_tp` raises otherwise), so a
  layout states `compile` beside it and a config without it is refused; fp8 FSDP gathers are
  `quantize.linear.float8.enable_fsdp_float8_all_gather`, written with
  `precompute_float8_dynamic_scale_for_fsdp`, which torchtitan recommends beside it for tensorwise scaling;
- `[compile] enable` with `components` holding "model" compiles each transformer block (`Layout.compile`);
- `activation_checkpoint.mode = "selective"` checkpoints per op (`selective_ac_option = "op"`, the layout's
  `selective-op`) or every n-th layer (an integer option, torchtitan's default "2", which no layout states).
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

from stratagem.interop.engines import TF32_REASON, config_error, positive_int, refuse
from stratagem.layout import Layout

ENGINE = "torchtitan"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
FROM_SCHEDULE = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved1f1b": "interleaved-1f1b",
    "zbvzerobubble": "zero-bubble",
    "interleavedzerobubble": "zero-bubble",
}
MULTI_STAGE = ("interleaved1f1b", "zbvzerobubble", "interleavedzerobubble", "loopedbfs", "dualpipev")
"""Schedules that hold several stages per rank (2 unless `pipeline_parallel_layers_per_stage` says)."""
FLOAT8_CONVERTER = "quantize.linear.float8"
DDP_BUCKET_MB = 100
"""`apply_ddp` (`models/llama3/infra/parallelize.py`) replicates with `bucket_cap_mb=100`."""
AC_MODES = {"none": "none", "selective-op": "selective", "full": "full"}


def layout_to_torchtitan(layout: Layout, *, layers: int | None = None, clip: float | None = None) -> str:
    """The `[training]`, `[parallelism]`, `[activation_checkpoint]` (and fp8) sections of a job config.
    `clip` (`engines.graph_clip`) is `training.max_norm`; torchtitan clips every step (0 would zero the
    gradients), so a graph that does not clip gets a comment instead."""
    tensor, pipeline, context = layout.tensor or 1, layout.pipeline or 1, layout.context or 1
    reasons = _refusals(layout, tensor, pipeline, context, layers)
    refuse(ENGINE, reasons)
    replicate, shard = _data_degrees(layout)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
    }
    if layout.zero == 2:
        parallelism["fsdp_reshard_after_forward"] = "never"
    parallelism |= {"tensor_parallel_degree": tensor, "pipeline_parallel_degree": pipeline}
    if pipeline > 1:
        parallelism["pipeline_parallel_schedule"] = _schedule(layout)
        parallelism["pipeline_parallel_microbatch_size"] = layout.micro_batch or 1
        default_chunks = 2 if parallelism["pipeline_parallel_schedule"].lower() in MULTI_STAGE else 1
        if layout.virtual_stages != default_chunks and layers is not None:
            chunks = pipeline * layout.virtual_stages
            if layers % chunks:
                refuse(
                    ENGINE,
                    [
                        f"layers({layers}) is not a multiple of pipeline({pipeline})*virtual_stages"
                        f"({layout.virtual_stages})={chunks}: pipeline_parallel_layers_per_stage is one number"
                    ],
                )
            parallelism["pipeline_parallel_layers_per_stage"] = layers // chunks
    parallelism["context_parallel_degree"] = context
    if context > 1:
        parallelism["context_parallel_rotate_method"] = "allgather"  # torchtitan's default, what is priced
    if layout.async_tensor_parallel:
        parallelism["enable_async_tensor_parallel"] = True
    sections: dict[str, dict[str, Any]] = {"training": _training(layout, pipeline), "parallelism": parallelism}
    if clip:
        sections["training"]["max_norm"] = clip
    sections["activation_checkpoint"] = {"mode": AC_MODES[layout.recompute]}
    if layout.recompute == "selective-op":
        sections["activation_checkpoint"]["selective_ac_option"] = "op"
    if layout.compile:
        sections["compile"] = {"enable": True, "components": ["model", "loss"]}
    if layout.precision == "fp8":
        sections["model"] = {"converters": [FLOAT8_CONVERTER]}
        sections["quantize.linear.float8"] = {"recipe_name": "tensorwise"}
        if layout.fp8_all_gather:
            sections["quantize.linear.float8"] |= {
                "enable_fsdp_float8_all_gather": True,
                "precompute_float8_dynamic_scale_for_fsdp": True,
            }
    header = f"# torchtitan job config written by Stratagem for the layout {layout}\n"
    if layout.micro_batch is None:
        header += "# local_batch_size is unset: pass the graph (captured at the micro-batch) to write it\n"
    if clip == 0.0:
        header += "# the graph does not clip; torchtitan clips every step at training.max_norm (default 1.0)\n"
    return header + dump_toml(sections)


def _refusals(layout: Layout, tensor: int, pipeline: int, context: int, layers: int | None) -> list[str]:
    reasons = []
    precision = layout.precision
    if precision == "tf32":
        reasons.append(TF32_REASON)
    if precision in ("amp-fp16", "fp16"):
        reasons.append(f"{precision}: mixed_precision_param takes bfloat16 or float32 only")
    fsdp = (layout.zero >= 2 and (layout.data is None or layout.data > 1)) or context > 1
    if precision in ("amp-bf16", "fp8") and not fsdp and (tensor > 1 or pipeline > 1):
        reasons.append(
            f"{precision} with tensor or pipeline parallelism needs FSDP or context parallelism (zero 2 or 3 over "
            "data > 1): torchtitan applies mixed precision through fully_shard, and without it trains in fp32"
        )
    if layout.zero == 1:
        reasons.append("zero 1: FSDP2 shards parameters and gradients with the optimizer state; use zero 2 or 3")
    data = layout.data
    if layout.zero == 0 and (data is None or data > 1) and (tensor > 1 or pipeline > 1 or context > 1):
        reasons.append(
            "zero 0 (DDP) beside tensor, pipeline or context parallelism: torchtitan runs DDP only as the sole "
            "parallelism; use zero 2 or 3 (FSDP)"
        )
    if not layout.overlap_grad_reduce:
        reasons.append("reducing after backward: torchtitan's DDP and FSDP reduce gradients during backward")
    if layout.bucket_mb not in (None, DDP_BUCKET_MB):
        reasons.append(
            f"bucket_mb({layout.bucket_mb}): torchtitan's DDP buckets at {DDP_BUCKET_MB} MiB (apply_ddp), which "
            "no config key changes"
        )
    if layout.zero == 0 and data is None:
        reasons.append("data: DDP states its replicate degree; resolve the layout for a device count first")
    if layout.shard_group is not None and data is None:
        reasons.append("shard_group: HSDP states its replicate degree, which needs the data degree")
    if layout.recompute == "selective":
        reasons.append(
            "selective recomputation of the attention core: torchtitan checkpoints per op (selective-op) or per layer"
        )
    if tensor > 1 and not layout.sequence_parallel:
        reasons.append(
            "tensor parallelism without sequence parallelism: torchtitan always splits norms along the sequence"
        )
    if layout.async_tensor_parallel and not layout.compile:
        reasons.append(
            "async tensor parallelism without compile: torchtitan runs it only inside compiled blocks "
            "(inductor's micro-pipeline pass); state compile on the layout"
        )
    if pipeline > 1 and layout.schedule == "zero-bubble" and layout.virtual_stages == 1:
        reasons.append(
            "zero-bubble with one chunk per rank: torch.distributed.pipelining's zero-bubble schedules hold 2 or more"
        )
    if pipeline > 1 and layout.virtual_stages > 2 and layers is None:
        reasons.append(
            f"{layout.virtual_stages} chunks per rank: pipeline_parallel_layers_per_stage needs the number of blocks (pass the graph)"
        )
    if pipeline == 1 and (layout.micro_batches or 1) > 1 and layout.global_batch is None and data is None:
        reasons.append("gradient accumulation without a data degree: global_batch_size needs it")
    if pipeline > 1 and layout.micro_batches is None and layout.global_batch is not None and data is None:
        reasons.append("pipeline micro-batches from global_batch without a data degree: local_batch_size needs it")
    return reasons


def _data_degrees(layout: Layout) -> tuple[int, int]:
    data = layout.data
    if layout.zero == 0:
        return data or 1, 1
    if layout.shard_group is not None and data is not None:
        return data // layout.shard_group, layout.shard_group
    return 1, -1 if data is None else data


def _schedule(layout: Layout) -> str:
    if layout.schedule == "zero-bubble":
        return "ZBVZeroBubble" if layout.virtual_stages == 2 else "InterleavedZeroBubble"
    return SCHEDULES[layout.schedule]


def _training(layout: Layout, pipeline: int) -> dict[str, Any]:
    """Samples per data-parallel rank per pipeline step (all of a step's micro-batches with a pipeline,
    one micro-batch without: the rest is accumulation through `global_batch_size`)."""
    training: dict[str, Any] = {}
    micro, data, count = layout.micro_batch, layout.data, layout.micro_batches
    if micro is not None:
        if count is None:
            count = layout.global_batch // (micro * data) if layout.global_batch and data else 1
        training["local_batch_size"] = micro * count if pipeline > 1 else micro
        global_batch = layout.global_batch or (micro * count * data if data is not None else None)
        if global_batch is not None:
            training["global_batch_size"] = global_batch
    if layout.precision == "bf16":
        training["dtype"] = "bfloat16"
    training["mixed_precision_param"] = "float32" if layout.precision == "fp32" else "bfloat16"
    return training


def layout_from_torchtitan(toml_text: str) -> Layout:
    """The layout a torchtitan job config runs; degrees torchtitan fills (`-1`) stay unset."""
    try:
        doc = tomllib.loads(toml_text)
    except tomllib.TOMLDecodeError as error:
        raise config_error(ENGINE, "", f"not TOML: {error}") from None
    par, training = _section(doc, "parallelism"), _section(doc, "training")
    ac, model = _section(doc, "activation_checkpoint"), _section(doc, "model")
    tensor = positive_int(ENGINE, "parallelism.tensor_parallel_degree", par.get("tensor_parallel_degree", 1))
    pipeline = positive_int(ENGINE, "parallelism.pipeline_parallel_degree", par.get("pipeline_parallel_degree", 1))
    context = positive_int(ENGINE, "parallelism.context_parallel_degree", par.get("context_parallel_degree", 1))
    replicate = positive_int(
        ENGINE, "parallelism.data_parallel_replicate_degree", par.get("data_parallel_replicate_degree", 1)
    )
    shard = par.get("data_parallel_shard_degree", -1)
    if shard == -1 and replicate > 1:
        raise config_error(
            ENGINE,
            "parallelism.data_parallel_shard_degree",
            f"-1 beside data_parallel_replicate_degree({replicate}) leaves the HSDP shard group to the world size; state it",
        )
    if shard != -1:
        shard = positive_int(ENGINE, "parallelism.data_parallel_shard_degree", shard)
    fsdp = shard == -1 or shard > 1
    zero = (2 if par.get("fsdp_reshard_after_forward") == "never" else 3) if fsdp else 0
    schedule, chunks = _pipeline_schedule(par, pipeline)
    fields: dict[str, Any] = {
        "data": None if shard == -1 else replicate * shard,
        "tensor": tensor,
        "pipeline": pipeline,
        "context": context,
        "schedule": schedule,
        "virtual_stages": chunks,
        "zero": zero,
        "shard_group": shard if fsdp and replicate > 1 else None,
        "bucket_mb": DDP_BUCKET_MB if not fsdp and replicate > 1 and context == 1 else None,
        "recompute": _recompute(ac),
        "precision": _precision(training, model, fsdp=fsdp or context > 1, alone=tensor == pipeline == 1),
        "sequence_parallel": tensor > 1 and bool(par.get("enable_sequence_parallel", True)),
        "async_tensor_parallel": tensor > 1 and bool(par.get("enable_async_tensor_parallel", False)),
        "compile": _compiled(_section(doc, "compile")),
    }
    if fields["async_tensor_parallel"] and not fields["compile"]:
        raise config_error(
            ENGINE,
            "parallelism.enable_async_tensor_parallel",
            "needs [compile] enable with 'model' in its components (torchtitan raises without them)",
        )
    fields["fp8_all_gather"] = fields["precision"] == "fp8" and zero == 3 and _fp8_all_gather(doc)
    fields |= _batch(training, par, pipeline)
    return Layout.parse(fields)


def _fp8_all_gather(doc: dict[str, Any]) -> bool:
    """Whether the job config turns on torchao's fp8 FSDP gathers (`[quantize.linear.float8]`)."""
    table: Any = doc
    for name in ("quantize", "linear", "float8"):
        table = table.get(name, {}) if isinstance(table, dict) else {}
    return isinstance(table, dict) and bool(table.get("enable_fsdp_float8_all_gather", False))


def _section(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise config_error(ENGINE, name, "must be a table")
    return value


def _pipeline_schedule(par: dict[str, Any], pipeline: int) -> tuple[str, int]:
    if pipeline == 1:
        return "1f1b", 1
    name = str(par.get("pipeline_parallel_schedule", "1F1B"))
    key = name.lower()
    if key not in FROM_SCHEDULE:
        raise config_error(
            ENGINE,
            "parallelism.pipeline_parallel_schedule",
            f"{name!r} has no layout schedule (gpipe, 1f1b, interleaved-1f1b, zero-bubble)",
        )
    chunks = 2 if key in MULTI_STAGE else 1
    parts = par.get("module_fqns_per_model_part")
    if isinstance(parts, list) and parts:
        chunks = max(len(parts) // pipeline, 1)
    elif par.get("pipeline_parallel_layers_per_stage") is not None:
        raise config_error(
            ENGINE,
            "parallelism.pipeline_parallel_layers_per_stage",
            "gives chunks per rank only with the model's number of layers, which the job config does not state; "
            "set virtual_stages on the layout instead",
        )
    return FROM_SCHEDULE[key], chunks


def _compiled(section: dict[str, Any]) -> bool:
    enable = section.get("enable", False)
    if not isinstance(enable, bool):
        raise config_error(ENGINE, "compile.enable", f"must be true or false, got {enable!r}")
    components = section.get("components", ["model", "loss"])
    return enable and isinstance(components, list) and "model" in components


def _recompute(ac: dict[str, Any]) -> str:
    mode = ac.get("mode", "selective")
    if mode not in ("none", "selective", "full"):
        raise config_error(
            ENGINE, "activation_checkpoint.mode", f"{mode!r} has no layout recomputation (none, selective, full)"
        )
    if mode != "selective":
        return mode
    option = str(ac.get("selective_ac_option", "2"))
    if option != "op":
        raise config_error(
            ENGINE,
            "activation_checkpoint.selective_ac_option",
            f"{option!r} checkpoints every n-th layer, which no layout recomputation states; use 'op'",
        )
    return "selective-op"


def _precision(training: dict[str, Any], model: dict[str, Any], *, fsdp: bool, alone: bool) -> str:
    converters = model.get("converters", [])
    if isinstance(converters, str):
        converters = [part.strip() for part in converters.split(",")]
    if FLOAT8_CONVERTER in converters or "float8" in converters:
        return "fp8"
    if training.get("dtype") == "bfloat16":
        return "bf16"
    if training.get("mixed_precision_param", "bfloat16") == "float32" or not (fsdp or alone):
        return "fp32"
    return "amp-bf16"


def _batch(training: dict[str, Any], par: dict[str, Any], pipeline: int) -> dict[str, Any]:
    local = positive_int(ENGINE, "training.local_batch_size", training.get("local_batch_size", 8))
    global_batch = training.get("global_batch_size", -1)
    given = None if global_batch == -1 else positive_int(ENGINE, "training.global_batch_size", global_batch)
    if pipeline == 1:
        return {"micro_batch": local, "global_batch": given}
    micro = positive_int(
        ENGINE, "parallelism.pipeline_parallel_microbatch_size", par.get("pipeline_parallel_microbatch_size", 1)
    )
    if local % micro:
        raise config_error(
            ENGINE,
            "parallelism.pipeline_parallel_microbatch_size",
            f"local_batch_size({local}) is not a multiple of pipeline_parallel_microbatch_size({micro})",
        )
    return {"micro_batch": micro, "global_batch": given, "micro_batches": None if given else local // micro}


def dump_toml(sections: dict[str, dict[str, Any]]) -> str:
    """TOML for tables of scalars and lists of strings (all a job config needs here)."""
    out = []
    for name, table in sections.items():
        out.append(f"[{name}]")
        out += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
        out.append("")
    return "\n".join(out)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")
