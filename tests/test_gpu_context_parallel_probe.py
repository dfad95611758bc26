"""The context-parallel probe's arithmetic, on the CPU at toy sizes (its timings need CUDA: gpu_check.sh)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.gpu_context_parallel import (
    CHUNK,
    merged_attention,
    merged_with_lse,
    priced_seconds,
    rank_blocks,
    ring_backward,
)
from stratagem.ir.catalog import CATALOG


@pytest.mark.parametrize("degree", [2, 4])
def test_a_ranks_blocks_merged_by_log_sum_exp_equal_causal_attention_over_the_sequence(degree: int) -> None:
    torch.manual_seed(0)
    chunk, heads, dim = 8, 2, 16
    q, k, v = (torch.randn(1, heads, 2 * degree * chunk, dim) for _ in range(3))
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def part(t: torch.Tensor, index: int) -> torch.Tensor:
        return t[:, :, index * chunk : (index + 1) * chunk]

    for query_chunk, attended in rank_blocks(degree, rank=1):
        merged = merged_attention(part(q, query_chunk), [part(k, j) for j in attended], [part(v, j) for j in attended])
        torch.testing.assert_close(merged, part(whole, query_chunk), rtol=1e-4, atol=1e-5)


def test_the_blocks_backward_against_the_merged_output_sums_to_causal_attentions_gradients() -> None:
    """Every rank's blocks, each differentiated against the merged output and log-sum-exp, give the
    whole sequence's query gradients, and their key and value shares add up to its key and value ones."""
    torch.manual_seed(0)
    degree, chunk, heads, dim = 2, 8, 2, 16
    q, k, v = (torch.randn(1, heads, 2 * degree * chunk, dim, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, 2 * degree * chunk, dim)
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
    assert q.grad is not None and k.grad is not None and v.grad is not None

    def part(t: torch.Tensor, index: int) -> torch.Tensor:
        return t.detach()[:, :, index * chunk : (index + 1) * chunk]

    grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
    for rank in range(degree):
        for query_chunk, attended in rank_blocks(degree, rank):
            keys, values = [part(k, j) for j in attended], [part(v, j) for j in attended]
            merged = merged_with_lse(part(q, query_chunk), keys, values)
            dq, dks, dvs = ring_backward(part(grad, query_chunk), part(q, query_chunk), keys, values, merged)
            torch.testing.assert_close(dq, part(q.grad, query_chunk), rtol=1e-4, atol=1e-5)
            for j, dk, dv in zip(attended, dks, dvs, strict=True):
                grad_k[:, :, j * chunk : (j + 1) * chunk] += dk
                grad_v[:, :, j * chunk : (j + 1) * chunk] += dv
    torch.testing.assert_close(grad_k, k.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad_v, v.grad, rtol=1e-4, atol=1e-5)


def test_load_balancing_gives_every_rank_the_same_blocks() -> None:
    for degree in (2, 4, 8):
        counts = {sum(len(a) for _, a in rank_blocks(degree, rank)) for rank in range(degree)}
        assert counts == {2 * degree + 1}


def test_the_price_counts_the_diagonal_blocks_at_the_causal_share() -> None:
    spec = CATALOG["H100"]
    full = priced_seconds(spec, blocks=2, diagonal=0)
    assert priced_seconds(spec, blocks=2, diagonal=2) == pytest.approx(full / 2)
    # degree 8: 15 full blocks and 2 diagonal ones on a rank, eight times two full blocks
    assert priced_seconds(spec, blocks=17, diagonal=2) == pytest.approx(8 * full)
    assert CHUNK == 16384
    backward = CATALOG["H100"].attention_backward_efficiency
    assert priced_seconds(spec, blocks=2, diagonal=0, backward=True) == pytest.approx(
        2.5 * full * CATALOG["H100"].attention_efficiency / backward
    )
