"""Which few candidates of a job to run for real, and when to stop.

A job may run only a handful of trials (default 4). The planner spends them so that the answer is
(1) never worse than a measured builder baseline, (2) the predicted best is checked, and (3) the rest
go where a trial is most likely to find something faster: lowest lower confidence bound or highest
expected improvement, with a penalty for candidates of a family already tried, since two strategies
of one family tend to be wrong in the same way. After each result the predictions are refitted (by a
callback, e.g. the cost model refit on the new trial) and the planner stops as soon as the best is
clear: its upper bound lies below every other candidate's lower bound.

An uncalibrated cluster shows at the first measurement: when the job's first successful trial lands
far from its prediction (`Relevel.far`: outside its interval, or more than 15% off), every candidate
is re-levelled by that miss (its interval times measured / predicted) before the next choice, so the
rest are judged on the level the cluster actually runs at. The level stays: later refits work on
measurements divided by it and their intervals are multiplied by it.

Pure logic on candidate ids and (low, mid, high) intervals; the service drives it:

    planner = TrialPlanner(candidates, budget=4, update=CostModelUpdater(...))
    while not planner.done():
        for cid in planner.next_candidates(1):
            planner.record(cid, run(cid))          # seconds, or TrialFailure(reason)
    answer = planner.answer()
"""

from optimizer_service.lowshot.planner import TrialPlanner, run_plan
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
from optimizer_service.lowshot.updaters import CostModelUpdater, SharedBiasUpdater, candidates_from_model

__all__ = [
    "DEFAULT_RELEVEL",
    "Acquisition",
    "Answer",
    "Candidate",
    "CostModelUpdater",
    "Interval",
    "InvalidPlanError",
    "Relevel",
    "Relevelled",
    "SharedBiasUpdater",
    "TrialFailure",
    "TrialPlanner",
    "Updater",
    "candidates_from_model",
    "run_plan",
]
