"""How far step-time predictions are from measurements: the scores every benchmark, the learned
correction and the dashboard report.

Every function takes `measured=` and `predicted=` by keyword, so the two can never be swapped: MAPE
divides by the measurement, and a swapped call would silently score another figure. Inputs are any
sequences of floats; empty inputs, or inputs with no order to compare, score NaN.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

Values = Sequence[float] | np.ndarray


def mape(*, measured: Values, predicted: Values) -> float:
    """Mean |predicted − measured| / measured, as a fraction (0.1 = 10%)."""
    m, p = _arrays(measured, predicted)
    return float(np.mean(np.abs(p - m) / m)) if m.size else math.nan


def mean_abs_log_error(*, measured: Values, predicted: Values) -> float:
    """Mean |log(predicted / measured)|: 2× too slow and 2× too fast weigh the same (MAPE caps
    under-prediction at 100% and lets over-prediction grow without bound)."""
    m, p = _arrays(measured, predicted)
    return float(np.mean(np.abs(np.log(p / m)))) if m.size else math.nan


def kendall_tau(*, measured: Values, predicted: Values) -> float:
    """Kendall's tau-b: pairs tied on one side count for neither order; NaN when either side has no
    order at all (fewer than two values, or all equal)."""
    m, p = _arrays(measured, predicted)
    concordant = discordant = ties_measured = ties_predicted = 0
    for i in range(m.size - 1):
        dm, dp = np.sign(m[i + 1 :] - m[i]), np.sign(p[i + 1 :] - p[i])
        untied = (dm != 0) & (dp != 0)
        concordant += int(np.count_nonzero(untied & (dm == dp)))
        discordant += int(np.count_nonzero(untied & (dm != dp)))
        ties_measured += int(np.count_nonzero((dm == 0) & (dp != 0)))
        ties_predicted += int(np.count_nonzero((dm != 0) & (dp == 0)))
    ordered = concordant + discordant
    denominator = (ordered + ties_measured) * (ordered + ties_predicted)
    return (concordant - discordant) / math.sqrt(denominator) if denominator else math.nan


def kendall_tau_within_groups(*, measured: Values, predicted: Values, groups: Sequence[str]) -> float:
    """Mean over groups (jobs, models) of the tau within each; groups with one member, or where either
    side is constant, have no order to compare and are skipped."""
    m, p = _arrays(measured, predicted)
    taus = [kendall_tau(measured=m[rows], predicted=p[rows]) for rows in _by_group(groups).values() if len(rows) > 1]
    finite = [tau for tau in taus if not math.isnan(tau)]
    return float(np.mean(finite)) if finite else math.nan


def kendall_tau_on_pairs(*, measured: Values, predicted: Values, pairs: Sequence[tuple[int, int]]) -> float:
    """Tau over the given index pairs only (those whose measured order is established); a pair
    predicted as a tie counts neither way."""
    if not pairs:
        return math.nan
    m, p = _arrays(measured, predicted)
    return float(np.mean([np.sign(m[i] - m[j]) * np.sign(p[i] - p[j]) for i, j in pairs]))


def top1_regret(*, measured: Values, predicted: Values, groups: Sequence[str]) -> float:
    """Mean over groups of how much slower the predicted-fastest member is than the measured-fastest
    (0.05 = 5%): what a user who takes the prediction's pick loses."""
    m, p = _arrays(measured, predicted)
    regrets = []
    for rows in _by_group(groups).values():
        chosen = rows[int(np.argmin(p[rows]))]
        regrets.append(m[chosen] / m[rows].min() - 1.0)
    return float(np.mean(regrets)) if regrets else math.nan


def _arrays(measured: Values, predicted: Values) -> tuple[np.ndarray, np.ndarray]:
    m, p = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    if m.shape != p.shape:
        raise ValueError(f"measured has {m.size} values and predicted {p.size}: they must pair up")
    return m, p


def _by_group(groups: Sequence[str]) -> dict[str, list[int]]:
    members: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    return members
