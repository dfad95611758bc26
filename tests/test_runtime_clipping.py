"""Clipping to a global gradient norm (`distribute(..., max_grad_norm=...)`) steps exactly as one process
that runs the whole batch, `torch.nn.utils.clip_grad_norm_`, then the same optimizer step.

On 2 gloo ranks, for every synchronizer kind (all-reduce dense and sparse, ZeRO-1 and ZeRO-2, parameter
servers dense and sparse, SSP with staleness 1, and a mix with replicated shards), each clipped to a
norm the gradients exceed (so clipping acts) and to a huge one (so it must not): after STEPS steps every
parameter is within 1e-5 of the reference and `last_grad_norm` is the reference's norm. On 4 ranks the
mesh layouts, whose gradients are spread over tensor shards, pipeline stages and shard groups: tensor 2
× data 2 with servers and ZeRO chunks of split and unsplit weights beside all-reduce, the same under
FSDP2, pipeline 2 × data 2, and hybrid ZeRO-1/2 (shard group 2 of data 4); on 2 ranks the zoo's GPT
cut into traced stages, whose embedding and head (one tied weight) both stages hold. In this process: bad values
and asynchronous servers are refused before any collective, a step the fp16 loss scaler skips is not
clipped, and a bf16 model (stepped through fp32 masters) is clipped once.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from runtime_helpers import (
    loss_of,
    make_batches,
    make_model,
    make_optimizer,
    make_strategy,
    max_relative_error,
    ps,
    relative_error,
    replicas,
    run_ranks,
    servers,
)

from stratagem.errors import InvalidDocumentError, UnsupportedStrategyError
from stratagem.ir import Strategy
from stratagem.runtime import distribute

STEPS, GLOBAL_BATCH = 2, 8
SMALL, HUGE = 0.1, 1e6
"""Norms the step clips to: a fraction of the small models' gradient norms (about 0.5 to 0.9), and far above them."""
EXACT = 1e-5
SPLIT = 1e-4
"""Tensor splits and pipeline micro-batches: sums split across ranks (as `test_hybrid_runtime`)."""


# --- data parallelism on 2 ranks ---------------------------------------------------------------------


def uniform(model: torch.nn.Module, world_size: int, sync: Any, **extra: Any) -> Strategy:
    """Every variable on the synchronizer `sync(index)` gives."""
    variables = [{"var_name": n, "synchronizer": sync(i)} for i, (n, _) in enumerate(model.named_parameters())]
    return Strategy.parse({"replicas": replicas(world_size), "variables": variables, **extra})


def data_parallel_cases(world_size: int) -> dict[str, dict[str, Any]]:
    cnn, rec = make_model("cnn"), make_model("rec")
    srv = servers(world_size)
    stale = {"consistency": {"kind": "ssp", "staleness": 1}}
    strategies = {
        "allreduce": ("cnn", "sgd", make_strategy("allreduce_groups", cnn, world_size)),
        "allreduce-sparse": ("rec", "sgd", uniform(rec, world_size, lambda i: {"kind": "allreduce"})),
        "zero1": ("cnn", "sgd", uniform(cnn, world_size, lambda i: {"kind": "sharded", "stage": 1, "group": i % 2})),
        "zero2": ("cnn", "sgd", make_strategy("sharded", cnn, world_size)),
        "ps": ("cnn", "sgd", make_strategy("ps_balanced", cnn, world_size)),
        "ps-sparse": ("rec", "sgd", make_strategy("ps_partitioned", rec, world_size)),
        "ps-ssp": ("cnn", "sgd", uniform(cnn, world_size, lambda i: ps(srv[i % 2], staleness=1), **stale)),
        "mixed": ("cnn", "sgd", make_strategy("mixed", cnn, world_size)),
    }
    return {
        f"{label}@{norm:g}": {"kind": kind, "opt": opt, "max_norm": norm, "strategy": s.model_dump(mode="json")}
        for label, (kind, opt, s) in strategies.items()
        for norm in (SMALL, HUGE)
    }


