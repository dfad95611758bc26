"""The trial planner: which candidate to run next, what a result changes, when to stop (the package
docstring says how)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from scipy.stats import norm

from optimizer_service.lowshot.relevel import DEFAULT_RELEVEL, Relevel, Relevelled
from optimizer_service.lowshot.types import (
    Acquisition,
    Answer,
    Candidate,
    Interval,
    InvalidPlanError,
    TrialFailure,
    Updater,
)
from optimizer_service.lowshot.updaters import (
    SharedBiasUpdater,
)
from stratagem.errors import Problem, StratagemError, TrialFailedError


@dataclass
class _State:
    intervals: dict[str, Interval]
    measured: dict[str, float] = field(default_factory=dict)
    failed: dict[str, TrialFailure] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    """Ids in the order trials were handed out."""
    level: float = 1.0
    """Every interval's factor from re-levelling (1 until a far first measurement)."""
    relevelled: Relevelled | None = None


class TrialPlanner:
    """Chooses trials within a budget; one planner per job."""

    def __init__(
        self,
        candidates: Sequence[Candidate],
        *,
        budget: int = 4,
        acquisition: Acquisition | str = Acquisition.lcb,
        diversity: float = 0.25,
        update: Updater | None = None,
        measurement_noise: float = 0.02,
        interval_z: float = 1.645,
        relevel: Relevel | None = DEFAULT_RELEVEL,
    ) -> None:
        _check_inputs(candidates, budget, diversity, measurement_noise)
        self.candidates = {c.id: c for c in candidates}
        self.budget = budget
        self.acquisition = Acquisition(acquisition)
        self.diversity = diversity
        self.update = update if update is not None else SharedBiasUpdater(candidates)
        self.measurement_noise = measurement_noise
        """Relative spread of a measured step time (run-to-run noise), its interval's half-width."""
        self.interval_z = interval_z
        """How many standard deviations the candidates' intervals span on each side (for expected improvement)."""
        self.relevel = relevel
        """When the first measurement re-levels every candidate; None never re-levels."""
        self._state = _State(intervals={c.id: (c.low, c.mid, c.high) for c in candidates})

    # --- what the driver calls -------------------------------------------------------------------

    def next_candidates(self, k: int = 1) -> list[str]:
        """Up to k ids to run now (fewer when the budget or the candidates run out, none when done)."""
        if k < 1:
            raise InvalidPlanError([Problem("k", f"must be at least 1, got {k}")])
        chosen: list[str] = []
        limit = min(k, self.trials_left)
        while len(chosen) < limit and not self._best_is_settled():
            pick = self._pick(excluded=set(chosen))
            if pick is None:
                break
            chosen.append(pick)
            self._state.pending.append(pick)
            self._state.order.append(pick)
        return chosen

    def record(self, candidate_id: str, result: float | TrialFailure) -> None:
        """A trial's median step time in seconds, or its failure; then re-rank every candidate."""
        state = self._state
        if candidate_id not in self.candidates:
            raise InvalidPlanError([Problem("candidate_id", f"unknown candidate {candidate_id!r}")])
        if candidate_id in state.measured or candidate_id in state.failed:
            raise InvalidPlanError([Problem("candidate_id", f"{candidate_id!r} was already recorded")])
        if isinstance(result, TrialFailure):
            state.failed[candidate_id] = result
        elif isinstance(result, (int, float)) and not isinstance(result, bool) and math.isfinite(result) and result > 0:
            state.measured[candidate_id] = float(result)
        else:
            raise InvalidPlanError(
                [Problem("result", f"must be a positive number of seconds or a TrialFailure, got {result!r}")]
            )
        if candidate_id in state.pending:
            state.pending.remove(candidate_id)
        else:
            state.order.append(candidate_id)
        if isinstance(result, TrialFailure):
            return
        first = len(state.measured) == 1 and state.relevelled is None
        if first and self.relevel is not None:
            self._relevel(candidate_id, state.measured[candidate_id])
        self._apply_update(self.update({cid: s / state.level for cid, s in state.measured.items()}))
        if first and state.relevelled is not None and state.relevelled.applied:
            levelled = {cid: interval[1] for cid, interval in state.intervals.items()}
            state.relevelled = replace(state.relevelled, levelled=levelled)

    def done(self) -> bool:
        """No trial is out and none is worth starting: budget spent, nothing left, or the best is clear."""
        if self._state.pending:
            return False
        return self.trials_left == 0 or self._pick(excluded=set()) is None or self._best_is_settled()

    def answer(self) -> Answer:
        """The fastest measured candidate, unless an untried one's whole interval is faster still."""
        state = self._state
        alive = [cid for cid in self.candidates if cid not in state.failed]
        if not alive:
            reasons = "; ".join(f"{cid}: {f.outcome} ({f.reason})" for cid, f in list(state.failed.items())[:5])
            raise TrialFailedError(f"every candidate failed its trial: {reasons}")
        untried = [cid for cid in alive if cid not in state.measured]
        if not state.measured:
            best = min(untried, key=lambda cid: state.intervals[cid][1])
            low, mid, high = state.intervals[best]
            return Answer(best, mid, low, high, "predicted", "no trial succeeded; the best prediction stands")
        fastest = min(state.measured, key=state.measured.__getitem__)
        seconds = state.measured[fastest]
        floor, _ = self._measured_interval(seconds)
        # Judge an untried candidate against the measured one on the same footing: scale its interval by
        # how far the measured candidate's own prediction was off, so a bias shared by every prediction
        # (an uncalibrated cluster, a loaded machine) can never make a guess beat a measurement.
        scale = seconds / state.intervals[fastest][1] if state.intervals[fastest][1] > 0 else 1.0
        clearing = [cid for cid in untried if state.intervals[cid][2] * max(scale, 1.0) < floor]
        if clearing:
            best = min(clearing, key=lambda cid: state.intervals[cid][1])
            low, mid, high = (value * max(scale, 1.0) for value in state.intervals[best])
            return Answer(
                best,
                mid,
                low,
                high,
                "predicted",
                f"its upper bound {high:.4g} s is below the fastest measured {seconds:.4g} s ({fastest}) less noise",
            )
        return Answer(
            fastest,
            seconds,
            floor,
            self._measured_interval(seconds)[1],
            "measured",
            f"fastest of {len(state.measured)} measured",
        )

    # --- views -----------------------------------------------------------------------------------

    @property
    def trials_left(self) -> int:
        state = self._state
        return max(0, self.budget - len(state.measured) - len(state.failed) - len(state.pending))

    @property
    def measured(self) -> dict[str, float]:
        return dict(self._state.measured)

    @property
    def failed(self) -> dict[str, TrialFailure]:
        return dict(self._state.failed)

    @property
    def trial_order(self) -> list[str]:
        return list(self._state.order)

    @property
    def relevelled(self) -> Relevelled | None:
        """What the first measurement did to the predictions (None before one, or without the rule)."""
        return self._state.relevelled

    def interval(self, candidate_id: str) -> Interval:
        """The current interval: a measured candidate's is its measurement ± noise."""
        if candidate_id in self._state.measured:
            low, high = self._measured_interval(self._state.measured[candidate_id])
            return low, self._state.measured[candidate_id], high
        return self._state.intervals[candidate_id]

    def ranking(self) -> list[str]:
        """Candidates that have not failed, fastest first by measurement or else by prediction."""
        alive = [cid for cid in self.candidates if cid not in self._state.failed]
        return sorted(alive, key=lambda cid: self.interval(cid)[1])

    # --- choosing --------------------------------------------------------------------------------

    def _pick(self, excluded: set[str]) -> str | None:
        state = self._state
        taken = set(state.measured) | set(state.failed) | set(state.pending) | excluded
        untried = [cid for cid in self.candidates if cid not in taken]
        if not untried:
            return None
        if not taken:
            return min(untried, key=lambda cid: state.intervals[cid][1])
        if not self._baseline_covered(taken):
            baselines = [cid for cid in untried if self.candidates[cid].baseline]
            if baselines:
                return min(baselines, key=lambda cid: state.intervals[cid][1])
        ceiling = self._leader_ceiling()
        worth = [cid for cid in untried if state.intervals[cid][0] < ceiling]
        if not worth:
            return None
        return min(worth, key=lambda cid: self._acquisition_cost(cid, taken))

    def _leader_ceiling(self) -> float:
        """The slowest the fastest measured candidate may really be (its measurement plus noise): an
        untried candidate whose lower bound is under it might still be faster, so it is worth a trial."""
        if not self._state.measured:
            return math.inf
        return self._measured_interval(min(self._state.measured.values()))[1]

    def _baseline_covered(self, taken: set[str]) -> bool:
        """A baseline was measured, or one is out being measured."""
        state = self._state
        return any(self.candidates[cid].baseline and cid not in state.failed for cid in taken)

    def _baseline_measured_or_impossible(self) -> bool:
        state = self._state
        baselines = [cid for cid in self.candidates if self.candidates[cid].baseline]
        return any(cid in state.measured for cid in baselines) or all(cid in state.failed for cid in baselines)

    def _incumbent(self) -> float:
        """What a new trial has to beat: the fastest measurement, else the best prediction still alive."""
        if self._state.measured:
            return min(self._state.measured.values())
        return min(self._state.intervals[cid][1] for cid in self.candidates if cid not in self._state.failed)

    def _acquisition_cost(self, candidate_id: str, taken: set[str]) -> float:
        """Lower is better. Candidates of a family already tried pay 1 + diversity × (earlier members)."""
        family = self.candidates[candidate_id].family
        repeats = sum(1 for cid in taken if family is not None and self.candidates[cid].family == family)
        penalty = 1.0 + self.diversity * repeats
        low, mid, high = self._state.intervals[candidate_id]
        if self.acquisition is Acquisition.lcb:
            return low * penalty
        return -_expected_improvement(self._incumbent(), low, mid, high, self.interval_z) / penalty

    def _best_is_settled(self) -> bool:
        """The measured leader's upper bound is below every other live candidate's lower bound.

        Not before a baseline has been measured (unless every baseline failed): the guarantee that the
        answer is no worse than a builder's strategy rests on a measurement, not on the intervals.
        """
        ranking = self.ranking()
        if not ranking or ranking[0] not in self._state.measured:
            return False
        if not self._baseline_measured_or_impossible():
            return False
        upper = self.interval(ranking[0])[2]
        return all(upper < self.interval(cid)[0] for cid in ranking[1:])

    def _measured_interval(self, seconds: float) -> tuple[float, float]:
        return seconds * (1 - self.measurement_noise), seconds * (1 + self.measurement_noise)

    def _relevel(self, candidate_id: str, seconds: float) -> None:
        """On the first measurement: when it is far from its prediction, multiply every interval by the miss."""
        state = self._state
        predicted = state.intervals[candidate_id]
        factor = seconds / predicted[1]
        applied = self.relevel is not None and self.relevel.far(seconds, predicted)
        state.relevelled = Relevelled(candidate_id, predicted, seconds, factor, applied)
        if not applied:
            return
        state.level = factor
        state.intervals = {
            cid: (low * factor, mid * factor, high * factor) for cid, (low, mid, high) in state.intervals.items()
        }

    def _apply_update(self, fresh: Mapping[str, Interval]) -> None:
        """Take the update's intervals (computed on measurements divided by the level), at the level."""
        level = self._state.level
        for cid, interval in fresh.items():
            if cid not in self.candidates:
                raise StratagemError(f"the update returned an interval for unknown candidate {cid!r}")
            low, mid, high = (float(x) for x in interval)
            if not (0 < low <= mid <= high and math.isfinite(high)):
                raise StratagemError(
                    f"the update returned a bad interval for {cid!r}: low={low}, mid={mid}, high={high}"
                )
            self._state.intervals[cid] = (low * level, mid * level, high * level)


