"""The learned correction: simulator when empty, better than the simulator on unseen jobs, JSON only."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError as SklearnNotFittedError

from simulator.learned import (
    CostModel,
    InvalidCostModelError,
    NotFittedError,
    build_features,
    cross_validate,
    retrain_needed,
)
from simulator.learned.features import MONOTONE_INCREASING, breakdown_component, default_feature_names, feature_row
from simulator.learned.synthetic import synthetic_records
from stratagem.errors import StratagemError

SMALL = {"n_estimators": 60, "n_bootstrap": 4}


@pytest.fixture(scope="module")
def records():
    return synthetic_records(n_groups=12, per_group=8, seed=0)


@pytest.fixture(scope="module")
def fitted(records):
    return CostModel(**SMALL).fit(records[:64])


def test_without_trials_the_model_is_exactly_the_simulator(records):
    model = CostModel().fit([])
    simulated = np.array([r.simulated_step_time_s for r in records])
    assert np.array_equal(model.predict(records), simulated)
    low, mid, high = model.predict_interval(records)
    assert np.array_equal(mid, simulated)
    assert np.all(low < mid) and np.all(mid < high)
    assert model.n_train_ == 0 and model.feature_importance() == {}


@pytest.mark.parametrize("call", ["predict", "predict_interval", "predict_log_ratio", "to_json", "feature_importance"])
def test_using_an_unfitted_model_raises_not_fitted(records, call):
    model = CostModel()
    args = () if call in ("to_json", "feature_importance") else (records[:2],)
    with pytest.raises(NotFittedError, match="not fitted"):
        getattr(model, call)(*args)
    assert issubclass(NotFittedError, StratagemError) and issubclass(NotFittedError, SklearnNotFittedError)


def test_correction_beats_the_simulator_on_held_out_jobs(records):
    result = cross_validate(lambda: CostModel(**SMALL), build_features(records), n_splits=4)
    simulator, corrected = result.simulator, result.corrected
    assert simulator.mape > 0.2, "the synthetic simulator should be clearly biased"
    assert corrected.mape < 0.5 * simulator.mape
    assert corrected.kendall_tau >= simulator.kendall_tau
    assert corrected.top1_regret <= simulator.top1_regret
    assert result.n_splits == 4 and corrected.n_groups == 12


def test_correction_learns_a_simulator_that_overrates_communication():
    """On CPU ranks the simulator over-rates some communication: the correction must be free to go down."""
    records = synthetic_records(n_groups=12, per_group=8, seed=1, bias={"compute": 1.0, "allreduce": 0.4, "ps": 0.5})
    result = cross_validate(lambda: CostModel(**SMALL), build_features(records), n_splits=4)
    assert result.simulator.mape > 0.15, "the synthetic simulator should be clearly pessimistic"
    assert result.corrected.mape < 0.5 * result.simulator.mape
    assert result.corrected.kendall_tau >= result.simulator.kendall_tau
    assert result.corrected.top1_regret <= result.simulator.top1_regret


def test_a_correction_that_carries_over_between_jobs_is_applied_in_full(records):
    assert CostModel(**SMALL).fit(records).scale_ > 0.8


def test_job_shifts_that_no_feature_explains_leave_the_model_near_the_simulator():
    """Each job measured at its own random multiple of the simulator: nothing learned from some jobs
    says anything about another's, and the inner cross-validation by job sees that."""
    records = synthetic_records(n_groups=10, per_group=6, seed=3, bias={"compute": 1.0, "allreduce": 1.0, "ps": 1.0})
    rng = np.random.default_rng(0)
    shifts = {f"job-{g}": float(np.exp(rng.normal(0, 0.4))) for g in range(10)}
    shifted = [
        r.model_copy(update={"measured_step_time_s": r.measured_step_time_s * shifts[r.group_id]}) for r in records
    ]
    model = CostModel(**SMALL).fit(shifted)
    assert model.scale_ < 0.3
    unshrunk = CostModel(**SMALL, shrink_folds=0).fit(shifted)
    assert unshrunk.scale_ == 1.0
    assert np.abs(model.predict_log_ratio(records)[0]).max() < np.abs(unshrunk.predict_log_ratio(records)[0]).max()


