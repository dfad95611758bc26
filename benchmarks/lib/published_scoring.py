"""What the published benchmark scores beyond `simulator.metrics`: tau per group, and scaling error.

MAPE and Kendall's tau-b are `simulator.metrics`' (keyword-only `measured=` and `predicted=`, as every
function here). Values are fractions (0.1 = 10%); an empty or undefined score is NaN.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from simulator.metrics import kendall_tau, kendall_tau_within_groups, mape

__all__ = [
    "kendall_tau",
    "kendall_tau_by_group",
    "kendall_tau_within_groups",
    "mape",
    "max_abs_scaling_error",
    "scaling_errors",
]


def kendall_tau_by_group(
    *, measured: Sequence[float], predicted: Sequence[float], groups: Sequence[str]
) -> dict[str, float]:
    """Tau within each group of at least two rows whose tau is defined (their mean is
    `kendall_tau_within_groups`)."""
    _same_length(measured, predicted, groups)
    out = {}
    for group, rows in _members(groups).items():
        if len(rows) < 2:
            continue
        tau = kendall_tau(measured=[measured[i] for i in rows], predicted=[predicted[i] for i in rows])
        if not math.isnan(tau):
            out[group] = tau
    return out


def scaling_errors(
    *, devices: Sequence[int], measured: Sequence[float], predicted: Sequence[float], series: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """For every series of rows with at least two device counts: each larger run's step time relative to
    the smallest run's, predicted over measured, minus one. 0 means the prediction scales exactly as
    measured; +0.05 that it predicts 5% more slowdown than measured. Where several rows share the
    smallest count, the first is the base."""
    _same_length(devices, measured, predicted, series)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, rows in _members(series).items():
        if len({devices[i] for i in rows}) < 2:
            continue
        base = min(rows, key=lambda i: (devices[i], i))
        points = []
        for i in rows:
            if i == base:
                continue
            measured_ratio = measured[i] / measured[base]
            predicted_ratio = predicted[i] / predicted[base]
            points.append(
                {
                    "devices": devices[i],
                    "base_devices": devices[base],
                    "measured_ratio": measured_ratio,
                    "predicted_ratio": predicted_ratio,
                    "error": predicted_ratio / measured_ratio - 1.0,
                }
            )
        out[name] = points
    return out


def max_abs_scaling_error(errors: dict[str, list[dict[str, Any]]]) -> float:
    values = [abs(point["error"]) for points in errors.values() for point in points]
    return max(values) if values else math.nan


def _members(groups: Sequence[str]) -> dict[str, list[int]]:
    members: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    return members


def _same_length(*columns: Sequence[Any]) -> None:
    lengths = {len(column) for column in columns}
    if len(lengths) > 1:
        raise ValueError(f"columns of different lengths: {sorted(lengths)}")
