"""The user's present configuration, priced beside the answer with the same simulator and correction.

A job may carry `options.current`: a Layout (the short form is parsed at submission) or a Strategy.
After the candidates are ranked it is priced by `stratagem.predict` (a layout's step is all of its
micro-batches, as predict prices it), corrected by the job's cost model the way every candidate is,
and joins the candidates with source `current`: shown and ranked, never tried and never the answer
(the user runs it already). The answer states its predicted speed-up over it: the answer's predicted
samples per second over the current one's, both from the same simulator and the same correction, so a
layout that trains a different global batch per step compares fairly (for equal batches it is the step
time of the current over the answer's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from optimizer_service.jobs.correction import LoadedCostModel, correct_candidates
from optimizer_service.jobs.decision import CURRENT
from optimizer_service.jobs.types import RankedCandidate
from optimizer_service.lowshot import Relevelled
from simulator import SIMULATOR_VERSION
from simulator.step_graph import step_graph
from stratagem.errors import StratagemError
from stratagem.ir import ModelGraph, PredictedPerformance, ResourceSpec, Strategy
from stratagem.layout import Layout
from stratagem.prediction import predict

log = logging.getLogger(__name__)


@dataclass
class PricedCurrent:
    candidate: RankedCandidate
    label: str
    """The layout in short form, or the strategy's description."""
    global_batch: int

    def to_json(self, *, same_as: str | None) -> dict[str, Any]:
        predicted = self.candidate.strategy.predicted
        return {
            "strategy_id": str(self.candidate.strategy.id),
            "label": self.label,
            "same_as": same_as,
            "global_batch": self.global_batch,
            "step_time_s": predicted.step_time_s if predicted else None,
            "samples_per_s": predicted.samples_per_s if predicted else None,
            "feasible": predicted.feasible if predicted else None,
            "infeasible_reason": predicted.infeasible_reason if predicted else None,
            "cost_model_version": self.candidate.strategy.provenance.cost_model_version,
        }


def price_current(
    graph: ModelGraph,
    resources: ResourceSpec,
    current: Layout | Strategy,
    cost_model: LoadedCostModel | None,
    *,
    place: str | None = None,
) -> PricedCurrent:
    """The current configuration as a candidate with its prediction (corrected where the model applies).
    Raises the library's errors when it cannot be built or priced."""
    prediction = predict(graph, resources, current)
    strategy = prediction.strategy
    if strategy is None:  # predict always keeps what it priced
        raise RuntimeError("stratagem.predict returned no strategy")
    predicted = PredictedPerformance(
        step_time_s=prediction.step_time_s,
        samples_per_s=prediction.samples_per_s,
        memory_per_device_bytes=prediction.memory_per_device_bytes,
        feasible=prediction.feasible,
        infeasible_reason=prediction.infeasible_reason,
        breakdown=dict(prediction.breakdown),
        bottleneck=prediction.bottleneck,
    )
    provenance = strategy.provenance.model_copy(update={"simulator_version": SIMULATOR_VERSION})
    strategy = strategy.model_copy(update={"predicted": predicted, "provenance": provenance})
    candidate = RankedCandidate(strategy=strategy, source=CURRENT)
    if cost_model is not None and predicted.feasible and predicted.step_time_s > 0:
        candidate.strategy = _corrected(graph, resources, strategy, cost_model, place)
    return PricedCurrent(candidate=candidate, label=prediction.label, global_batch=prediction.global_batch)


def price_for_job(
    graph: ModelGraph,
    resources: ResourceSpec,
    current: Layout | Strategy | None,
    cost_model: LoadedCostModel | None,
    notes: list[str],
    *,
    place: str | None = None,
) -> PricedCurrent | None:
    """`price_current` for a job: a configuration that cannot be priced now costs a note, not the answer."""
    if current is None:
        return None
    try:
        return price_current(graph, resources, current, cost_model, place=place)
    except StratagemError as error:
        notes.append(f"your current configuration could not be priced: {error}")
    except Exception as error:  # a correction that cannot predict it must not cost the user their answer
        log.exception("pricing the current configuration failed")
        notes.append(f"your current configuration could not be priced ({type(error).__name__}: {error})")
    return None


def join_candidates(candidates: list[RankedCandidate], current: PricedCurrent | None) -> str | None:
    """The current configuration joins the candidates, unless it is one of them already (whose source is returned)."""
    if current is None:
        return None
    strategy_id = str(current.candidate.strategy.id)
    for candidate in candidates:
        if str(candidate.strategy.id) == strategy_id:
            return candidate.source
    candidates.append(current.candidate)
    return None


def state_against(
    answer: RankedCandidate,
    current: PricedCurrent,
    *,
    same_as: str | None,
    notes: list[str],
) -> dict[str, Any]:
    """`result.current` and `result.speedup_vs_current`, and a note saying it in words."""
    speedup = speedup_over(answer.strategy, current.candidate.strategy)
    predicted = current.candidate.strategy.predicted
    if predicted is not None and not predicted.feasible:
        notes.append(
            f"your current configuration ({current.label}) is predicted not to fit: {predicted.infeasible_reason}"
        )
    elif speedup is None:
        notes.append(f"your current configuration ({current.label}) could not be compared with the answer")
    elif speedup >= 1.0:
        notes.append(
            f"the answer is predicted {speedup:.2f}× the throughput of your current configuration ({current.label})"
        )
    else:
        notes.append(
            f"your current configuration ({current.label}) is predicted {1 / speedup:.2f}× the throughput of the "
            "answer: keep it"
        )
    return {"current": current.to_json(same_as=same_as), "speedup_vs_current": speedup}


def relevelled_current(current: PricedCurrent, relevel: Relevelled | None) -> dict[str, float]:
    """The current configuration's prediction re-levelled like every untried candidate, by strategy id
    (empty when the first trial re-levelled nothing). The speed-up over it, a ratio of two predictions
    on one level, does not change."""
    predicted = current.candidate.strategy.predicted
    if relevel is None or not relevel.applied or predicted is None:
        return {}
    return {str(current.candidate.strategy.id): predicted.step_time_s * relevel.factor}


def speedup_over(answer: Strategy, current: Strategy) -> float | None:
    """The answer's predicted throughput over the current configuration's; None when either does not fit."""
    mine, theirs = answer.predicted, current.predicted
    if mine is None or theirs is None or not (mine.feasible and theirs.feasible):
        return None
    if not (mine.samples_per_s > 0 and theirs.samples_per_s > 0):
        return None
    return mine.samples_per_s / theirs.samples_per_s


def _corrected(
    graph: ModelGraph, resources: ResourceSpec, strategy: Strategy, cost_model: LoadedCostModel, place: str | None
) -> Strategy:
    """The correction on the graph the simulator priced: the whole step of a strategy that states its
    micro-batch size (`simulator.step_graph`)."""
    priced = step_graph(graph, strategy.step_samples(graph.batch_size))
    probe = strategy if priced is graph else strategy.model_copy(update={"graph_id": priced.id})
    corrected = RankedCandidate(strategy=probe, source=CURRENT)
    correct_candidates(priced, resources, [corrected], cost_model, place=place)
    return strategy.model_copy(
        update={"predicted": corrected.strategy.predicted, "provenance": corrected.strategy.provenance}
    )