def _expected_improvement(incumbent: float, low: float, mid: float, high: float, z: float) -> float:
    """E[max(incumbent - T, 0)] for a log-normal T with median `mid` and the interval's log width."""
    sigma = (math.log(high) - math.log(low)) / (2 * z) if z > 0 else 0.0
    if sigma <= 0:
        return max(incumbent - mid, 0.0)
    mu = math.log(mid)
    d = (math.log(incumbent) - mu) / sigma
    return float(incumbent * norm.cdf(d) - math.exp(mu + sigma**2 / 2) * norm.cdf(d - sigma))


def run_plan(planner: TrialPlanner, run: Callable[[str], float | TrialFailure], *, batch: int = 1) -> Answer:
    """Drive a planner with a callback that runs one trial; a TrialFailedError it raises is a failure."""
    while not planner.done():
        chosen = planner.next_candidates(batch)
        if not chosen:
            break
        for cid in chosen:
            try:
                result = run(cid)
            except TrialFailedError as error:
                result = TrialFailure(str(error))
            planner.record(cid, result)
    return planner.answer()


def _check_inputs(candidates: Sequence[Candidate], budget: int, diversity: float, noise: float) -> None:
    problems: list[Problem] = []
    if not candidates:
        problems.append(Problem("candidates", "at least one candidate is needed"))
    if budget < 1:
        problems.append(Problem("budget", f"must be at least 1 trial, got {budget}"))
    if diversity < 0:
        problems.append(Problem("diversity", f"must not be negative, got {diversity}"))
    if not 0 <= noise < 1:
        problems.append(Problem("measurement_noise", f"must be in [0, 1), got {noise}"))
    seen: set[str] = set()
    for i, c in enumerate(candidates):
        if c.id in seen:
            problems.append(Problem(f"candidates[{i}].id", f"duplicate id {c.id!r}"))
        seen.add(c.id)
        if not all(math.isfinite(x) for x in (c.low, c.mid, c.high)) or not 0 < c.low <= c.mid <= c.high:
            problems.append(
                Problem(f"candidates[{i}]", f"needs 0 < low <= mid <= high, got {c.low}, {c.mid}, {c.high}")
            )
    if problems:
        raise InvalidPlanError(problems)