def _placed(records: list, level: dict[str, float], place_of) -> list:
    return [
        r.model_copy(
            update={
                "source": place_of(r),
                "measured_step_time_s": r.measured_step_time_s * level[place_of(r)],
            }
        )
        for r in records
    ]


def _two_jobs_per_source(record) -> str:
    return f"source-{int(record.group_id.split('-')[1]) // 2}"


def test_trials_from_several_sources_fold_by_source_so_a_level_each_source_shares_is_not_applied():
    """Two jobs per source, every source measured at its own multiple of the simulator: folded by job,
    a source's other job teaches its level and looks transferable; folded by source, it does not."""
    records = synthetic_records(n_groups=12, per_group=6, seed=4, bias={"compute": 1.0, "allreduce": 1.0, "ps": 1.0})
    rng = np.random.default_rng(1)
    level = {f"source-{s}": float(np.exp(rng.normal(0, 0.4))) for s in range(6)}
    placed = _placed(records, level, _two_jobs_per_source)
    by_source = CostModel(**SMALL).fit(placed)
    by_job = CostModel(**SMALL).fit([r.model_copy(update={"source": None}) for r in placed])
    assert by_source.scale_ < 0.3 < by_job.scale_
    assert by_job.place_levels_ == {}


def test_each_source_keeps_its_own_level_and_a_source_without_trials_gets_none():
    """A source's level is its own (its clocks, its harness, what its timer counts): its rows get it back,
    shrunk by `prior_strength` trials, and a row of a source without trials gets the simulator, with an
    interval widened by how far the levels spread."""
    records = synthetic_records(n_groups=12, per_group=6, seed=4, bias={"compute": 1.0, "allreduce": 1.0, "ps": 1.0})
    level = {f"source-{s}": factor for s, factor in enumerate([0.7, 0.8, 0.9, 1.1, 1.25, 1.4])}
    placed = _placed(records, level, _two_jobs_per_source)
    model = CostModel(**SMALL).fit(placed)
    n = 2 * 6
    for source, factor in level.items():
        assert model.place_levels_[source] == pytest.approx(np.log(factor) * n / (n + model.prior_strength), abs=0.02)
    known, known_std = model.predict_log_ratio(placed)
    expected = np.array([model.place_levels_[r.source] for r in placed])
    assert np.abs(known - expected).max() < 0.05
    elsewhere = [r.model_copy(update={"source": "a-new-cluster"}) for r in placed]
    unknown, unknown_std = model.predict_log_ratio(elsewhere)
    assert np.abs(unknown).max() < 0.05
    assert model.level_log_std_ > 0.15 and np.all(unknown_std > known_std)
    flat = CostModel(**SMALL, place_levels=False).fit(placed)
    assert flat.place_levels_ == {} and flat.level_log_std_ == 0.0
    assert CostModel.from_json(flat.to_json()).place_levels is False


def test_a_source_of_a_few_trials_weighs_as_much_as_one_of_many_in_the_share_applied():
    """Two sources share an error that varies within each (72 trials); a third of four trials has none.
    Each source is left out in turn and weighs the same, so the third's four trials lower the share
    applied where, counted as four of 76, they would not. Every source is measured at the simulator's
    level on average, so what is shared is the within-source shape, not a level."""

    def placed(source: str, records: list) -> list:
        ratio = np.exp(np.mean([np.log(r.measured_step_time_s / r.simulated_step_time_s) for r in records]))
        return [
            r.model_copy(
                update={
                    "source": source,
                    "group_id": f"{source}-{r.group_id}",
                    "measured_step_time_s": r.measured_step_time_s / ratio,
                }
            )
            for r in records
        ]

    biased = {"compute": 1.0, "allreduce": 1.0, "ps": 3.0}
    shared = placed("big", synthetic_records(n_groups=8, per_group=8, seed=1, bias=biased)) + placed(
        "ally", synthetic_records(n_groups=2, per_group=4, seed=2, bias=biased)
    )
    odd = placed(
        "odd", synthetic_records(n_groups=1, per_group=4, seed=3, bias={"compute": 1.0, "allreduce": 1.0, "ps": 1.0})
    )
    assert CostModel(**SMALL).fit(shared).scale_ > 0.9
    assert CostModel(**SMALL).fit(shared + odd).scale_ < 0.8


