"""Re-levelling: when a job's first successful trial lands far from its prediction (an uncalibrated cluster), every candidate is scaled by that miss before the next choice."""

from __future__ import annotations

from dataclasses import dataclass, field

from optimizer_service.lowshot.types import Interval


@dataclass(frozen=True)
class Relevel:
    """The rule for re-levelling on the first measurement, and what it did when it fired."""

    relative: float = 0.15
    """A first measurement more than this far from its prediction (either way) is far."""
    outside_interval: bool = True
    """A first measurement outside the prediction's (low, high) interval is far too."""

    def far(self, measured: float, interval: Interval) -> bool:
        low, mid, high = interval
        off = abs(measured / mid - 1.0) > self.relative
        return off or (self.outside_interval and not low <= measured <= high)


DEFAULT_RELEVEL = Relevel()


@dataclass(frozen=True)
class Relevelled:
    """A re-levelling that happened: which trial, by how much, and every candidate's level after it."""

    candidate_id: str
    predicted: Interval
    """The measured candidate's interval when it ran."""
    measured: float
    factor: float
    """measured / predicted mid: what every interval was multiplied by."""
    applied: bool
    """False when the first measurement was close enough: nothing was re-levelled."""
    levelled: dict[str, float] = field(default_factory=dict)
    """Each candidate's step-time prediction (interval mid) right after the re-levelling."""

    def to_json(self, rule: Relevel) -> dict[str, object]:
        low, mid, high = self.predicted
        return {
            "applied": self.applied,
            "trial_strategy_id": self.candidate_id,
            "predicted_s": mid,
            "interval_s": [low, high],
            "measured_s": self.measured,
            "factor": self.factor,
            "far_when": {"relative": rule.relative, "outside_interval": rule.outside_interval},
            "relevelled_s": dict(self.levelled),
            "reason": self.words(rule),
        }

    def words(self, rule: Relevel) -> str:
        low, mid, high = self.predicted
        where = f"{self.measured:.4g} s against {mid:.4g} s predicted (interval {low:.4g}–{high:.4g} s)"
        if not self.applied:
            return f"the first trial measured {where}: within {rule.relative:.0%} and the interval, so nothing was re-levelled"
        return (
            f"the first trial measured {where}, {self.factor:.2f}× its prediction: far from it (outside its "
            f"interval or more than {rule.relative:.0%} off), so every untried candidate was re-levelled by "
            f"{self.factor:.2f}× before the next choice"
        )
