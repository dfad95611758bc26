"""The optimization itself: search, then (optionally) a few real trials, then the answer.

This is the one function a job runs. It knows nothing about the database or HTTP: the worker hands
it the documents, the options, a progress callback and a cancel check, and persists what it returns
(and each trial as it finishes, through `on_trial`). The answer is the fastest strategy a trial
measured; without trials (no backend, budget 0, every trial failed) it is the fastest predicted one,
and the summary says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from models import JobPhase
from optimizer_service.jobs.search_adapter import SearchFn, SearchOutcome, resolve_search, run_search
from optimizer_service.jobs.trial_plan import make_planner, trial_result
from optimizer_service.jobs.types import (
    CancelCheck,
    JobInterrupted,
    PipelineOptions,
    PipelineResult,
    Progress,
    ProgressCallback,
    RankedCandidate,
    TrialExecutor,
    TrialRecord,
)
from stratagem.ir import ModelGraph, ResourceSpec

log = logging.getLogger(__name__)


def run_pipeline(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: PipelineOptions,
    progress: ProgressCallback,
    cancelled: CancelCheck,
    *,
    search: SearchFn | None = None,
    trials: TrialExecutor | None = None,
    on_trial: Callable[[TrialRecord], None] | None = None,
) -> PipelineResult:
    state = Progress(phase=JobPhase.searching)
    clock = _PhaseClock()
    progress(state)
    outcome = _search(graph, resources, options, state, progress, cancelled, search)
    state.timings_s["searching"] = clock.lap()
    candidates = _rank_by_prediction(outcome)
    if not candidates:
        raise JobInterrupted("the search returned no candidate strategy", status="failed")
    records = _trial_phase(graph, resources, options, candidates, state, progress, cancelled, trials, on_trial)
    state.timings_s["trials"] = clock.lap()
    state.phase = JobPhase.finalizing
    progress(state)
    ranked = _rank_final(candidates)
    best = ranked[0]
    summary = _summary(outcome, best, records, state)
    state.timings_s["finalizing"] = clock.lap()
    summary["timings_s"] = dict(state.timings_s)
    progress(state)
    return PipelineResult(candidates=ranked, best=best, trials=records, summary=summary)


def _search(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: PipelineOptions,
    state: Progress,
    progress: ProgressCallback,
    cancelled: CancelCheck,
    search: SearchFn | None,
) -> SearchOutcome:
    def on_progress(evaluated: int, best: float | None) -> None:
        state.candidates_evaluated = evaluated
        if best is not None:
            state.best_step_time_s = best
        progress(state)
        _stop_if_cancelled(cancelled)

    search_fn, engine = (search, "search") if search is not None else resolve_search()
    outcome = run_search(graph, resources, options, on_progress, search=search_fn, engine=engine)
    _stop_if_cancelled(cancelled)
    state.candidates_evaluated = max(state.candidates_evaluated, outcome.evaluated)
    if engine != "search":
        state.notes.append(f"ranked by {engine}: the strategy search is not installed")
    return outcome


def _rank_by_prediction(outcome: SearchOutcome) -> list[RankedCandidate]:
    """Search candidates first, then builder baselines, one entry per distinct strategy."""
    seen: set[str] = set()
    candidates: list[RankedCandidate] = []
    entries = [(s, s.provenance.builder if s.provenance.builder and not s.provenance.search else "search") for s in outcome.candidates]
    entries += [(s, name) for name, s in outcome.baselines.items()]
    for strategy, source in entries:
        if strategy.id in seen or strategy.predicted is None:
            continue
        seen.add(str(strategy.id))
        candidates.append(RankedCandidate(strategy=strategy, source=source))
    candidates.sort(key=_predicted_key)
    for rank, candidate in enumerate(candidates, start=1):
        candidate.rank = rank
    return candidates


def _trial_phase(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: PipelineOptions,
    candidates: list[RankedCandidate],
    state: Progress,
    progress: ProgressCallback,
    cancelled: CancelCheck,
    trials: TrialExecutor | None,
    on_trial: Callable[[TrialRecord], None] | None,
) -> list[TrialRecord]:
    if options.max_trials <= 0:
        state.notes.append("no trials ran: the trial budget is 0")
        return []
    if trials is None:
        state.notes.append("no trials ran: no trial backend is configured; the answer is the simulator's prediction")
        return []
    plan = make_planner(candidates, options.max_trials)
    if plan is None:
        state.notes.append("no trials ran: no candidate is predicted to fit in memory")
        return []
    planner, by_id = plan
    state.phase, state.trials_budget = JobPhase.trials, planner.budget
    progress(state)
    records: list[TrialRecord] = []
    while not planner.done():
        chosen = planner.next_candidates(1)
        if not chosen:
            break
        _stop_if_cancelled(cancelled)
        candidate = by_id[chosen[0]]
        record = _run_one(trials, graph, resources, candidate, state)
        if record is None:
            break
        records.append(record)
        if on_trial is not None:
            on_trial(record)
        planner.record(chosen[0], trial_result(record))
        measured = record.measured()
        if measured is not None:
            candidate.strategy = candidate.strategy.model_copy(update={"measured": measured})
        state.trials_done = len(records)
        progress(state)
    if len(records) < planner.budget and planner.done() and not any("trials stopped" in n for n in state.notes):
        state.notes.append(f"trials stopped after {len(records)} of {planner.budget}: no other candidate could beat the fastest measured")
    return records


def _run_one(
    trials: TrialExecutor, graph: ModelGraph, resources: ResourceSpec, candidate: RankedCandidate, state: Progress
) -> TrialRecord | None:
    """One trial; a backend that cannot run trials at all ends the phase with a note, not the job."""
    try:
        return trials.run(graph, resources, candidate.strategy)
    except JobInterrupted:
        raise
    except Exception as error:  # the backend itself broke (Ray unreachable, ...): answer from predictions
        log.exception("trial backend %s failed", trials.backend)
        state.notes.append(f"trials stopped: the {trials.backend} backend failed ({type(error).__name__}: {error})")
        return None


def _rank_final(candidates: list[RankedCandidate]) -> list[RankedCandidate]:
    """Measured strategies first, fastest first; then the rest by prediction."""

    def key(candidate: RankedCandidate) -> tuple[int, float, int]:
        measured = candidate.strategy.measured
        if measured is not None:
            return (0, measured.step_time_s, candidate.rank)
        return (1, *_predicted_key(candidate)[1:], candidate.rank)

    ranked = sorted(candidates, key=key)
    for rank, candidate in enumerate(ranked, start=1):
        candidate.rank = rank
    return ranked


def _predicted_key(candidate: RankedCandidate) -> tuple[int, float]:
    predicted = candidate.strategy.predicted
    if predicted is None:
        return (2, float("inf"))
    return (0 if predicted.feasible else 1, predicted.step_time_s)


def _summary(outcome: SearchOutcome, best: RankedCandidate, records: list[TrialRecord], state: Progress) -> dict[str, object]:
    measured = best.strategy.measured is not None
    return {
        "engine": outcome.engine,
        "evaluated": outcome.evaluated,
        "search_elapsed_s": outcome.elapsed_s,
        "speedup_vs_data_parallel": outcome.speedup_vs_data_parallel,
        "speedup_vs_best_builder": outcome.speedup_vs_best_builder,
        "trials_ran": len(records),
        "trials_ok": sum(1 for r in records if r.ok),
        "answer_basis": "measured" if measured else "predicted",
        "best_source": best.source,
        "best_strategy_id": best.strategy.id,
        "notes": list(state.notes),
        "search": outcome.details,
    }


def _stop_if_cancelled(cancelled: CancelCheck) -> None:
    if cancelled():
        raise JobInterrupted("cancelled on request", status="cancelled")


class _PhaseClock:
    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        return round(elapsed, 6)

