"""`benchmarks/cpu_rank_settings.py` runs end to end at a small size and reports both comparisons."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import cpu_rank_settings as bench
from benchmarks.lib.cases import strategies_for
from stratagem.rank_env import MALLOC_SETTINGS


@pytest.mark.slow
def test_both_comparisons_report_medians_and_speedups() -> None:
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


def test_powersgd_product_orders_compute_the_same_numbers_and_report_a_speedup() -> None:
    import torch

    ms = [torch.randn(rows, cols) for rows, cols in ((64, 16), (16, 48))]
    qs = [torch.randn(m.shape[1], 4) for m in ms]
    textbook = bench.textbook_products(ms, qs)
    runtime = bench.runtime_products(ms, [q.T.contiguous() for q in qs])
    for q, qt in zip(textbook, runtime, strict=True):
        torch.testing.assert_close(qt.T, q, rtol=1e-4, atol=1e-4)
    report = bench.powersgd_products(repeats=1)
    assert set(report) == set(bench.POWERSGD_SHAPES)
    for figures in report.values():
        assert (
            figures["textbook_ms"] > 0
            and figures["runtime_ms"] > 0
            and figures["gradient_mb"] == pytest.approx(20.0, abs=0.1)
        )
        assert figures["speedup"] == pytest.approx(figures["textbook_ms"] / figures["runtime_ms"], rel=0.05)


@pytest.mark.slow
def test_blocks_with_and_without_mappings_report_each_strategy_measured_and_simulated() -> None:
    from sample_documents import make_mlp_graph

    from stratagem.ir import Node, ResourceSpec
    from trial_runner import ReplayWorkload

    graph = make_mlp_graph(batch_size=8, widths=(64, 32, 10))
    two_ranks = ResourceSpec(name="local", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")])
    every = strategies_for(graph, two_ranks)
    strategies = {name: every[name] for name in ("AllReduce", "Sharded")}
    job = bench.BlockJob(graph, ReplayWorkload(graph), strategies, warmup=1)
    label, arena = bench.parse_setting("arena:MALLOC_ARENA_MAX=1")
    report = bench.mappings_in_blocks({"tiny": job}, rounds=1, steps=2, extra_settings={label: arena})

    assert report["settings"] == {
        "mapped": {"MALLOC_MMAP_MAX_": bench.GLIBC_MMAP_MAX},
        "tuned": {},
        "arena": {"MALLOC_ARENA_MAX": "1"},
    }
    assert set(report["jobs"]["tiny"]) == set(strategies)
    for figures in report["jobs"]["tiny"].values():
        for label in ("mapped", "tuned", "arena"):
            assert figures[label]["measured_ms"] > 0 and figures[label]["simulated_ms"] > 0
        mapped = figures["mapped"]["measured_ms"]
        assert figures["speedups"]["tuned"] == pytest.approx(mapped / figures["tuned"]["measured_ms"], rel=0.05)
        assert figures["speedups"]["arena"] == pytest.approx(mapped / figures["arena"]["measured_ms"], rel=0.05)


@pytest.mark.parametrize("text", ["arena", ":A=1", "arena:A", "arena:=1"])
def test_a_malformed_setting_names_the_option_and_the_expected_form(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="LABEL:NAME=VALUE"):
        bench.parse_setting(text)


def test_an_extra_setting_may_not_take_the_label_of_mapped_or_tuned() -> None:
    with pytest.raises(ValueError, match=r"\['tuned'\] would replace"):
        bench.mappings_in_blocks({}, rounds=1, steps=1, extra_settings={"tuned": {"MALLOC_ARENA_MAX": "1"}})
