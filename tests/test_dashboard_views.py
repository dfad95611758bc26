"""The dashboard's view logic without a server: placement, strategy knobs, progress, charts, formatting."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from sample_documents import make_embedding_graph, make_mlp_graph, make_t4_cluster

from models import Job, JobPhase, JobStatus, utcnow
from optimizer_service.dashboard import charts, formatting
from optimizer_service.dashboard.knobs import ASP_STALENESS, knobs_of
from optimizer_service.dashboard.placement import placement
from optimizer_service.dashboard.progress import progress_of
from stratagem.builders import PS, AllReduce, Parallax, PartitionedPS
from stratagem.ir import Consistency


def test_placement_groups_variables_by_consumer_layer_with_bytes_per_shard() -> None:
    graph, cluster = make_embedding_graph(rows=1000, dim=8), make_t4_cluster(2)
    strategy = PartitionedPS().build(graph, cluster)
    layout = placement(strategy, graph)
    assert [layer.name for layer in layout.layers] == ["embedding", "fc1", "fc2"]
    rows = {row.name: row for layer in layout.layers for row in layer.variables}
    table = rows["embedding.weight"]
    assert table.sparse and table.kind == "ps" and table.partition == "axis 0 × 2"
    assert [s.nbytes for s in table.shards] == [500 * 8 * 4, 500 * 8 * 4]
    assert {s.where for s in table.shards} == {"10.0.0.1:CPU:0", "10.0.0.2:CPU:0"}
    assert rows["position.weight"].kind == "not synchronized" and "frozen" in rows["position.weight"].detail
    trainable = sum(v.nbytes for v in graph.variables if v.trainable)
    assert layout.total_bytes == trainable == sum(layout.bytes_by_destination.values())
    assert set(layout.bytes_by_destination) == {"PS 10.0.0.1:CPU:0", "PS 10.0.0.2:CPU:0"}


def test_placement_without_the_graph_still_shows_where_variables_go() -> None:
    graph = make_mlp_graph()
    strategy = AllReduce().build(graph, make_t4_cluster(1))
    layout = placement(strategy, None)
    assert layout.total_bytes is None and layout.bytes_by_destination == {}
    rows = layout.layers[0].variables
    assert [r.name for r in rows] == [c.var_name for c in strategy.variables]
    assert all(r.kind == "allreduce" and r.where.startswith("group 0") and r.nbytes is None for r in rows)


def test_knobs_weigh_parameter_server_traffic_by_bytes() -> None:
    graph, cluster = make_embedding_graph(rows=100_000, dim=64), make_t4_cluster(2)
    parallax = knobs_of(Parallax().build(graph, cluster), graph)
    table = graph.variable("embedding.weight").nbytes
    trainable = sum(v.nbytes for v in graph.variables if v.trainable)
    assert parallax.ps_bytes_fraction == pytest.approx(table / trainable)
    assert parallax.groups >= 1 and parallax.compressed_fraction == 0.0 and parallax.staleness == 0
    assert knobs_of(PS().build(graph, cluster), graph).ps_bytes_fraction == 1.0
    assert knobs_of(PartitionedPS().build(graph, cluster), graph).max_shards == 2
    allreduce = knobs_of(AllReduce().build(make_mlp_graph(), cluster), make_mlp_graph())
    assert (allreduce.ps_bytes_fraction, allreduce.groups, allreduce.max_shards) == (0.0, 1, 1)


def test_asp_staleness_is_plotted_apart_from_bounded_staleness() -> None:
    graph, cluster = make_mlp_graph(), make_t4_cluster(2)
    asp = PS(sync=False).build(graph, cluster)
    assert asp.consistency == Consistency(kind="asp")
    assert knobs_of(asp, graph).staleness == ASP_STALENESS
    figure = charts.knobs_parcoords([knobs_of(asp, graph)], [0.1])
    staleness = figure["data"][0]["dimensions"][4]
    assert staleness["ticktext"][staleness["tickvals"].index(ASP_STALENESS)] == "asp"


def _job(**fields: object) -> Job:
    options = {"search": {"time_budget_s": 10.0, "max_candidates": 1000}, "max_trials": 2}
    return Job(id=uuid.uuid4(), graph_id="g", resource_id="r", options=options, **fields)


def test_search_progress_is_the_further_of_its_two_budgets() -> None:
    now = utcnow()
    by_time = progress_of(
        _job(
            status=JobStatus.running,
            phase=JobPhase.searching,
            started_at=now - timedelta(seconds=5),
            progress={"candidates_evaluated": 100},
        ),
        now,
    )
    assert by_time.fraction == pytest.approx(0.5) and by_time.live
    assert "100 of at most 1,000 candidates" in by_time.text and "5 of 10 s" in by_time.text
    by_count = progress_of(
        _job(
            status=JobStatus.running, phase=JobPhase.searching, started_at=now, progress={"candidates_evaluated": 800}
        ),
        now,
    )
    assert by_count.fraction == pytest.approx(0.8)


def test_progress_of_trials_queued_and_ended_jobs() -> None:
    trials = progress_of(
        _job(status=JobStatus.running, phase=JobPhase.trials, progress={"trials_done": 1, "trials_budget": 4})
    )
    assert (trials.fraction, trials.text) == (0.25, "trials: 1 of 4 run")
    assert progress_of(_job(status=JobStatus.queued, phase=JobPhase.queued, progress={})).fraction == 0.0
    failed = progress_of(
        _job(status=JobStatus.failed, phase=JobPhase.searching, progress={}, error="the search crashed")
    )
    assert not failed.live and failed.text == "failed: the search crashed"


def test_best_so_far_line_never_rises_and_mape_is_relative_to_the_measurement() -> None:
    figure = charts.step_time_over_time(["t1", "t2", "t3", "t4"], [0.3, 0.2, 0.25, 0.1], ["a", "b", "c", "d"])
    assert figure["data"][1]["y"] == pytest.approx([300.0, 200.0, 200.0, 100.0])
    assert charts.mape([1.1, 0.5], [1.0, 1.0]) == pytest.approx((0.1 + 0.5) / 2)
    assert charts.mape([], []) is None
    scatter = charts.predicted_vs_measured_scatter([1.1, 0.5], [1.0, 1.0], ["a", "b"])
    assert "MAPE 30.0%" in scatter["layout"]["title"]["text"]


def test_breakdown_chart_stacks_only_the_components_that_cost_time() -> None:
    figure = charts.breakdown_chart(
        ["#1", "#2"], [{"compute": 0.001, "allreduce": 0.002, "ps": 0.0}, {"compute": 0.001, "ps": 0.004}]
    )
    assert [trace["name"] for trace in figure["data"]] == ["compute", "allreduce", "ps"]
    assert figure["layout"]["barmode"] == "stack"
    assert figure["data"][2]["y"] == pytest.approx([0.0, 4.0])


def test_times_and_sizes_read_with_sensible_units() -> None:
    assert [formatting.seconds(v) for v in (7.3e-4, 0.0123, 2.5, None)] == ["730 µs", "12.3 ms", "2.5 s", "—"]
    assert [formatting.nbytes(v) for v in (512, 2_048, 3.2e6, 1.5e9)] == ["512 B", "2.05 kB", "3.2 MB", "1.5 GB"]
    assert formatting.percent(0.1234) == "12.3%" and formatting.percent(float("nan")) == "—"


def test_figures_reach_the_page_as_json_that_cannot_close_their_script_tag() -> None:
    from optimizer_service.dashboard.templating import figure_json

    text = str(
        figure_json({"data": [{"name": "</script><script>alert(1)</script>", "y": [1.0, float("nan"), float("inf")]}]})
    )
    assert "<" not in text and ">" not in text and "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"data": [{"name": "</script><script>alert(1)</script>", "y": [1.0, None, None]}]}
