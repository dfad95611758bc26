"""Turn the search's archive into the answer: guarded, diverse, decoded, predicted and explained.

Only here do candidates become `Strategy` objects: the few that are returned. A builder's strategy
is returned exactly as its builder made it; the others are decoded from their rows. Every one is
re-simulated with detail (for the breakdown and the bottleneck in words) and checked with
`validate_for` before it leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimizer_service.search.evaluate import Archive, Evaluator
from optimizer_service.search.explain import composition, differences, why
from optimizer_service.search.guard import admissible
from optimizer_service.search.local_search import SUFFIX
from optimizer_service.search.select import default_min_distance, select_diverse, signatures
from optimizer_service.search.simplicity import Choice, Decision, decide, predicted_choice
from optimizer_service.search.space import Space, SpaceSize, size_of
from optimizer_service.search.variants import Group, group_variants, small_variables, variant_keys
from simulator import SIMULATOR_VERSION, CandidateBatch, Prediction, predictions, to_strategy
from stratagem.builders import DataParallel
from stratagem.errors import InfeasibleStrategyError
from stratagem.ir import ModelGraph, Provenance, ResourceSpec, Strategy

DATA_PARALLEL = DataParallel().name
VARIANTS_LISTED = 8
"""Variants described per candidate (all are counted), and differing variables listed per variant."""


@dataclass
class SearchResult:
    candidates: list[Strategy]
    """Best first, at most top_k, different ideas, none predicted slower than the best baseline."""
    baselines: dict[str, Strategy]
    """Every pre-built strategy by builder name (DataParallel included), each with `.predicted` set."""
    best_builder: str | None
    """The fastest feasible AutoDist builder (plain data parallel is reported on its own; None if none fits)."""
    evaluated: int
    """Candidates simulated (duplicates are not counted)."""
    evaluated_by_phase: dict[str, int]
    elapsed_s: float
    speedup_vs_data_parallel: float | None
    """Predicted step time of plain data parallel over the best candidate's (None if it does not fit)."""
    speedup_vs_best_builder: float | None
    space: SpaceSize
    seed: int
    stopped_by: str
    """`candidates` (the candidate budget), `time` (the time budget) or `completed`."""
    decision: Decision | None = None
    """The answer rule (`simplicity.py`) on these predictions at the stated floor: the candidate a user
    should run when nothing else is known. `candidates` stay ranked by prediction; a job applies the
    rule again with the learned correction and its trials."""

    def summary(self) -> dict[str, Any]:
        """The numbers without the strategies, as JSON-ready values (for job progress and logs)."""
        return {
            "best_step_time_s": self.candidates[0].predicted.step_time_s
            if self.candidates and self.candidates[0].predicted
            else None,
            "best_builder": self.best_builder,
            "evaluated": self.evaluated,
            "evaluated_by_phase": dict(self.evaluated_by_phase),
            "elapsed_s": self.elapsed_s,
            "speedup_vs_data_parallel": self.speedup_vs_data_parallel,
            "speedup_vs_best_builder": self.speedup_vs_best_builder,
            "space": self.space.model_dump(),
            "seed": self.seed,
            "stopped_by": self.stopped_by,
            "decision": self.decision.to_json() if self.decision is not None else None,
        }


@dataclass
class Baselines:
    """The pre-built strategies, as built and as rows of the search's batches."""

    names: list[str]
    strategies: list[Strategy]
    batch: CandidateBatch
    build_seconds: list[float] = field(default_factory=list)
    """How long each builder took: the yardstick for how long making a Strategy takes here."""
    predictions: list[Prediction] = field(default_factory=list)

    @property
    def data_parallel(self) -> Prediction | None:
        return self.predictions[self.names.index(DATA_PARALLEL)] if DATA_PARALLEL in self.names else None

    @property
    def best_builder(self) -> tuple[str, Prediction] | None:
        """The fastest feasible AutoDist builder (plain data parallel left out)."""
        feasible = [
            (-p.samples_per_s, i)
            for i, p in enumerate(self.predictions)
            if p.feasible and self.names[i] != DATA_PARALLEL
        ]
        if not feasible:
            return None
        _, i = min(feasible)
        return self.names[i], self.predictions[i]

    @property
    def best_step(self) -> float:
        """The guard's bar: the fastest feasible pre-built strategy, data parallel included."""
        steps = [p.step_time_s for p in self.predictions if p.feasible]
        return min(steps, default=float("inf"))


