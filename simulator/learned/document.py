"""The cost model's saved document: its format, the checks it must pass to load, and its errors.

`CostModel.to_json` writes one JSON object (parameters, feature names, every booster as XGBoost's own
JSON, metadata; never pickle) and `CostModel.from_json` reads it back through these checks, so a bad
document is refused with each problem named by its field before anything is built from it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import xgboost as xgb

from stratagem.errors import InvalidDocumentError, Problem

FORMAT = "stratagem-cost-model"
FORMAT_VERSION = 1
LEGACY_PARAMS: dict[str, Any] = {"shrink_folds": 0, "place_levels": True}
"""Hyper-parameters added to format 1 later, at the value that reproduces documents saved without them
(which load with it); a model at that value saves without it, and without `scale` at 1, so versions
stored before keep their content hash."""


class InvalidCostModelError(InvalidDocumentError):
    """Bad hyper-parameters, training data without measurements, or a saved model that does not load."""

    def __init__(self, problems: list[Problem] | str) -> None:
        super().__init__(problems, document="cost model")


_PARAM_RULES: dict[str, tuple[float, float, bool]] = {
    # name: (lowest, highest, must be an integer)
    "n_estimators": (1, 100_000, True),
    "learning_rate": (1e-6, 1.0, False),
    "max_depth": (1, 16, True),
    "min_child_weight": (0.0, math.inf, False),
    "reg_lambda": (0.0, math.inf, False),
    "colsample_bytree": (1e-6, 1.0, False),
    "n_bootstrap": (1, 1000, True),
    "prior_log_std": (0.0, math.inf, False),
    "prior_strength": (0.0, math.inf, False),
    "interval_z": (0.0, math.inf, False),
    "shrink_folds": (0, 100, True),
    "n_jobs": (1, 1024, True),
}


def check_params(params: dict[str, Any]) -> None:
    """Every hyper-parameter in range and of its type, each problem named `params.<name>`."""
    problems = []
    for name, (low, high, integer) in _PARAM_RULES.items():
        value = params[name]
        if integer and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(Problem(f"params.{name}", f"must be an integer, got {value!r}"))
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            problems.append(Problem(f"params.{name}", f"must be a number in [{low}, {high}], got {value!r}"))
    for name in ("monotone", "place_levels"):
        if not isinstance(params[name], bool):
            problems.append(Problem(f"params.{name}", f"must be true or false, got {params[name]!r}"))
    if problems:
        raise InvalidCostModelError(problems)


def check_document(document: Any, known_params: Sequence[str]) -> None:
    """The fields a saved model needs, of the right kinds, naming each that is not; `known_params` are the
    hyper-parameters this library takes."""
    if not isinstance(document, dict):
        raise InvalidCostModelError("a saved cost model is a JSON object")
    if document.get("format") != FORMAT:
        raise InvalidCostModelError([Problem("format", f"expected {FORMAT!r}, got {document.get('format')!r}")])
    if document.get("format_version") != FORMAT_VERSION:
        raise InvalidCostModelError(
            [
                Problem(
                    "format_version",
                    f"{document.get('format_version')!r} is not supported (this library reads {FORMAT_VERSION})",
                )
            ]
        )
    expected: dict[str, type | tuple[type, ...]] = {
        "params": dict,
        "feature_names": list,
        "boosters": list,
        "residual_log_std": (int, float),
        "n_train": int,
        "n_groups": int,
        "version": str,
    }
    problems = [
        Problem(key, f"missing or not a {kind.__name__ if isinstance(kind, type) else 'number'}")
        for key, kind in expected.items()
        if not isinstance(document.get(key), kind)
    ]
    scale = document.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0.0 <= scale <= 1.0:
        problems.append(Problem("scale", f"must be a number in [0, 1], got {scale!r}"))
    levels = document.get("place_levels", {})
    if not isinstance(levels, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in levels.values()
    ):
        problems.append(Problem("place_levels", "must map each place to a finite number"))
    if not problems:
        unknown = sorted(set(document["params"]) - set(known_params))
        problems = [Problem(f"params.{name}", "unknown hyper-parameter") for name in unknown]
    if problems:
        raise InvalidCostModelError(problems)


def load_booster(raw: Any, index: int) -> xgb.Booster:
    """One booster from its XGBoost JSON; a booster that does not load is named by its index."""
    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(json.dumps(raw).encode()))
    except xgb.core.XGBoostError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "unreadable"
        raise InvalidCostModelError([Problem(f"boosters[{index}]", f"XGBoost cannot load it: {first_line}")]) from None
    return booster
