"""The pipeline on its own (no database, no HTTP): search -> trials -> answer, and how it stops."""

from __future__ import annotations

import pytest
from sample_documents import make_embedding_graph, make_mlp_graph, make_t4_cluster

from models import JobPhase
from optimizer_service.core.inputs import JobOptions, SearchBudget
from optimizer_service.jobs.correction import LoadedCostModel
from optimizer_service.jobs.pipeline import run_pipeline
from optimizer_service.jobs.types import Interruption, JobInterrupted, Progress, TrialRecord
from simulator.learned import CostModel
from simulator.learned.synthetic import synthetic_records
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.layout import Layout
from trial_runner.result import Outcome

OPTIONS = JobOptions(max_trials=2, search=SearchBudget(time_budget_s=0.5, max_candidates=300, top_k=3, seed=0))


class BrokenBackend:
    """A trial executor whose backend cannot run anything (as when a Ray cluster is unreachable)."""

    backend = "ray"

    def run(self, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy) -> TrialRecord:
        raise ConnectionError("ray://head:10001 is unreachable")


class TimedBackend:
    """Measures every strategy at 1.5x its prediction (the first one crashes, when told to)."""

    backend = "test"

    def __init__(self, fail_first: bool = False) -> None:
        self.fail_first = fail_first
        self.ran: list[str] = []

    def run(self, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy) -> TrialRecord:
        self.ran.append(str(strategy.id))
        if self.fail_first and len(self.ran) == 1:
            return TrialRecord(strategy=strategy, outcome=Outcome.crash, backend=self.backend, error="rank 1 raised")
        assert strategy.predicted is not None
        step = strategy.predicted.step_time_s * 1.5
        return TrialRecord(
            strategy=strategy,
            outcome=Outcome.ok,
            backend=self.backend,
            step_times_s=[step] * 3,
            median_s=step,
            p90_s=step,
        )


def test_without_trials_the_answer_is_the_decided_prediction_and_progress_walks_the_phases() -> None:
    phases: list[JobPhase] = []
    result = run_pipeline(
        make_mlp_graph(), make_t4_cluster(2), OPTIONS, lambda p: phases.append(p.phase), lambda: False
    )
    assert result.best is result.candidates[0] and result.best.rank == 1
    assert result.summary["answer_basis"] == "predicted" and result.summary["trials_ran"] == 0
    assert result.summary["decision"]["chosen"] == result.best.strategy.id
    assert phases[0] == JobPhase.searching and phases[-1] == JobPhase.finalizing
    steps = [
        c.strategy.predicted.step_time_s
        for c in result.candidates[1:]
        if c.strategy.predicted and c.strategy.predicted.feasible
    ]
    assert steps == sorted(steps)


def test_the_search_shows_the_trial_budget_to_come_and_a_job_without_trials_ends_at_none() -> None:
    budgets: list[tuple[JobPhase, int]] = []
    run_pipeline(
        make_mlp_graph(),
        make_t4_cluster(2),
        OPTIONS,
        lambda p: budgets.append((p.phase, p.trials_budget)),
        lambda: False,
    )
    assert budgets[0] == (JobPhase.searching, OPTIONS.max_trials)
    assert budgets[-1] == (JobPhase.finalizing, 0)  # no backend: nothing ran, and the job says 0/0 with a note


def test_trials_decide_the_answer_and_each_is_reported() -> None:
    backend = TimedBackend()
    reported: list[TrialRecord] = []
    result = run_pipeline(
        make_embedding_graph(),
        make_t4_cluster(2),
        OPTIONS,
        lambda p: None,
        lambda: False,
        trials=backend,
        on_trial=reported.append,
    )
    assert [r.strategy.id for r in reported] == backend.ran and 1 <= len(reported) <= 2
    assert result.summary["answer_basis"] == "measured"
    measured = [c for c in result.candidates if c.strategy.measured is not None]
    assert result.candidates[: len(measured)] == measured
    assert result.best.strategy.measured is not None
    fastest = min(m.strategy.measured.step_time_s for m in measured)  # type: ignore[union-attr]
    # the fastest measured, or a simpler one measured within the measurements' 2% noise of it
    assert result.best.strategy.measured.step_time_s <= fastest * 1.02
    assert result.summary["decision"]["basis"] == "measured"


def test_a_failed_trial_is_recorded_and_never_chosen() -> None:
    backend = TimedBackend(fail_first=True)
    result = run_pipeline(make_mlp_graph(), make_t4_cluster(2), OPTIONS, lambda p: None, lambda: False, trials=backend)
    assert result.trials[0].outcome == "crash" and result.trials[0].error == "rank 1 raised"
    assert result.best.strategy.id != backend.ran[0]
    assert len(result.trials) == 2 and result.summary["trials_ok"] == 1
    assert (
        "1 of 2 trials failed and were not considered for the answer (first: crash: rank 1 raised)"
        in result.summary["notes"]
    )


def test_a_broken_backend_ends_the_trials_with_a_note_not_the_job() -> None:
    result = run_pipeline(
        make_mlp_graph(), make_t4_cluster(2), OPTIONS, lambda p: None, lambda: False, trials=BrokenBackend()
    )
    assert result.summary["answer_basis"] == "predicted"
    assert any("the ray backend failed (ConnectionError" in note for note in result.summary["notes"])


def test_a_cancel_request_stops_the_pipeline() -> None:
    seen: list[Progress] = []
    with pytest.raises(JobInterrupted) as stop:
        run_pipeline(make_mlp_graph(), make_t4_cluster(2), OPTIONS, seen.append, lambda: bool(seen))
    assert stop.value.why == Interruption.cancelled


def test_with_the_learned_correction_the_bar_is_the_fastest_candidates_interval_and_current_is_corrected_too() -> None:
    model = CostModel(n_estimators=40, n_bootstrap=4).fit(synthetic_records(n_groups=4, per_group=8, seed=1))
    options = OPTIONS.model_copy(update={"max_trials": 0, "current": Layout(data=8)})
    result = run_pipeline(
        make_embedding_graph(),
        make_t4_cluster(2),
        options,
        lambda p: None,
        lambda: False,
        cost_model=LoadedCostModel("v1", model),
    )
    decision = result.summary["decision"]
    by_id = {str(c.strategy.id): c for c in result.candidates}
    fastest = by_id[decision["fastest"]].strategy.predicted
    assert decision["bar_source"] == "interval" and 0.03 < decision["bar"] < fastest.uncertainty
    assert decision["chosen"] == str(result.best.strategy.id)
    current = next(c for c in result.candidates if c.source == "current")
    assert current.strategy.provenance.cost_model_version == "v1"
    assert current.strategy.predicted.simulated_step_time_s is not None
    assert result.summary["speedup_vs_current"] == pytest.approx(
        result.best.strategy.predicted.samples_per_s / current.strategy.predicted.samples_per_s
    )
