"""benchmarks/communication_share.py: predicted communication against the runtime's own launch plus waits."""

from __future__ import annotations

import json

from benchmarks import communication_share as share


def pair(model: str, breakdown: dict[str, float], sync: dict[str, float]) -> dict:
    return {"model": model, "strategy": "s", "predicted_breakdown_ms": breakdown, "measured_sync_ms": sync}


def test_only_communication_is_compared_and_the_update_is_left_out():
    p = pair(
        "m",
        {"compute": 50.0, "allreduce": 20.0, "ps": 4.0, "optimizer_update": 9.0},
        {"launch": 6.0, "update": 30.0, "wait_allreduce": 10.0, "wait_ps": 4.0},
    )
    assert share.predicted_ms(p) == 24.0
    assert share.measured_ms(p) == 20.0


def test_medians_per_model_and_overall_skip_pairs_without_communication():
    report = {
        "pairs": [
            pair("a", {"allreduce": 10.0}, {"launch": 2.0, "wait_allreduce": 8.0}),  # 1.0
            pair("a", {"allreduce": 30.0}, {"launch": 5.0, "wait_allreduce": 5.0}),  # 3.0
            pair("b", {"allreduce": 12.0}, {"wait_allreduce": 10.0}),  # 1.2
            pair("b", {"compute": 40.0}, {"update": 3.0}),  # no communication: left out
        ]
    }
    ratios = share.report_ratios(report)
    assert ratios == {"pairs": 3, "median_ratio": 1.2, "models": {"a": 2.0, "b": 1.2}}
    assert share.report_ratios({"pairs": []}) == {"pairs": 0, "median_ratio": None, "models": {}}


def test_cli_prints_one_entry_per_report(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"pairs": [pair("a", {"sharded": 9.0}, {"launch": 1.0, "wait_sharded": 7.0})]}))
    share.main([str(path)])
    printed = json.loads(capsys.readouterr().out)
    assert printed["benchmark"] == "communication_share"
    assert printed["reports"][str(path)]["median_ratio"] == 1.125
