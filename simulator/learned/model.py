"""The learned correction: XGBoost fits log(measured / simulated) on top of the simulator.

The simulator's log step time is each row's base margin, so the boosters only learn what the
simulator gets wrong; with no trials there are no boosters and the model *is* the simulator, exactly.
A bootstrap ensemble of boosters gives each prediction a spread, widened by the out-of-bag error and
shrunk towards a prior when there are few trials, so early predictions admit they are guesses.
How much of the correction is applied is itself cross-validated by job (`shrink_folds`). Trained on
a few jobs, boosting turns their errors into one shift for every new job. Where the simulator's error
differs from job to job, that shift is as often wrong as right, and the model then stays near the
simulator.

Trials measured in several places (published sources, other deployments) each carry their place's own
level: its clocks, its harness, what its timer includes. A place's level is its mean log ratio, shrunk
towards the simulator by `prior_strength` trials (`place_levels_`). The boosters learn what is left,
how the error varies within a place, which is what can carry over to a place without trials. A row of a
known place gets its level back; a row of any other place gets none, and its interval widens by the
spread of the levels (`level_log_std_`).

Saved as one JSON document (XGBoost's own JSON for each booster, never pickle; `simulator.learned.document`
checks it on load).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import xgboost as xgb
from sklearn.exceptions import NotFittedError as SklearnNotFittedError

from simulator.learned.document import (
    FORMAT,
    FORMAT_VERSION,
    LEGACY_PARAMS,
    InvalidCostModelError,
    check_document,
    check_params,
    load_booster,
)
from simulator.learned.features import FeatureMatrix, build_features, default_feature_names, monotone_constraints
from simulator.learned.metrics import out_of_fold
from simulator.learned.records import TrainingRecord
from stratagem.errors import Problem, StratagemError

Data = Sequence[TrainingRecord] | FeatureMatrix


class NotFittedError(StratagemError, SklearnNotFittedError):
    """`predict` (or `to_json`) was called before `fit` or `from_json`."""


class CostModel:
    """Corrects the simulator's step time; scikit-learn's estimator habits, JSON persistence."""

    def __init__(
        self,
        *,
        n_estimators: int = 150,
        learning_rate: float = 0.05,
        max_depth: int = 3,
        min_child_weight: float = 2.0,
        reg_lambda: float = 5.0,
        colsample_bytree: float = 0.8,
        n_bootstrap: int = 8,
        monotone: bool = False,
        prior_log_std: float = 0.3,
        prior_strength: float = 4.0,
        place_levels: bool = True,
        interval_z: float = 1.645,
        shrink_folds: int = 3,
        random_state: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        """Boosting rounds per booster; at a small learning rate on shallow, L2-shrunk trees, 150 fit a bias fully."""
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.min_child_weight = min_child_weight
        """Trials per leaf at least (squared error has unit hessians), so one odd trial cannot own a leaf."""
        self.reg_lambda = reg_lambda
        """L2 on leaf values: with n trials in a leaf its value is shrunk by n / (n + lambda) towards the simulator."""
        self.colsample_bytree = colsample_bytree
        self.n_bootstrap = n_bootstrap
        """Boosters, each on a bootstrap resample; their spread is the model's own uncertainty."""
        self.monotone = monotone
        """Constrain the correction to be non-decreasing in exposed communication, server load and bubble.

        Off by default: physics makes the step time non-decreasing in them, not the correction on top of
        the simulator (which already grows with them). Constraining the correction asserts that the
        simulator never over-rates communication, and on CPU ranks it does (see docs/cost_model.md)."""
        self.prior_log_std = prior_log_std
        """The simulator's error (std of the log ratio) assumed before any trial."""
        self.prior_strength = prior_strength
        """How many trials the prior is worth: blended with the out-of-bag error, and shrinking each
        place's level towards the simulator (`place_levels_`)."""
        self.place_levels = place_levels
        """Keep each place's level apart where trials come from two or more places (`place_levels_`).
        Off, every place shares one correction: the ablation `benchmarks.published --loso-variants`
        scores."""
        self.interval_z = interval_z
        """Half-width of intervals in standard deviations (1.645: a two-sided 90% interval)."""
        self.shrink_folds = shrink_folds
        """Folds by job of the inner cross-validation that sets `scale_`, the share of the correction
        applied (least squares of the jobs' log ratios on their out-of-fold corrections, in [0, 1]).
        Below 2, or with one job, all of it is applied. `reg_lambda` cannot do this: later boosting
        rounds re-fit whatever it holds back."""
        self.random_state = random_state
        self.n_jobs = n_jobs

    # --- scikit-learn's parameter protocol ----------------------------------------------------------

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _init_parameter_names()}

    def set_params(self, **params: Any) -> Self:
        unknown = sorted(set(params) - set(_init_parameter_names()))
        if unknown:
            raise InvalidCostModelError([Problem(f"params.{name}", "unknown hyper-parameter") for name in unknown])
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.get_params().items() if v != _init_defaults()[k]}
        return f"CostModel({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    # --- fitting ---------------------------------------------------------------------------------

    def fit(self, data: Data) -> Self:
        """Fit on measured trials; an empty set is allowed and leaves the simulator as it is."""
        check_params(self.get_params())
        matrix = _as_matrix(data, default_feature_names())
        _check_measured(matrix)
        self.feature_names_ = list(matrix.names)
        self.boosters_: list[xgb.Booster] = []
        self.residual_log_std_ = float(self.prior_log_std)
        self.scale_ = 1.0
        self.place_levels_ = _place_levels(matrix, self.prior_strength) if self.place_levels else {}
        self.level_log_std_ = _spread(self.place_levels_)
        if len(matrix):
            within = _levelled(matrix, self.place_levels_)
            self.scale_ = self._cross_validated_scale(within)
            self._fit_ensemble(within)
        self.n_train_ = len(matrix)
        self.n_groups_ = len(set(matrix.groups))
        self.metadata_: dict[str, Any] = {
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "xgboost": xgb.__version__,
            "n_train": self.n_train_,
            "n_groups": self.n_groups_,
        }
        self.version_ = self._content_version()
        return self

    def _cross_validated_scale(self, matrix: FeatureMatrix) -> float:
        """Trials measured in several places (published sources, other deployments) are folded by
        place, so the share applied is what holds where the model has not been: a correction that only
        learns each place's own level shrinks towards the simulator. Each place is then a fold of its
        own (leave one place out) and weighs the same in the fit of the share, so a place with many
        trials cannot set what is applied everywhere else."""
        folds, by_place = _fold_labels(matrix)
        distinct = len(set(folds))
        if self.shrink_folds < 2 or distinct < 2:
            return 1.0
        splits = distinct if by_place else min(self.shrink_folds, distinct)
        inner = {**self.get_params(), "shrink_folds": 0, "n_bootstrap": 1}
        folded = FeatureMatrix(
            X=matrix.X, names=matrix.names, simulated_s=matrix.simulated_s, measured_s=matrix.measured_s, groups=folds
        )
        predicted = out_of_fold(lambda: CostModel(**inner), folded, n_splits=splits)
        correction = np.log(predicted) - np.log(matrix.simulated_s)
        residual = np.log(matrix.measured_s) - np.log(matrix.simulated_s)
        if by_place:
            counts = Counter(folds)
            correction = correction / np.sqrt([counts[f] for f in folds])
            residual = residual / np.sqrt([counts[f] for f in folds])
        power = float(correction @ correction)
        return float(np.clip(residual @ correction / power, 0.0, 1.0)) if power > 0 else 1.0

    def _fit_ensemble(self, matrix: FeatureMatrix) -> None:
        rng = np.random.default_rng(self.random_state)
        n = len(matrix)
        target = np.log(matrix.measured_s)
        margin = np.log(matrix.simulated_s)
        oob_sum, oob_count = np.zeros(n), np.zeros(n)
        for index in range(self.n_bootstrap):
            rows = rng.integers(0, n, size=n) if self.n_bootstrap > 1 else np.arange(n)
            train = xgb.DMatrix(
                matrix.X[rows], label=target[rows], base_margin=margin[rows], feature_names=matrix.names
            )
            booster = xgb.train(
                self._xgb_params(seed=self.random_state + index), train, num_boost_round=self.n_estimators
            )
            self.boosters_.append(booster)
            out_of_bag = np.setdiff1d(np.arange(n), rows)
            if out_of_bag.size:
                oob_sum[out_of_bag] += self._tree_output(booster, matrix.X[out_of_bag], matrix.names)
                oob_count[out_of_bag] += 1
        seen = oob_count > 0
        residuals = (target - margin)[seen] - self.scale_ * oob_sum[seen] / oob_count[seen]
        mse = (self.prior_strength * self.prior_log_std**2 + float(np.sum(residuals**2))) / (
            self.prior_strength + int(seen.sum())
        )
        self.residual_log_std_ = math.sqrt(mse)

    def _xgb_params(self, *, seed: int) -> dict[str, Any]:
        params: dict[str, Any] = {
            "objective": "reg:squarederror",
            "eta": self.learning_rate,
            "max_depth": self.max_depth,
            "min_child_weight": self.min_child_weight,
            "lambda": self.reg_lambda,
            "colsample_bytree": self.colsample_bytree,
            "tree_method": "exact",
            "seed": seed,
            "nthread": self.n_jobs,
        }
        if self.monotone:
            params["monotone_constraints"] = "(" + ",".join(map(str, monotone_constraints(self.feature_names_))) + ")"
        return params

    @staticmethod
    def _tree_output(booster: xgb.Booster, X: np.ndarray, names: list[str]) -> np.ndarray:
        """The boosters' correction alone: a zero base margin replaces the simulator's."""
        matrix = xgb.DMatrix(X, base_margin=np.zeros(X.shape[0]), feature_names=names)
        return booster.predict(matrix).astype(np.float64)

    # --- predicting ------------------------------------------------------------------------------

    def predict_log_ratio(self, data: Data) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of log(true / simulated) for each row."""
        self._check_fitted()
        return self._log_ratio(_as_matrix(data, self.feature_names_))

    def predict(self, data: Data) -> np.ndarray:
        """Corrected step time in seconds: simulated × exp(correction)."""
        self._check_fitted()
        matrix = _as_matrix(data, self.feature_names_)
        mean, _ = self._log_ratio(matrix)
        return matrix.simulated_s * np.exp(mean)

    def predict_interval(self, data: Data) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(low, mid, high) step times; low and high are `interval_z` standard deviations out in log space."""
        self._check_fitted()
        matrix = _as_matrix(data, self.feature_names_)
        mean, std = self._log_ratio(matrix)
        simulated, width = matrix.simulated_s, self.interval_z * std
        return simulated * np.exp(mean - width), simulated * np.exp(mean), simulated * np.exp(mean + width)

    def _log_ratio(self, matrix: FeatureMatrix) -> tuple[np.ndarray, np.ndarray]:
        level, known = _row_levels(matrix, self.place_levels_)
        unplaced = np.where(known, 0.0, self.level_log_std_**2)
        if not self.boosters_ or not len(matrix):
            return level, np.sqrt(self.residual_log_std_**2 + unplaced)
        outputs = self.scale_ * np.stack([self._tree_output(b, matrix.X, self.feature_names_) for b in self.boosters_])
        spread = outputs.std(axis=0)
        return level + outputs.mean(axis=0), np.sqrt(spread**2 + self.residual_log_std_**2 + unplaced)

    def feature_importance(self) -> dict[str, float]:
        """Total gain per feature averaged over the ensemble, normalised to sum to 1 (empty without boosters)."""
        self._check_fitted()
        totals = dict.fromkeys(self.feature_names_, 0.0)
        for booster in self.boosters_:
            for name, gain in booster.get_score(importance_type="total_gain").items():
                totals[name] += float(gain) if isinstance(gain, int | float) else math.fsum(gain)
        whole = sum(totals.values())
        return {name: value / whole for name, value in totals.items() if value > 0} if whole > 0 else {}

    def _check_fitted(self) -> None:
        if not hasattr(self, "boosters_"):
            raise NotFittedError(
                "this CostModel is not fitted yet: call fit(records) or CostModel.from_json(text) first"
            )

    # --- persistence -----------------------------------------------------------------------------

    def to_json(self) -> str:
        """The whole model as one JSON document: parameters, feature names, every booster, metadata."""
        self._check_fitted()
        return json.dumps({**self._content(), "version": self.version_, "metadata": self.metadata_})

    @classmethod
    def from_json(cls, text: str | bytes) -> CostModel:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidCostModelError(f"not JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
        check_document(document, _init_parameter_names())
        model = cls(**{**LEGACY_PARAMS, **document["params"]})
        check_params(model.get_params())
        model.feature_names_ = list(document["feature_names"])
        model.boosters_ = [load_booster(raw, i) for i, raw in enumerate(document["boosters"])]
        model.residual_log_std_ = float(document["residual_log_std"])
        model.scale_ = float(document.get("scale", 1.0))
        model.place_levels_ = {str(k): float(v) for k, v in (document.get("place_levels") or {}).items()}
        model.level_log_std_ = _spread(model.place_levels_)
        model.n_train_ = int(document["n_train"])
        model.n_groups_ = int(document["n_groups"])
        model.metadata_ = dict(document.get("metadata") or {})
        model.version_ = model._content_version()
        if document["version"] != model.version_:
            raise InvalidCostModelError(
                [Problem("version", f"{document['version']!r} does not match the content ({model.version_!r})")]
            )
        return model

    def _content(self) -> dict[str, Any]:
        params = {k: v for k, v in self.get_params().items() if not (k in LEGACY_PARAMS and v == LEGACY_PARAMS[k])}
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "params": params,
            "feature_names": self.feature_names_,
            "residual_log_std": self.residual_log_std_,
            **({"scale": self.scale_} if self.scale_ != 1.0 else {}),
            **({"place_levels": self.place_levels_} if self.place_levels_ else {}),
            "n_train": self.n_train_,
            "n_groups": self.n_groups_,
            "boosters": [json.loads(bytes(b.save_raw("json"))) for b in self.boosters_],
        }

    def _content_version(self) -> str:
        canonical = json.dumps(self._content(), sort_keys=True, separators=(",", ":"))
        return "cm-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def retrain_needed(n_new_trials: int, every: int = 20) -> bool:
    """Retrain once `every` trials have been recorded since the model in use was fitted."""
    if every < 1:
        raise InvalidCostModelError([Problem("every", f"must be at least 1, got {every}")])
    if n_new_trials < 0:
        raise InvalidCostModelError([Problem("n_new_trials", f"must not be negative, got {n_new_trials}")])
    return n_new_trials >= every