def clipped_reference(kind: str, opt: str, max_norm: float, *, stale: bool = False) -> tuple[torch.nn.Module, list]:
    """One process on the whole batch: backward, `clip_grad_norm_`, step. Dense gradients (torch's clipping
    takes no sparse ones; the sparse runs' arithmetic is the same). `stale`: SSP with staleness 1, whose
    every gradient is taken at values one update old: both steps' gradients at the initial values, and the
    values after the second step are those after the first update."""
    model = make_model(kind, sparse=False)
    initial = copy.deepcopy(model)
    optimizer = make_optimizer(opt, model.parameters())
    norms = []
    for step, batch in enumerate(make_batches(kind, steps=STEPS, batch=GLOBAL_BATCH)):
        at = initial if stale and step > 0 else model
        loss_of(at, batch).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(at.parameters(), max_norm)))
        if at is model:
            optimizer.step()
        optimizer.zero_grad()
        at.zero_grad()
    return model, norms


def data_parallel_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from stratagem.runtime import local_batch

    out = {}
    for label, case in payload["cases"].items():
        kind, opt, max_norm = case["kind"], case["opt"], case["max_norm"]
        model = make_model(kind, sparse=True)
        model, optimizer = distribute(
            model, make_optimizer(opt, model.parameters()), Strategy.parse(case["strategy"]), max_grad_norm=max_norm
        )
        norms = []
        for batch in make_batches(kind, steps=STEPS, batch=GLOBAL_BATCH):
            loss_of(model, tuple(local_batch(t, rank=rank, world_size=world_size) for t in batch)).backward()
            optimizer.step()
            optimizer.zero_grad()
            norms.append(optimizer.last_grad_norm)
        reference, expected = clipped_reference(kind, opt, max_norm, stale=label.startswith("ps-ssp"))
        stats = optimizer.sync_stats
        out[label] = {
            "error": max_relative_error(model, reference),
            "norms": norms,
            "expected": expected,
            "clip_wait": stats is not None and "clip" in stats.wait_s,
        }
    return out


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks("test_runtime_clipping:data_parallel_worker", 2, {"cases": data_parallel_cases(2)})


@pytest.mark.slow
@pytest.mark.parametrize("label", list(data_parallel_cases(2)))
def test_every_synchronizer_clips_to_the_global_norm_of_one_process(two_ranks, label: str) -> None:
    for rank, results in enumerate(two_ranks):
        result = results[label]
        assert all(norm > 3 * SMALL for norm in result["expected"]), "the gradients should exceed the small norm"
        assert result["error"] < EXACT, f"rank {rank}: parameters differ by {result['error']:.2e} (relative)"
        assert result["norms"] == pytest.approx(result["expected"], rel=EXACT), f"rank {rank}"
        assert result["clip_wait"], "the norm's all-reduce is timed as its own wait"


# --- mesh layouts on 4 ranks -------------------------------------------------------------------------


def mesh_cases() -> dict[str, dict[str, Any]]:
    from llm_cases import stage3, strategy

    server = {"kind": "ps", "reduction_destination": "10.0.0.1:CPU:0"}
    beside_splits = {
        "0.pos.weight": server,  # unsplit: each tensor rank's data group serves its own copy
        "3.ln.bias": {"kind": "ps", "reduction_destination": "10.0.0.2:CPU:0"},
        "1.fc.weight": {"kind": "sharded", "stage": 2},  # split by the tensor group
        "2.fc.weight": {"kind": "sharded", "stage": 1, "group": 1},
        "1.ln1.weight": {"kind": "sharded", "stage": 2, "group": 2},  # unsplit ZeRO chunks
    }
    in_stages = {"0.pos.weight": server, "2.proj.weight": {"kind": "sharded", "stage": 1}}

    def hybrid_zero(i: int, _: str) -> dict[str, Any]:
        return {"kind": "sharded", "stage": 1 + i % 2, "group": i % 2, "shard_group": 2}

    stages = {"stages": [["0", "1"], ["2", "3"]], "micro_batches": 2, "schedule": "1f1b"}
    return {
        "dp2-tp2-servers-and-zero": strategy("sequential", data=2, tensor=2, sync=lambda _, n: beside_splits.get(n)),
        "dp2-tp2-fsdp": strategy("sequential", data=2, tensor=2, sync=stage3()),
        "dp2-pp2": strategy("sequential", data=2, pipeline=stages, sync=lambda _, n: in_stages.get(n)),
        "dp4-hybrid-zero12": strategy("sequential", data=4, sync=hybrid_zero),
    }


