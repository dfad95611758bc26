"""`benchmarks/trial_page_faults.py` runs one strategy on two real gloo ranks beside an undistributed copy."""

from __future__ import annotations

import pytest

from benchmarks import trial_page_faults as bench


@pytest.mark.slow
def test_one_strategy_reports_step_times_page_faults_and_their_ratio() -> None:
    result = bench.measure("dlrm", "AllReduce", steps=2, warmup=1, glibc_defaults=True)
    assert set(result) == {"AllReduce", "undistributed", "over_undistributed"}
    for copy in ("AllReduce", "undistributed"):
        assert result[copy]["step_ms"] > 0
        assert result[copy]["page_faults_per_step"] >= 0
    assert result["over_undistributed"] == round(result["AllReduce"]["step_ms"] / result["undistributed"]["step_ms"], 3)
