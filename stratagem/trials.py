"""`stratagem.trial`: time a strategy on your own model, inside your own `torchrun` job.

The module is `trials`, not `trial`, so that importing it never shadows the function on the
`stratagem` namespace (as `stratagem.tracing` holds `capture`).

The service never imports a user's code, so its own trials of a model outside the zoo train a replay
of the model's operator trace (`docs/trials.md`). A user who can run their code measures the real
thing instead: every rank calls `trial(...)` with its model and batch maker, the strategy is applied
with `stratagem.distribute`, warm-up steps run untimed, and each timed step counts as long as its
slowest rank took (the others wait for it in a collective). With `record_to=client` (and the graph
and resource spec the strategy was made for), rank 0 records the measurement on the service
(`Client.record_trial`), so the cost model learns from real steps; nothing is sent otherwise.

    torchrun --nproc-per-node 2 train.py        # train.py:
    stratagem.runtime.init_from_env()
    report = stratagem.trial(model, make_batch, strategy, steps=10, batch_size=8)
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from stratagem.errors import InvalidDocumentError, Problem, UnsupportedStrategyError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

if TYPE_CHECKING:
    from stratagem.client import Client

MakeBatch = Callable[[int], Any]
LossFn = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class TrialReport:
    """What a trial measured, the same on every rank (rank 0 also holds the service's record)."""

    step_times_s: list[float]
    """Per timed step, the slowest rank's time."""
    median_s: float
    p90_s: float
    samples_per_s: float
    """Global batch (per-replica batch times the data-parallel degree) over the median step."""
    peak_memory_bytes: float
    """The largest rank's high-water mark: allocator peak on a GPU, resident set on a CPU."""
    world_size: int
    batch_size: int
    warmup: int
    recorded: dict[str, Any] | None = field(default=None)
    """The trial row the service stored, on rank 0 when `record_to` was given."""


def trial(
    model: nn.Module,
    make_batch: MakeBatch,
    strategy: Strategy | str | Path,
    *,
    steps: int = 10,
    warmup: int = 3,
    batch_size: int | None = None,
    optimizer: torch.optim.Optimizer | str = "adam",
    loss_fn: LossFn | None = None,
    graph: ModelGraph | None = None,
    resources: ResourceSpec | None = None,
    record_to: Client | None = None,
) -> TrialReport:
    """Train `model` under `strategy` for `warmup` + `steps` steps on batches of `make_batch(batch_size)`.

    Call it on every rank of an initialized process group (`stratagem.runtime.init_from_env()`; a
    lone process becomes a one-rank group). `batch_size` is per replica (default: the graph's);
    `optimizer` is a torch optimizer over the model's parameters or an optimizer kind; `loss_fn(output)`
    defaults to the output itself when it is a scalar (the zoo's models and Hugging Face models given
    labels return their loss), else the sum of its first tensor. Steps clip to the graph's
    `optimizer.max_grad_norm` when it has one. `record_to`, `graph` and `resources` together record the
    result on the service.
    """
    from stratagem.runtime import distribute, init_from_env, load_strategy, replica_device

    strategy = load_strategy(strategy) if isinstance(strategy, str | Path) else strategy
    batch = _check(strategy, steps=steps, warmup=warmup, batch_size=batch_size, graph=graph)
    _check_recording(record_to, graph, resources)
    if not dist.is_initialized():
        init_from_env()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size != len(strategy.replicas):
        raise UnsupportedStrategyError(
            f"the strategy has {len(strategy.replicas)} replicas but the process group {world_size} ranks"
        )
    torch_optimizer = optimizer if isinstance(optimizer, torch.optim.Optimizer) else make_optimizer(optimizer, model)
    device = replica_device(strategy.replicas[rank])
    max_grad_norm = graph.optimizer.max_grad_norm if graph is not None else None
    model, torch_optimizer = distribute(model, torch_optimizer, strategy, rank=rank, max_grad_norm=max_grad_norm)
    loss_of = loss_fn or default_loss
    dist.barrier()
    times = []
    for step in range(warmup + steps):
        inputs = _to_device(make_batch(batch), device)
        seconds = _step(model, torch_optimizer, inputs, loss_of, device)
        if step >= warmup:
            times.append(seconds)
    slowest = _slowest(times, device)
    peak = _slowest([peak_memory_bytes(device)], device)[0]
    middle = statistics.median(slowest)
    report = TrialReport(
        step_times_s=slowest,
        median_s=middle,
        p90_s=_quantile(slowest, 0.9),
        samples_per_s=batch * strategy.effective_mesh.data / middle if middle > 0 else 0.0,
        peak_memory_bytes=peak,
        world_size=world_size,
        batch_size=batch,
        warmup=warmup,
    )
    if rank == 0 and record_to is not None and graph is not None and resources is not None:
        report = _record(report, record_to, strategy, graph, resources)
    dist.barrier()
    return report


def _check(strategy: Strategy, *, steps: int, warmup: int, batch_size: int | None, graph: ModelGraph | None) -> int:
    problems = []
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        problems.append(Problem("steps", f"must be a positive integer, got {steps!r}"))
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        problems.append(Problem("warmup", f"must be 0 or more, got {warmup!r}"))
    batch = batch_size if batch_size is not None else (graph.batch_size if graph is not None else None)
    if batch is None:
        problems.append(Problem("batch_size", "is required when no graph is given (the per-replica batch)"))
    elif isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        problems.append(Problem("batch_size", f"must be a positive integer, got {batch!r}"))
    if problems:
        raise InvalidDocumentError(problems, document="trial")
    if strategy.effective_mesh.pipeline > 1:
        raise UnsupportedStrategyError(
            "a pipelined strategy trains with PipelinedModel.train_step; time it with your own loop "
            "(stratagem.trial times data- and tensor-parallel strategies)"
        )
    return int(batch)  # type: ignore[arg-type]


def _check_recording(client: Client | None, graph: ModelGraph | None, resources: ResourceSpec | None) -> None:
    if client is not None and (graph is None or resources is None):
        missing = "graph" if graph is None else "resources"
        raise InvalidDocumentError(
            [Problem(missing, "is needed to record the trial: the service files it under the graph and cluster")],
            document="trial",
        )


def _step(
    model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Any, loss_of: LossFn, device: torch.device
) -> float:
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    output = model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)
    loss_of(output).backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def default_loss(output: Any) -> torch.Tensor:
    """The output when it is the loss (a scalar, or a `loss` entry); else the sum of its first tensor."""
    if isinstance(output, torch.Tensor):
        return output if output.numel() == 1 else output.sum()
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        loss = output.get("loss") if hasattr(output, "get") else None
        if isinstance(loss, torch.Tensor):
            return loss
        values = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        raise InvalidDocumentError([Problem("loss_fn", f"the model returned {type(output).__name__}; pass loss_fn")])
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return default_loss(value)
    raise InvalidDocumentError([Problem("loss_fn", "the model's output holds no floating tensor; pass loss_fn")])