def mesh_reference(max_norm: float) -> tuple[dict[str, torch.Tensor], list[float]]:
    from llm_cases import batches, build, make_optimizer, sequential_loss

    model = build("sequential")
    optimizer = make_optimizer(model.parameters())
    norms = []
    for ids, target in batches()[:STEPS]:
        sequential_loss(model(ids), target).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach() for n, p in model.named_parameters()}, norms


def mesh_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from llm_cases import batches, build, make_optimizer, sequential_loss
    from torch.distributed.tensor import DTensor

    from stratagem.runtime import data_parallel_rank, local_batch

    out: dict[str, Any] = {}
    for label, raw in payload["cases"].items():
        plan = Strategy.parse(raw)
        model = build("sequential")
        runner, optimizer = distribute(
            model, make_optimizer(model.parameters()), plan, loss_fn=sequential_loss, max_grad_norm=SMALL
        )
        index, size = data_parallel_rank(plan, rank)
        norms = []
        for ids, target in batches()[:STEPS]:
            ids, target = (
                local_batch(ids, rank=index, world_size=size),
                local_batch(target, rank=index, world_size=size),
            )
            if hasattr(runner, "train_step"):
                runner.train_step(ids, target=target)
            else:
                sequential_loss(runner(ids), target).backward()
            optimizer.step()
            optimizer.zero_grad()
            norms.append(optimizer.last_grad_norm)
        module = getattr(runner, "stage", runner)
        out[label] = {
            "params": {
                n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().tolist()
                for n, p in module.named_parameters()
            },
            "norms": norms,
        }
    return out


@pytest.fixture(scope="module")
def four_ranks() -> list[dict[str, Any]]:
    return run_ranks("test_runtime_clipping:mesh_worker", 4, {"cases": mesh_cases()}, timeout_s=300)


@pytest.mark.slow
@pytest.mark.parametrize("label", list(mesh_cases()))
def test_mesh_layouts_clip_to_the_whole_models_norm(four_ranks, label: str) -> None:
    expected, norms = mesh_reference(SMALL)
    assert all(norm > 3 * SMALL for norm in norms), "the gradients should exceed the small norm"
    seen: set[str] = set()
    for rank, results in enumerate(four_ranks):
        result = results[label]
        assert result["norms"] == pytest.approx(norms, rel=SPLIT), f"rank {rank}"
        for name, values in result["params"].items():
            seen.add(name)
            error = relative_error(torch.tensor(values), expected[name])
            assert error < SPLIT, f"rank {rank} {name} differs by {error:.2e} (relative)"
    assert seen == set(expected)


# --- a weight tied across pipeline stages, on 2 ranks ---------------------------------------------------


def tied_layout() -> dict[str, Any]:
    """The zoo's GPT (embedding tied to the head) cut into two traced stages at its second block."""
    from zoo_training import cpu_node, graph_of

    graph = graph_of("gpt")
    names = [layer.name for layer in graph.layers]
    first = next(i for i, name in enumerate(names) if name.startswith("blocks.1."))
    layout = {
        "replicas": [f"127.0.0.1:CPU:{r}" for r in range(2)],
        "mesh": {"data": 1, "tensor": 1, "pipeline": 2},
        "pipeline": {"stages": [names[:first], names[first:]], "micro_batches": 2, "schedule": "gpipe"},
        "variables": [{"var_name": v.name, "synchronizer": {"kind": "allreduce"}} for v in graph.trainable_variables],
    }
    return Strategy.parse(layout).validate_for(graph, cpu_node(2)).model_dump(mode="json")


