"""Which candidates a job's trial budget is spent on, through the low-shot planner.

`optimizer_service.lowshot.TrialPlanner` chooses: the predicted best first, a pre-built (builder)
strategy early so the answer is never worse than a measured baseline, then whatever is most likely
to beat the fastest measurement; it stops early once the best is clear. Only feasible candidates are
offered: one predicted not to fit would measure nothing but an out-of-memory.

With the learned correction each candidate comes with the cost model's (low, mid, high) interval.
Without one a prediction carries no interval, so it gets a symmetric one of
`DEFAULT_RELATIVE_UNCERTAINTY`: wide enough that a few trials, not the simulator alone, settle
close calls.
"""

from __future__ import annotations

from collections.abc import Mapping

from optimizer_service.jobs.types import RankedCandidate, TrialRecord
from optimizer_service.lowshot import Candidate, Interval, TrialFailure, TrialPlanner
from stratagem.ir import PredictedPerformance

DEFAULT_RELATIVE_UNCERTAINTY = 0.25
"""Half-width of a simulator-only prediction's interval, relative to the prediction."""


def make_planner(
    candidates: list[RankedCandidate], budget: int, *, intervals: Mapping[str, Interval] | None = None
) -> tuple[TrialPlanner, dict[str, RankedCandidate]] | None:
    """A planner over the feasible candidates, and the candidates by id; None when nothing can be tried.

    `intervals` are the cost model's, by strategy id; a candidate without one gets the default.
    """
    offered: dict[str, RankedCandidate] = {}
    planned: list[Candidate] = []
    intervals = intervals or {}
    for candidate in candidates:
        predicted = candidate.strategy.predicted
        if predicted is None or not predicted.feasible or predicted.step_time_s <= 0:
            continue
        candidate_id = str(candidate.strategy.id)
        offered[candidate_id] = candidate
        planned.append(_candidate(candidate_id, candidate, predicted, intervals.get(candidate_id)))
    if budget <= 0 or not planned:
        return None
    return TrialPlanner(planned, budget=min(budget, len(planned))), offered


def trial_result(record: TrialRecord) -> float | TrialFailure:
    """What the planner records: the median step time, or the failure."""
    if record.ok and record.median_s is not None:
        return record.median_s
    return TrialFailure(reason=record.error or f"outcome {record.outcome}", outcome=record.outcome)


def _candidate(
    candidate_id: str, candidate: RankedCandidate, predicted: PredictedPerformance, interval: Interval | None
) -> Candidate:
    if interval is None:
        # `uncertainty` is the interval's whole relative width; the default is a half-width.
        spread = predicted.uncertainty / 2 if predicted.uncertainty is not None else DEFAULT_RELATIVE_UNCERTAINTY
        spread = min(max(spread, 0.01), 0.9)
        mid = predicted.step_time_s
        interval = (mid * (1 - spread), mid, mid * (1 + spread))
    low, mid, high = interval
    return Candidate(
        candidate_id, low=low, mid=mid, high=high, baseline=candidate.source != "search", family=_family(candidate)
    )


def _family(candidate: RankedCandidate) -> str:
    """Strategies that synchronize with the same mix of methods tend to be mispredicted the same way."""
    kinds = sorted({sync.kind for config in candidate.strategy.variables for sync in config.synchronizers})
    return "+".join(kinds) or candidate.source
