"""How close predicted step times are to measured ones: MAPE, Kendall tau within a group, scaling error.

Every function takes keyword arguments only, so measured and predicted cannot be swapped by accident.
Values are fractions (0.1 = 10%); an empty or undefined score is NaN.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any


def mape(*, measured: Sequence[float], predicted: Sequence[float]) -> float:
    """Mean of |predicted - measured| / measured."""
    _same_length(measured, predicted)
    if not measured:
        return math.nan
    return sum(abs(p - m) / m for m, p in zip(measured, predicted, strict=True)) / len(measured)


def kendall_tau(*, measured: Sequence[float], predicted: Sequence[float]) -> float:
    """Kendall's tau-b between the two orders (ties counted as neither concordant nor discordant, and
    normalised by the untied pairs on each side); NaN with fewer than two rows or a constant side."""
    _same_length(measured, predicted)
    n = len(measured)
    concordant = discordant = tied_m = tied_p = 0
    for i in range(n):
        for j in range(i + 1, n):
            dm = _sign(measured[i] - measured[j])
            dp = _sign(predicted[i] - predicted[j])
            if dm == 0 and dp == 0:
                continue
            if dm == 0:
                tied_m += 1
            elif dp == 0:
                tied_p += 1
            elif dm == dp:
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + tied_m) * (concordant + discordant + tied_p))
    return (concordant - discordant) / denominator if denominator > 0 else math.nan


def kendall_tau_by_group(
    *, measured: Sequence[float], predicted: Sequence[float], groups: Sequence[str]
) -> dict[str, float]:
    """Tau within each group of at least two rows whose tau is defined."""
    _same_length(measured, predicted, groups)
    out = {}
    for group, rows in _members(groups).items():
        if len(rows) < 2:
            continue
        tau = kendall_tau(measured=[measured[i] for i in rows], predicted=[predicted[i] for i in rows])
        if not math.isnan(tau):
            out[group] = tau
    return out


def mean_kendall_tau(*, measured: Sequence[float], predicted: Sequence[float], groups: Sequence[str]) -> float:
    """Mean of `kendall_tau_by_group` (NaN where no group has an order to compare)."""
    taus = kendall_tau_by_group(measured=measured, predicted=predicted, groups=groups)
    return sum(taus.values()) / len(taus) if taus else math.nan


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


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def _members(groups: Sequence[str]) -> dict[str, list[int]]:
    members: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    return members


def _same_length(*columns: Sequence[Any]) -> None:
    lengths = {len(column) for column in columns}
    if len(lengths) > 1:
        raise ValueError(f"columns of different lengths: {sorted(lengths)}")
