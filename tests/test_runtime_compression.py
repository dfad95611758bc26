"""Compressors keep what they drop (error feedback) and PowerSGD recovers low-rank gradients exactly.

A team of one rank needs no process group, so the reducers' arithmetic is checked in-process.
"""

from __future__ import annotations

import pytest
import torch

from stratagem.ir import Compressor
from stratagem.runtime import compression
from stratagem.runtime.comm import Team
from stratagem.runtime.compression import CastReducer, PowerSGDReducer, TopKReducer, apply_compression, select_largest

SOLO = Team([0], [0], None)


def _steps(reducer, grads_per_step: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    outs = []
    for grads in grads_per_step:
        reducer.start(grads)
        outs.append([out.clone() for out in reducer.finish()])  # valid until the next start
    return outs


def _grads(steps: int, shapes: list[tuple[int, ...]], seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes] for _ in range(steps)]


@pytest.mark.parametrize(
    "reducer",
    [
        TopKReducer(SOLO, ratio=0.2, error_feedback=True),
        CastReducer(SOLO, wire_dtype=torch.float16, error_feedback=True),
        CastReducer(SOLO, wire_dtype=torch.bfloat16, error_feedback=True),
    ],
    ids=["topk", "fp16", "bf16"],
)
def test_error_feedback_loses_nothing_over_steps(reducer) -> None:
    grads = _grads(6, [(5, 4), (7,)])
    outs = _steps(reducer, grads)
    sent = sum(torch.cat([o.reshape(-1) for o in out]) for out in outs)
    total = sum(torch.cat([g.reshape(-1) for g in step]) for step in grads)
    torch.testing.assert_close(sent + reducer.error, total)
    assert not torch.allclose(sent, total), "compression should have dropped something"


def test_powersgd_error_feedback_loses_nothing_and_vectors_travel_exactly() -> None:
    reducer = PowerSGDReducer(SOLO, rank=1, error_feedback=True, seed=3)
    grads = _grads(5, [(8, 6), (6,), (4, 2, 3)])
    outs = _steps(reducer, grads)
    for i in (0, 2):
        sent = sum(out[i] for out in outs)
        total = sum(step[i] for step in grads)
        torch.testing.assert_close(sent + reducer.errors[i].view_as(total), total)
    for out, step in zip(outs, grads, strict=True):
        torch.testing.assert_close(out[1], step[1])
        assert [o.shape for o in out] == [g.shape for g in step]


def test_powersgd_recovers_a_gradient_of_at_most_its_rank_exactly() -> None:
    g = torch.Generator().manual_seed(1)
    low_rank = torch.randn(10, 2, generator=g) @ torch.randn(2, 7, generator=g)
    (out,) = _steps(PowerSGDReducer(SOLO, rank=2, error_feedback=False, seed=0), [[low_rank]])[0]
    torch.testing.assert_close(out, low_rank, rtol=1e-4, atol=1e-5)


class CountingTeam(Team):
    """Two members whose collectives are only counted: an all-reduce's peer contributes nothing, an
    all-gather's peer sends what this rank sends."""

    def __init__(self) -> None:
        super().__init__([0, 1], [0, 1], None)
        self.all_reduces: list[int] = []
        self.all_gathers: list[int] = []

    def all_reduce(self, tensor: torch.Tensor, *, async_op: bool = False) -> None:
        self.all_reduces.append(tensor.numel())

    def all_gather(self, tensor: torch.Tensor, *, async_op: bool = False) -> tuple[list[torch.Tensor], None]:
        self.all_gathers.append(tensor.numel() * tensor.element_size())
        return [tensor.clone(), tensor.clone()], None


def test_topk_sends_values_and_indices_in_one_all_gather() -> None:
    team = CountingTeam()
    grads = [torch.randn(40, 5), torch.randn(30)]
    counted, solo = TopKReducer(team, ratio=0.1, error_feedback=True), TopKReducer(SOLO, ratio=0.1, error_feedback=True)
    for _ in range(2):
        counted.start([g.clone() for g in grads])
        solo.start([g.clone() for g in grads])
        for mine, alone in zip(counted.finish(), solo.finish(), strict=True):
            torch.testing.assert_close(mine, alone)
    assert team.all_gathers == [23 * (4 + 4)] * 2  # k = ceil(0.1 * 230) values and int32 indices


def test_powersgd_sends_vectors_in_p_s_collective_so_a_step_pays_two_latencies() -> None:
    team = CountingTeam()
    reducer = PowerSGDReducer(team, rank=2, error_feedback=True, seed=0)
    grads = [torch.randn(16, 8), torch.randn(8), torch.randn(5)]
    reducer.start(grads)
    out = reducer.finish()
    assert team.all_reduces == [16 * 2 + 8 + 5, 8 * 2]  # P and the vectors, then Q
    torch.testing.assert_close(out[1], grads[1] / 2)
    torch.testing.assert_close(out[2], grads[2] / 2)
    assert reducer.wire_bytes == (16 * 2 + 8 + 5 + 8 * 2) * 4


