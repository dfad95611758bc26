"""The interleaved measurement both accuracy benchmarks rely on, run for real: two gloo ranks, a tiny
replayed model, every strategy stepped in turn, the machine calibrated alongside."""

from __future__ import annotations

import pytest
from sample_documents import make_mlp_graph

from benchmarks.lib import interleaved
from stratagem.builders import PS, AllReduce
from stratagem.ir import Node, ResourceSpec
from trial_runner import ReplayWorkload


@pytest.mark.slow
def test_a_block_times_every_strategy_and_the_undistributed_copy_and_calibrates_the_machine():
    graph = make_mlp_graph(batch_size=8, widths=(64, 32, 10))
    two_ranks = ResourceSpec(name="local", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")])
    wrong_ranks = ResourceSpec(
        name="three", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1, 2], device="CPU")]
    )
    strategies = {
        "AllReduce": AllReduce().build(graph, two_ranks),
        "PS": PS().build(graph, two_ranks),
        "three-ranks": AllReduce().build(graph, wrong_ranks),
    }
    block = interleaved.measure_block(
        ReplayWorkload(graph), strategies, warmup=1, steps=2, timeout=240, undistributed=True
    )

    assert block.failure is None, block.failure
    assert block.resources is not None and block.resources.provenance["interleaved_with"] == f"replay:{graph.name}"
    assert block.undistributed_s() > 0
    for name in ("AllReduce", "PS"):
        result = block.result(name, strategies[name])
        assert result["outcome"] == "ok" and len(result["step_times_s"]) == 2
        assert result["median_s"] > 0 and [r["rank"] for r in result["ranks"]] == [0, 1]
        assert result["strategy_id"] == strategies[name].id and result["global_batch_size"] == 16
        assert result["optimizer_primed"] is True
    refused = block.result("three-ranks", strategies["three-ranks"])
    assert refused["outcome"] == "invalid" and "3" in refused["error"] and refused["median_s"] is None
