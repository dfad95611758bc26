"""`benchmarks/cpu_rank_settings.py` runs end to end at a small size and reports both comparisons."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

from stratagem.rank_env import MALLOC_SETTINGS


def test_both_comparisons_report_medians_and_speedups() -> None:
    bench = load_benchmark("cpu_rank_settings")
    selection = bench.selection(200_000, 0.01, repeats=2)
    assert selection["k"] == 2000
    assert selection["torch_topk_ms"] > 0 and selection["select_largest_ms"] > 0
    assert selection["speedup"] == pytest.approx(selection["torch_topk_ms"] / selection["select_largest_ms"], rel=0.05)
    allocator = bench.allocator(2.0, rounds=1, repeats=2)
    assert allocator["settings"] == MALLOC_SETTINGS
    for label in ("default", "tuned"):
        assert set(allocator[label]) == {"fp32_bucket_ms", "fp16_bucket_ms", "adam_step_ms"}
        assert all(value > 0 for value in allocator[label].values())
    assert set(allocator["speedup"]) == set(allocator["default"])
