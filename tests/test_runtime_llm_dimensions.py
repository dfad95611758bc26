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
import torch.nn.functional as F
from runtime_helpers import relative_error, run_ranks
from torch import nn

STEPS, BATCH, SEQ, VOCAB = 5, 8, 8, 64
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


class CausalLM(nn.Module):
    """A Hugging Face causal LM trained as `loss = model(ids, labels)` (its ModelOutput's loss)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> Any:
        return self.model(input_ids=ids, labels=labels)


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
            bos_token_id=0,
            eos_token_id=1,
        )
        return CausalLM(LlamaForCausalLM(config))
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=VOCAB,
            n_positions=SEQ,
            n_embd=32,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=1,
        )
        return CausalLM(GPT2LMHeadModel(config))
    if kind.startswith("zoo-gpt"):
        from stratagem.zoo import build as zoo_build

        layers = 4 if kind == "zoo-gpt-4" else 2
        model, _ = zoo_build("gpt", "small", vocab=VOCAB, seq=SEQ, hidden=32, ffn=64, layers=layers)
        return model
    from test_hybrid_runtime import tiny_gpt

    return tiny_gpt()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))
        for _ in range(STEPS)
    ]


def loss_of(kind: str, output: Any, target: torch.Tensor) -> torch.Tensor:
    """The training loss from a model's output: Hugging Face's ModelOutput.loss, the zoo's own loss,
    or cross-entropy of the small GPT's logits."""
    if kind in ("llama", "gpt2"):
        return output.loss
    if kind.startswith("zoo-gpt"):
        return output
    return sequential_loss(output, target)


def sequential_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def inputs_of(kind: str, ids: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (ids,) if kind == "sequential" else (ids, target)


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def train_alone(kind: str) -> tuple[dict[str, torch.Tensor], list[float]]:
    model = build(kind)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for ids, target in batches():
        loss = loss_of(kind, model(*inputs_of(kind, ids, target)), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


# --- strategies ------------------------------------------------------------------------------------


def strategy(
    kind: str,
    *,
    data: int,
    tensor: int = 1,
    pipeline: dict[str, Any] | None = None,
    sync: Any = None,
    **fields: Any,
) -> dict[str, Any]:
    """A strategy over `data × pipeline × tensor` ranks, tensor innermost on one node; `sync(index, name)`
    gives each variable's synchronizer (all-reduce by default)."""
    model = build(kind)
    stages = pipeline["stages"] if pipeline else []
    chunks = len(stages) // pipeline.get("virtual_stages", 1) if pipeline else 1
    world = data * tensor * chunks
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    variables = [
        {"var_name": name, "synchronizer": (sync(i, name) if sync else None) or {"kind": "allreduce", "group": i // 4}}
        for i, name in enumerate(names)
    ]
    out: dict[str, Any] = {
        "replicas": [f"10.0.0.{r // tensor + 1}:CPU:{r % tensor}" for r in range(world)],
        "mesh": {"data": data, "tensor": tensor, "pipeline": chunks},
        "variables": variables,
        **fields,
    }
    if pipeline:
        out["pipeline"] = pipeline
    if tensor > 1:
        from test_hybrid_runtime import split_plan

        out["tensor_parallel"] = split_plan()
    return out


def stage3(group: int | None = None) -> Any:
    def sync(_: int, __: str) -> dict[str, Any]:
        return {"kind": "sharded", "stage": 3, "shard_group": group}

    return sync


def sequential_pipeline(schedule: str, micro_batches: int) -> dict[str, Any]:
    """The small GPT's four children as four chunks on two pipeline ranks."""
    return {
        "stages": [["0"], ["1"], ["2"], ["3"]],
        "micro_batches": micro_batches,
        "schedule": schedule,
        "virtual_stages": 2,
    }


def zoo_pipeline(schedule: str, micro_batches: int) -> dict[str, Any]:
    """The zoo GPT's four blocks as four chunks (cut at the beginning of blocks) on two pipeline ranks."""
    return {
        "stages": [["embed", "positions", "blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3", "final_norm", "head"]],
        "micro_batches": micro_batches,
        "schedule": schedule,
        "virtual_stages": 2,
    }


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
