"""Updaters the planner calls after each trial: a shared bias learned from the job's own trials, or the cost model refitted on them; and the candidates a cost model's intervals make."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from optimizer_service.lowshot.types import Candidate, Interval
from simulator.learned import CostModel, TrainingRecord


class SharedBiasUpdater:
    """The default refit without a cost model: every trial says how far off the predictions are overall.

    The mean log ratio measured/predicted, shrunk towards zero by `prior_trials` pseudo-trials, scales
    every candidate's original interval. It corrects a shared bias and leaves the order alone.
    """

    def __init__(self, candidates: Sequence[Candidate], *, prior_trials: float = 1.0) -> None:
        self.original = {c.id: (c.low, c.mid, c.high) for c in candidates}
        self.prior_trials = prior_trials

    def __call__(self, measured: Mapping[str, float]) -> dict[str, Interval]:
        return _shift_by_bias(self.original, measured, self.prior_trials)


class CostModelUpdater:
    """Refit the cost model on earlier jobs' trials plus this job's, re-predict every candidate, then
    remove what is left of this job's own bias as `SharedBiasUpdater` does.

    The refit learns what this job's trials say about strategies like them; the bias step matters
    because a job often sits off every earlier job as a whole (another machine load, another model),
    and a few trials among many earlier ones barely move shallow, regularised trees.
    """

    def __init__(
        self,
        history: Sequence[TrainingRecord],
        queries: Mapping[str, TrainingRecord],
        make_model: Callable[[], CostModel] = CostModel,
        *,
        prior_trials: float = 1.0,
    ) -> None:
        self.history = list(history)
        self.queries = dict(queries)
        """Candidate id -> a record without a measurement (the simulator's prediction and summaries)."""
        self.make_model = make_model
        self.prior_trials = prior_trials

    def __call__(self, measured: Mapping[str, float]) -> dict[str, Interval]:
        trials = [
            self.queries[cid].model_copy(update={"measured_step_time_s": seconds}) for cid, seconds in measured.items()
        ]
        model = self.make_model().fit(self.history + trials)
        ids = list(self.queries)
        low, mid, high = model.predict_interval([self.queries[cid] for cid in ids])
        refitted = {cid: (float(lo), float(m), float(hi)) for cid, lo, m, hi in zip(ids, low, mid, high, strict=True)}
        return _shift_by_bias(refitted, measured, self.prior_trials)


def _shift_by_bias(
    intervals: Mapping[str, Interval], measured: Mapping[str, float], prior_trials: float
) -> dict[str, Interval]:
    """Scale every interval by exp(mean log(measured / mid)), the mean shrunk by `prior_trials` pseudo-trials."""
    ratios = [math.log(seconds / intervals[cid][1]) for cid, seconds in measured.items()]
    shift = math.exp(sum(ratios) / (len(ratios) + prior_trials))
    return {cid: (low * shift, mid * shift, high * shift) for cid, (low, mid, high) in intervals.items()}


def candidates_from_model(
    model: CostModel,
    queries: Mapping[str, TrainingRecord],
    *,
    baselines: Sequence[str] = (),
    families: Mapping[str, str] | None = None,
) -> list[Candidate]:
    """Candidates with the model's intervals, ready for a planner."""
    ids = list(queries)
    low, mid, high = model.predict_interval([queries[cid] for cid in ids])
    baseline_ids, families = set(baselines), families or {}
    return [
        Candidate(cid, float(lo), float(m), float(hi), baseline=cid in baseline_ids, family=families.get(cid))
        for cid, lo, m, hi in zip(ids, low, mid, high, strict=True)
    ]
