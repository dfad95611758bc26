"""The context-parallel probe's arithmetic, on the CPU at toy sizes (its timings need CUDA: gpu_check.sh)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.gpu_context_parallel import CHUNK, merged_attention, priced_seconds, rank_blocks
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
