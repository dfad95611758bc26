"""`capture`: one forward and backward of a model on fake tensors, recorded layer by layer, and its
operator trace (forward, backward and an optimizer step, op by op) beside it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.func import functional_call
from torch.utils._pytree import tree_leaves

from stratagem.architecture import zoo_architecture
from stratagem.collector import collector_paused
from stratagem.errors import CaptureError, InvalidGraphError, Problem, StratagemError
from stratagem.ir import ModelGraph, OptimizerSpec
from stratagem.parallel_rules import BLOCK_LISTS
from stratagem.tracing.assemble import build_graph
from stratagem.tracing.fake import fake_inputs, fake_state
from stratagem.tracing.modes import recording
from stratagem.tracing.optrace import OperatorTrace
from stratagem.tracing.recorder import Phase, Recorder
from stratagem.tracing.trace_recorder import TraceRecorder, record_optimizer_step

LossFn = Callable[[Any], torch.Tensor]


def capture(
    model: nn.Module,
    example_inputs: Any,
    *,
    batch_size: int,
    optimizer: str = "adam",
    optimizer_implementation: str = "multi-tensor",
    max_grad_norm: float | None = None,
    loss_fn: LossFn | None = None,
    name: str | None = None,
    trace: bool = True,
) -> ModelGraph:
    """Record one training step of `model` on `example_inputs` as a ModelGraph, without real compute.

    `example_inputs` is a tuple of positional arguments (a lone tensor or a dict of keyword arguments
    also work) holding `batch_size` samples; real, meta or fake tensors are all fine, since only their
    metadata is used. `loss_fn(output)` must return a scalar; by default the output (or its first
    tensor) is summed. The model is left as it was: parameters stay untouched, `training` is restored.

    `optimizer_implementation` says how the training run steps it (`OptimizerSpec.implementation`):
    `multi-tensor` (PyTorch's default on CUDA), `for-loop` (`foreach=False`) or `fused` (`fused=True`,
    apex's or DeepSpeed's `FusedAdam`); a fused update moves a third of the bytes. `max_grad_norm` is the
    global gradient norm the run clips to (`OptimizerSpec.max_grad_norm`; None when it does not clip).

    With `trace` (the default) the step's operator trace is recorded too: the graph's `trace_id`
    names it and `graph.trace` holds it (see `docs/capture.md`).
    """
    spec = _check_arguments(model, batch_size, optimizer, optimizer_implementation, max_grad_norm)
    with collector_paused():
        return _capture(model, example_inputs, batch_size, spec, loss_fn, name, trace)


def _capture(
    model: nn.Module,
    example_inputs: Any,
    batch_size: int,
    optimizer: OptimizerSpec,
    loss_fn: LossFn | None,
    name: str | None,
    trace: bool,
) -> ModelGraph:
    started = time.perf_counter()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    params, buffers = fake_state(fake_mode, model)
    fake_batch = fake_inputs(fake_mode, example_inputs)
    args, kwargs = _split_inputs(fake_batch)
    recorder = Recorder(model, params, buffers)
    graph_name = name or _zoo_name(model) or type(model).__name__
    tracer = _tracer(graph_name, batch_size, optimizer.kind, params, buffers, fake_batch) if trace else None
    with _training_mode(model), fake_mode, torch.enable_grad(), recording(recorder, tracer):
        output = _guarded(recorder, lambda: functional_call(model, (params, buffers), args, kwargs, strict=False))
        loss = _guarded(recorder, lambda: _loss(loss_fn, output))
        recorder.phase = Phase.backward
        _guarded(recorder, loss.backward)
    if tracer is not None:
        with fake_mode:
            record_optimizer_step(tracer, params, optimizer.kind, loss)
    provenance = _provenance(model, example_inputs, seconds=time.perf_counter() - started)
    operator_trace = _finish_trace(tracer, provenance) if tracer is not None else None
    graph = build_graph(
        model,
        recorder,
        name=graph_name,
        batch_size=batch_size,
        optimizer=optimizer,
        provenance=provenance,
        trace_id=operator_trace.id if operator_trace is not None else None,
    )
    graph.architecture = zoo_architecture(provenance.get("zoo"))
    if operator_trace is not None:
        graph.attach_trace(operator_trace)
    return graph


def _zoo_name(model: nn.Module) -> str | None:
    zoo = getattr(model, "zoo_spec", None)
    name = zoo.get("name") if isinstance(zoo, Mapping) else None
    return name if isinstance(name, str) and name else None


def _tracer(
    graph_name: str,
    batch_size: int,
    optimizer: str,
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    fake_batch: Any,
) -> TraceRecorder:
    tracer = TraceRecorder(graph_name=graph_name, batch_size=batch_size, optimizer=optimizer)
    for name, tensor in params.items():
        tracer.register(tensor, source="parameter", name=name)
    for name, tensor in buffers.items():
        tracer.register(tensor, source="buffer", name=name)
    tracer.add_inputs(list(tree_leaves(fake_batch)))
    return tracer


def _finish_trace(tracer: TraceRecorder, provenance: dict[str, Any]) -> OperatorTrace:
    return tracer.build(provenance={"torch": provenance["torch"], "model_class": provenance["model_class"]})


def _provenance(model: nn.Module, example_inputs: Any, *, seconds: float) -> dict[str, Any]:
    """Where the graph came from; a zoo model's `zoo_spec` lets a trial runner rebuild it."""
    model_class = type(model)
    provenance: dict[str, Any] = {
        "source": "capture",
        "torch": torch.__version__,
        "model_class": f"{model_class.__module__}.{model_class.__qualname__}",
        "inputs": _describe_inputs(example_inputs),
        "block_lists": _block_lists(model),
        "capture_seconds": round(seconds, 3),
    }
    zoo = getattr(model, "zoo_spec", None)
    if isinstance(zoo, Mapping):
        provenance["zoo"] = dict(zoo)
    return provenance


