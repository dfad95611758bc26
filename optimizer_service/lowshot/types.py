"""The planner's vocabulary: candidates with their (low, mid, high) step-time intervals, failures, answers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from stratagem.errors import InvalidDocumentError, Problem

Interval = tuple[float, float, float]
"""(low, mid, high) step time in seconds."""


Updater = Callable[[Mapping[str, float]], Mapping[str, Interval]]
"""Given every measured step time so far (id -> seconds), fresh intervals for some or all candidates."""


class Acquisition(StrEnum):
    lcb = "lcb"
    """Lowest lower confidence bound: optimism in the face of uncertainty."""
    ei = "ei"
    """Highest expected improvement over the fastest measured so far (log-normal predictions)."""


class InvalidPlanError(InvalidDocumentError):
    def __init__(self, problems: list[Problem] | str) -> None:
        super().__init__(problems, document="trial plan")


@dataclass(frozen=True)
class Candidate:
    id: str
    low: float
    mid: float
    high: float
    baseline: bool = False
    """A pre-built builder's strategy: one of them is always measured, so the answer is never worse."""
    family: str | None = None
    """Candidates of one family (a builder, a synchronizer mix) are tried together only when nothing else looks as good."""


@dataclass(frozen=True)
class TrialFailure:
    reason: str
    outcome: str = "crash"


@dataclass(frozen=True)
class Answer:
    candidate_id: str
    step_time_s: float
    low: float
    high: float
    source: str
    """`measured` (a trial ran it) or `predicted` (its interval clears every measured candidate)."""
    reason: str