def test_powersgd_sends_fewer_numbers_than_the_gradient() -> None:
    reducer = PowerSGDReducer(SOLO, rank=2, error_feedback=True, seed=0)
    reducer.start([torch.randn(64, 32)])
    reducer.finish()
    assert reducer.wire_bytes == (64 + 32) * 2 * 4


def test_topk_sends_values_and_indices_of_k_entries() -> None:
    reducer = apply_compression(Compressor(kind="topk", ratio=0.25), team=SOLO, what="test", seed=0)
    reducer.start([torch.randn(40)])
    (out,) = reducer.finish()
    assert int((out != 0).sum()) == 10
    assert reducer.wire_bytes == 10 * (4 + 4)  # fp32 values, int32 indices


def _magnitudes(kind: str, n: int = 300_000) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if kind == "normal":
        return torch.randn(n, generator=g).abs()
    if kind == "mostly zero":  # an embedding's untouched rows
        return torch.cat([torch.zeros(n - n // 50), torch.randn(n // 50, generator=g)]).abs()
    if kind == "heavy tail":
        return (torch.randn(n, generator=g) * torch.exp(3 * torch.randn(n, generator=g))).abs()
    if kind == "layered":  # one layer's gradients far larger than the rest's
        return torch.cat([torch.randn(n - 1000, generator=g), 1e3 * torch.randn(1000, generator=g)]).abs()
    return torch.full((n,), 0.5)  # all tied


@pytest.mark.parametrize("kind", ["normal", "mostly zero", "heavy tail", "layered", "tied"])
@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.05])
def test_select_largest_picks_what_a_full_topk_picks(kind: str, ratio: float) -> None:
    magnitudes = _magnitudes(kind)
    k = int(ratio * magnitudes.numel())
    picked = select_largest(magnitudes, k)
    assert picked.numel() == k and picked.unique().numel() == k
    expected = magnitudes.topk(k).values
    torch.testing.assert_close(magnitudes[picked].sort(descending=True).values, expected)


def test_select_largest_falls_back_to_a_full_selection_when_the_sample_aims_too_high(monkeypatch) -> None:
    monkeypatch.setattr(compression, "CANDIDATE_MARGIN", 0.5)  # about k/2 candidates: always too few
    magnitudes = _magnitudes("normal")
    picked = select_largest(magnitudes, 3000)
    torch.testing.assert_close(magnitudes[picked].sort(descending=True).values, magnitudes.topk(3000).values)


def test_select_largest_skips_the_sample_when_it_would_hold_a_quarter_of_the_entries(monkeypatch) -> None:
    def no_sample(*args, **kwargs):
        raise AssertionError("sampled a bucket that one full topk selects faster")

    monkeypatch.setattr(compression.torch, "randint", no_sample)
    magnitudes = _magnitudes("normal")[:85_000]  # a DLRM's dense gradients: at 1% the sample would be 51,200
    picked = select_largest(magnitudes, 850)
    torch.testing.assert_close(magnitudes[picked].sort(descending=True).values, magnitudes.topk(850).values)


def test_select_largest_on_a_tie_takes_every_larger_entry_then_tied_ones_wherever_they_lie() -> None:
    # The sampled threshold lands on the 1.0s; they all lie past the prefix where they are first sought.
    g = torch.Generator().manual_seed(3)
    magnitudes = torch.cat(
        [torch.full((198_000,), 0.1), torch.full((100_000,), 1.0), 2 + torch.rand(2000, generator=g)]
    )
    picked = select_largest(magnitudes, 15_000)
    assert picked.unique().numel() == 15_000
    torch.testing.assert_close(magnitudes[picked].sort(descending=True).values, magnitudes.topk(15_000).values)


class _NoBFloat16(Team):
    """A team whose backend refuses bfloat16, as some gloo builds do."""

    def all_reduce(self, tensor: torch.Tensor, *, async_op: bool = False):
        if tensor.dtype == torch.bfloat16:
            raise RuntimeError("Unsupported dtype BFloat16")
        return None


def test_a_backend_without_bf16_is_refused_with_the_bucket_named() -> None:
    from stratagem.errors import UnsupportedStrategyError

    team = _NoBFloat16([0, 1], [0, 1], None)
    with pytest.raises(
        UnsupportedStrategyError, match=r"all-reduce group 0 \(fc1.weight\).*cannot all-reduce torch.bfloat16"
    ):
        apply_compression(Compressor(kind="bf16"), team=team, what="all-reduce group 0 (fc1.weight)", seed=0)
    assert isinstance(apply_compression(Compressor(kind="fp16"), team=team, what="x", seed=0), CastReducer)
