"""How the simulator prices communication against what the runtime itself timed, per accuracy report.

A step's error mixes compute, the optimizer update and communication; a change to the link probe
should be judged on the last alone. The runtime times its own collectives (launch plus every wait),
so for each strategy this prints predicted communication over measured, and the median per model
and overall. Prints JSON.

    python -m benchmarks.communication_share accuracy-run-ag.json [more reports ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

NOT_COMMUNICATION = frozenset({"compute", "optimizer_update", "pipeline_bubble"})
"""Breakdown parts that are not communication."""

MIN_MS = 0.5
"""A pair whose predicted or measured communication is under this is left out: its ratio is noise."""


def predicted_ms(pair: dict[str, Any]) -> float:
    return sum(v for k, v in pair["predicted_breakdown_ms"].items() if k not in NOT_COMMUNICATION)


def measured_ms(pair: dict[str, Any]) -> float:
    sync = pair["measured_sync_ms"]
    return sync.get("launch", 0.0) + sum(v for k, v in sync.items() if k.startswith("wait"))


def report_ratios(report: dict[str, Any]) -> dict[str, Any]:
    """Median predicted/measured communication per model and over every pair that has some."""
    by_model: dict[str, list[float]] = {}
    for pair in report["pairs"]:
        predicted, measured = predicted_ms(pair), measured_ms(pair)
        if predicted >= MIN_MS and measured >= MIN_MS:
            by_model.setdefault(pair["model"], []).append(predicted / measured)
    ratios = [r for values in by_model.values() for r in values]
    return {
        "pairs": len(ratios),
        "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
        "models": {m: round(statistics.median(v), 3) for m, v in by_model.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="JSON reports of benchmarks/simulator_accuracy.py")
    args = parser.parse_args(argv)
    out = {str(path): report_ratios(json.loads(path.read_text())) for path in args.reports}
    print(json.dumps({"benchmark": "communication_share", "reports": out}, indent=2))


if __name__ == "__main__":
    main()
