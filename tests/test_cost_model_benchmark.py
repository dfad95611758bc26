"""The cost-model benchmark's bookkeeping: rounds of one strategy fold into one record, jobs stay whole
across calibrations, and the noise floor is computed from the rounds (stand-in times, no trials)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from sample_documents import make_loopback_cpus

from benchmarks.lib.cases import comm_graph
from benchmarks.lib.learned import learning_curve, load_adjusted, load_trials, lowshot, noise_floor, separable_pairs
from benchmarks.lib.records import trial_documents
from simulator.metrics import kendall_tau_on_pairs
from stratagem.builders import PS, AllReduce, PartitionedPS
from stratagem.ir import DeviceSpec, ResourceSpec


def calibrated(bandwidth_gbps: float) -> ResourceSpec:
    """Two CPU ranks as `stratagem.calibrate` describes them; each round's calibration differs a little."""
    device = DeviceSpec(name="CPU", peak_flops={"float32": 50e9}, memory_bytes=8e9, memory_bandwidth=8e9, is_gpu=False)
    return make_loopback_cpus("calibrated-test", device, bandwidth_gbps)


ROUNDS = {"PS": [0.30, 0.33, 0.31], "PartitionedPS": [0.20, 0.21, 0.26], "AllReduce": [0.10, 0.12, 0.11]}
"""Stand-in step times per round (seconds), one job; the order is clear beyond each strategy's spread."""


def write_trials(path: Path, rounds: dict[str, list[float]], *, primed: bool = True) -> Path:
    """One job, one calibration per round, every strategy once per round, plus a crashed trial per round."""
    graph = comm_graph("mlp-test", 2, 256, 8, 0)
    builders = {"PS": PS(), "PartitionedPS": PartitionedPS(), "AllReduce": AllReduce()}
    with path.open("w") as out:
        for round_index, bandwidth in enumerate((4.0, 5.0, 3.0)):
            resources = calibrated(bandwidth)
            for name, builder in builders.items():
                strategy = builder.build(graph, resources)
                result = {
                    "outcome": "ok",
                    "median_s": rounds[name][round_index],
                    "workload": "replay:mlp-test",
                    "optimizer_primed": primed,
                }
                out.write(
                    json.dumps(
                        {
                            "job": "mlp-test",
                            "round": round_index + 1,
                            "graph": graph.model_dump(mode="json"),
                            "resources": resources.model_dump(mode="json"),
                            "strategy": strategy.model_dump(mode="json"),
                            "result": result,
                        }
                    )
                    + "\n"
                )
            failed = {"outcome": "crash", "median_s": None, "workload": "replay:mlp-test"}
            out.write(
                json.dumps(
                    {
                        "job": "mlp-test",
                        "graph": graph.model_dump(mode="json"),
                        "resources": resources.model_dump(mode="json"),
                        "strategy": builders["PS"].build(graph, resources).model_dump(mode="json"),
                        "result": failed,
                    }
                )
                + "\n"
            )
    return path


@pytest.fixture(scope="module")
def trials_file(tmp_path_factory) -> Path:
    return write_trials(tmp_path_factory.mktemp("bench") / "trials.jsonl", ROUNDS)


def test_rounds_under_different_calibrations_are_one_strategy_of_one_job(trials_file):
    strategies, stats = load_trials([trials_file])
    assert stats["jobs"] == 1 and stats["strategies"] == 3 and stats["trials_ok"] == 9
    assert stats["outcomes"] == {"ok": 9, "crash": 3} and stats["rounds_per_strategy"] == {"3": 3}
    by_name = {s.name: s for s in strategies}
    assert sorted(by_name) == sorted(ROUNDS)
    for name, times in ROUNDS.items():
        assert by_name[name].measured == times
        assert len({r.resources_id for r in by_name[name].records}) == 3, "each round keeps its own calibration"


def test_a_folded_strategy_takes_the_median_time_and_the_median_prediction(trials_file):
    strategies, _ = load_trials([trials_file])
    for s in strategies:
        folded = s.folded()
        simulated = sorted(r.simulated_step_time_s for r in s.records)
        assert folded.measured_step_time_s == statistics.median(ROUNDS[s.name])
        assert folded.simulated_step_time_s == simulated[1]
        assert folded.group_id.startswith("mlp-test-") and folded.group_id.endswith("/replay")


def test_the_noise_floor_scores_one_round_against_the_others(trials_file):
    strategies, _ = load_trials([trials_file])
    noise = noise_floor(strategies)
    spreads = {name: (max(t) - min(t)) / statistics.median(t) for name, t in ROUNDS.items()}
    assert noise["median_round_spread"] == pytest.approx(statistics.median(spreads.values()))
    assert noise["max_round_spread"] == pytest.approx(max(spreads.values()))
    assert noise["separable_pairs"] == 1.0
    ceiling = noise["one_round_vs_others"]
    assert ceiling["kendall_tau"] == pytest.approx(1.0) and ceiling["top1_regret"] == 0.0
    errors = [
        abs(t[r] - statistics.median(t[:r] + t[r + 1 :])) / statistics.median(t[:r] + t[r + 1 :])
        for t in ROUNDS.values()
        for r in range(3)
    ]
    assert ceiling["mape"] == pytest.approx(statistics.mean(errors))