def answer(
    graph: ModelGraph,
    resources: ResourceSpec,
    space: Space,
    evaluator: Evaluator,
    baselines: Baselines,
    *,
    top_k: int,
    seed: int,
) -> SearchResult:
    baselines.predictions = predictions(space.context, baselines.batch)
    best = baselines.best_builder
    archive, rows, explained, groups = _pick(space, evaluator, baselines, baselines.best_step, top_k)
    shared = {
        "seed": seed,
        "evaluated": evaluator.evaluated,
        "best_builder": best[0] if best else None,
        "options": space.options.as_record(),
    }
    candidates = [
        _candidate(
            space,
            archive,
            int(row),
            prediction,
            baselines,
            rank=rank,
            shared={**shared, "variants": _variants(space, archive, groups[int(row)], prediction)},
        ).validate_for(graph, resources)
        for rank, (row, prediction) in enumerate(zip(rows, explained, strict=True), start=1)
    ]
    speedups = _speedups(explained[0], baselines)
    annotated = _annotated_baselines(baselines)
    return SearchResult(
        candidates=candidates,
        baselines=annotated,
        best_builder=best[0] if best else None,
        evaluated=evaluator.evaluated,
        evaluated_by_phase=dict(evaluator.by_phase),
        elapsed_s=evaluator.elapsed_s,
        speedup_vs_data_parallel=speedups["speedup_vs_data_parallel"],
        speedup_vs_best_builder=speedups["speedup_vs_best_builder"],
        space=size_of(space),
        seed=seed,
        stopped_by="candidates" if evaluator.remaining == 0 else "time" if evaluator.out_of_time else "completed",
        decision=_decision(candidates, annotated),
    )


def _pick(
    space: Space, evaluator: Evaluator, baselines: Baselines, best_step: float, top_k: int
) -> tuple[Archive, np.ndarray, list[Prediction], dict[int, Group]]:
    """Archive rows to return, best first, with their explained predictions and their groups of variants
    (by archive row); raises if nothing fits. Only each group's representative competes for the top-K."""
    archive = evaluator.archive
    allowed = (
        np.zeros(0, dtype=np.intp)
        if archive is None
        else np.flatnonzero(admissible(archive.batch, archive.scores, space.options, best_step))
    )
    if archive is None or len(allowed) == 0:
        reason = baselines.data_parallel.infeasible_reason if baselines.data_parallel else "no baseline"
        limit = "max_candidates" if evaluator.remaining == 0 else "time_budget_s"
        budget = (
            f"; the search stopped at its {limit}, and a larger one may find a candidate" if evaluator.exhausted else ""
        )
        raise InfeasibleStrategyError(
            f"no candidate fits on this cluster after {evaluator.evaluated} evaluated; plain data parallel: "
            f"{reason}{budget}"
        )
    groups = group_variants(variant_keys(space.context, archive.batch.take(allowed)), archive.scores[allowed])
    by_row = {int(allowed[g.representative]): Group(g.key, [int(allowed[m]) for m in g.members]) for g in groups}
    representatives = np.array(sorted(by_row), dtype=np.intp)
    rows = archive.batch.take(representatives)
    picked = representatives[
        select_diverse(
            signatures(space, rows),
            archive.scores[representatives],
            top_k,
            min_distance=default_min_distance(space),
            mixes=rows.kind,
        )
    ]
    explained = predictions(space.context, archive.batch, picked)
    # rank by the explained prediction itself (throughput: layouts differ in global batch), so the order
    # shown is the order of the numbers shown
    order = sorted(range(len(picked)), key=lambda i: -explained[i].samples_per_s)
    return archive, picked[order], [explained[i] for i in order], by_row


