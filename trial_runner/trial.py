"""`run_trial`: the one call the service makes to measure a strategy."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from stratagem.errors import InvalidDocumentError, Problem
from stratagem.ir import ResourceSpec, Strategy
from stratagem.ir.document import problems_from_validation_error
from stratagem.ir.strategy import strategy_problems
from trial_runner.backends.base import TrialBackend
from trial_runner.backends.local import LocalBackend
from trial_runner.result import Outcome, TrialResult
from trial_runner.spec import TrialSpec, Workload
from trial_runner.summary import now_utc
from trial_runner.workloads import FaultWorkload, ReplayWorkload


def run_trial(
    workload: Workload,
    resources: ResourceSpec,
    strategy: Strategy,
    *,
    warmup: int = 2,
    steps: int = 5,
    timeout: float = 120.0,
    backend: TrialBackend | None = None,
    seed: int = 0,
    **options: Any,
) -> TrialResult:
    """Run `strategy` for `warmup` + `steps` steps and measure it.

    Arguments that are not a valid trial (wrong types, negative steps) raise InvalidDocumentError
    naming the field. A strategy that does not fit the workload or the cluster is an `invalid`
    outcome, like every other way a trial can fail, because the caller records it either way.
    `options` are further TrialSpec fields (min_stall_s, threads_per_rank, measure_undistributed, ...).
    """
    try:
        spec = TrialSpec(
            workload=workload,
            resources=resources,
            strategy=strategy,
            warmup=warmup,
            steps=steps,
            timeout_s=timeout,
            seed=seed,
            **options,
        )
    except ValidationError as error:
        raise InvalidDocumentError(problems_from_validation_error(error), document="trial spec") from None
    backend = backend or LocalBackend()
    problems = preflight_problems(spec)
    if problems:
        return invalid_result(spec, problems, backend=backend.name)
    return backend.run(spec)


def preflight_problems(spec: TrialSpec) -> list[Problem]:
    """What can be refused before a single process starts: the strategy against the graph and cluster."""
    workload = spec.workload.inner if isinstance(spec.workload, FaultWorkload) else spec.workload
    if isinstance(workload, ReplayWorkload):
        return [
            Problem(f"strategy.{p.path}", p.reason)
            for p in strategy_problems(spec.strategy, workload.graph, spec.resources)
        ]
    devices = set(spec.resources.all_devices)
    problems = [
        Problem(f"strategy.replicas[{i}]", f"device {device!r} is not in the resource spec")
        for i, device in enumerate(spec.strategy.replicas)
        if device not in devices
    ]
    if spec.strategy.resources_id is not None and spec.strategy.resources_id != spec.resources.id:
        problems.append(
            Problem(
                "strategy.resources_id",
                f"made for resource spec {spec.strategy.resources_id[:12]}, not {str(spec.resources.id)[:12]}",
            )
        )
    return problems


def invalid_result(spec: TrialSpec, problems: list[Problem], *, backend: str) -> TrialResult:
    now = now_utc()
    shown = "; ".join(str(p) for p in problems[:10]) + (
        f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
    )
    return TrialResult(
        outcome=Outcome.invalid,
        error=shown,
        world_size=spec.world_size,
        backend=backend,
        workload=spec.workload.label,
        strategy_id=spec.strategy.id,
        resources_id=spec.resources.id,
        global_batch_size=spec.global_batch_size,
        started_at=now.isoformat(),
        finished_at=now.isoformat(),
        wall_s=0.0,
    )
