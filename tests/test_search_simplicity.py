"""The answer rule on constructed candidates: the simpler strategy unless the gain exceeds the uncertainty."""

from __future__ import annotations

import pytest
from layout_helpers import gpt_graph, gpu_cluster
from sample_documents import make_embedding_graph, make_mlp_graph, make_t4_cluster

from optimizer_service.search.simplicity import (
    FLOOR,
    BarSource,
    Choice,
    Rule,
    Simplicity,
    decide,
    simplicity_of,
)
from stratagem.builders import PS, AllReduce, DataParallel, Parallax
from stratagem.ir import AllReduceSynchronizer, Compressor, PSSynchronizer
from stratagem.layout import Layout


def choice(name: str, simplicity: Simplicity, throughput: float, uncertainty: float | None = None) -> Choice:
    return Choice(name, name, simplicity, throughput, uncertainty)


def test_simplicity_is_read_from_what_the_strategy_executes() -> None:
    graph, cluster = make_mlp_graph(), make_t4_cluster(2)
    assert simplicity_of(DataParallel().build(graph, cluster)) == Simplicity.data_parallel
    assert simplicity_of(AllReduce().build(graph, cluster)) == Simplicity.data_parallel, "AllReduce is DDP's shape"
    assert simplicity_of(PS().build(graph, cluster)) == Simplicity.builder
    assert simplicity_of(Parallax().build(graph, cluster)) == Simplicity.data_parallel, "no sparse variable: all-reduce"
    assert simplicity_of(Parallax().build(make_embedding_graph(), cluster)) == Simplicity.builder, (
        "its table on servers"
    )
    dp = DataParallel().build(graph, cluster)
    mixed = dp.replace(
        provenance={},
        variables=[
            dp.variables[0].model_copy(update={"synchronizer": PSSynchronizer(reduction_destination="10.0.0.1:CPU:0")}),
            *dp.variables[1:],
        ],
    )
    assert simplicity_of(mixed) == Simplicity.searched, "one variable on a server makes a mix"
    squeezed = dp.replace(
        variables=[
            dp.variables[0].model_copy(
                update={"synchronizer": AllReduceSynchronizer(compressor=Compressor(kind="fp16"))}
            ),
            *dp.variables[1:],
        ],
    )
    assert simplicity_of(squeezed.replace(provenance={})) == Simplicity.searched, "compression is not plain DDP"


def test_layouts_are_data_parallel_fsdp_or_searched_by_their_degrees() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(1, 8)
    assert simplicity_of(Layout().build(graph, cluster)) == Simplicity.data_parallel
    assert simplicity_of(Layout(recompute="full", global_batch=64).build(graph, cluster)) == Simplicity.data_parallel
    assert simplicity_of(Layout(zero=3).build(graph, cluster)) == Simplicity.fsdp
    assert simplicity_of(Layout(tensor=2).build(graph, cluster)) == Simplicity.searched
    assert simplicity_of(Layout(pipeline=2, global_batch=64).build(graph, cluster)) == Simplicity.searched


def test_a_simpler_strategy_within_the_floor_is_the_answer() -> None:
    decision = decide([choice("dp", Simplicity.data_parallel, 100.0), choice("mix", Simplicity.searched, 102.0)])
    assert decision.rule == Rule.simpler_within_uncertainty
    assert (decision.chosen.id, decision.fastest.id) == ("dp", "mix")
    assert decision.bar == FLOOR and decision.bar_source == BarSource.floor
    assert decision.gain == pytest.approx(0.02)
    assert "dp (plain data parallel) is predicted within 2.0% of the fastest, mix" in decision.reason


def test_a_gain_beyond_the_floor_makes_the_complex_strategy_the_answer() -> None:
    decision = decide(
        [
            choice("dp", Simplicity.data_parallel, 100.0),
            choice("ps", Simplicity.builder, 101.0),
            choice("mix", Simplicity.searched, 105.0),
        ]
    )
    assert decision.rule == Rule.gain_exceeds_uncertainty and decision.chosen.id == "mix"
    assert decision.gain == pytest.approx(105.0 / 101.0 - 1), "weighed against the best simpler strategy"
    assert "exceeds the prediction's uncertainty (3.0%, the stated floor)" in decision.reason


def test_the_learned_interval_raises_the_bar_but_never_lowers_it_below_the_floor() -> None:
    wide = decide([choice("dp", Simplicity.data_parallel, 100.0), choice("mix", Simplicity.searched, 105.0, 0.08)])
    assert wide.rule == Rule.simpler_within_uncertainty and wide.chosen.id == "dp"
    assert wide.bar == pytest.approx(0.08) and wide.bar_source == BarSource.interval
    narrow = decide([choice("dp", Simplicity.data_parallel, 100.0), choice("mix", Simplicity.searched, 102.0, 0.005)])
    assert narrow.chosen.id == "dp" and narrow.bar == FLOOR and narrow.bar_source == BarSource.floor


def test_the_simplest_within_the_bar_wins_and_the_faster_of_one_kind() -> None:
    decision = decide(
        [
            choice("mix", Simplicity.searched, 103.0),
            choice("ps", Simplicity.builder, 102.5),
            choice("fsdp", Simplicity.fsdp, 101.0),
            choice("ddp-slow", Simplicity.data_parallel, 99.0),
            choice("ddp", Simplicity.data_parallel, 100.5),
        ]
    )
    assert decision.chosen.id == "ddp"
    only_fsdp = decide([choice("fsdp", Simplicity.fsdp, 101.0), choice("ps", Simplicity.builder, 102.0)])
    assert only_fsdp.chosen.id == "fsdp"


def test_when_nothing_simpler_fits_the_fastest_stands_and_says_so() -> None:
    alone = decide([choice("tp", Simplicity.searched, 50.0), choice("pp", Simplicity.searched, 40.0)])
    assert alone.rule == Rule.fastest_is_simplest and alone.chosen.id == "tp" and alone.gain is None
    assert "no simpler strategy fits" in alone.reason
    tie = decide([choice("mix", Simplicity.searched, 100.0), choice("dp", Simplicity.data_parallel, 100.0)])
    assert tie.rule == Rule.fastest_is_simplest and tie.chosen.id == "dp", "a tie goes to the simpler"


def test_measurements_are_weighed_against_their_noise() -> None:
    decision = decide(
        [choice("dp", Simplicity.data_parallel, 100.0), choice("mix", Simplicity.searched, 102.5)],
        floor=0.02,
        floor_source=BarSource.measurement_noise,
        basis="measured",
    )
    assert decision.rule == Rule.gain_exceeds_uncertainty and decision.basis == "measured"
    assert "is measured 2.5% faster" in decision.reason and "their noise" in decision.reason
    assert decision.to_json()["bar_source"] == "measurement_noise"


def test_no_usable_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="no candidate"):
        decide([choice("broken", Simplicity.searched, 0.0)])
