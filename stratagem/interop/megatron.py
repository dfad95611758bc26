"""Megatron-LM command-line arguments to and from layouts.

Flags follow `megatron/training/arguments.py` and the config dataclasses it builds flags from
(`core/model_parallel_config.py`, `core/transformer/transformer_config.py`,
`training/config/training_config.py`) at `ENGINE_SOURCES["megatron"]`. What Megatron does, and so what
a layout must say:
- the data-parallel size is the world size over tensor × pipeline × context; no flag states it, so an
  imported layout leaves it unset; `--global-batch-size / (--micro-batch-size × dp)` micro-batches run
  per step, through the pipeline or accumulated;
- pipelines run 1F1B, interleaved with virtual stages (`--num-layers-per-virtual-pipeline-stage`, or
  `--num-virtual-stages-per-pipeline-rank`); there is no GPipe or zero-bubble schedule;
- `--use-distributed-optimizer` shards the optimizer state over the data-parallel group (zero 1;
  `--num-distributed-optimizer-instances` replicas of it make the hybrid shard group);
  `--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads|optim_grads_params` is zero 2|3;
- `--recompute-granularity selective` recomputes the core attention (its default `--recompute-modules`),
  `full` every layer (`--recompute-method uniform --recompute-num-layers 1`);
- `--fp16` trains an fp16 model with fp32 main weights (`fp16`), and the nearest Megatron has to
  autocast's `amp-fp16`, which exports to it too; `--bf16` stands for `amp-bf16`; fp8 is Transformer
  Engine's (`--fp8-format hybrid --fp8-recipe tensorwise` with `--bf16`); pure bf16 and TF32 have no flag;
- `--tp-comm-overlap` overlaps sequence parallelism's collectives with the GEMMs (Transformer Engine's
  userbuffers): async tensor parallelism; `--fp8-param-gather` gathers fp8 parameters in fp8;
- `--overlap-grad-reduce` is `Layout.overlap_grad_reduce`: without it Megatron reduces the gradients after
  backward; zero 3 (Megatron FSDP) is always written with it and `--overlap-param-gather`;
- `--ddp-bucket-size` counts parameters of Megatron's fp32 main-gradient buffers. Without it Megatron
  buckets max(40M, 1M × dp) parameters (`DistributedDataParallelConfig.bucket_size`), so a zero-0 layout
  that overlaps writes its bucket (`Layout.bucket_mb`, or DDP's 25 MiB, as priced) as MiB / 4 bytes,
  and an import reads it back there (25 MiB as the default);
- Megatron runs each element-wise chain of a block as one hand-written kernel (masked softmax, bias-GeLU,
  bias-dropout-add, on by default), which prices as `Layout.compile`; Megatron has no `torch.compile`
  switch, so an exported layout writes none either way and an imported one does not compile (state
  `compile` on it to price Megatron's fused kernels).
"""

from __future__ import annotations

import shlex
from typing import Any, overload

from stratagem.interop.engines import TF32_REASON, config_error, refuse
from stratagem.layout import Layout
from stratagem.layout_build import DDP_BUCKET_MB, MIB

ENGINE = "megatron"
MAIN_GRAD_BYTES = 4
"""Bytes per element of Megatron's main-gradient buffers (`main_grads_dtype`, fp32 by default)."""
SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
FLAGS = (
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--micro-batch-size",
    "--global-batch-size",
    "--num-layers",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--data-parallel-sharding-strategy",
    "--num-distributed-optimizer-instances",
    "--fp8-format",
    "--fp8-recipe",
    "--ddp-bucket-size",
)
"""Flags read with a value; switches (`--sequence-parallel`, `--bf16`, ...) are read without one."""


