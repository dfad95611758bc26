"""A replay of an operator trace runs what the model runs: its ops in order, its backward, its hooks, its activations."""

from __future__ import annotations

import json

import pytest
import torch
from sample_documents import make_cpu_cluster
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from stratagem import zoo
from stratagem.builders import DataParallel
from stratagem.ir import ModelGraph
from stratagem.tracing import capture
from stratagem.tracing.optrace import OperatorTrace
from trial_runner import LocalBackend, Outcome, ReplayWorkload, run_trial
from trial_runner.build import build_workload, make_optimizer, output_loss
from trial_runner.replay import ReplayModel, replay_batch_maker, replay_loss
from trial_runner.replay_inputs import input_bounds
from trial_runner.replay_trace import replay_notes
from trial_runner.spec import TrialSpec
from trial_runner.workloads import workload_for_graph

ZOO_BATCH = {"resnet50": 4, "vgg16": 4, "bert_large": 4, "gpt": 4, "dlrm": 16}


def _zoo(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], ModelGraph]:
    torch.manual_seed(0)
    model, make_batch = zoo.build(name, "small")
    batch = make_batch(ZOO_BATCH[name])
    optimizer = "adagrad" if name == "dlrm" else "adam"
    return model, batch, capture(model, batch, batch_size=ZOO_BATCH[name], optimizer=optimizer)


class OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...] | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace not in ("prim", "profiler"):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
            self.ops.append((f"{func.namespace}::{func._opname}.{func._overloadname}", shape))
        return out


def _shape(trace: OperatorTrace, out) -> tuple[int, ...] | None:
    return tuple(trace.tensors[out["t"]].shape) if isinstance(out, dict) and "t" in out else None


@pytest.mark.parametrize("name", sorted(ZOO_BATCH))
def test_the_replay_has_the_graph_variables_and_the_model_buffers(name: str) -> None:
    model, _, graph = _zoo(name)
    replay = ReplayModel(graph)
    assert replay.replays_trace
    assert {n: list(p.shape) for n, p in replay.named_parameters()} == {v.name: v.shape for v in graph.variables}
    assert {n: list(b.shape) for n, b in replay.named_buffers()} == {n: list(b.shape) for n, b in model.named_buffers()}


@pytest.mark.parametrize("name", sorted(ZOO_BATCH))
def test_the_replay_runs_the_recorded_ops_in_order_forward_and_backward(name: str) -> None:
    _, _, graph = _zoo(name)
    trace = graph.trace
    replay = ReplayModel(graph)
    batch = replay_batch_maker(graph)(graph.batch_size)
    replay_loss(replay(*batch)).backward()  # the first call also makes the trace's constants
    replay.zero_grad(set_to_none=True)
    with OpLog() as forward:
        loss = replay_loss(replay(*batch))
    with OpLog() as backward:
        loss.backward()
    # `detach` (an alias, no work) is where running under a Python mode differs from running without one:
    # autograd detaches saved outputs and stolen gradients on the dispatcher only when a mode watches.
    # A sparse gradient's entries are as many as the rows looked up, which fake tensors record as 0.
    for ran, recorded in ((forward.ops, trace.forward), (backward.ops, trace.backward)):
        expected = [(op.op, _shape(trace, op.out)) for op in recorded if op.op != "aten::detach.default"]
        got = [op for op in ran if op[0] != "aten::detach.default"]
        assert [name for name, _ in got] == [name for name, _ in expected]
        assert [shape for (_, shape), (_, want) in zip(got, expected, strict=True) if not want or 0 not in want] == [
            want for _, want in expected if not want or 0 not in want
        ]
    assert not replay.notes


@pytest.mark.parametrize("name", ["resnet50", "gpt", "dlrm"])
def test_gradients_become_ready_in_the_order_the_real_model_makes_them(name: str) -> None:
    model, batch, graph = _zoo(name)
    replay = ReplayModel(graph)

    def ready_order(module: nn.Module, loss) -> list[str]:
        order: list[str] = []
        handles = [
            p.register_post_accumulate_grad_hook(lambda _p, n=n: order.append(n))
            for n, p in module.named_parameters()
            if p.requires_grad
        ]
        loss().backward()
        for handle in handles:
            handle.remove()
        return order

    real = ready_order(model, lambda: output_loss(model(*batch)))
    replayed = ready_order(replay, lambda: replay_loss(replay(*replay_batch_maker(graph)(graph.batch_size))))
    assert replayed == real


@pytest.mark.parametrize("name", ["resnet50", "bert_large", "dlrm"])
def test_the_replay_holds_the_activations_the_real_step_holds(name: str) -> None:
    model, batch, graph = _zoo(name)
    replay = ReplayModel(graph)

    def saved_bytes(step) -> int:
        storages: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if not isinstance(tensor, nn.Parameter):
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
        return sum(storages.values())

    real = saved_bytes(lambda: output_loss(model(*batch)))
    replayed = saved_bytes(lambda: replay(*replay_batch_maker(graph)(graph.batch_size)))
    assert replayed == real


