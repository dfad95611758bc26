"""`benchmarks/zero_state_update.py` times sqrt and Adam against the share of zeros in the state."""

from __future__ import annotations

import pytest

from benchmarks import zero_state_update as bench


def test_reports_every_zero_share_and_the_slowdowns_it_derives() -> None:
    report = bench.measure(repeats=1, elements=1 << 14)
    assert report["elements"] == 1 << 14
    assert set(report["adam_slowdown"]) == {str(share) for share in bench.ZERO_SHARES}
    assert report["adam_slowdown"]["0.0"] == 1.0
    for share in bench.ZERO_SHARES:
        assert report[f"adam_zero_share_{share}_ms"] > 0
    assert report["sqrt_zero_over_one"] == pytest.approx(
        report["sqrt_zeros_ms"] / report["sqrt_ones_ms"], rel=0.05, abs=2e-3
    )


def test_zero_gradients_leave_the_adam_state_at_zero() -> None:
    """The premise of the measurement: an entry whose gradient is always zero keeps a zero second moment."""
    import torch

    step = bench._adam(0.5, 1 << 12)
    step()
    optimizer = step.__self__
    (state,) = optimizer.state.values()
    (param,) = optimizer.param_groups[0]["params"]
    zero = param.grad == 0
    assert 0.4 < float(zero.float().mean()) < 0.6
    assert torch.all(state["exp_avg_sq"][zero] == 0) and torch.all(state["exp_avg_sq"][~zero] > 0)
