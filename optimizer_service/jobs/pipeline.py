"""The optimization itself: search, rank (simulator x learned correction), a few real trials, the answer.

This is the one function a job runs. It knows nothing about the database or HTTP: the worker hands
it the documents, the options, the cost model in use, a progress callback and a cancel check, and
persists what it returns (and each trial as it finishes, through `on_trial`).

With a cost model, the search's candidates are re-ranked by the corrected step time and the trial
planner gets the model's intervals (`correction.py`); without one, the simulator alone ranks. The
answer is the planner's: the fastest measured strategy, or an untried one only when its whole
interval lies below every measurement; without trials (no backend, budget 0) it is the fastest
predicted one, and the summary says so. When every candidate offered to trials failed, the job fails.

A resumed job hands in the trials it `recorded` before: they count against the budget and inform the
planner as if just run, so a restart never runs more trials than the budget (nor any twice).

The answer a user gets is then decided by the answer rule (`decision.py`): the simpler strategy unless
a more complex one gains more than the prediction's uncertainty; `result.decision` names the rule that
decided. A first trial far from its prediction re-levels every untried candidate (`lowshot.Relevel`);
`result.relevel` keeps predicted, re-levelled and measured. The user's `current` configuration, when
given, is priced beside the answer (`current.py`); `result.speedup_vs_current` is the answer's predicted
speed-up over it. Candidates that stand for near-copies carry their variants (`result.variants`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from models import JobPhase
from optimizer_service.core.inputs import CLIENT_BACKEND, JobOptions
from optimizer_service.jobs.correction import LoadedCostModel, correct_candidates
from optimizer_service.jobs.current import (
    join_candidates,
    price_for_job,
    relevelled_current,
    speedup_over,
    state_against,
)
from optimizer_service.jobs.decision import decide_answer
from optimizer_service.jobs.search_adapter import SearchFn, SearchOutcome, run_search
from optimizer_service.jobs.trial_plan import make_planner, trial_result
from optimizer_service.jobs.types import (
    CancelCheck,
    Interruption,
    JobInterrupted,
    PipelineResult,
    Progress,
    ProgressCallback,
    RankedCandidate,
    TrialExecutor,
    TrialRecord,
)
from optimizer_service.lowshot import Answer, Interval, Relevel, Relevelled, TrialPlanner
from optimizer_service.search.simplicity import Decision
from stratagem.errors import TrialFailedError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

log = logging.getLogger(__name__)

DATA_PARALLEL = "DataParallel"


def run_pipeline(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: JobOptions,
    progress: ProgressCallback,
    cancelled: CancelCheck,
    *,
    search: SearchFn | None = None,
    trials: TrialExecutor | None = None,
    on_trial: Callable[[TrialRecord], None] | None = None,
    cost_model: LoadedCostModel | None = None,
    recorded: list[TrialRecord] | None = None,
) -> PipelineResult:
    state = Progress(phase=JobPhase.searching, trials_budget=max(options.max_trials, 0))
    clock = _PhaseClock()
    progress(state)
    outcome = _search(graph, resources, options, state, progress, cancelled, search)
    state.timings_s["searching"] = clock.lap()
    candidates = _distinct_candidates(outcome)
    if not candidates:
        raise JobInterrupted("the search returned no candidate strategy", why=Interruption.failed)
    place = trials.backend if trials is not None else CLIENT_BACKEND
    intervals = _correct(graph, resources, candidates, cost_model, state, place)
    _rank_by_prediction(candidates)
    current = price_for_job(graph, resources, options.current, cost_model, state.notes, place=place)
    state.timings_s["ranking"] = clock.lap()
    phase = _trial_phase(
        graph, resources, options, candidates, intervals, state, progress, cancelled, trials, on_trial, recorded or []
    )
    state.timings_s["trials"] = clock.lap()
    state.phase = JobPhase.finalizing
    progress(state)
    phase.decision = decide_answer(
        candidates,
        intervals,
        planner_answer=phase.answer,
        measurement_noise=phase.measurement_noise,
        failed=phase.failed,
    )
    if phase.decision is not None:
        state.notes.append(f"answer: {phase.decision.reason}")
    same_as = join_candidates(candidates, current)
    ranked = _rank_final(candidates, phase)
    best = ranked[0]
    stated = state_against(best, current, same_as=same_as, notes=state.notes) if current is not None else {}
    summary = {**_summary(outcome, best, ranked, phase, state, cost_model), **stated}
    relevel = summary.get("relevel")
    if current is not None and isinstance(relevel, dict):
        relevel["relevelled_s"].update(relevelled_current(current, phase.relevelled))
    state.timings_s["finalizing"] = clock.lap()
    summary["timings_s"] = dict(state.timings_s)
    progress(state)
    return PipelineResult(candidates=ranked, best=best, trials=phase.records, summary=summary)


@dataclass
class _TrialPhase:
    records: list[TrialRecord] = field(default_factory=list)
    answer: Answer | None = None
    """The planner's answer; None when no trials were planned."""
    failed: set[str] = field(default_factory=set)
    """Ids of candidates whose trial failed: never the answer."""
    measurement_noise: float = 0.02
    relevelled: Relevelled | None = None
    relevel_rule: Relevel | None = None
    decision: Decision | None = None
    """The answer rule's decision (`decision.py`), made once the trials are done."""