def test_integer_inputs_stay_inside_what_they_index() -> None:
    _, _, graph = _zoo("dlrm")
    trace = graph.trace
    _, indices, offsets, labels = replay_batch_maker(graph)(graph.batch_size)
    assert indices.dtype == torch.int64 and int(indices.min()) >= 0 and int(indices.max()) < 200  # smallest table
    assert torch.equal(offsets, torch.arange(0, 2 * graph.batch_size, 2))  # evenly spaced bags of the pooling
    assert labels.is_floating_point()
    bounds = input_bounds(trace)
    assert bounds[trace.inputs[1]].high == 200 and bounds[trace.inputs[2]].offsets_of == 2 * graph.batch_size
    _, _, gpt = _zoo("gpt")
    tokens, labels = replay_batch_maker(gpt)(gpt.batch_size)
    assert int(tokens.max()) < 1000 and int(labels.max()) < 1000 and int(tokens.max()) > 1


def test_an_op_this_process_cannot_run_is_burnt_and_named_while_the_rest_replays() -> None:
    _, _, graph = _zoo("gpt")
    data = json.loads(graph.trace.model_dump_json(exclude={"id"}))
    gelu = next(i for i, op in enumerate(data["forward"]) if op["op"] == "aten::gelu.default")
    data["forward"][gelu]["op"] = "mylib::fused_gelu.default"
    trace = OperatorTrace.parse(data)
    edited = graph.replace(trace_id=trace.id).attach_trace(trace)
    replay = ReplayModel(edited)
    loss = replay_loss(replay(*replay_batch_maker(edited)(edited.batch_size)))
    loss.backward()
    assert torch.isfinite(loss)
    assert list(replay.notes) == ["mylib::fused_gelu.default"]
    assert "not loaded" in replay.notes["mylib::fused_gelu.default"]
    assert replay_notes(trace) == [f"mylib::fused_gelu.default ({replay.notes['mylib::fused_gelu.default']})"]
    assert all(p.grad is not None for p in replay.parameters())


def test_a_replay_workload_carries_its_trace_to_the_worker_as_json() -> None:
    _, _, graph = _zoo("dlrm")
    graph = graph.replace(provenance={}).attach_trace(graph.trace)  # not a zoo model: the service replays it
    workload = workload_for_graph(graph)
    assert isinstance(workload, ReplayWorkload) and workload.trace is not None
    resources = make_cpu_cluster(2)
    spec = TrialSpec(workload=workload, resources=resources, strategy=DataParallel().build(graph, resources))
    parsed = TrialSpec.parse(spec.to_json())
    built = build_workload(parsed.workload, seed=0, rank=0)
    assert isinstance(built.model, ReplayModel) and built.model.replays_trace
    stale = OperatorTrace.parse(json.loads(graph.trace.model_dump_json(exclude={"id"})) | {"graph_name": "other"})
    with pytest.raises(ValueError, match=r"graph\.trace_id"):
        ReplayWorkload(graph, trace=stale)


def test_a_graph_naming_a_trace_nobody_has_replays_its_layer_totals() -> None:
    _, _, graph = _zoo("gpt")
    detached = ModelGraph.parse(graph.to_json())
    assert detached.trace_id == graph.trace_id and detached.trace is None
    replay = ReplayModel(detached)
    assert not replay.replays_trace
    replay_loss(replay(*replay_batch_maker(detached)(detached.batch_size))).backward()


def test_a_replay_trains_with_the_trial_optimizers() -> None:
    _, _, graph = _zoo("dlrm")
    replay = ReplayModel(graph)
    optimizer = make_optimizer("adagrad", replay)
    before = {n: p.detach().clone() for n, p in replay.named_parameters()}
    for _ in range(2):
        optimizer.zero_grad()
        replay_loss(replay(*replay_batch_maker(graph)(graph.batch_size))).backward()
        optimizer.step()
    assert all(not torch.equal(before[n], p) for n, p in replay.named_parameters())


@pytest.mark.slow
def test_a_trace_replay_trial_runs_on_two_ranks() -> None:
    _, _, graph = _zoo("resnet50")
    graph = graph.replace(provenance={}).attach_trace(graph.trace)
    resources = make_cpu_cluster(2)
    result = run_trial(
        ReplayWorkload(graph),
        resources,
        DataParallel().build(graph, resources),
        warmup=1,
        steps=3,
        timeout=180,
        backend=LocalBackend(),
    )
    assert result.outcome == Outcome.ok, result.error
    assert len(result.step_times_s) == 3 and result.median_s > 0
