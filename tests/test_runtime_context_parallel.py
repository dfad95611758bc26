"""Context parallelism (`mesh.context`) trains like one process on real gloo ranks: Hugging Face Llama
(rotary positions, grouped-query attention) and GPT-2 (learned positions), the zoo's GPT and its BERT
(no causal mask), alone and beside data, tensor (with and without sequence parallelism), FSDP2 (whole
and hybrid), ZeRO-1/2 over hybrid shard groups, recomputation and amp-bf16 (within bf16's distance of fp32).

Each rank is fed its data-parallel slice of the global batch (`local_batch`) and its positions of each
sequence (`context_shard`), and its loss is the mean over its own tokens of cross-entropy against
position-aligned targets (Hugging Face's `labels=` would shift inside a chunk). One process trains the
same models on the whole batch with the same loss; every parameter and the mean of the ranks' losses
must match it to 1e-5 (relative) after STEPS SGD-with-momentum steps. One spawn per world size runs
every case in turn.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from llm_cases import BATCH, SEQ, STEPS, VOCAB, build, make_optimizer, stage3
from runtime_helpers import relative_error, run_ranks
from torch import nn

TOLERANCE = 1e-5
"""Attention over gathered keys under an explicit mask, gradients summed across ranks: the same sums
as one process in another order (measured: 3e-7 at most, parameters and losses)."""


HALF = (2e-2, 1e-2)
"""amp-bf16 against the fp32 process: parameters and losses, the bounds of `test_runtime_llm_dimensions`
(bf16 keeps 8 bits of mantissa; a broken cast or gather moves a parameter by the learning rate's order)."""


class Logits(nn.Module):
    """A Hugging Face causal LM returning its logits (named like `llm_cases.CausalLM`, parameters and all)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def build_model(kind: str) -> nn.Module:
    if kind in ("llama", "gpt2"):
        return Logits(build(kind).model)
    if kind == "zoo-bert":
        from stratagem.zoo import build as zoo_build

        torch.manual_seed(0)
        model, _ = zoo_build("bert_large", "small", vocab=VOCAB, seq=SEQ, hidden=32, ffn=64, layers=2, dropout=0.0)
        return model
    return build(kind)


def batches(kind: str) -> list[tuple[torch.Tensor, ...]]:
    """(ids, targets), or (ids, token types, targets) for BERT, every step's global batch."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        target = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        types = torch.randint(0, 2, (BATCH, SEQ), generator=g)
        out.append((ids, types, target) if kind == "zoo-bert" else (ids, target))
    return out


def loss_of(kind: str, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Mean cross-entropy over the batch's tokens, each against the target at its own position."""
    if kind.startswith("zoo"):
        return model(*batch)  # the zoo's own loss: no shift
    ids, target = batch
    return F.cross_entropy(model(ids).flatten(0, 1), target.flatten())


def train_alone(kind: str) -> tuple[dict[str, torch.Tensor], list[float]]:
    model = build_model(kind)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for batch in batches(kind):
        loss = loss_of(kind, model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


def zoo_split_plan(layers: int = 2, heads: int = 4) -> list[dict[str, Any]]:
    """Megatron's split of the zoo GPT's blocks (its embedding stays whole: it is tied to the head)."""
    plan: list[dict[str, Any]] = []
    for i in range(layers):
        plan += [
            {"name": f"blocks.{i}.attn", "style": "heads", "heads": heads},
            {"name": f"blocks.{i}.mlp.fc", "style": "colwise"},
            {"name": f"blocks.{i}.mlp.proj", "style": "rowwise"},
        ]
    return plan


def strategy(kind: str, *, data: int, context: int, tensor: int = 1, sync: Any = None, **fields: Any) -> dict:
    """A strategy over data × context × tensor ranks (tensor innermost, one node per tensor group)."""
    names = [n for n, p in build_model(kind).named_parameters() if p.requires_grad]
    world = data * context * tensor
    out: dict[str, Any] = {
        "replicas": [f"10.0.0.{r // tensor + 1}:CPU:{r % tensor}" for r in range(world)],
        "mesh": {"data": data, "context": context, "tensor": tensor},
        "variables": [
            {
                "var_name": name,
                "synchronizer": (sync(i, name) if sync else None) or {"kind": "allreduce", "group": i // 4},
            }
            for i, name in enumerate(names)
        ],
        **fields,
    }
    if tensor > 1:
        out["tensor_parallel"] = zoo_split_plan()
    return out


def two_rank_cases() -> dict[str, dict[str, Any]]:
    return {
        "llama-context2": {"model": "llama", "strategy": strategy("llama", data=1, context=2)},
        "gpt2-context2": {"model": "gpt2", "strategy": strategy("gpt2", data=1, context=2)},
        "zoo-gpt-context2": {"model": "zoo-gpt", "strategy": strategy("zoo-gpt", data=1, context=2)},
        "zoo-bert-context2": {"model": "zoo-bert", "strategy": strategy("zoo-bert", data=1, context=2)},
        "llama-context2-recompute": {
            "model": "llama",
            "strategy": strategy("llama", data=1, context=2, recompute="full"),
        },
        "gpt2-context2-fsdp": {"model": "gpt2", "strategy": strategy("gpt2", data=1, context=2, sync=stage3())},
        "llama-context2-amp-bf16": {
            "model": "llama",
            "strategy": strategy("llama", data=1, context=2, precision="amp-bf16"),
            "tolerance": HALF,
        },
    }


def four_rank_cases() -> dict[str, dict[str, Any]]:
    def hybrid_zero(i: int, _: str) -> dict[str, Any]:
        return {"kind": "sharded", "stage": 1 + i % 2, "group": i % 2, "shard_group": 1}

    return {
        "llama-data2-context2": {"model": "llama", "strategy": strategy("llama", data=2, context=2)},
        "gpt2-data2-context2": {"model": "gpt2", "strategy": strategy("gpt2", data=2, context=2)},
        "zoo-gpt-data2-context2": {"model": "zoo-gpt", "strategy": strategy("zoo-gpt", data=2, context=2)},
        "zoo-gpt-context2-tensor2": {"model": "zoo-gpt", "strategy": strategy("zoo-gpt", data=1, context=2, tensor=2)},
        "zoo-gpt-context2-tensor2-sequence-parallel": {
            "model": "zoo-gpt",
            "strategy": strategy("zoo-gpt", data=1, context=2, tensor=2, sequence_parallel=True),
        },
        "llama-data2-context2-fsdp": {
            "model": "llama",
            "strategy": strategy("llama", data=2, context=2, sync=stage3()),
        },
        "gpt2-data2-context2-fsdp-hybrid": {
            "model": "gpt2",
            "strategy": strategy("gpt2", data=2, context=2, sync=stage3(1)),
        },
        "zoo-gpt-data2-context2-hybrid-zero12": {
            "model": "zoo-gpt",
            "strategy": strategy("zoo-gpt", data=2, context=2, sync=hybrid_zero),
        },
    }


def worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from stratagem.ir import Strategy
    from stratagem.runtime import context_parallel_rank, context_shard, data_parallel_rank, distribute, local_batch
    from stratagem.runtime.tensor_parallel import gathered_parameters

    out: dict[str, Any] = {}
    for label, case in payload["cases"].items():
        kind, plan = case["model"], Strategy.parse(case["strategy"])
        model = build_model(kind)
        runner, optimizer = distribute(model, make_optimizer(model.parameters()), plan)
        index, size = data_parallel_rank(plan, rank)
        losses = []
        tokens = 0
        for batch in batches(kind):
            mine = context_shard(plan, rank, *(local_batch(t, rank=index, world_size=size) for t in batch))
            tokens = mine[0].numel()
            loss = loss_of(kind, runner, mine)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss))
        named = dict(model.named_parameters())  # gathered_parameters also names a tied weight's second holder
        params = {
            name: value.float().tolist() for name, value in sorted(gathered_parameters(model).items()) if name in named
        }
        out[label] = {
            "params": params,
            "losses": losses,
            "context": context_parallel_rank(plan, rank),
            "tokens": tokens,
            "sharded": sum(isinstance(p, DTensor) for p in model.parameters()),
        }
    return out


Run = tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[dict[str, torch.Tensor], list[float]]]:
    return {kind: train_alone(kind) for kind in ("llama", "gpt2", "zoo-gpt", "zoo-bert")}


@pytest.fixture(scope="module")
def two_ranks() -> Run:
    cases = two_rank_cases()
    return run_ranks("test_runtime_context_parallel:worker", 2, {"cases": cases}, timeout_s=600), cases


@pytest.fixture(scope="module")
def four_ranks() -> Run:
    cases = four_rank_cases()
    return run_ranks("test_runtime_context_parallel:worker", 4, {"cases": cases}, timeout_s=600), cases


def assert_trains_like_one_process(run: Run, label: str, references: dict[str, Any]) -> None:
    results, cases = run
    case = cases[label]
    expected, expected_losses = references[case["model"]]
    parameters, losses = case.get("tolerance", (TOLERANCE, TOLERANCE))
    mesh = case["strategy"]["mesh"]
    for rank, result in enumerate(results):
        got = result[label]
        assert got["context"] == [(rank // mesh.get("tensor", 1)) % mesh["context"], mesh["context"]], label
        assert got["tokens"] == BATCH * SEQ // (mesh["data"] * mesh["context"]), (
            f"{label}: rank {rank} was fed the wrong piece"
        )
        assert set(got["params"]) == set(expected), label
        for name, values in got["params"].items():
            error = relative_error(torch.tensor(values), expected[name])
            assert error < parameters, f"{label}: rank {rank} {name} differs by {error:.2e} (relative)"
    # Every rank's loss is the mean over its own tokens; equal counts make their mean the global mean.
    mean = [sum(step) / len(results) for step in zip(*(r[label]["losses"] for r in results), strict=True)]
    assert mean == pytest.approx(expected_losses, rel=losses), label
    first, second = results[0][label]["losses"], results[mesh.get("tensor", 1)][label]["losses"]
    assert first != second, f"{label}: the two context ranks saw the same tokens"


@pytest.mark.slow
@pytest.mark.parametrize("label", list(two_rank_cases()))
def test_two_rank_context_parallelism_trains_like_one_process(two_ranks: Run, references, label: str) -> None:
    assert_trains_like_one_process(two_ranks, label, references)
    if "fsdp" in label:
        assert two_ranks[0][0][label]["sharded"], f"{label}: FSDP2 sharded no parameter"


@pytest.mark.slow
@pytest.mark.parametrize("label", list(four_rank_cases()))
def test_four_rank_context_parallelism_trains_like_one_process(four_ranks: Run, references, label: str) -> None:
    assert_trains_like_one_process(four_ranks, label, references)
    if "fsdp" in label or "tensor" in label:
        assert four_ranks[0][0][label]["sharded"], f"{label}: nothing was split or sharded"


# --- in this process -------------------------------------------------------------------------------


def test_each_rank_holds_two_chunks_placed_for_causal_load_balance() -> None:
    from stratagem.runtime import context_positions

    assert context_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert context_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    held = torch.cat([context_positions(24, 3, c) for c in range(3)])
    assert sorted(held.tolist()) == list(range(24))
    # Under a causal mask each rank's queries see the same number of keys.
    seen = [int(sum(p + 1 for p in context_positions(24, 3, c).tolist())) for c in range(3)]
    assert len(set(seen)) == 1


@pytest.mark.slow
def test_a_zoo_gpt_trial_with_context_parallelism_runs_each_rank_on_its_piece_of_the_sequence() -> None:
    from sample_documents import make_cpu_cluster

    from stratagem import zoo
    from stratagem.builders import DataParallel
    from stratagem.ir import Strategy
    from stratagem.tracing import capture
    from trial_runner import LocalBackend, Outcome, ZooWorkload, run_trial

    module, make_batch = zoo.build("gpt", "small")
    graph = capture(module, make_batch(4), batch_size=4, optimizer="adam")
    resources = make_cpu_cluster(2)
    document = DataParallel().build(graph, resources).model_dump(mode="json", exclude_none=True)
    document.pop("id", None)
    document["mesh"] = {"data": 1, "context": 2}
    result = run_trial(
        ZooWorkload("gpt", batch_size=4),
        resources,
        Strategy.parse(document),
        warmup=1,
        steps=2,
        timeout=180,
        backend=LocalBackend(),
    )
    assert result.outcome == Outcome.ok, result.error
    assert len(result.step_times_s) == 2 and all(t > 0 for t in result.step_times_s)
    assert result.samples_per_s == pytest.approx(4 / result.median_s)  # one data index: 4 samples a step
    assert result.undistributed_step_s is None  # the undistributed step is timed for data-parallel meshes only
    assert all(r.wire_bytes.get("allreduce", 0) > 0 for r in result.ranks)


def test_context_ranks_sit_between_the_stage_and_the_tensor_index_and_synchronize_with_the_data_ranks() -> None:
    from stratagem.runtime import MeshLayout

    layout = MeshLayout(data=2, pipeline=1, tensor=2, context=2)  # rank = (d·C + c)·T + t
    assert [layout.coordinates(r) for r in (0, 1, 2, 5, 7)] == [(0, 0, 0), (0, 0, 1), (0, 0, 0), (1, 0, 1), (1, 0, 1)]
    assert [layout.context_index(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert layout.data_group(5) == [1, 3, 5, 7]  # every (d, c) holding tensor shard 1, in (d, c) order
    assert MeshLayout(data=2, pipeline=2, tensor=2).data_group(3) == [3, 7]  # without a context degree, as before