def _block_lists(model: nn.Module) -> list[str]:
    """The ModuleLists where the runtime may cut pipeline stages between blocks: the graph's layer names
    alone cannot tell a ModuleList from a ModuleDict or a plain module with numbered children."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and name.rpartition(".")[2] in BLOCK_LISTS
    ]


def _check_arguments(
    model: object, batch_size: object, optimizer: str, implementation: str, max_grad_norm: float | None
) -> OptimizerSpec:
    """The optimizer as the run steps it, at fp32 itemsize (`build_graph` sets the model's)."""
    problems = []
    if not isinstance(model, nn.Module):
        problems.append(Problem("model", f"must be a torch.nn.Module, got {type(model).__name__}"))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        problems.append(Problem("batch_size", f"must be a positive integer, got {batch_size!r}"))
    if problems:
        raise InvalidGraphError(problems)
    return OptimizerSpec.of(optimizer, implementation=implementation, max_grad_norm=max_grad_norm)


def _split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


@contextmanager
def _training_mode(model: nn.Module) -> Iterator[None]:
    """A training step runs in train mode (dropout, batch statistics); put every flag back afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


def _loss(loss_fn: LossFn | None, output: Any) -> torch.Tensor:
    loss = loss_fn(output) if loss_fn is not None else _first_tensor(output).sum()
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = f"shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise CaptureError(f"loss_fn must return a scalar tensor, got {got}")
    if not loss.requires_grad:
        raise CaptureError(
            "the loss does not require grad: no trainable parameter reaches the output "
            "(is the model frozen, or the output integer-valued?)"
        )
    return loss


def _first_tensor(output: Any) -> torch.Tensor:
    """The tensor a default loss sums: the output itself, or the first tensor in a tuple, dict or ModelOutput."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else ()
    for value in values:
        if value is None:
            continue
        try:
            return _first_tensor(value)
        except CaptureError:
            continue
    raise CaptureError(f"the model's output ({type(output).__name__}) holds no tensor; pass loss_fn")


def _guarded(recorder: Recorder, step: Callable[[], Any]) -> Any:
    """Run a step, turning any failure into a CaptureError that names the layer and the reason."""
    try:
        return step()
    except StratagemError:
        raise
    except Exception as error:
        where = recorder.location()
        raise CaptureError(
            f"cannot capture layer {where} in {recorder.phase.value}: {_reason(error)}: {type(error).__name__}: {error}"
        ) from error


def _reason(error: Exception) -> str:
    if isinstance(error, (DataDependentOutputException, DynamicOutputShapeException)):
        return (
            "data-dependent control flow or value (.item(), .tolist(), bool(tensor), nonzero, ...); "
            "capture runs without real values, so the step must not depend on them"
        )
    if isinstance(error, UnsupportedOperatorException):
        return "an operator has no fake-tensor (meta) implementation"
    return "the forward or backward raised"


def _describe_inputs(inputs: Any) -> list[dict[str, Any]]:
    return [
        {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        for t in tree_leaves(inputs)
        if isinstance(t, torch.Tensor)
    ]
