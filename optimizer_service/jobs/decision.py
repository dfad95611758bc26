"""The job's answer rule: prefer the simpler strategy unless the gain exceeds the prediction's uncertainty.

The rule itself is `optimizer_service.search.simplicity`; this module feeds it a job's candidates on
the basis the job has:

- no trial succeeded: every feasible candidate's prediction (corrected where the learned model applies),
  the bar the fastest one's interval ((high − mid) / mid) where it has one from the model, never below
  the 3% floor;
- trials measured candidates: the measured ones, compared on measured throughput, the bar the
  measurements' noise. When the low-shot planner answered with an untried candidate whose whole
  interval lies below every measurement, that answer stands (`interval_clears_measurements`).

Throughput is compared in samples per second (a candidate's predicted global batch over its step time),
so layouts that train different batches per step compare fairly.
"""

from __future__ import annotations

from collections.abc import Mapping

from optimizer_service.jobs.types import RankedCandidate
from optimizer_service.lowshot import Answer, Interval
from optimizer_service.search.simplicity import (
    BarSource,
    Choice,
    Decision,
    Rule,
    decide,
    predicted_choice,
    simplicity_of,
)

CURRENT = "current"
"""The source of the user's own configuration among a job's candidates: priced, never the answer."""


def decide_answer(
    candidates: list[RankedCandidate],
    intervals: Mapping[str, Interval],
    *,
    planner_answer: Answer | None,
    measurement_noise: float,
    failed: set[str],
) -> Decision | None:
    """The rule's decision for this job; None when no candidate has a usable prediction. Candidates
    whose trial failed, and the user's current configuration, are never the answer."""
    eligible = [c for c in candidates if c.source != CURRENT and str(c.strategy.id) not in failed]
    measured = [c for c in eligible if c.strategy.measured is not None]
    if planner_answer is not None and planner_answer.source == "predicted" and measured:
        return _cleared(eligible, planner_answer, intervals)
    if measured:
        choices = [_measured_choice(c) for c in measured]
        usable = [c for c in choices if c is not None]
        if usable:
            return decide(usable, floor=measurement_noise, floor_source=BarSource.measurement_noise, basis="measured")
    choices = [predicted_choice(c.strategy, label(c), uncertainty=_upper(intervals, c)) for c in eligible]
    usable = [c for c in choices if c is not None]
    return decide(usable) if usable else None


def label(candidate: RankedCandidate) -> str:
    """How the answer names a candidate: its builder, or the search's candidate by its short id."""
    if candidate.source not in ("search", CURRENT):
        return candidate.source
    return f"{candidate.source} candidate {str(candidate.strategy.id)[:8]}"


def _upper(intervals: Mapping[str, Interval], candidate: RankedCandidate) -> float | None:
    interval = intervals.get(str(candidate.strategy.id))
    if interval is None:
        return None
    _, mid, high = interval
    return (high - mid) / mid if mid > 0 else None


def _measured_choice(candidate: RankedCandidate) -> Choice | None:
    """Measured throughput: the samples a step trains (as predicted: the global batch) over the measured
    step, so it compares with other candidates as their predictions do; the trial's own count without one."""
    measured, predicted = candidate.strategy.measured, candidate.strategy.predicted
    if measured is None or measured.step_time_s <= 0:
        return None
    throughput = measured.samples_per_s
    if predicted is not None and predicted.samples_per_s > 0:
        throughput = predicted.samples_per_s * predicted.step_time_s / measured.step_time_s
    if not throughput > 0:
        return None
    return Choice(str(candidate.strategy.id), label(candidate), simplicity_of(candidate.strategy), throughput)


def _cleared(candidates: list[RankedCandidate], answer: Answer, intervals: Mapping[str, Interval]) -> Decision:
    by_id = {str(c.strategy.id): c for c in candidates}
    winner = by_id[answer.candidate_id]
    choice = predicted_choice(winner.strategy, label(winner), uncertainty=_upper(intervals, winner)) or Choice(
        answer.candidate_id, label(winner), simplicity_of(winner.strategy), 0.0
    )
    return Decision(
        Rule.interval_clears_measurements,
        "predicted",
        choice,
        choice,
        0.0,
        BarSource.interval,
        None,
        f"{choice.label} was not measured, but {answer.reason}",
    )
