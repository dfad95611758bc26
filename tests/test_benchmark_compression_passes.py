"""benchmarks/compression_passes.py: the report it prints and the size law it sets beside the measurement."""

from __future__ import annotations

import pytest
import torch

from benchmarks import compression_passes as passes


def test_the_size_law_prices_a_large_tensor_dearer_per_byte_and_a_flat_buffer_does_not() -> None:
    mib = 1 << 20
    law = passes._law_ratio(4 * mib)
    expected = (16 * mib * 5 + 4 * mib * 1.25) / (20 * mib * 1.25)  # 1 + bytes/knee per tensor, both sets 20 MiB
    assert law == pytest.approx(expected) and law > 1
    assert passes._law_ratio(None) == 1.0


def test_the_report_sets_each_compressors_measured_extra_beside_the_priced_ratios() -> None:
    ms = {
        "one_large/plain": 10.0,
        "one_large/fp16": 16.0,
        "one_large/topk": 30.0,
        "small_only/plain": 9.0,
        "small_only/fp16": 14.0,
        "small_only/topk": 29.0,
    }
    report = passes.report(ms, None)
    assert report["extra_ms"] == {
        "one_large/fp16": 6.0,
        "one_large/topk": 20.0,
        "small_only/fp16": 5.0,
        "small_only/topk": 20.0,
    }
    assert report["large_over_small"]["fp16"] == {"measured": 1.2, "priced_by_size_law": 1.0, "flat_buffer": 1.0}
    assert report["large_over_small"]["topk"]["measured"] == 1.0


def test_both_sets_hold_the_same_bytes_and_every_bucket_runs_through_the_runtimes_reducers() -> None:
    assert sum(passes.SETS["one_large"]) == sum(passes.SETS["small_only"])
    runs = passes.bucket_runs(torch)
    assert set(runs) == {f"{s}/{r}" for s in passes.SETS for r in ("plain", "fp16", "topk")}
    for run in runs.values():
        run()


def test_the_priced_extra_counts_the_simulators_passes_beyond_the_uncompressed_bucket() -> None:
    rates = {"stream_rate": 1e10, "cast_rate": 5e9, "select_rate": 1e9}
    priced = passes.priced_extra_ms(rates)
    b = 20 * (1 << 20)
    assert priced["small_only/fp16"] == pytest.approx(1e3 * (8 * b / 1e10 + 4.5 * b / 5e9), abs=1e-3)
    assert priced["small_only/topk"] == pytest.approx(1e3 * (10 * b / 1e10 + b / 1e9), abs=1e-3)
    assert priced["one_large/fp16"] == priced["small_only/fp16"]  # no size law: the same bytes cost the same
