"""The learned correction to the simulator: records of measured trials, features, the XGBoost model, metrics.

    records = [make_record(graph, resources, strategy, prediction, measured_step_time_s=0.21), ...]
    model = CostModel().fit(records)
    low, mid, high = model.predict_interval(queries)
    text = model.to_json()             # one JSON document; CostModel.from_json(text) restores it

`Trainer().train(samples)` does it all from full documents (the service's retrain endpoint plugs it in).
"""

from simulator.learned.features import FeatureMatrix, build_features, default_feature_names
from simulator.learned.metrics import CrossValidation, Scores, cross_validate, promotion, score
from simulator.learned.model import CostModel, InvalidCostModelError, NotFittedError, retrain_needed
from simulator.learned.records import (
    InvalidRecordError,
    TrainingRecord,
    make_record,
    read_jsonl,
    write_jsonl,
)
from simulator.learned.training import TrainedModel, Trainer, records_from_samples

__all__ = [
    "CostModel",
    "CrossValidation",
    "FeatureMatrix",
    "InvalidCostModelError",
    "InvalidRecordError",
    "NotFittedError",
    "Scores",
    "TrainedModel",
    "Trainer",
    "TrainingRecord",
    "build_features",
    "cross_validate",
    "default_feature_names",
    "make_record",
    "promotion",
    "read_jsonl",
    "records_from_samples",
    "retrain_needed",
    "score",
    "write_jsonl",
]