def _fold_labels(matrix: FeatureMatrix) -> tuple[list[str], bool]:
    """The rows' sources when they come from two or more (and True), else their jobs (and False)."""
    sources = matrix.sources or []
    known = {source for source in sources if source is not None}
    if len(known) >= 2:
        return [source or "" for source in sources], True
    return list(matrix.groups), False


def _place_levels(matrix: FeatureMatrix, prior_strength: float) -> dict[str, float]:
    """Each place's mean log ratio, shrunk towards zero as if `prior_strength` trials had measured the
    simulator exactly; empty unless the trials come from two or more places."""
    places, by_place = _fold_labels(matrix)
    if not by_place:
        return {}
    ratio = matrix.log_ratio
    levels = {}
    for place in sorted(set(places)):
        rows = np.array([p == place for p in places])
        levels[place] = float(ratio[rows].sum() / (rows.sum() + prior_strength))
    return levels


def _spread(levels: dict[str, float]) -> float:
    """How far a place's level lies from the simulator (root mean square): what an unknown place may be off by."""
    return math.sqrt(sum(v * v for v in levels.values()) / len(levels)) if levels else 0.0


def _row_levels(matrix: FeatureMatrix, levels: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's place level (0 for a place without trials) and whether its place had trials."""
    if not levels:
        return np.zeros(len(matrix)), np.ones(len(matrix), dtype=bool)
    if matrix.sources is None:
        return np.zeros(len(matrix)), np.zeros(len(matrix), dtype=bool)
    places = [source or "" for source in matrix.sources]
    known = np.array([place in levels for place in places], dtype=bool)
    return np.array([levels.get(place, 0.0) for place in places]), known


def _levelled(matrix: FeatureMatrix, levels: dict[str, float]) -> FeatureMatrix:
    """The matrix with each row's place level moved into its base margin, leaving the within-place error."""
    if not levels:
        return matrix
    level, _ = _row_levels(matrix, levels)
    return FeatureMatrix(
        X=matrix.X,
        names=matrix.names,
        simulated_s=matrix.simulated_s * np.exp(level),
        measured_s=matrix.measured_s,
        groups=matrix.groups,
        sources=matrix.sources,
    )


def _as_matrix(data: Data, names: Sequence[str]) -> FeatureMatrix:
    if isinstance(data, FeatureMatrix):
        if list(data.names) == list(names):
            return data
        position = {name: i for i, name in enumerate(data.names)}
        columns = [data.X[:, position[n]] if n in position else np.full(len(data), np.nan) for n in names]
        X = np.column_stack(columns) if columns else np.zeros((len(data), 0))
        return FeatureMatrix(
            X=X,
            names=list(names),
            simulated_s=data.simulated_s,
            measured_s=data.measured_s,
            groups=data.groups,
            sources=data.sources,
        )
    return build_features(data, names)


def _check_measured(matrix: FeatureMatrix) -> None:
    missing = np.flatnonzero(np.isnan(matrix.measured_s))
    if missing.size:
        raise InvalidCostModelError(
            [
                Problem(f"records[{i}].measured_step_time_s", "is missing; only measured trials can train the model")
                for i in missing[:10]
            ]
        )


def _init_parameter_names() -> list[str]:
    return [name for name in inspect.signature(CostModel.__init__).parameters if name != "self"]


def _init_defaults() -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(CostModel.__init__).parameters.items() if name != "self"}
