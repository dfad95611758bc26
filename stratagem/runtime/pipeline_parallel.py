"""Pipeline parallelism: this rank's stage of the model, driven by torch.distributed.pipelining.

A strategy's stages are lists of graph layer names (module paths). The runtime cuts the model between
its top-level modules, so the model must be an `nn.Sequential` whose children chain into the output
(embeddings, blocks, head) and leave the loss to `loss_fn`, and every child must fall inside one stage
(`stratagem.parallel_rules.pipeline_refusal`, which the search obeys too). The stage keeps the children's
names, so parameter names — what the strategy's variables refer to — are the same as in the whole model.

A step runs every micro-batch through the stages with PyTorch's own schedules (point-to-point sends
over the pipeline group): `ScheduleGPipe`, `Schedule1F1B`, `ScheduleInterleaved1F1B` for
`interleaved-1f1b`, and for `zero-bubble` `ScheduleZBVZeroBubble` with two chunks per rank (the V-shaped
placement: rank r holds chunks r and 2p − 1 − r) or `ScheduleInterleavedZeroBubble` otherwise (chunk i on
rank i mod p). Gradients are summed over micro-batches and divided by their number, so a step sees the
mean loss gradient over the local batch, as one process would. With a single stage the schedule is
plain gradient accumulation over the micro-batches.

A model of another class that returns its own loss and keeps numbered blocks in a ModuleList (the zoo's
transformers) is cut at the beginning of blocks instead, by pipelining's tracer: `TracedPipelinedModel`
(the `blocks` route of `parallel_rules.pipeline_route`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.ir import PipelineConfig
from stratagem.parallel_rules import class_path, pipeline_refusal
from stratagem.runtime.precision import StepNumerics

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ROOT_LAYERS = ("<root>", "<loss>")
"""Capture's names for operations of the model's own forward and of the loss: they belong to no child."""


def stage_children(model: nn.Module, stages: list[list[str]]) -> list[list[str]]:
    """The model's top-level children in each stage, in order. A child no stage names (capture recorded
    no layer inside it) runs in the stage of the child before it."""
    refusal = pipeline_refusal(class_path(type(model)), returns_loss=False)
    if refusal is not None:
        raise UnsupportedStrategyError(
            f"pipeline: {refusal}; wrap the model's parts (embeddings, blocks, head) in an nn.Sequential"
        )
    children = list(model._modules)
    stage_of: dict[str, int] = {}
    for s, names in enumerate(stages):
        for j, name in enumerate(names):
            child = name.split("/")[0].split(".")[0]
            if child in ROOT_LAYERS:
                continue
            if child not in model._modules:
                raise InvalidStrategyError(
                    [Problem(f"pipeline.stages[{s}][{j}]", f"{name!r} is not inside any child of the model")]
                )
            if stage_of.setdefault(child, s) != s:
                raise UnsupportedStrategyError(
                    f"pipeline.stages: module {child!r} is split between stages {stage_of[child]} and {s}; "
                    "stages must cut between the model's top-level children"
                )
    out: list[list[str]] = [[] for _ in stages]
    current = 0
    for child in children:
        stage = stage_of.get(child, current)
        if stage < current:
            raise UnsupportedStrategyError(
                f"pipeline.stages: child {child!r} is in stage {stage}, after a child of stage {current}"
            )
        current = stage
        out[stage].append(child)
    empty = [s for s, names in enumerate(out) if not names]
    if empty:
        raise InvalidStrategyError([Problem(f"pipeline.stages[{empty[0]}]", "holds no module of the model")])
    return out


def chunk_owner(chunk: int, pipeline: int, config: PipelineConfig) -> int:
    """The pipeline rank holding model chunk `chunk` (Megatron's interleaving, or ZBV's V shape)."""
    if config.schedule == "zero-bubble" and config.virtual_stages == 2 and chunk >= pipeline:
        return 2 * pipeline - 1 - chunk
    return chunk % pipeline


def chunks_of(rank: int, pipeline: int, config: PipelineConfig) -> list[int]:
    """The chunks pipeline rank `rank` holds, in model order."""
    return [i for i in range(pipeline * config.virtual_stages) if chunk_owner(i, pipeline, config) == rank]


def schedule_class(config: PipelineConfig) -> type:
    if config.schedule == "gpipe":
        return ScheduleGPipe
    if config.schedule == "1f1b":
        return Schedule1F1B
    if config.schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B
    return ScheduleZBVZeroBubble if config.virtual_stages == 2 else ScheduleInterleavedZeroBubble


def _multi(config: PipelineConfig) -> bool:
    """Whether the schedule takes a list of stages (several chunks per rank, or zero-bubble's)."""
    return config.schedule in ("interleaved-1f1b", "zero-bubble")


def _check_micro_batches(config: PipelineConfig, num_stages: int, pipeline: int) -> None:
    if config.schedule == "1f1b" and config.micro_batches < num_stages:
        raise InvalidStrategyError(
            [
                Problem(
                    "pipeline.micro_batches",
                    f"1F1B needs at least as many micro-batches as stages: {config.micro_batches} < {num_stages}",
                )
            ]
        )
    if _multi(config) and config.micro_batches < pipeline:
        raise InvalidStrategyError(
            [
                Problem(
                    "pipeline.micro_batches",
                    f"{config.schedule} needs at least as many micro-batches as pipeline ranks: "
                    f"{config.micro_batches} < {pipeline}",
                )
            ]
        )


def stage_module(model: nn.Module, children: list[str]) -> nn.Sequential:
    """The stage's children as an nn.Sequential that keeps their names (so parameter names do not change)."""
    return nn.Sequential(OrderedDict((name, model.get_submodule(name)) for name in children))


class _HeldChunks:
    """Whether this rank holds the pipeline's first chunk (reads the inputs) or its last (the loss)."""

    indices: list[int]
    num_stages: int

    @property
    def is_first(self) -> bool:
        return 0 in self.indices

    @property
    def is_last(self) -> bool:
        return self.num_stages - 1 in self.indices


class PipelinedModel(_HeldChunks, nn.Module):
    """This rank's stage (its chunks), trained a whole step at a time: every rank calls `train_step`
    with the same arguments; the rank holding the first chunk reads the inputs, the one holding the
    last the targets, the others neither. `stage` holds every chunk of this rank (its parameters);
    `chunks` gives each chunk's index among the `num_stages` chunks, when the rank holds several."""

    def __init__(
        self,
        stage: nn.Sequential,
        *,
        stage_index: int,
        num_stages: int,
        config: PipelineConfig,
        group: dist.ProcessGroup | None,
        device: torch.device,
        loss_fn: LossFn,
        chunks: Sequence[tuple[int, nn.Module]] | None = None,
        numerics: StepNumerics | None = None,
    ) -> None:
        super().__init__()
        self.stage = stage
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.micro_batches = config.micro_batches
        self.numerics = numerics or StepNumerics()
        pipeline = num_stages // config.virtual_stages
        _check_micro_batches(config, num_stages, pipeline)
        held = chunks if chunks is not None else [(stage_index, stage)]
        self.indices = [index for index, _ in held]
        stages = [PipelineStage(module, index, num_stages, device, group=group) for index, module in held]
        scored = self.numerics.loss_fn(_scoring_outputs(loss_fn))
        schedule = schedule_class(config)
        self.schedule = schedule(stages if _multi(config) else stages[0], config.micro_batches, loss_fn=scored)

    def train_step(self, *inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of every micro-batch; the mean micro-batch loss on the last stage, else None."""
        batch = (inputs[0] if inputs else target).shape[0]
        if batch % self.micro_batches:
            raise UnsupportedStrategyError(
                f"pipeline.micro_batches: {self.micro_batches} micro-batches do not split the local batch of {batch}"
            )
        losses: list[torch.Tensor] = []
        args = self.numerics.inputs(inputs) if self.is_first else ()
        with self.numerics.context():
            if self.is_last:
                self.schedule.step(*args, target=target, losses=losses)
            else:
                self.schedule.step(*args)
        if self.is_last:
            return self.numerics.loss_value(torch.stack([loss.detach() for loss in losses]).mean())
        return None

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        raise UnsupportedStrategyError("a pipeline stage runs whole steps: call model.train_step(*inputs, target=...)")


class AccumulatedModel(nn.Module):
    """Micro-batches on one stage for a model that returns its own loss (a mean over samples), trained
    as usual: `loss = model(*batch); loss.backward()`. Forward splits every input along its first
    dimension, runs forward and backward for every micro-batch but the last, and returns the mean loss
    whose backward is the last micro-batch's — so gradients are the whole batch's mean while only one
    micro-batch's activations are alive. The model is `self.module` (parameter names gain `module.`,
    as under DDP). Without gradients (evaluation) it only averages the micro-batch losses."""

    def __init__(self, module: nn.Module, *, micro_batches: int) -> None:
        super().__init__()
        self.module = module
        self.micro_batches = micro_batches

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        chunks = self._chunks(inputs)
        for index, chunk in enumerate(chunks):
            loss = self.module(*chunk)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise UnsupportedStrategyError(
                    f"pipeline.micro_batches: {type(self.module).__name__} returned {shape}, not its loss: micro-batches of a "
                    "model that is not an nn.Sequential accumulate only when its forward returns the loss (a single number)"
                )
            if index < len(chunks) - 1 and torch.is_grad_enabled():
                (loss / self.micro_batches).backward()
                loss = loss.detach()
            losses.append(loss)
        return torch.stack(losses).mean()

    def _chunks(self, inputs: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
        """Every tensor input split along its first dimension, which must be the same batch for all."""
        rows = sorted({t.shape[0] if t.dim() else 0 for t in inputs if isinstance(t, torch.Tensor)})
        if len(rows) != 1 or rows[0] % self.micro_batches:
            raise UnsupportedStrategyError(
                f"pipeline.micro_batches: {self.micro_batches} micro-batches split every input along its first dimension, "
                f"which must be one local batch they divide; the inputs' first dimensions are {rows}"
            )
        split = [
            t.chunk(self.micro_batches) if isinstance(t, torch.Tensor) else (t,) * self.micro_batches for t in inputs
        ]
        return list(zip(*split, strict=True))


def _scoring_outputs(loss_fn: LossFn) -> LossFn:
    """`loss_fn`, refusing a 0-d model output: the model computed its own loss, which micro-batching cannot score."""

    def scored(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if isinstance(output, torch.Tensor) and output.dim() == 0:
            raise UnsupportedStrategyError(f"pipeline: {pipeline_refusal(None, returns_loss=True)}")
        return loss_fn(output, target)

    return scored


def stage_parameters(model: nn.Module, stages: list[list[str]]) -> list[dict[str, nn.Parameter]]:
    """Each stage's parameters under their first name in `model.named_parameters()` (the strategy's
    variable names): those of the modules its layers name. A weight tied between modules of two stages
    (embedding and output head) is in both."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    owners = [{name.split("/")[0].split("#")[0] for name in names} for names in stages]
    named = set().union(*owners)
    out: list[dict[str, nn.Parameter]] = [{} for _ in stages]
    for name, param in model.named_parameters(remove_duplicate=False):
        module = _owning_module(name, named)
        for s, modules in enumerate(owners):
            if module in modules:
                out[s][canonical[id(param)]] = param
    missing = [name for name in canonical.values() if not any(name in stage for stage in out)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InvalidStrategyError([Problem("pipeline.stages", f"no stage names the module of {missing[0]!r}{more}")])
    return out


def _owning_module(parameter: str, named: set[str]) -> str:
    """The module a parameter's stage is decided by: its own module when a layer names it, else the
    nearest enclosing module that one does. A submodule whose weights its parent reads functionally is
    never called, so no layer names it: nn.MultiheadAttention applies `out_proj.weight` inside its own
    forward, and capture records those ops as the pseudo-layer `<attn>/ops0`."""
    module = parameter.rpartition(".")[0]
    candidate = module
    while candidate and candidate not in named:
        candidate = candidate.rpartition(".")[0]
    return candidate or module


class TracedPipelinedModel(_HeldChunks, nn.Module):
    """This rank's stage of a model that returns its own loss, cut at the beginning of blocks by
    torch.distributed.pipelining's tracer (`parallel_rules.block_cuts`), trained as usual:
    `loss = model(*batch); loss.backward()`. Forward runs the whole step (every micro-batch's forward
    and backward through the schedule) and returns the mean micro-batch loss on every rank of the
    pipeline (broadcast from the last stage) as a leaf tensor, so the caller's backward touches no
    parameter. Every rank passes the same batch; only the first stage reads it.

    The trace is built on the first step, from the first micro-batch's shapes (export fixes them, so
    later batches must have the same shapes). Every input is cloned at the top of the traced forward,
    so the inputs the later stages need (the labels) travel through the stages as activations:
    pipelining feeds the model's own inputs to the first stage only. The stage's parameters are the
    model's own (the tracer copies a weight used by two stages; it is put back), and the gradient of a
    weight tied across stages is summed over the pipeline group after the schedule."""

    def __init__(
        self,
        model: nn.Module,
        *,
        cuts: list[str],
        stage_index: int,
        num_stages: int,
        config: PipelineConfig,
        group: dist.ProcessGroup,
        device: torch.device,
        tied: list[str],
        held: set[str],
        numerics: StepNumerics | None = None,
    ) -> None:
        super().__init__()
        pipeline = num_stages // config.virtual_stages
        _check_micro_batches(config, num_stages, pipeline)
        self.module = model
        self.cuts = cuts
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.indices = chunks_of(stage_index, pipeline, config)
        self.last_rank = chunk_owner(num_stages - 1, pipeline, config)
        self.config = config
        self.micro_batches = config.micro_batches
        self.group = group
        self.device = device
        self.tied = tied
        self.held = held
        self.numerics = numerics or StepNumerics()
        self.schedule: Any = None
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        shapes = [tuple(t.shape) for t in batch]
        rows = {shape[0] if shape else 0 for shape in shapes}
        if len(rows) != 1 or next(iter(rows)) % self.micro_batches:
            raise UnsupportedStrategyError(
                f"pipeline.micro_batches: {self.micro_batches} micro-batches split every input along its first dimension, "
                f"which must be one local batch they divide; the inputs' shapes are {[list(s) for s in shapes]}"
            )
        if self.schedule is None:
            self.schedule = self._build(batch)
            self.shapes = shapes
        elif shapes != self.shapes:
            raise UnsupportedStrategyError(
                f"pipeline: the stages were traced for inputs of shapes {[list(s) for s in self.shapes]}, "
                f"not {[list(s) for s in shapes]}: every step of a traced pipeline has the same shapes"
            )
        losses: list[torch.Tensor] = []
        args = self.numerics.inputs(batch) if self.is_first else ()
        with self.numerics.context():
            if self.is_last:  # the schedule splits a target for its loss_fn; the model's own loss needs none
                self.schedule.step(
                    *args,
                    target=torch.zeros(self.micro_batches, device=self.device),
                    losses=losses,
                    return_outputs=False,
                )
            else:
                self.schedule.step(*args)
        self._sum_tied_gradients()
        loss = (
            self.numerics.loss_value(torch.stack([loss.detach() for loss in losses]).mean())
            if self.is_last
            else torch.zeros((), device=self.device)
        )
        dist.broadcast(loss, group_src=self.last_rank, group=self.group)
        return loss.requires_grad_()

    def _build(self, batch: tuple[torch.Tensor, ...]) -> Any:
        from torch.distributed.pipelining import SplitPoint, pipeline

        example = tuple(t.chunk(self.micro_batches)[0] for t in batch)
        handle = self.module.register_forward_pre_hook(_clone_inputs)
        try:
            pipe = pipeline(self.module, mb_args=example, split_spec={cut: SplitPoint.BEGINNING for cut in self.cuts})
        finally:
            handle.remove()
        if pipe.num_stages != self.num_stages:
            raise UnsupportedStrategyError(
                f"pipeline: tracing at {self.cuts} gave {pipe.num_stages} stages, not {self.num_stages}: "
                "a cut block is not called in the traced forward"
            )
        stages = []
        for index in self.indices:
            _retie(pipe.get_stage_module(index), self.module)
            stages.append(pipe.build_stage(index, self.device, group=self.group))
        schedule = schedule_class(self.config)
        loss_fn = self.numerics.loss_fn(_own_loss)
        return schedule(stages if _multi(self.config) else stages[0], self.micro_batches, loss_fn=loss_fn)

    def _sum_tied_gradients(self) -> None:
        """A weight held by several stages gets each stage's gradient; they add up to the whole model's."""
        for name in self.tied:
            param = self.module.get_parameter(name)
            grad = param.grad if param.grad is not None and name in self.held else torch.zeros_like(param)
            dist.all_reduce(grad, group=self.group)
            if name in self.held:
                param.grad = grad


def _clone_inputs(_module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
    """Inputs copied inside the traced forward: their copies are stage 0's outputs, sent on to the stages that need them."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _retie(stage: nn.Module, model: nn.Module) -> None:
    """Point each of the stage's parameters at the model's own (the optimizer holds those)."""
    for name, param in list(stage.named_parameters(remove_duplicate=False)):
        try:
            original = model.get_parameter(name)
        except AttributeError:
            raise UnsupportedStrategyError(
                f"pipeline: the traced stage holds {name!r}, which is not a parameter of the model"
            ) from None
        if param is not original:
            owner, _, leaf = name.rpartition(".")
            stage.get_submodule(owner)._parameters[leaf] = original


def _own_loss(output: torch.Tensor, _target: object) -> torch.Tensor:
    """The last stage's output is the model's own loss: a single number, scored as it is."""
    if not isinstance(output, torch.Tensor) or output.dim() != 0:
        shape = list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise UnsupportedStrategyError(
            f"pipeline: the model returned {shape}, not its loss; a pipeline cut between blocks needs a "
            "model whose forward returns its loss (a single number)"
        )
    return output