def _search(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: JobOptions,
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

    outcome = run_search(graph, resources, options, on_progress, search=search)
    _stop_if_cancelled(cancelled)
    state.candidates_evaluated = max(state.candidates_evaluated, outcome.evaluated)
    return outcome


def _distinct_candidates(outcome: SearchOutcome) -> list[RankedCandidate]:
    """Search candidates first, then builder baselines, one entry per distinct strategy."""
    seen: set[str] = set()
    candidates: list[RankedCandidate] = []
    entries = [
        (s, s.provenance.builder if s.provenance.builder and not s.provenance.search else "search")
        for s in outcome.candidates
    ]
    entries += [(s, name) for name, s in outcome.baselines.items()]
    for strategy, source in entries:
        if strategy.id in seen or strategy.predicted is None:
            continue
        seen.add(str(strategy.id))
        candidates.append(RankedCandidate(strategy=strategy, source=source))
    return candidates


def _correct(
    graph: ModelGraph,
    resources: ResourceSpec,
    candidates: list[RankedCandidate],
    cost_model: LoadedCostModel | None,
    state: Progress,
    place: str | None,
) -> dict[str, Interval]:
    """Apply the cost model in use, as measured at `place`: where the job's trials run, or, with no trial
    runner, where a client's own trials come from (`CLIENT_BACKEND`). One that cannot predict leaves the
    simulator's ranking, with a note."""
    if cost_model is None:
        return {}
    try:
        intervals = correct_candidates(graph, resources, candidates, cost_model, place=place)
    except Exception as error:  # a model that cannot predict must not cost the user their answer
        log.exception("cost model %s could not be applied", cost_model.version)
        state.notes.append(
            f"ranked by the simulator alone: cost model {cost_model.version} failed ({type(error).__name__}: {error})"
        )
        return {}
    state.notes.append(
        f"ranked by the simulator corrected by cost model {cost_model.version} "
        f"({len(intervals)} of {len(candidates)} candidates corrected)"
    )
    return intervals


def _rank_by_prediction(candidates: list[RankedCandidate]) -> None:
    candidates.sort(key=_predicted_key)
    for rank, candidate in enumerate(candidates, start=1):
        candidate.rank = rank


def _no_trials(state: Progress, reason: str) -> _TrialPhase:
    """The search showed the requested budget as "trials 0/N"; a job that runs none says 0/0 and why."""
    state.trials_budget = 0
    state.notes.append(f"no trials ran: {reason}")
    return _TrialPhase()


def _trial_phase(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: JobOptions,
    candidates: list[RankedCandidate],
    intervals: dict[str, Interval],
    state: Progress,
    progress: ProgressCallback,
    cancelled: CancelCheck,
    trials: TrialExecutor | None,
    on_trial: Callable[[TrialRecord], None] | None,
    recorded: list[TrialRecord],
) -> _TrialPhase:
    if options.max_trials <= 0:
        return _no_trials(state, "the trial budget is 0")
    if trials is None:
        return _no_trials(state, "no trial backend is configured; the answer is the simulator's prediction")
    if options.search.runner == "engine":
        return _no_trials(
            state,
            "the search looked for layouts torchtitan and Megatron-LM run (runner 'engine'), which trials "
            "through stratagem.distribute cannot; export the answer to the trainer and measure it there",
        )
    plan = make_planner(candidates, options.max_trials, intervals=intervals)
    if plan is None:
        return _no_trials(state, "no candidate is predicted to fit in memory")
    planner, by_id = plan
    state.phase, state.trials_budget = JobPhase.trials, planner.budget
    _note_workload(trials, graph, state)
    records = _resume(planner, by_id, recorded, state)
    progress(state)
    while not planner.done() and len(records) < planner.budget:
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
        state.notes.append(
            f"trials stopped after {len(records)} of {planner.budget}: no other candidate could beat the fastest measured"
        )
    failures = _failure_note(records)
    if failures:
        state.notes.append(failures)
    if planner.relevelled is not None and planner.relevelled.applied and planner.relevel is not None:
        state.notes.append(planner.relevelled.words(planner.relevel))
    return _TrialPhase(
        records=records,
        answer=_answer(planner),
        failed=set(planner.failed),
        measurement_noise=planner.measurement_noise,
        relevelled=planner.relevelled,
        relevel_rule=planner.relevel,
    )


def _resume(
    planner: TrialPlanner, by_id: dict[str, RankedCandidate], recorded: list[TrialRecord], state: Progress
) -> list[TrialRecord]:
    """Feed an earlier attempt's trials to the planner; each one spends the budget, candidate or not."""
    records: list[TrialRecord] = []
    for record in recorded[: planner.budget]:
        records.append(record)
        strategy_id = str(record.strategy.id)
        candidate = by_id.get(strategy_id)
        if candidate is None or strategy_id in planner.measured or strategy_id in planner.failed:
            continue
        planner.record(strategy_id, trial_result(record))
        measured = record.measured()
        if measured is not None:
            candidate.strategy = candidate.strategy.model_copy(update={"measured": measured})
    if records:
        state.notes.append(f"resumed with {len(records)} trial(s) recorded by an earlier attempt")
    state.trials_done = len(records)
    return records


def _failure_note(records: list[TrialRecord]) -> str | None:
    """Failed trials are never the answer; the note says so where the user reads the job, with the first reason."""
    failed = [r for r in records if not r.ok]
    if not failed:
        return None
    first = failed[0]
    reason = f"{first.outcome}: {first.error}" if first.error else first.outcome
    return (
        f"{len(failed)} of {len(records)} trials failed and were not considered for the answer (first: {reason[:300]})"
    )


def _note_workload(trials: TrialExecutor, graph: ModelGraph, state: Progress) -> None:
    """What the trials train, when the executor can say (a replay stands in for a user's own model)."""
    describe = getattr(trials, "workload_note", None)
    note = describe(graph) if callable(describe) else None
    if note:
        state.notes.append(note)


def _answer(planner: TrialPlanner) -> Answer:
    """The planner's answer; when every candidate it was offered failed, the job fails with their reasons."""
    try:
        return planner.answer()
    except TrialFailedError as error:
        raise JobInterrupted(f"no strategy to answer with: {error}", why=Interruption.failed) from None


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


def _rank_final(candidates: list[RankedCandidate], phase: _TrialPhase) -> list[RankedCandidate]:
    """The decided answer first; then measured strategies, fastest first; then the rest by prediction; failed last."""
    answer_id = (
        phase.decision.chosen.id
        if phase.decision is not None
        else phase.answer.candidate_id
        if phase.answer is not None
        else None
    )

    def key(candidate: RankedCandidate) -> tuple[int, int, float, int]:
        strategy_id, measured = str(candidate.strategy.id), candidate.strategy.measured
        if strategy_id == answer_id:
            return (0, 0, 0.0, candidate.rank)
        if measured is not None:
            return (1, 0, measured.step_time_s, candidate.rank)
        tier = 3 if strategy_id in phase.failed else 2
        return (tier, *_predicted_key(candidate), candidate.rank)

    ranked = sorted(candidates, key=key)
    for rank, candidate in enumerate(ranked, start=1):
        candidate.rank = rank
    return ranked


def _predicted_key(candidate: RankedCandidate) -> tuple[int, float]:
    predicted = candidate.strategy.predicted
    if predicted is None:
        return (2, float("inf"))
    return (0 if predicted.feasible else 1, predicted.step_time_s)


def _summary(
    outcome: SearchOutcome,
    best: RankedCandidate,
    ranked: list[RankedCandidate],
    phase: _TrialPhase,
    state: Progress,
    cost_model: LoadedCostModel | None,
) -> dict[str, object]:
    records = phase.records
    basis = "measured" if best.strategy.measured is not None else "predicted"
    builder = outcome.details.get("best_builder")
    summary: dict[str, object] = {
        "evaluated": outcome.evaluated,
        "search_elapsed_s": outcome.elapsed_s,
        "speedup_vs_data_parallel": _speedup_vs(best, ranked, outcome.baselines.get(DATA_PARALLEL)),
        "speedup_vs_best_builder": _speedup_vs(best, ranked, outcome.baselines.get(str(builder))),
        "trials_ran": len(records),
        "trials_ok": sum(1 for r in records if r.ok),
        "answer_basis": basis,
        "best_source": best.source,
        "best_strategy_id": best.strategy.id,
        "cost_model_version": cost_model.version if cost_model is not None else None,
        "notes": list(state.notes),
        "search": outcome.details,
    }
    if phase.answer is not None:
        summary["answer_reason"] = phase.answer.reason
    summary["decision"] = phase.decision.to_json() if phase.decision is not None else None
    if phase.relevelled is not None and phase.relevel_rule is not None:
        summary["relevel"] = phase.relevelled.to_json(phase.relevel_rule)
    summary["variants"] = _variants(ranked)
    return summary


def _speedup_vs(best: RankedCandidate, ranked: list[RankedCandidate], baseline: Strategy | None) -> float | None:
    """The answer's predicted throughput over a baseline's, on one basis: the baseline as a candidate of
    this job (corrected like the answer; a builder whose strategy another one made already is that one)."""
    if baseline is None:
        return None
    same = next((c.strategy for c in ranked if c.strategy.id == baseline.id), baseline)
    return speedup_over(best.strategy, same)


def _variants(ranked: list[RankedCandidate]) -> dict[str, object]:
    """Per candidate that stands for near-copies of itself, its variants (`search/variants.py`)."""
    out: dict[str, object] = {}
    for candidate in ranked:
        record = candidate.strategy.provenance.search or {}
        variants = record.get("variants")
        if candidate.source == "search" and isinstance(variants, dict) and variants.get("count"):
            out[str(candidate.strategy.id)] = variants
    return out


def _stop_if_cancelled(cancelled: CancelCheck) -> None:
    if cancelled():
        raise JobInterrupted("cancelled on request", why=Interruption.cancelled)


class _PhaseClock:
    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        return round(elapsed, 6)