def layout_to_megatron(layout: Layout, *, layers: int | None = None, clip: float | None = None) -> list[str]:
    """`clip` is the graph's global clip norm (`engines.graph_clip`): `--clip-grad`, whose default of 1.0
    clips, so a graph that does not clip writes 0."""
    tensor, pipeline, context = layout.tensor or 1, layout.pipeline or 1, layout.context or 1
    refuse(ENGINE, _refusals(layout, pipeline, layers))
    args = [
        "--tensor-model-parallel-size",
        str(tensor),
        "--pipeline-model-parallel-size",
        str(pipeline),
        "--context-parallel-size",
        str(context),
    ]
    if layout.virtual_stages > 1:
        if layers is not None:
            per_stage = layers // (pipeline * layout.virtual_stages)
            args += ["--num-layers", str(layers), "--num-layers-per-virtual-pipeline-stage", str(per_stage)]
        else:
            args += ["--num-virtual-stages-per-pipeline-rank", str(layout.virtual_stages)]
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    if layout.async_tensor_parallel:
        args.append("--tp-comm-overlap")
    args += _batch(layout)
    args += _sharding(layout)
    if layout.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif layout.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    args += {
        "amp-bf16": ["--bf16"],
        "amp-fp16": ["--fp16"],
        "fp16": ["--fp16"],
        "fp8": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    }.get(layout.precision, [])
    if layout.fp8_all_gather:
        args.append("--fp8-param-gather")
    if clip is not None:
        args += ["--clip-grad", str(clip)]
    if layout.zero == 0 and layout.overlap_grad_reduce:
        bucket_mb = layout.bucket_mb or DDP_BUCKET_MB
        args += ["--ddp-bucket-size", str(bucket_mb * MIB // MAIN_GRAD_BYTES)]
    return args


def _refusals(layout: Layout, pipeline: int, layers: int | None) -> list[str]:
    reasons = []
    chunks = pipeline * layout.virtual_stages
    if layers is not None and layers % chunks:
        reasons.append(
            f"layers({layers}) is not a multiple of pipeline({pipeline})*virtual_stages({layout.virtual_stages})"
            f"={chunks}: Megatron gives every chunk the same number of layers"
        )
    if layout.precision == "tf32":
        reasons.append(TF32_REASON)
    if layout.recompute == "selective-op":
        reasons.append("selective-op recomputation: Megatron recomputes by module (--recompute-modules), not per op")
    if layout.precision == "bf16":
        reasons.append("bf16 without fp32 main weights: Megatron's --bf16 keeps fp32 main weights (that is amp-bf16)")
    if pipeline > 1 and layout.schedule in ("gpipe", "zero-bubble"):
        reasons.append(f"the {layout.schedule} schedule: Megatron runs 1F1B, interleaved with virtual stages")
    if layout.shard_group is not None and layout.zero != 1:
        reasons.append(
            f"a shard group at zero {layout.zero}: hybrid sharding is the distributed optimizer's instances (zero 1)"
        )
    if layout.shard_group is not None and layout.data is None:
        reasons.append("shard_group: --num-distributed-optimizer-instances needs the data degree")
    if (layout.micro_batches or 1) > 1 and layout.global_batch is None and layout.data is None:
        reasons.append("micro_batches without a data degree: --global-batch-size needs it")
    return reasons


def _batch(layout: Layout) -> list[str]:
    args = []
    if layout.micro_batch is not None:
        args += ["--micro-batch-size", str(layout.micro_batch)]
        global_batch = layout.global_batch
        if global_batch is None and layout.data is not None:
            global_batch = layout.micro_batch * (layout.micro_batches or 1) * layout.data
        if global_batch is not None:
            args += ["--global-batch-size", str(global_batch)]
    return args


def _sharding(layout: Layout) -> list[str]:
    """The data-parallel flags. Megatron overlaps the gradient reduction with backward (and, at zero 3, each
    unit's gather with the compute before it) only when asked: `overlap_grad_reduce` and
    `overlap_param_gather` default to False (`DistributedDataParallelConfig`)."""
    args = ["--overlap-grad-reduce"] if layout.overlap_grad_reduce else []
    if layout.zero == 1:
        args.append("--use-distributed-optimizer")
        if layout.shard_group is not None and layout.data is not None:
            args += ["--num-distributed-optimizer-instances", str(layout.data // layout.shard_group)]
    elif layout.zero >= 2:
        strategy = "optim_grads" if layout.zero == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
        if layout.zero == 3:
            args.append("--overlap-param-gather")
    return args


def layout_from_megatron(args: str | list[str]) -> Layout:
    """The layout a Megatron-LM command line runs (unknown flags, such as the model's, are skipped)."""
    words = shlex.split(args) if isinstance(args, str) else list(args)
    values, switches = _read(words)
    tensor = _int(values, "--tensor-model-parallel-size", 1)
    pipeline = _int(values, "--pipeline-model-parallel-size", 1)
    chunks = _chunks(values, pipeline)
    micro = _int(values, "--micro-batch-size", None)
    fields: dict[str, Any] = {
        "data": None,
        "tensor": tensor,
        "pipeline": pipeline,
        "context": _int(values, "--context-parallel-size", 1),
        "micro_batch": micro,
        "global_batch": _int(values, "--global-batch-size", None),
        "schedule": "interleaved-1f1b" if chunks > 1 else "1f1b",
        "virtual_stages": chunks,
        "sequence_parallel": "--sequence-parallel" in switches,
        "async_tensor_parallel": "--tp-comm-overlap" in switches and "--sequence-parallel" in switches,
        "recompute": _recompute(values),
        "precision": _precision(values, switches),
    }
    fields |= _zero(values, switches)
    fields["overlap_grad_reduce"] = "--overlap-grad-reduce" in switches or fields["zero"] == 3
    bucket = _int(values, "--ddp-bucket-size", None)
    if bucket is not None and fields["zero"] == 0 and fields["overlap_grad_reduce"]:
        bucket_mb = max(1, round(bucket * MAIN_GRAD_BYTES / MIB))
        fields["bucket_mb"] = None if bucket_mb == DDP_BUCKET_MB else bucket_mb
    fields["fp8_all_gather"] = "--fp8-param-gather" in switches and fields["precision"] == "fp8" and fields["zero"] == 3
    return Layout.parse(fields)


def _read(words: list[str]) -> tuple[dict[str, str], set[str]]:
    values: dict[str, str] = {}
    switches: set[str] = set()
    i = 0
    while i < len(words):
        word = words[i]
        flag, sep, inline = word.partition("=")
        if flag in FLAGS:
            if sep:
                values[flag] = inline
            elif i + 1 < len(words):
                values[flag] = words[i + 1]
                i += 1
            else:
                raise config_error(ENGINE, flag, "is missing its value")
        elif word.startswith("--"):
            switches.add(word)
        i += 1
    return values, switches


@overload
def _int(values: dict[str, str], flag: str, default: int) -> int: ...
@overload
def _int(values: dict[str, str], flag: str, default: None) -> int | None: ...
def _int(values: dict[str, str], flag: str, default: int | None) -> int | None:
    if flag not in values:
        return default
    text = values[flag]
    if not text.isdigit() or int(text) < 1:
        raise config_error(ENGINE, flag, f"must be a positive integer, got {text!r}")
    return int(text)


def _chunks(values: dict[str, str], pipeline: int) -> int:
    per_rank = _int(values, "--num-virtual-stages-per-pipeline-rank", None)
    if per_rank is not None:
        return per_rank
    per_stage = _int(values, "--num-layers-per-virtual-pipeline-stage", None)
    if per_stage is None:
        return 1
    layers = _int(values, "--num-layers", None)
    if layers is None:
        raise config_error(
            ENGINE,
            "--num-layers-per-virtual-pipeline-stage",
            "gives virtual stages only with --num-layers (layers / (pipeline × layers per virtual stage))",
        )
    if layers % (pipeline * per_stage):
        raise config_error(
            ENGINE,
            "--num-layers-per-virtual-pipeline-stage",
            f"num_layers({layers}) is not a multiple of pipeline({pipeline})*layers_per_virtual_stage({per_stage})",
        )
    return layers // (pipeline * per_stage)


def _recompute(values: dict[str, str]) -> str:
    granularity = values.get("--recompute-granularity")
    if granularity is None:
        return "none"
    if granularity not in ("selective", "full"):
        raise config_error(ENGINE, "--recompute-granularity", f"must be selective or full, got {granularity!r}")
    return granularity


def _precision(values: dict[str, str], switches: set[str]) -> str:
    if "--fp8-format" in values:
        return "fp8"
    if "--bf16" in switches:
        return "amp-bf16"
    if "--fp16" in switches:
        return "fp16"
    return "fp32"


def _zero(values: dict[str, str], switches: set[str]) -> dict[str, Any]:
    if "--use-megatron-fsdp" in switches or "--use-custom-fsdp" in switches:
        strategy = values.get("--data-parallel-sharding-strategy", "optim_grads_params")
        if strategy not in SHARDING:
            raise config_error(
                ENGINE, "--data-parallel-sharding-strategy", f"must be one of {', '.join(SHARDING)}, got {strategy!r}"
            )
        return {"zero": SHARDING[strategy]}
    if "--use-torch-fsdp2" in switches:
        return {"zero": 3}
    if "--use-distributed-optimizer" in switches:
        instances = _int(values, "--num-distributed-optimizer-instances", 1)
        if instances and instances > 1:
            raise config_error(
                ENGINE,
                "--num-distributed-optimizer-instances",
                "gives the shard group only with the data degree, which the command line does not state; "
                "set shard_group on the layout instead",
            )
        return {"zero": 1}
    return {"zero": 0}
