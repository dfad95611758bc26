"""benchmarks/pool_accuracy_reports.py: several accuracy runs scored as one from their printed reports."""

from __future__ import annotations

import json

import pytest

from benchmarks import pool_accuracy_reports as pool


def report(version: str, rounds: dict[str, tuple[list[float], list[float]]]) -> dict:
    """A report in simulator_accuracy's format: one model, strategies with per-round medians and predictions."""
    pairs = [
        {"model": "m", "strategy": name, "round_medians_ms": measured, "round_predicted_ms": predicted}
        for name, (measured, predicted) in rounds.items()
    ]
    return {
        "benchmark": "simulator_accuracy",
        "simulator_version": version,
        "overall": {"n": len(pairs)},
        "pairs": pairs,
    }


def test_pooling_takes_the_median_over_every_round_of_every_run():
    # run 1 alone ranks a, b backwards (a measured slower); run 2's rounds outvote it when pooled
    run1 = report("v", {"a": ([12.0], [10.0]), "b": ([11.0], [20.0])})
    run2 = report("v", {"a": ([9.0, 10.0], [10.0, 10.0]), "b": ([21.0, 19.0], [20.0, 20.0])})

    scores = pool.pooled_scores([run1, run2])

    # a: median(12, 9, 10) = 10 measured, 10 predicted; b: median(11, 21, 19) = 19 measured, 20 predicted
    assert scores["models"]["m"] == {
        "n": 2,
        "mape": pytest.approx((0 + 1 / 19) / 2, abs=1e-4),
        "kendall_tau": 1.0,
        "rounds": 3,
    }
    assert scores["overall"]["kendall_tau_within"] == 1.0 and scores["overall"]["meets_targets"] is True
    assert pool.pooled_scores([run1])["models"]["m"]["kendall_tau"] == -1.0


def test_pooled_rounds_resolve_pairs_that_no_single_run_can():
    # four rounds per run: a sign test at 0.05 needs 6 of 6 at least, so only the pool of both runs resolves a < b
    runs = [report("v", {"a": ([1.0] * 4, [1.0] * 4), "b": ([2.0] * 4, [2.0] * 4)}) for _ in range(2)]
    alone = pool.resolved_pairs(pool.pooled_rounds(runs[:1]))["overall"]
    pooled = pool.resolved_pairs(pool.pooled_rounds(runs))["overall"]
    assert alone["resolved"] == 0 and alone["kendall_tau_resolved"] is None
    assert pooled == {"pairs": 1, "resolved": 1, "ordered_right": 1, "ordered_wrong": 0, "kendall_tau_resolved": 1.0}


def test_split_half_compares_even_and_odd_rounds():
    agree = report("v", {"a": ([1.0, 1.1, 1.0, 1.2], [1.0] * 4), "b": ([2.0, 2.1, 2.2, 2.0], [2.0] * 4)})
    flip = report("v", {"a": ([1.0, 3.0], [1.0] * 2), "b": ([2.0, 2.0], [2.0] * 2)})
    assert pool.pooled_split_half_tau([agree]) == 1.0
    assert pool.pooled_split_half_tau([flip]) == -1.0


def test_cli_pools_files_and_refuses_mixed_versions_or_other_json(tmp_path, capsys):
    paths = []
    for index, version in enumerate(("v1", "v1", "v2")):
        path = tmp_path / f"run{index}.json"
        path.write_text(json.dumps(report(version, {"a": ([1.0], [1.1]), "b": ([2.0], [2.2])})))
        paths.append(str(path))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmark": "simulator"}))

    pool.main(paths[:2])
    printed = json.loads(capsys.readouterr().out)
    assert printed["simulator_version"] == "v1" and printed["overall"]["mape"] == pytest.approx(0.1)
    assert set(printed["runs"]) == set(paths[:2])

    with pytest.raises(SystemExit, match=r"\['v1', 'v2'\]"):
        pool.main(paths)
    with pytest.raises(SystemExit, match="not a simulator_accuracy report"):
        pool.main([paths[0], str(other)])
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"benchmark": "simulator_accuracy", "pairs": [{"model": "m", "strategy": "a"}]}))
    with pytest.raises(SystemExit, match="round_medians_ms"):
        pool.main([str(old)])


def test_cli_refuses_to_pool_runs_timed_over_primed_and_empty_optimizer_state(tmp_path, capsys):
    paths = []
    for index, primed in enumerate((True, True, None)):  # None: a report without the setting
        data = report("v1", {"a": ([1.0], [1.1]), "b": ([2.0], [2.2])})
        if primed is not None:
            data["settings"] = {"optimizer_primed": primed}
        path = tmp_path / f"run{index}.json"
        path.write_text(json.dumps(data))
        paths.append(str(path))

    pool.main(paths[:2])
    assert json.loads(capsys.readouterr().out)["optimizer_primed"] is True
    with pytest.raises(SystemExit, match="optimizer_primed"):
        pool.main(paths)