def test_place_levels_survive_the_json_round_trip_and_bad_ones_are_refused_by_name(records):
    placed = [r.model_copy(update={"source": "even" if i % 2 else "odd"}) for i, r in enumerate(records[:40])]
    model = CostModel(**SMALL).fit(placed)
    document = json.loads(model.to_json())
    assert set(document["place_levels"]) == {"even", "odd"}
    restored = CostModel.from_json(model.to_json())
    assert restored.place_levels_ == model.place_levels_ and restored.version_ == model.version_
    for before, after in zip(model.predict_interval(placed), restored.predict_interval(placed), strict=True):
        assert np.array_equal(before, after)
    with pytest.raises(InvalidCostModelError, match="place_levels"):
        CostModel.from_json(json.dumps({**document, "place_levels": {"even": "fast"}}))


def test_documents_saved_before_the_scale_existed_load_with_their_version(records):
    legacy = CostModel(**SMALL, shrink_folds=0).fit(records[:40])
    document = json.loads(legacy.to_json())
    assert "shrink_folds" not in document["params"] and "scale" not in document
    restored = CostModel.from_json(json.dumps(document))
    assert restored.shrink_folds == 0 and restored.scale_ == 1.0 and restored.version_ == legacy.version_


def test_a_scale_outside_zero_to_one_is_refused_by_name(fitted):
    document = json.loads(fitted.to_json())
    with pytest.raises(InvalidCostModelError, match="scale"):
        CostModel.from_json(json.dumps({**document, "scale": 1.5}))


def test_json_round_trip_gives_identical_predictions(fitted, records):
    text = fitted.to_json()
    document = json.loads(text)
    assert document["format"] == "stratagem-cost-model" and len(document["boosters"]) == SMALL["n_bootstrap"]
    restored = CostModel.from_json(text)
    for before, after in zip(fitted.predict_interval(records), restored.predict_interval(records), strict=True):
        assert np.array_equal(before, after)
    assert restored.version_ == fitted.version_ and restored.get_params() == fitted.get_params()
    assert restored.to_json() == text


def test_version_changes_with_the_training_data(records):
    first = CostModel(**SMALL).fit(records[:40])
    second = CostModel(**SMALL).fit(records[:48])
    assert first.version_.startswith("cm-") and first.version_ != second.version_
    assert CostModel(**SMALL).fit(records[:40]).version_ == first.version_, "fitting is deterministic"


def test_a_tampered_or_foreign_document_is_refused_with_its_field(fitted):
    document = json.loads(fitted.to_json())
    document["residual_log_std"] = 0.001
    with pytest.raises(InvalidCostModelError, match="version"):
        CostModel.from_json(json.dumps(document))
    with pytest.raises(InvalidCostModelError, match="format"):
        CostModel.from_json(json.dumps({**document, "format": "pickle"}))
    with pytest.raises(InvalidCostModelError, match="not JSON"):
        CostModel.from_json("{not json")
    with pytest.raises(InvalidCostModelError, match=r"params\.max_depth"):
        CostModel.from_json(json.dumps({**document, "params": {**document["params"], "max_depth": 0}}))
    with pytest.raises(InvalidCostModelError, match=r"boosters\[0\]"):
        CostModel.from_json(json.dumps({**document, "boosters": [{"learner": "nonsense"}]}))


def test_fitting_on_unmeasured_records_names_the_record():
    queries = synthetic_records(n_groups=1, per_group=3, measured=False)
    with pytest.raises(InvalidCostModelError, match=r"records\[0\]\.measured_step_time_s"):
        CostModel().fit(queries)


