"""A server's master copies: kept in one buffer, they step exactly as separate copies do, so a pull can
send that buffer as it is (no flatten of the masters on the server's critical path)."""

from __future__ import annotations

import torch

from stratagem.runtime.updates import MasterUpdater


def _updaters() -> tuple[MasterUpdater, MasterUpdater, list[torch.Tensor]]:
    values = [torch.randn(4, 3), torch.randn(5), torch.randn(2, 2, 2)]
    model = torch.nn.ParameterList([torch.nn.Parameter(v.clone()) for v in values])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    groups = [0, 0, 0]
    return MasterUpdater(optimizer, groups, values, flat=True), MasterUpdater(optimizer, groups, values), values


def test_flat_masters_are_views_of_one_buffer_that_steps_in_place() -> None:
    flat, separate, values = _updaters()
    assert flat.flat is not None and separate.flat is None
    buffer = flat.flat.data_ptr()
    for _ in range(3):
        grads = [torch.randn_like(v) for v in values]
        flat.step([g.clone() for g in grads])
        separate.step(grads)
    assert flat.flat.data_ptr() == buffer
    torch.testing.assert_close(flat.flat, torch.cat([m.reshape(-1) for m in separate.masters]))
    assert not torch.equal(flat.flat, torch.cat([v.reshape(-1) for v in values]))
    assert [m.shape for m in flat.masters] == [v.shape for v in values]
