"""Score several runs of `benchmarks/simulator_accuracy.py` as one, from the reports they printed.

Each run's report keeps, for every (model, strategy), the median step time of each round and the
prediction made with that round's calibration. Pooling them is what `--from-records` over the
concatenated records files would score (measured: the median over every round; predicted: the median
of the rounds' predictions), and it still works when only the reports were kept. Runs on different
machines pool fine: each round was predicted with the spec calibrated beside it. Reports from
different simulator versions are refused (their predictions are not one simulator's), and so are
reports whose trials timed steps differently (primed and unprimed optimizer state).

    .venv/bin/python benchmarks/pool_accuracy_reports.py run-o.json run-p.json run-q.json

Prints one JSON object: the pooled scores in the report's format, and each run's own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.simulator_accuracy import TARGETS, Rounds, kendall_tau, mape, resolved_pairs, split_half_of

PAIR_KEYS = ("model", "strategy", "round_medians_ms", "round_predicted_ms")


def pooled_rounds(reports: list[dict[str, Any]]) -> Rounds:
    """Per model and strategy, every round's measured median and prediction (ms), over all reports."""
    rounds: Rounds = defaultdict(dict)
    for report in reports:
        for pair in report["pairs"]:
            measured, predicted = rounds[pair["model"]].setdefault(pair["strategy"], ([], []))
            measured.extend(pair["round_medians_ms"])
            predicted.extend(pair["round_predicted_ms"])
    return rounds


def pooled_scores(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE and within-model Kendall tau of the pooled medians, as `accuracy_report` computes them."""
    models: dict[str, dict[str, Any]] = {}
    all_measured: list[float] = []
    all_predicted: list[float] = []
    for model, strategies in pooled_rounds(reports).items():
        done = [(statistics.median(m), statistics.median(p)) for m, p in strategies.values() if m and p]
        measured, predicted = [m for m, _ in done], [p for _, p in done]
        models[model] = {
            "n": len(done),
            "mape": round(mape(measured, predicted), 4),
            "kendall_tau": round(kendall_tau(measured, predicted), 4),
            "rounds": min(len(m) for m, _ in strategies.values()),
        }
        all_measured += measured
        all_predicted += predicted
    within = statistics.mean(s["kendall_tau"] for s in models.values())
    overall = {
        "n": len(all_measured),
        "mape": round(mape(all_measured, all_predicted), 4),
        "kendall_tau_within": round(within, 4),
    }
    overall["meets_targets"] = overall["mape"] <= TARGETS["mape"] and within >= TARGETS["kendall_tau"]
    return {"overall": overall, "models": models}


def split_half_tau(reports: list[dict[str, Any]]) -> float:
    """Mean within models of `simulator_accuracy.split_half_of` over the pooled rounds."""
    halves = [split_half_of([m for m, _ in strategies.values()]) for strategies in pooled_rounds(reports).values()]
    taus = [t for t in halves if t is not None]
    return round(statistics.mean(taus), 4) if taus else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "reports", type=Path, nargs="+", help="JSON reports printed by benchmarks/simulator_accuracy.py"
    )
    args = parser.parse_args()
    reports = []
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
            if report.get("benchmark") != "simulator_accuracy" or not report.get("pairs"):
                raise ValueError("not a simulator_accuracy report with pairs")
            if any(key not in pair for pair in report["pairs"] for key in PAIR_KEYS):
                raise ValueError(f"its pairs lack one of {PAIR_KEYS} (a report older than per-round figures?)")
        except (OSError, ValueError) as error:
            raise SystemExit(f"{path}: {error}") from None
        reports.append(report)
    versions = sorted({str(r.get("simulator_version")) for r in reports})
    if len(versions) > 1:
        raise SystemExit(
            f"the reports come from simulator versions {versions}: re-score their records with one version first"
        )
    protocols = sorted({str(r.get("settings", {}).get("optimizer_primed", False)) for r in reports})
    if len(protocols) > 1:
        raise SystemExit(
            f"the reports time steps under different protocols (optimizer_primed {protocols}): pool each on its own"
        )
    print(
        json.dumps(
            {
                "benchmark": "simulator_accuracy_pooled",
                "simulator_version": versions[0],
                "optimizer_primed": protocols[0] == "True",
                "targets": TARGETS,
                **pooled_scores(reports),
                "noise": {"kendall_tau_split_half_within": split_half_tau(reports)},
                "resolved_pairs": resolved_pairs(pooled_rounds(reports)),
                "runs": {
                    str(path): {**r["overall"], "resolved_pairs": resolved_pairs(pooled_rounds([r]))["overall"]}
                    for path, r in zip(args.reports, reports, strict=True)
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
