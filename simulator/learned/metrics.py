"""How good a step-time predictor is, judged the way the search uses it.

MAPE says how far off the seconds are; the search only needs the order of one job's candidates
(Kendall tau within a job) and, above all, that the one it picks is fast (top-1 regret). Every score
is cross-validated by job: a job's strategies are all in training or all in test, because a model
that has seen a job's other strategies would look better than it will on a new job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
from sklearn.model_selection import GroupKFold

from simulator.learned.features import FeatureMatrix
from simulator.metrics import kendall_tau_within_groups, mape, mean_abs_log_error, top1_regret
from stratagem.errors import InvalidDocumentError, Problem


class Predictor(Protocol):
    def fit(self, data: FeatureMatrix) -> object: ...
    def predict(self, data: FeatureMatrix) -> np.ndarray: ...


@dataclass(frozen=True)
class Scores:
    mape: float
    """Mean absolute percentage error of the step time, as a fraction (0.1 = 10%)."""
    log_error: float
    """Mean |log(predicted / measured)|: like MAPE, but 2x too slow and 2x too fast weigh the same
    (MAPE caps under-prediction at 100% and lets over-prediction grow without bound)."""
    kendall_tau: float
    """Mean over jobs with at least two trials of Kendall's tau between predicted and measured order."""
    top1_regret: float
    """Mean over jobs of how much slower the predicted-fastest is than the measured-fastest (0.05 = 5%)."""
    n: int
    n_groups: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def score(*, measured: np.ndarray, predicted: np.ndarray, groups: Sequence[str]) -> Scores:
    return Scores(
        mape=mape(measured=measured, predicted=predicted),
        log_error=mean_abs_log_error(measured=measured, predicted=predicted),
        kendall_tau=kendall_tau_within_groups(measured=measured, predicted=predicted, groups=groups),
        top1_regret=top1_regret(measured=measured, predicted=predicted, groups=groups),
        n=len(groups),
        n_groups=len(set(groups)),
    )


@dataclass(frozen=True)
class CrossValidation:
    simulator: Scores
    """The analytic simulator alone on the same rows."""
    corrected: Scores
    """Out-of-fold predictions of the learned model."""
    n_splits: int

    def to_dict(self) -> dict[str, object]:
        return {"simulator": self.simulator.to_dict(), "corrected": self.corrected.to_dict(), "n_splits": self.n_splits}


def cross_validate(make_model: Callable[[], Predictor], data: FeatureMatrix, *, n_splits: int = 5) -> CrossValidation:
    """Out-of-fold predictions with GroupKFold over jobs; needs at least two jobs."""
    n_groups = len(set(data.groups))
    if n_groups < 2:
        raise InvalidDocumentError(
            [Problem("groups", f"cross-validation by job needs at least 2 jobs, got {n_groups}")],
            document="training set",
        )
    if np.isnan(data.measured_s).any():
        raise InvalidDocumentError(
            [Problem("measured_step_time_s", "every row needs a measurement to be scored")], document="training set"
        )
    splits = min(n_splits, n_groups)
    predicted = out_of_fold(make_model, data, n_splits=splits)
    return CrossValidation(
        simulator=score(measured=data.measured_s, predicted=data.simulated_s, groups=data.groups),
        corrected=score(measured=data.measured_s, predicted=predicted, groups=data.groups),
        n_splits=splits,
    )


def out_of_fold(make_model: Callable[[], Predictor], data: FeatureMatrix, *, n_splits: int) -> np.ndarray:
    """Each row's step time predicted by a model fitted on the other folds' jobs (GroupKFold)."""
    predicted = np.empty(len(data))
    for train, test in GroupKFold(n_splits=n_splits).split(data.X, groups=data.groups):
        model = make_model()
        model.fit(data.take(train))
        predicted[test] = model.predict(data.take(test))
    return predicted


REGRET_TOLERANCE = 0.005
"""Top-1 regret a new version may lose against the simulator alone and still serve (half a percent)."""
LOG_ERROR_TOLERANCE = 0.01
"""Mean absolute log error it may lose (about one percent of step time)."""


def promotion(metrics: dict[str, Any]) -> tuple[bool, str]:
    """Whether a newly trained version should serve, and why: only when cross-validation by job does
    not show it worse than the simulator alone in top-1 regret (what a user loses) or in log error. A
    correction learned on other jobs can be worse than none when the simulator's remaining error
    differs from job to job. Without cross-validated metrics (fewer than two jobs) it serves: with few
    trials its ensemble stays close to the simulator."""
    simulator, corrected = metrics.get("simulator"), metrics.get("corrected")
    if not (isinstance(simulator, dict) and isinstance(corrected, dict)):
        return True, "no cross-validated metrics (fewer than two jobs): serves"
    worse = [
        f"{key} {corrected[key]:.4g} > simulator's {simulator[key]:.4g}"
        for key, tolerance in (("top1_regret", REGRET_TOLERANCE), ("log_error", LOG_ERROR_TOLERANCE))
        if _finite(corrected.get(key)) and _finite(simulator.get(key)) and corrected[key] > simulator[key] + tolerance
    ]
    if worse:
        return False, "cross-validated by job it is worse than the simulator alone: " + "; ".join(worse)
    return True, "cross-validated by job it is not worse than the simulator alone"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