def test_separable_pairs_are_those_whose_gap_exceeds_both_spreads(tmp_path):
    # PS and PartitionedPS overlap (gap 1.2x, PartitionedPS's spread 1.5x); AllReduce is clear of both
    path = write_trials(
        tmp_path / "overlap.jsonl",
        {"PS": [0.30, 0.30, 0.30], "PartitionedPS": [0.20, 0.25, 0.50], "AllReduce": [0.10, 0.10, 0.10]},
    )
    strategies, _ = load_trials([path])
    names = [s.name for s in strategies]
    pairs = {frozenset((names[i], names[j])) for i, j in separable_pairs(strategies)}
    assert pairs == {frozenset(("PS", "AllReduce")), frozenset(("PartitionedPS", "AllReduce"))}
    assert noise_floor(strategies)["separable_pairs"] == pytest.approx(2 / 3)

    measured = np.array([s.folded().measured_step_time_s for s in strategies])
    position = {name: i for i, name in enumerate(names)}
    backwards = measured.copy()
    backwards[position["AllReduce"]] = 1.0  # priced slowest: both separable pairs ordered wrong
    listed = separable_pairs(strategies)
    assert kendall_tau_on_pairs(measured=measured, predicted=measured, pairs=listed) == 1.0
    assert kendall_tau_on_pairs(measured=measured, predicted=backwards, pairs=listed) == -1.0
    assert math.isnan(kendall_tau_on_pairs(measured=measured, predicted=measured, pairs=[]))


def test_a_record_that_is_not_a_trial_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"result": {"outcome": "ok", "median_s": 0.1}}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: not a trial record"):
        load_trials([path])


def test_trials_timed_over_primed_and_empty_optimizer_state_are_not_scored_together(trials_file, tmp_path):
    _, stats = load_trials([trials_file])
    assert stats["optimizer_primed"] is True
    unprimed = write_trials(tmp_path / "unprimed.jsonl", ROUNDS, primed=False)
    with pytest.raises(SystemExit, match="primed and over empty optimizer state"):
        load_trials([trials_file, unprimed])


def test_a_record_with_stale_ids_loads_with_ids_derived_from_its_content(trials_file):
    line = json.loads(trials_file.read_text().splitlines()[0])
    stale = "0" * 64
    line["resources"]["id"] = stale
    line["strategy"]["resources_id"] = stale
    graph, resources, strategy = trial_documents(line)
    assert resources.id != stale and strategy.resources_id == resources.id and strategy.graph_id == graph.id


def test_load_shared_by_a_round_is_divided_out(tmp_path):
    load = (1.0, 2.0, 0.5)
    base = {"PS": 0.3, "PartitionedPS": 0.2, "AllReduce": 0.1}
    path = write_trials(tmp_path / "loaded.jsonl", {name: [t * f for f in load] for name, t in base.items()})
    strategies, _ = load_trials([path])
    assert noise_floor(strategies)["median_round_spread"] == pytest.approx(1.5)
    adjusted = load_adjusted(strategies)
    assert noise_floor(adjusted)["median_round_spread"] == pytest.approx(0.0, abs=1e-12)
    for s in adjusted:
        assert s.folded().measured_step_time_s == pytest.approx(base[s.name])


@pytest.mark.slow
def test_the_served_curve_is_the_correction_where_the_service_would_put_it_in_use():
    """With a bias the correction can learn (the synthetic jobs' PS traffic 2.5x dearer than simulated),
    cross-validation on its own training trials always promotes it, so what is served is the correction;
    with no training trials nothing is fitted and the service answers with the simulator alone."""
    from simulator.learned.synthetic import synthetic_records

    curve = learning_curve(synthetic_records(n_groups=6, per_group=6), (0, 20), seeds=1)
    untrained, trained = curve
    assert untrained["served"] == untrained["simulator"]
    assert trained["served_share"] == 1.0
    assert trained["served"] == trained["corrected"]
    assert trained["served"]["log_error"] < 0.5 * trained["simulator"]["log_error"]


def test_lowshot_reports_each_jobs_trials_answer_and_regret():
    """The per-job lines are what the aggregate counts: a miss can be traced to the trials it ran."""
    from simulator.learned.synthetic import synthetic_records

    records = synthetic_records(n_groups=3, per_group=5)
    names = {str(r.strategy_id): f"s{i}" for i, r in enumerate(records)}
    result = lowshot(records, names, budget=2, mode="simulator_only", noise=0.02)

    jobs = result["per_job"]
    assert len(jobs) == result["jobs"] == 3
    assert {j["job"] for j in jobs} == {r.group_id for r in records}
    for job in jobs:
        assert 1 <= len(job["trials"]) <= 2 and set(job["trials"]) <= set(names.values())
        assert job["regret"] >= 0 and (job["regret"] == 0) == (job["answer"] == job["fastest"])
    assert result["answer_is_fastest"] == pytest.approx(sum(j["regret"] == 0 for j in jobs) / 3)
    assert result["max_regret"] == pytest.approx(max(j["regret"] for j in jobs), abs=1e-4)
