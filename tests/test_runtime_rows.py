"""Sparse rows on a team of one: the same rows as any team computes, without reading the device (each
read waits for every queued kernel, which on a GPU stops the host from running ahead)."""

from __future__ import annotations

import torch

from stratagem.runtime.comm import Team, all_gather_rows, coalesced_rows, sum_rows


def sparse_grad(indices: list[int], rows: int = 10, dim: int = 3) -> torch.Tensor:
    values = torch.arange(len(indices) * dim, dtype=torch.float32).reshape(len(indices), dim)
    return torch.sparse_coo_tensor(torch.tensor([indices]), values, (rows, dim))


def test_a_whole_table_keeps_its_coalesced_rows_and_a_range_is_cut_and_shifted():
    grad = sparse_grad([7, 2, 7, 4])
    idx, vals = coalesced_rows(grad, 0, 10, torch.Size([3]), torch.zeros(10, 3))
    dense = grad.to_dense()
    assert idx.tolist() == [2, 4, 7] and torch.equal(vals, dense[[2, 4, 7]])
    idx, vals = coalesced_rows(grad, 3, 5, torch.Size([3]), torch.zeros(10, 3))
    assert idx.tolist() == [1, 4] and torch.equal(vals, dense[[4, 7]])


def test_one_row_set_is_its_own_sum_and_several_are_added():
    one = (torch.tensor([1, 5]), torch.ones(2, 3))
    idx, vals = sum_rows([one], 10, torch.Size([3]))
    assert idx is one[0] and vals is one[1]
    idx, vals = sum_rows([one, (torch.tensor([5, 6]), torch.ones(2, 3))], 10, torch.Size([3]))
    assert idx.tolist() == [1, 5, 6] and vals[:, 0].tolist() == [1.0, 2.0, 1.0]


def test_a_team_of_one_gathers_its_own_rows_without_a_process_group():
    rows = [(torch.tensor([0, 3]), torch.ones(2, 4)), (torch.tensor([], dtype=torch.long), torch.zeros(0, 4))]
    gathered = all_gather_rows(Team([0], [0], None), rows)
    assert [[(i.tolist(), v.shape[0]) for i, v in per_set] for per_set in gathered] == [[([0, 3], 2)], [([], 0)]]
