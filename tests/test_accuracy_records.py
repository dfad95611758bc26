"""Real accuracy records (`tests/data/`): they parse under today's schema, and the simulator prices every
one of them exactly as the pinned predictions say, so a refactoring cannot move a prediction unnoticed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import simulator
from benchmarks.lib.learned import load_trials
from benchmarks.lib.records import Measured, read_lines, read_records, strategy_name, trial_documents
from benchmarks.lib.scoring import accuracy_report, predict

DATA = Path(__file__).resolve().parent / "data"
RECORDS = DATA / "accuracy-records.jsonl.xz"
PINNED = DATA / "accuracy-predictions.json"


def predicted_in_file_order() -> tuple[list[float], list[Measured]]:
    """Every record's predicted step time, in the order of the file's lines."""
    pairs = read_records(RECORDS)
    predict(pairs)
    by_key = {(str(p.graph.id), p.name): p for p in pairs}
    seen: dict[tuple[str, str], int] = {}
    out = []
    for text in read_lines(RECORDS):
        graph, _, strategy = trial_documents(json.loads(text))
        key = (str(graph.id), strategy_name(strategy))
        round_index = seen.get(key, 0)
        seen[key] = round_index + 1
        out.append(by_key[key].trials[round_index].predicted_s)
    return out, pairs


def pinned(*, write: bool = False) -> dict[str, Any]:
    """The pinned predictions; with `write`, recomputed with today's simulator and saved first."""
    if write:
        predicted, pairs = predicted_in_file_order()
        document = {
            "simulator_version": simulator.SIMULATOR_VERSION,
            "predicted_step_time_s": predicted,
            "overall": accuracy_report(pairs)["overall"],
        }
        PINNED.write_text(json.dumps(document, indent=1) + "\n")
    return json.loads(PINNED.read_text())


def test_every_record_parses_under_todays_schema_with_ids_from_its_content():
    lines = [json.loads(text) for text in read_lines(RECORDS)]
    assert len(lines) == 48
    for line in lines:
        assert "id" not in line["graph"] and "id" not in line["strategy"]
        graph, resources, strategy = trial_documents(line)
        assert strategy.graph_id == graph.id and strategy.resources_id == resources.id
        assert line["result"]["outcome"] == "ok" and line["result"]["optimizer_primed"] is True


def test_every_prediction_is_the_pinned_one():
    expected = pinned()
    assert expected["simulator_version"] == simulator.SIMULATOR_VERSION, (
        "a new simulator version re-pins the predictions (tests/data/README.md)"
    )
    predicted, pairs = predicted_in_file_order()
    assert predicted == pytest.approx(expected["predicted_step_time_s"], rel=1e-12)
    assert accuracy_report(pairs)["overall"] == expected["overall"]


def test_the_records_pair_up_as_three_models_of_eight_strategies_in_two_rounds():
    pairs = read_records(RECORDS)
    assert sorted({p.model for p in pairs}) == ["bert_large", "dlrm", "vgg16"]
    assert len(pairs) == 24 and all(len(p.ok) == 2 for p in pairs)


def test_the_cost_model_benchmark_reads_the_same_records_as_three_jobs():
    strategies, stats = load_trials([RECORDS])
    assert (stats["lines"], stats["trials_ok"], stats["jobs"], stats["strategies"]) == (48, 48, 3, 24)
    assert stats["rounds_per_strategy"] == {"2": 24} and stats["optimizer_primed"] is True
    _, pairs = predicted_in_file_order()
    by_name = {(p.model, p.name): sorted(t.predicted_s for t in p.trials) for p in pairs}
    for rounds in strategies:
        model = rounds.job.split("-")[0]
        assert sorted(r.simulated_step_time_s for r in rounds.records) == pytest.approx(
            by_name[(model, rounds.name)], rel=1e-12
        )
