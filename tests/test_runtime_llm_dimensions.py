"""The LLM dimensions of a strategy train like one process on real gloo ranks: recomputation (full and
the attention core), FSDP2 (ZeRO-3, alone, beside other synchronizers, hybrid and under tensor
parallelism), ZeRO-1 and hybrid ZeRO-1/2, sequence parallelism with tensor parallelism, interleaved
and zero-bubble pipeline schedules, and amp-bf16 / amp-fp16 / bf16 within a stated distance of fp32.

Test models: Hugging Face Llama and GPT-2 built from small configs, the zoo's GPT, and the small
nn.Sequential GPT of `test_hybrid_runtime` (for tensor splits and pipelines cut between children).
One spawn per world size runs every case in turn (starting processes dominates the cost). Each case
trains STEPS SGD-with-momentum steps on a generated global batch; every parameter (gathered from the
ranks that hold it) and every loss is compared with one process training on the whole batch in fp32.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from llm_cases import (
    batches,
    build,
    inputs_of,
    loss_of,
    make_optimizer,
    sequential_loss,
    sequential_pipeline,
    stage3,
    strategy,
    train_alone,
)
from runtime_helpers import relative_error, run_ranks

EXACT = 1e-5
"""Recomputation, FSDP2 and ZeRO: the same arithmetic as one process, reordered sums."""
SPLIT = 1e-4
"""Sequence parallelism, interleaved and zero-bubble schedules: sums split across ranks and micro-batches."""
HALF_PARAMETERS = 2e-2
HALF_LOSSES = 1e-2
"""amp-bf16, amp-fp16 and bf16 against fp32 after STEPS steps: parameters to 2e-2 relative (the largest
parameter's scale), losses to 1e-2 relative. bf16 keeps 8 bits of mantissa (3e-3 per rounding), so a
few steps of half-precision matmuls move a small transformer by a few 1e-3; a broken cast or scale
moves it by the learning rate's order."""


# --- models ----------------------------------------------------------------------------------------


# --- strategies ------------------------------------------------------------------------------------


def two_rank_cases() -> dict[str, dict[str, Any]]:
    def mixed(i: int, _: str) -> dict[str, Any]:
        # FSDP2 beside all-reduce, a parameter server and ZeRO-1
        return [
            {"kind": "sharded", "stage": 3},
            {"kind": "allreduce"},
            {"kind": "ps", "reduction_destination": "10.0.0.2:CPU:0"},
            {"kind": "sharded", "stage": 1, "group": 1},
        ][i % 4]

    return {
        "llama-recompute-full": {"model": "llama", "strategy": strategy("llama", data=2, recompute="full")},
        "llama-recompute-selective": {"model": "llama", "strategy": strategy("llama", data=2, recompute="selective")},
        "gpt2-recompute-selective": {"model": "gpt2", "strategy": strategy("gpt2", data=2, recompute="selective")},
        "gpt2-fsdp": {"model": "gpt2", "strategy": strategy("gpt2", data=2, sync=stage3())},
        "zoo-gpt-fsdp-mixed-recompute": {
            "model": "zoo-gpt",
            "strategy": strategy("zoo-gpt", data=2, sync=mixed, recompute="full"),
        },
        "llama-zero1": {
            "model": "llama",
            "strategy": strategy("llama", data=2, sync=lambda i, _: {"kind": "sharded", "stage": 1, "group": i % 2}),
        },
        "sequential-tp2-sequence-parallel": {
            "model": "sequential",
            "strategy": strategy("sequential", data=1, tensor=2, sequence_parallel=True),
        },
        "sequential-interleaved-1f1b": {
            "model": "sequential",
            "strategy": strategy("sequential", data=1, pipeline=sequential_pipeline("interleaved-1f1b", 4)),
        },
        "sequential-zero-bubble-v": {
            "model": "sequential",
            "strategy": strategy("sequential", data=1, pipeline=sequential_pipeline("zero-bubble", 4)),
        },
        "sequential-zero-bubble": {
            "model": "sequential",
            "strategy": strategy(
                "sequential",
                data=1,
                pipeline={"stages": [["0", "1"], ["2", "3"]], "micro_batches": 2, "schedule": "zero-bubble"},
            ),
        },
        "llama-amp-bf16": {"model": "llama", "strategy": strategy("llama", data=2, precision="amp-bf16")},
        "zoo-gpt-amp-fp16": {"model": "zoo-gpt", "strategy": strategy("zoo-gpt", data=2, precision="amp-fp16")},
        "gpt2-bf16": {"model": "gpt2", "strategy": strategy("gpt2", data=2, precision="bf16")},
        "gpt2-fsdp-amp-bf16": {
            "model": "gpt2",
            "strategy": strategy("gpt2", data=2, sync=stage3(), precision="amp-bf16"),
        },
        "zoo-gpt-fsdp-accumulated": {
            "model": "zoo-gpt",
            "strategy": strategy(
                "zoo-gpt",
                data=2,
                sync=stage3(),
                pipeline={"stages": [["embed", "blocks", "head"]], "micro_batches": 2, "schedule": "gpipe"},
            ),
        },
        "sequential-tp2-sequence-parallel-amp-bf16": {
            "model": "sequential",
            "strategy": strategy("sequential", data=1, tensor=2, sequence_parallel=True, precision="amp-bf16"),
        },
        "sequential-zero-bubble-v-amp-fp16": {
            "model": "sequential",
            "strategy": strategy(
                "sequential", data=1, pipeline=sequential_pipeline("zero-bubble", 4), precision="amp-fp16"
            ),
        },
    }


def four_rank_cases() -> dict[str, dict[str, Any]]:
    def hybrid_zero(i: int, _: str) -> dict[str, Any]:
        return {"kind": "sharded", "stage": 1 + i % 2, "group": i % 2, "shard_group": 2}

    return {
        "gpt2-fsdp-hybrid": {"model": "gpt2", "strategy": strategy("gpt2", data=4, sync=stage3(2))},
        "zoo-gpt-hybrid-zero12": {"model": "zoo-gpt", "strategy": strategy("zoo-gpt", data=4, sync=hybrid_zero)},
        "sequential-dp2-tp2-fsdp-sequence-parallel": {
            "model": "sequential",
            "strategy": strategy("sequential", data=2, tensor=2, sync=stage3(), sequence_parallel=True),
        },
        "sequential-dp2-pp2-interleaved-fsdp": {
            "model": "sequential",
            "strategy": strategy(
                "sequential", data=2, pipeline=sequential_pipeline("interleaved-1f1b", 2), sync=stage3()
            ),
        },
        "sequential-tp2-pp2-interleaved-sequence-parallel": {
            "model": "sequential",
            "strategy": strategy(
                "sequential",
                data=1,
                tensor=2,
                pipeline=sequential_pipeline("interleaved-1f1b", 2),
                sequence_parallel=True,
                recompute="selective",
            ),
        },
    }


# --- the ranks -------------------------------------------------------------------------------------


def worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from stratagem.ir import Strategy
    from stratagem.runtime import data_parallel_rank, distribute, local_batch

    out: dict[str, Any] = {}
    for label, case in payload["cases"].items():
        kind, plan = case["model"], Strategy.parse(case["strategy"])
        model = build(kind)
        runner, optimizer = distribute(model, make_optimizer(model.parameters()), plan, loss_fn=sequential_loss)
        index, size = data_parallel_rank(plan, rank)
        losses: list[float | None] = []
        for ids, target in batches():
            ids, target = (
                local_batch(ids, rank=index, world_size=size),
                local_batch(target, rank=index, world_size=size),
            )
            if hasattr(runner, "train_step"):
                loss = runner.train_step(*inputs_of(kind, ids, target), target=target)
            else:
                loss = loss_of(kind, runner(*inputs_of(kind, ids, target)), target)
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(None if loss is None else float(loss))
        module = getattr(runner, "stage", None) or getattr(runner, "module", None) or runner
        held = getattr(runner, "held", None)
        named = dict(model.named_parameters())
        names = sorted(held) if held is not None else [n for n, _ in module.named_parameters()]
        params = {}
        for name in names:
            param = named[name] if held is not None else module.get_parameter(name)
            params[name] = (param.full_tensor() if isinstance(param, DTensor) else param).detach().float().tolist()
        scaler = getattr(optimizer, "scaler", None)
        out[label] = {
            "params": params,
            "losses": losses,
            "data_index": index,
            "data_size": size,
            "fsdp": sum(isinstance(p, DTensor) for p in model.parameters()) if "fsdp" in label else None,
            "loss_scale": None if scaler is None else scaler.scale,
        }
    return out


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[dict[str, torch.Tensor], list[float]]]:
    return {kind: train_alone(kind) for kind in ("llama", "gpt2", "zoo-gpt", "sequential")}


