"""Run strategies for real: a few warm-up and timed steps on worker processes, locally or via Ray.

    result = run_trial(ZooWorkload("resnet50", batch_size=8), resources, strategy, backend=LocalBackend())
    if result.ok:
        strategy = strategy.replace(measured=result.to_measured())

Out-of-memory, crashes, hangs and timeouts come back as `result.outcome` with the error text; only
invalid arguments raise.
"""

from trial_runner.backends import FakeBackend, LocalBackend, RayBackend, TrialBackend, fake_result
from trial_runner.result import Outcome, Progress, RankReport, TrialResult
from trial_runner.spec import TrialSpec, Workload
from trial_runner.trial import run_trial
from trial_runner.workloads import ZOO_ALLOW_LIST, FaultWorkload, ReplayWorkload, ZooWorkload, workload_for_graph

__all__ = [
    "ZOO_ALLOW_LIST",
    "FakeBackend",
    "FaultWorkload",
    "LocalBackend",
    "Outcome",
    "Progress",
    "RankReport",
    "RayBackend",
    "ReplayWorkload",
    "TrialBackend",
    "TrialResult",
    "TrialSpec",
    "Workload",
    "ZooWorkload",
    "fake_result",
    "run_trial",
    "workload_for_graph",
]