def tied_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from zoo_training import batch_of, build, make_optimizer

    model, make_batch = build("gpt")
    runner, optimizer = distribute(
        model, make_optimizer(model), Strategy.parse(payload["layout"]), rank=rank, max_grad_norm=SMALL
    )
    norms = []
    for step in range(STEPS):
        runner(*batch_of(make_batch, step, 0)).backward()
        optimizer.step()
        optimizer.zero_grad()
        norms.append(optimizer.last_grad_norm)
    return {"norms": norms, "params": {n: model.get_parameter(n).tolist() for n in sorted(runner.held)}}


@pytest.mark.slow
def test_a_weight_tied_across_pipeline_stages_counts_once() -> None:
    from zoo_training import batch_of, build, make_optimizer

    model, make_batch = build("gpt")
    optimizer = make_optimizer(model)
    norms = []
    for step in range(STEPS):
        chunks = zip(*(t.chunk(2) for t in batch_of(make_batch, step, 0)), strict=True)
        torch.stack([model(*chunk) for chunk in chunks]).mean().backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), SMALL)))
        optimizer.step()
        optimizer.zero_grad()
    results = run_ranks("test_runtime_clipping:tied_worker", 2, {"layout": tied_layout()})
    for rank, result in enumerate(results):
        assert result["norms"] == pytest.approx(norms, rel=SPLIT), f"rank {rank}"
        for name, values in result["params"].items():
            error = relative_error(torch.tensor(values), model.get_parameter(name).detach())
            assert error < SPLIT, f"rank {rank} {name} differs by {error:.2e} (relative)"


# --- in this process ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf, "1.0", True])
def test_a_bad_max_grad_norm_is_refused_naming_it(value: Any) -> None:
    model = make_model("cnn")
    strategy = make_strategy("allreduce_groups", model, 1)
    with pytest.raises(InvalidDocumentError, match=r"max_grad_norm: must be a positive finite norm"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy, max_grad_norm=value)


def test_clipping_an_asynchronous_parameter_server_is_refused_with_the_reason(one_rank) -> None:
    model = make_model("cnn")
    asp = uniform(model, 1, lambda i: ps(servers(1)[0], sync=False), consistency={"kind": "asp"})
    with pytest.raises(UnsupportedStrategyError, match=r"asynchronous parameter server \(conv1.weight\).*own update"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), asp, max_grad_norm=1.0)
    _, optimizer = distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), asp)
    assert optimizer.max_grad_norm is None and optimizer.last_grad_norm is None


def cnn_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: tuple) -> None:
    images, y = batch
    F.cross_entropy(model(images), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_step_the_fp16_loss_scaler_skips_is_not_clipped(one_rank) -> None:
    batches = make_batches("cnn", steps=2, batch=8)
    model = make_model("cnn")
    strategy = make_strategy("mixed", model, 1, precision="amp-fp16")
    model, optimizer = distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy, max_grad_norm=SMALL)
    assert optimizer.scaler is not None and optimizer.max_grad_norm == SMALL
    cnn_step(model, optimizer, batches[0])
    assert optimizer.last_grad_norm is not None and optimizer.last_grad_norm > 3 * SMALL
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.scaler.scale = 1e38  # the scaled gradients overflow fp16
    cnn_step(model, optimizer, batches[1])
    assert optimizer.scaler.skipped == 1 and optimizer.last_grad_norm is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_bf16_model_stepped_through_fp32_masters_moves_by_the_clipped_norm(one_rank) -> None:
    """Plain SGD at learning rate 1 moves the parameters by the clipped gradient itself, whose norm is
    max_grad_norm: a gradient scaled twice would move them a fifth as far, one never scaled five times."""
    model = make_model("cnn")
    strategy = uniform(model, 1, lambda i: {"kind": "allreduce"}, precision="bf16")
    model, optimizer = distribute(model, torch.optim.SGD(model.parameters(), lr=1.0), strategy, max_grad_norm=SMALL)
    before = [p.detach().float().clone() for p in model.parameters()]
    cnn_step(model, optimizer, make_batches("cnn", steps=1, batch=8)[0])
    moved = torch.cat([(p.detach().float() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert optimizer.last_grad_norm is not None and optimizer.last_grad_norm > 3 * SMALL
    assert float(moved.norm()) == pytest.approx(SMALL, rel=0.1)  # bf16 rounding of the parameters: about 3%
