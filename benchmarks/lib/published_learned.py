"""The learned correction on published rows, left out one source at a time.

For each source S: fit `simulator.learned.CostModel` on the priced rows of every other source, predict
S's rows, and score the simulator alone and corrected on S (MAPE, Kendall tau within one model on one
cluster). Pooled: every source's held-out predictions together. Beside them, each source's level (its
measured over simulated, shrunk by the model's `prior_strength`) as a model fitted on every row keeps it.
Only `simulator.learned`'s public API is used (`make_record`, `CostModel`); a record's group is the model
on its cluster, its source the row's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.published_rows import Row, cluster_key
from simulator.metrics import kendall_tau_within_groups, mape
from stratagem import ModelGraph, Prediction, ResourceSpec


@dataclass(frozen=True)
class Priced:
    """A row the simulator priced: what a training record is made from."""

    row: Row
    graph: ModelGraph
    resources: ResourceSpec
    prediction: Prediction


def make_records(priced: Sequence[Priced]) -> list[Any]:
    from simulator import SIMULATOR_VERSION
    from simulator.learned import make_record

    records = []
    for item in priced:
        strategy = item.prediction.strategy
        assert strategy is not None
        records.append(
            make_record(
                item.graph,
                item.resources,
                strategy,
                item.prediction,
                measured_step_time_s=item.row.measured_step_s,
                group_id=cluster_key(item.row),
                simulator_version=SIMULATOR_VERSION,
                source=item.row.source,
            )
        )
    return records


def leave_one_source_out(
    priced: Sequence[Priced], *, random_state: int = 0, place_levels: bool = True
) -> dict[str, Any]:
    """Per held-out source and pooled: MAPE and tau of the simulator alone and corrected."""
    from simulator.learned import CostModel

    records = make_records(priced)
    sources = sorted({item.row.source for item in priced})
    per_source: dict[str, Any] = {}
    pooled: dict[str, list[Any]] = {"measured": [], "simulated": [], "corrected": [], "groups": []}
    for held_out in sources:
        test = [i for i, item in enumerate(priced) if item.row.source == held_out]
        train = [i for i, item in enumerate(priced) if item.row.source != held_out]
        measured = [priced[i].row.measured_step_s for i in test]
        simulated = [records[i].simulated_step_time_s for i in test]
        groups = [records[i].group_id for i in test]
        entry: dict[str, Any] = {
            "n_test": len(test),
            "n_train": len(train),
            "simulator": _scores(measured, simulated, groups),
        }
        if not train:
            entry["corrected"] = None
            entry["note"] = "no other source has a priced row to train on"
            per_source[held_out] = entry
            continue
        model = CostModel(random_state=random_state, place_levels=place_levels).fit([records[i] for i in train])
        corrected = [float(x) for x in model.predict([records[i] for i in test])]
        entry["corrected"] = _scores(measured, corrected, groups)
        entry["train_sources"] = sorted({priced[i].row.source for i in train})
        entry["correction_scale"] = model.scale_
        per_source[held_out] = entry
        pooled["measured"] += measured
        pooled["simulated"] += simulated
        pooled["corrected"] += corrected
        pooled["groups"] += groups
    everywhere = CostModel(random_state=random_state, place_levels=place_levels).fit(records)
    return {
        "per_source": per_source,
        "source_levels": {source: round(math.exp(level), 4) for source, level in everywhere.place_levels_.items()},
        "pooled": {
            "n": len(pooled["measured"]),
            "simulator": _scores(pooled["measured"], pooled["simulated"], pooled["groups"]),
            "corrected": _scores(pooled["measured"], pooled["corrected"], pooled["groups"]),
        },
        "sources_priced": sources,
    }


VARIANT_SEEDS = (1, 2)
"""The other `random_state`s the variants refit with (the main run is 0)."""


def loso_variants(priced: Sequence[Priced]) -> dict[str, Any]:
    """The pooled leave-one-source-out scores again at other seeds, and without place levels: how much
    of the correction's edge over the simulator is its seed, and how much its levels."""
    seeds = {
        f"random_state={seed}": leave_one_source_out(priced, random_state=seed)["pooled"] for seed in VARIANT_SEEDS
    }
    flat = leave_one_source_out(priced, place_levels=False)
    return {
        **seeds,
        "without_place_levels": {
            "pooled": flat["pooled"],
            "per_source_corrected": {source: entry["corrected"] for source, entry in flat["per_source"].items()},
        },
    }


def _scores(measured: list[float], predicted: list[float], groups: list[str]) -> dict[str, float | None]:
    return {
        "mape": _finite(mape(measured=measured, predicted=predicted)),
        "kendall_tau": _finite(kendall_tau_within_groups(measured=measured, predicted=predicted, groups=groups)),
    }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)
