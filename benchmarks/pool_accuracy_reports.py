"""Score several runs of `benchmarks/simulator_accuracy.py` as one, from the reports they printed.

Each run's report keeps, for every (model, strategy), the median step time of each round and the
prediction made with that round's calibration. Pooling them is what `--from-records` over the
concatenated records files would score (measured: the median over every round; predicted: the median
of the rounds' predictions), and it still works when only the reports were kept. Runs on different
machines pool fine: each round was predicted with the spec calibrated beside it. Reports from
different simulator versions are refused (their predictions are not one simulator's), and so are
reports whose trials timed steps differently (primed and unprimed optimizer state).

    python -m benchmarks.pool_accuracy_reports run-1.json run-2.json run-3.json

Prints one JSON object: the pooled scores in the report's format, and each run's own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.lib.scoring import TARGETS, pooled_rounds, pooled_scores, pooled_split_half_tau, resolved_pairs

PAIR_KEYS = ("model", "strategy", "round_medians_ms", "round_predicted_ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "reports", type=Path, nargs="+", help="JSON reports printed by benchmarks/simulator_accuracy.py"
    )
    args = parser.parse_args(argv)
    reports = []
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
            if report.get("benchmark") != "simulator_accuracy" or not report.get("pairs"):
                raise ValueError("not a simulator_accuracy report with pairs")
            if any(key not in pair for pair in report["pairs"] for key in PAIR_KEYS):
                raise ValueError(f"its pairs lack one of {PAIR_KEYS}")
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
                "noise": {"kendall_tau_split_half_within": pooled_split_half_tau(reports)},
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