def _variants(space: Space, archive: Archive, group: Group, prediction: Prediction) -> dict[str, Any]:
    """The candidate's variants: how many, and for the first few what differs and their predicted step.
    A member that places every small variable as the representative does is the same strategy (its row
    differs only in fields its synchronizers ignore, such as servers of a variable on no server), not a
    variant."""
    small = small_variables(space.context)
    rep = group.representative
    distinct = [
        (row, differs)
        for row in group.variants
        if (differs := differences(space, archive.batch, rep, row, among=small, limit=VARIANTS_LISTED))
    ]
    listed = [
        {"step_time_s": prediction.step_time_s * float(archive.scores[row] / archive.scores[rep]), "differs": differs}
        for row, differs in distinct[:VARIANTS_LISTED]
    ]
    return {"key": group.key, "count": len(distinct), "listed": listed}


def _decision(candidates: list[Strategy], baselines: dict[str, Strategy]) -> Decision | None:
    """The answer rule over the returned candidates and every pre-built strategy, at the floor."""
    choices: dict[str, Choice] = {}
    for name, strategy in baselines.items():
        choice = predicted_choice(strategy, name)
        if choice is not None:
            choices.setdefault(choice.id, choice)
    for rank, strategy in enumerate(candidates, start=1):
        label = strategy.provenance.builder or f"candidate #{rank} ({str(strategy.id)[:8]})"
        choice = predicted_choice(strategy, label)
        if choice is not None:
            choices.setdefault(choice.id, choice)
    return decide(list(choices.values())) if choices else None


def _candidate(
    space: Space,
    archive: Archive,
    row: int,
    prediction: Prediction,
    baselines: Baselines,
    *,
    rank: int,
    shared: dict[str, Any],
) -> Strategy:
    label = str(archive.labels[row])
    builder = label.removeprefix("builder:") if method_of(label) == "builder" else None
    mix = composition(space, archive.batch, row)
    record = {
        "rank": rank,
        "found_by": label,
        "method": method_of(label),
        "why": why(
            prediction,
            mix,
            data_parallel=baselines.data_parallel,
            best_builder=baselines.best_builder,
            builder_name=builder,
        ),
        "composition": mix,
        **_speedups(prediction, baselines),
        **shared,
    }
    strategy = (
        baselines.strategies[baselines.names.index(builder)]
        if builder
        else to_strategy(space.context, archive.batch, row)
    )
    return strategy.model_copy(
        update={
            "predicted": prediction.to_predicted(),
            "provenance": Provenance(builder=builder, search=record, simulator_version=SIMULATOR_VERSION),
        }
    )


def _annotated_baselines(baselines: Baselines) -> dict[str, Strategy]:
    return {
        name: strategy.model_copy(
            update={
                "predicted": prediction.to_predicted(),
                "provenance": strategy.provenance.model_copy(update={"simulator_version": SIMULATOR_VERSION}),
            }
        )
        for name, strategy, prediction in zip(baselines.names, baselines.strategies, baselines.predictions, strict=True)
    }


def _speedups(prediction: Prediction, baselines: Baselines) -> dict[str, float | None]:
    """Predicted throughput (samples/s) over plain data parallel's and the best AutoDist builder's (None if
    it does not fit); for layouts with the same global batch, the step-time ratio."""
    data_parallel, best = baselines.data_parallel, baselines.best_builder
    dp = data_parallel.samples_per_s if data_parallel is not None and data_parallel.feasible else None
    builder = best[1].samples_per_s if best else None
    mine = prediction.samples_per_s
    return {
        "speedup_vs_data_parallel": mine / dp if dp and mine > 0 else None,
        "speedup_vs_best_builder": mine / builder if builder and mine > 0 else None,
    }


def method_of(label: str) -> str:
    """How a candidate was found, from its label: builder, proposal, sampling or local_search."""
    if label.endswith(SUFFIX):
        return "local_search"
    if label.startswith("builder:"):
        return "builder"
    if label == "autosync_sample":
        return "sampling"
    return "proposal"