Run = tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def two_ranks() -> Run:
    cases = two_rank_cases()
    return run_ranks("test_runtime_llm_dimensions:worker", 2, {"cases": cases}, timeout_s=600), cases


@pytest.fixture(scope="module")
def four_ranks() -> Run:
    cases = four_rank_cases()
    return run_ranks("test_runtime_llm_dimensions:worker", 4, {"cases": cases}, timeout_s=600), cases


def tolerances(strategy: dict[str, Any]) -> tuple[float, float]:
    if strategy.get("precision", "fp32") != "fp32":
        return HALF_PARAMETERS, HALF_LOSSES
    split = strategy["mesh"]["tensor"] > 1 or "pipeline" in strategy
    return (SPLIT, SPLIT) if split else (EXACT, EXACT)


def assert_trains_like_one_process(run: Run, label: str, references: dict[str, Any]) -> float:
    """Every parameter and the mean loss over data-parallel groups match one process; returns the largest
    parameter error seen."""
    results, cases = run
    case = cases[label]
    expected, expected_losses = references[case["model"]]
    parameters, losses = tolerances(case["strategy"])
    seen: set[str] = set()
    worst = 0.0
    for rank, result in enumerate(results):
        for name, values in result[label]["params"].items():
            seen.add(name)
            error = relative_error(torch.tensor(values), expected[name])
            worst = max(worst, error)
            assert error < parameters, f"{label}: rank {rank} {name} differs by {error:.2e} (relative)"
    assert seen == set(expected), f"{label}: no rank holds {sorted(set(expected) - seen)}"
    groups = {r[label]["data_index"]: r[label]["losses"] for r in results if r[label]["losses"][0] is not None}
    assert len(groups) == results[0][label]["data_size"], f"{label}: some data-parallel group reported no loss"
    mean = [sum(step) / len(groups) for step in zip(*groups.values(), strict=True)]
    assert mean == pytest.approx(expected_losses, rel=losses), label
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("label", list(two_rank_cases()))
def test_two_rank_dimensions_train_like_one_process(two_ranks: Run, references, label: str) -> None:
    assert_trains_like_one_process(two_ranks, label, references)
    result = two_ranks[0][0][label]
    if "fsdp" in label:
        assert result["fsdp"], f"{label}: FSDP2 sharded no parameter"
    if "amp-fp16" in label:
        assert result["loss_scale"] == 2.0**16, f"{label}: the loss scale moved without an overflow"


@pytest.mark.slow
@pytest.mark.parametrize("label", list(four_rank_cases()))
def test_four_rank_dimensions_train_like_one_process(four_ranks: Run, references, label: str) -> None:
    assert_trains_like_one_process(four_ranks, label, references)