def test_bad_hyper_parameters_name_the_parameter(records):
    with pytest.raises(InvalidCostModelError, match=r"params\.learning_rate.*params\.n_bootstrap"):
        CostModel(learning_rate=-1.0, n_bootstrap=0).fit(records)
    with pytest.raises(InvalidCostModelError, match=r"params\.depth"):
        CostModel().set_params(depth=3)


def test_intervals_cover_most_held_out_trials(fitted, records):
    held_out = records[64:]
    low, _, high = fitted.predict_interval(held_out)
    measured = np.array([r.measured_step_time_s for r in held_out])
    assert np.mean((low <= measured) & (measured <= high)) >= 0.75


def test_intervals_are_wide_with_few_trials_and_narrow_with_many(records):
    few = CostModel(**SMALL).fit(records[:3])
    many = CostModel(**SMALL).fit(records[:64])

    def width(model: CostModel) -> float:
        low, _, high = model.predict_interval(records[64:])
        return float(np.median(np.log(high / low)))

    assert width(few) > width(many)


def test_a_monotone_correction_never_decreases_with_exposed_communication(records):
    fitted = CostModel(**SMALL, monotone=True).fit(records[:64])
    matrix = build_features(records[64:], fitted.feature_names_)
    for name in ("exposed_ps_s", "exposed_allreduce_s"):
        column = fitted.feature_names_.index(name)
        previous = None
        for value in np.linspace(0.0, 1.0, 7):
            X = matrix.X.copy()
            X[:, column] = value
            mean, _ = fitted.predict_log_ratio(
                type(matrix)(X, matrix.names, matrix.simulated_s, matrix.measured_s, matrix.groups)
            )
            if previous is not None:
                assert np.all(mean >= previous - 1e-6), f"{name} raised to {value} lowered the correction"
            previous = mean
    assert {"exposed_ps_s", "server_load_max_s", "bubble_s"} <= MONOTONE_INCREASING


def test_predictions_look_columns_up_by_name(fitted, records):
    matrix = build_features(records[64:])
    order = np.random.default_rng(0).permutation(len(matrix.names))
    shuffled = type(matrix)(
        matrix.X[:, order], [matrix.names[i] for i in order], matrix.simulated_s, matrix.measured_s, matrix.groups
    )
    assert np.array_equal(fitted.predict(matrix), fitted.predict(shuffled))
    assert np.array_equal(fitted.predict(records[64:]), fitted.predict(matrix))


def test_feature_importance_finds_the_biased_component(fitted):
    importance = fitted.feature_importance()
    assert abs(sum(importance.values()) - 1) < 1e-9
    top = max(importance, key=importance.get)
    assert top in {"exposed_ps_s", "exposed_ps_share", "strategy_ps_fraction", "comm_share", "compute_share"}


def test_every_feature_is_built_for_a_record(records):
    assert list(feature_row(records[0])) == default_feature_names()


@pytest.mark.parametrize(
    ("key", "component"),
    [
        ("compute", "compute"),
        ("tensor_parallel", "tensor"),
        ("pipeline_bubble", "bubble"),
        ("pipeline_p2p", "pipeline"),
        ("allreduce", "allreduce"),
        ("all_reduce", "allreduce"),
        ("sharded", "sharded"),
        ("reduce_scatter", "sharded"),
        ("ps", "ps"),
        ("ps_load:10.0.0.1:CPU:0", "server_load"),
        ("optimizer_update", "update"),
        ("steps", "other"),
        ("mystery", "other"),
    ],
)
def test_breakdown_keys_fold_into_components(key, component):
    assert breakdown_component(key) == component


def test_retrain_rule():
    assert not retrain_needed(19, every=20)
    assert retrain_needed(20, every=20)
    with pytest.raises(StratagemError, match="every"):
        retrain_needed(5, every=0)
    with pytest.raises(StratagemError, match="n_new_trials"):
        retrain_needed(-1)