def make_optimizer(kind: str, model: nn.Module, *, lr: float = 1e-3) -> torch.optim.Optimizer:
    """The torch optimizer for an optimizer kind of the graph IR (`lamb` has none in torch; AdamW stands in)."""
    params = [p for p in model.parameters() if p.requires_grad]
    makers: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "sgd": lambda: torch.optim.SGD(params, lr=lr),
        "momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
        "adagrad": lambda: torch.optim.Adagrad(params, lr=lr),
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=lr),
        "adam": lambda: torch.optim.Adam(params, lr=lr),
        "adamw": lambda: torch.optim.AdamW(params, lr=lr),
        "lamb": lambda: torch.optim.AdamW(params, lr=lr),
    }
    if kind not in makers:
        raise InvalidDocumentError([Problem("optimizer", f"unknown optimizer {kind!r} (known: {', '.join(makers)})")])
    return makers[kind]()


def peak_memory_bytes(device: torch.device) -> float:
    """Allocator peak on a GPU; the process's maximum resident set on a CPU (as trial_runner measures it)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(maxrss if sys.platform == "darwin" else maxrss * 1024)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return (batch.to(device),)
    if isinstance(batch, Mapping):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in batch)


def _slowest(values: list[float], device: torch.device) -> list[float]:
    """Each entry's maximum over the ranks."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.cpu()]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _record(
    report: TrialReport, client: Client, strategy: Strategy, graph: ModelGraph, resources: ResourceSpec
) -> TrialReport:
    graph_id = client.upload_graph(graph)
    resource_id = client.upload_resources(resources)
    row = client.record_trial(
        strategy,
        graph_id=graph_id,
        resource_id=resource_id,
        step_times_s=report.step_times_s,
        peak_memory_bytes=report.peak_memory_bytes,
        median_s=report.median_s,
        p90_s=report.p90_s,
        samples_per_s=report.samples_per_s,
        backend="sdk",
    )
    return TrialReport(**{**report.__dict__, "recorded": row})
