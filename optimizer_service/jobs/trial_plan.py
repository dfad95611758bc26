"""Which candidates a job's trial budget is spent on, through the low-shot planner.

`optimizer_service.lowshot.TrialPlanner` chooses: the predicted best first, a pre-built (builder)
strategy early so the answer is never worse than a measured baseline, then whatever is most likely
to beat the fastest measurement; it stops early once the best is clear. Only feasible candidates are
offered: one predicted not to fit would measure nothing but an out-of-memory.

Without a learned correction a prediction carries no interval, so it gets a symmetric one of
`DEFAULT_RELATIVE_UNCERTAINTY`: wide enough that a few trials, not the simulator alone, settle
close calls.
"""

from __future__ import annotations

from optimizer_service.jobs.types import RankedCandidate, TrialRecord
from optimizer_service.lowshot import Candidate, TrialFailure, TrialPlanner
from stratagem.ir import PredictedPerformance

DEFAULT_RELATIVE_UNCERTAINTY = 0.25
"""Half-width of a simulator-only prediction's interval, relative to the prediction."""


def make_planner(candidates: list[RankedCandidate], budget: int) -> tuple[TrialPlanner, dict[str, RankedCandidate]] | None:
    """A planner over the feasible candidates, and the candidates by id; None when nothing can be tried."""
    offered: dict[str, RankedCandidate] = {}
    planned: list[Candidate] = []
    for candidate in candidates:
        predicted = candidate.strategy.predicted
        if predicted is None or not predicted.feasible or predicted.step_time_s <= 0:
            continue
        offered[str(candidate.strategy.id)] = candidate
        planned.append(_candidate(str(candidate.strategy.id), candidate, predicted))
    if budget <= 0 or not planned:
        return None
    return TrialPlanner(planned, budget=min(budget, len(planned))), offered


def trial_result(record: TrialRecord) -> float | TrialFailure:
    """What the planner records: the median step time, or the failure."""
    if record.ok and record.median_s is not None:
        return record.median_s
    return TrialFailure(reason=record.error or f"outcome {record.outcome}", outcome=record.outcome)


def _candidate(candidate_id: str, candidate: RankedCandidate, predicted: PredictedPerformance) -> Candidate:
    spread = predicted.uncertainty if predicted.uncertainty is not None else DEFAULT_RELATIVE_UNCERTAINTY
    spread = min(max(spread, 0.01), 0.9)
    mid = predicted.step_time_s
    return Candidate(
        candidate_id,
        low=mid * (1 - spread),
        mid=mid,
        high=mid * (1 + spread),
        baseline=candidate.source != "search",
        family=_family(candidate),
    )


def _family(candidate: RankedCandidate) -> str:
    """Strategies that synchronize with the same mix of methods tend to be mispredicted the same way."""
    kinds = sorted({sync.kind for config in candidate.strategy.variables for sync in config.synchronizers})
    return "+".join(kinds) or candidate.source
