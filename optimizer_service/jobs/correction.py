"""Ranking with the learned cost model: the simulator's step time, corrected by what trials taught.

The search ranks with the analytic simulator alone (it must score tens of thousands of candidates).
Its few survivors are then re-predicted by the cost model in use: the simulator's step time is the
model's base margin, so the model only rescales it, and each candidate gets an interval from the
bootstrap ensemble. What a corrected candidate carries afterwards:

- `predicted.step_time_s`: the corrected step time (what candidates are ranked by);
- `predicted.samples_per_s`: rescaled to match it;
- `predicted.uncertainty`: the interval's relative width, (high − low) / step time;
- `predicted.simulated_step_time_s`: the simulator's own step time, and `breakdown` is unchanged, so
  the simulator's account of where the time goes stays readable;
- `provenance.cost_model_version`: the version that corrected it.

A cost model trained on trials from several places (this service's runner, imported published runs)
keeps each place's level apart; the candidates are queried as measured where the job's trials run
(`place`, the trial backend, or `external` for a job without a runner), so that place's level applies
and no other's does.

The candidates are simulated again here because a training record needs what `PredictedPerformance`
drops (each parameter server's load); the model's factor (corrected / simulated) is then applied to
the search's own prediction, so a candidate's numbers stay consistent with its breakdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import simulator
from optimizer_service.jobs.types import RankedCandidate
from optimizer_service.lowshot import Interval, candidates_from_model
from simulator.learned import CostModel, TrainingRecord, make_record
from stratagem.ir import ModelGraph, ResourceSpec, Strategy


@dataclass(frozen=True)
class LoadedCostModel:
    """The version in use, parsed: what a job ranks with."""

    version: str
    """`CostModelVersion.version` (the model's content hash), recorded in each corrected strategy."""
    model: CostModel


def correct_candidates(
    graph: ModelGraph,
    resources: ResourceSpec,
    candidates: Sequence[RankedCandidate],
    cost_model: LoadedCostModel,
    *,
    place: str | None = None,
) -> dict[str, Interval]:
    """Rewrite each feasible candidate's prediction with the correction; its (low, mid, high) by strategy id.

    Candidates the simulator refuses now (or predicts infeasible) keep the simulator's prediction and get no interval.
    """
    eligible = [(c, raw) for c in candidates if (raw := _correctable_step_time(c.strategy)) is not None]
    queries = _queries(graph, resources, [c.strategy for c, _ in eligible], place or "query")
    if not queries:
        return {}
    by_id = {str(c.strategy.id): (c, raw) for c, raw in eligible}
    intervals: dict[str, Interval] = {}
    for planned in candidates_from_model(cost_model.model, queries):
        simulated = queries[planned.id].simulated_step_time_s
        factors = (planned.low / simulated, planned.mid / simulated, planned.high / simulated)
        candidate, raw = by_id[planned.id]
        candidate.strategy = _corrected(candidate.strategy, factors, cost_model.version)
        intervals[planned.id] = (raw * factors[0], raw * factors[1], raw * factors[2])
    return intervals


def _correctable_step_time(strategy: Strategy) -> float | None:
    """The predicted step time a correction scales: only a feasible prediction of a positive time has one."""
    predicted = strategy.predicted
    if predicted is None or not predicted.feasible or not predicted.step_time_s > 0:
        return None
    return predicted.step_time_s


def _queries(
    graph: ModelGraph, resources: ResourceSpec, strategies: list[Strategy], place: str
) -> dict[str, TrainingRecord]:
    """A record without a measurement per strategy, built the way training records are (same simulator)."""
    queries: dict[str, TrainingRecord] = {}
    for strategy, prediction in zip(strategies, simulator.simulate_each(graph, resources, strategies), strict=True):
        if prediction is None or not prediction.feasible or prediction.step_time_s <= 0:
            continue
        queries[str(strategy.id)] = make_record(
            graph, resources, strategy, prediction, simulator_version=simulator.SIMULATOR_VERSION, source=place
        )
    return queries


def _corrected(strategy: Strategy, factors: tuple[float, float, float], version: str) -> Strategy:
    """The strategy with its prediction scaled by (low, mid, high) factors of the simulator's step time."""
    predicted = strategy.predicted
    if predicted is None:
        return strategy
    raw = predicted.step_time_s
    low, mid, high = (raw * f for f in factors)
    scaled = predicted.model_copy(
        update={
            "step_time_s": mid,
            "samples_per_s": predicted.samples_per_s * raw / mid if mid > 0 else predicted.samples_per_s,
            "uncertainty": (high - low) / mid if mid > 0 else None,
            "simulated_step_time_s": raw,
        }
    )
    provenance = strategy.provenance.model_copy(update={"cost_model_version": version})
    return strategy.model_copy(update={"predicted": scaled, "provenance": provenance})
