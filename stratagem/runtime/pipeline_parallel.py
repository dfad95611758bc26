"""Pipeline parallelism: this rank's stage of the model, driven by torch.distributed.pipelining.

A strategy's stages are lists of graph layer names (module paths). The runtime cuts the model between
its top-level modules, so the model must be an `nn.Sequential` whose children chain into the output
(embeddings, blocks, head) and leave the loss to `loss_fn`, and every child must fall inside one stage
(`stratagem.parallel_rules.pipeline_refusal`, which the search obeys too). The stage keeps the children's
names, so parameter names — what the strategy's variables refer to — are the same as in the whole model.

A step runs every micro-batch through the stage with `ScheduleGPipe` or `Schedule1F1B` (PyTorch's own
schedules, point-to-point sends over the pipeline group); gradients are summed over micro-batches and
divided by their number, so a step sees the mean loss gradient over the local batch, as one process would.
With a single stage the schedule is plain gradient accumulation over the micro-batches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from stratagem.errors import InvalidStrategyError, Problem, UnsupportedStrategyError
from stratagem.ir import PipelineConfig
from stratagem.parallel_rules import class_path, pipeline_refusal

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ROOT_LAYERS = ("<root>", "<loss>")
"""Capture's names for operations of the model's own forward and of the loss: they belong to no child."""


def stage_children(model: nn.Module, stages: list[list[str]]) -> list[list[str]]:
    """The model's top-level children in each stage, in order. A child no stage names (capture recorded
    no layer inside it) runs in the stage of the child before it."""
    refusal = pipeline_refusal(class_path(type(model)), returns_loss=False)
    if refusal is not None:
        raise UnsupportedStrategyError(f"pipeline: {refusal}; wrap the model's parts (embeddings, blocks, head) in an nn.Sequential")
    children = list(model._modules)
    stage_of: dict[str, int] = {}
    for s, names in enumerate(stages):
        for j, name in enumerate(names):
            child = name.split("/")[0].split(".")[0]
            if child in ROOT_LAYERS:
                continue
            if child not in model._modules:
                raise InvalidStrategyError([Problem(f"pipeline.stages[{s}][{j}]", f"{name!r} is not inside any child of the model")])
            if stage_of.setdefault(child, s) != s:
                raise UnsupportedStrategyError(
                    f"pipeline.stages: module {child!r} is split between stages {stage_of[child]} and {s}; "
                    "stages must cut between the model's top-level children")
    out: list[list[str]] = [[] for _ in stages]
    current = 0
    for child in children:
        stage = stage_of.get(child, current)
        if stage < current:
            raise UnsupportedStrategyError(f"pipeline.stages: child {child!r} is in stage {stage}, after a child of stage {current}")
        current = stage
        out[stage].append(child)
    empty = [s for s, names in enumerate(out) if not names]
    if empty:
        raise InvalidStrategyError([Problem(f"pipeline.stages[{empty[0]}]", "holds no module of the model")])
    return out


def stage_module(model: nn.Module, children: list[str]) -> nn.Sequential:
    """The stage's children as an nn.Sequential that keeps their names (so parameter names do not change)."""
    return nn.Sequential(OrderedDict((name, model._modules[name]) for name in children))


class PipelinedModel(nn.Module):
    """This rank's stage, trained a whole step at a time: every rank calls `train_step` with the same
    arguments; the first stage reads the inputs, the last the targets, the others neither."""

    def __init__(self, stage: nn.Sequential, *, stage_index: int, num_stages: int, config: PipelineConfig,
                 group: dist.ProcessGroup | None, device: torch.device, loss_fn: LossFn) -> None:
        super().__init__()
        self.stage = stage
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.micro_batches = config.micro_batches
        if config.schedule == "1f1b" and config.micro_batches < num_stages:
            raise InvalidStrategyError([Problem("pipeline.micro_batches",
                                                f"1F1B needs at least as many micro-batches as stages: {config.micro_batches} < {num_stages}")])
        pipe = PipelineStage(stage, stage_index, num_stages, device, group=group)
        schedule = Schedule1F1B if config.schedule == "1f1b" else ScheduleGPipe
        self.schedule = schedule(pipe, config.micro_batches, loss_fn=_scoring_outputs(loss_fn))

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def train_step(self, *inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of every micro-batch; the mean micro-batch loss on the last stage, else None."""
        batch = (inputs[0] if inputs else target).shape[0]
        if batch % self.micro_batches:
            raise UnsupportedStrategyError(
                f"pipeline.micro_batches: {self.micro_batches} micro-batches do not split the local batch of {batch}")
        losses: list[torch.Tensor] = []
        args = inputs if self.is_first else ()
        if self.is_last:
            self.schedule.step(*args, target=target, losses=losses)
            return torch.stack([loss.detach() for loss in losses]).mean()
        self.schedule.step(*args)
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
                    "model that is not an nn.Sequential accumulate only when its forward returns the loss (a single number)")
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
                f"which must be one local batch they divide; the inputs' first dimensions are {rows}")
        split = [t.chunk(self.micro_batches) if isinstance(t, torch.Tensor) else (t,) * self.micro_batches for t in inputs]
        return list(zip(*split, strict=True))


def _scoring_outputs(loss_fn: LossFn) -> LossFn:
    """`loss_fn`, refusing a 0-d model output: the model computed its own loss, which micro-batching cannot score."""

    def scored(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if isinstance(output, torch.Tensor) and output.dim() == 0:
            raise UnsupportedStrategyError(f"pipeline: {pipeline_refusal(None, returns_loss=True)}")
        return loss_fn(output, target)

    return scored
