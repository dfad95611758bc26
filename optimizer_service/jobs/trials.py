"""Running a job's trials through `trial_runner`, and choosing the workload a trial trains.

A graph captured from an allow-listed zoo model trains that model; any other graph trains a replay
of itself (a synthetic module with the graph's variables and per-layer work), so no code from a
request is ever imported. The backend (local processes or Ray) comes from the settings.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from optimizer_service.core.redact import public_text
from optimizer_service.jobs.types import TrialRecord
from optimizer_service.settings import Settings
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from trial_runner.result import Outcome

log = logging.getLogger(__name__)


class TrialRunnerExecutor:
    """`TrialExecutor` over `trial_runner.run_trial` with one backend object."""

    def __init__(
        self,
        backend: Any,
        *,
        name: str,
        warmup: int,
        steps: int,
        timeout_s: float,
        simulator_version: str | None = None,
    ) -> None:
        self.backend = name
        self._backend = backend
        self._warmup = warmup
        self._steps = steps
        self._timeout_s = timeout_s
        self._simulator_version = simulator_version

    def close(self) -> None:
        """Release what the backend holds (a Ray it started itself)."""
        close = getattr(self._backend, "close", None)
        if callable(close):
            close()

    def workload_note(self, graph: ModelGraph) -> str | None:
        """Said in the job's notes when trials train a replay: a user's own model is never imported, so
        its "measured" answer comes from a stand-in, which the user should know when reading the times.
        A replay of the operator trace names the ops it runs as FLOP burns instead."""
        workload = workload_for(graph)
        if not isinstance(workload, importlib.import_module("trial_runner.workloads").ReplayWorkload):
            return None
        if workload.trace is None:
            return (
                "trials trained a replay of the graph (synthetic layers doing each layer's recorded work on its "
                "variables), not the model's own code, which the service never imports"
            )
        burned = importlib.import_module("trial_runner.replay_trace").replay_notes(workload.trace, _device_type())
        note = (
            f"trials trained a replay of the graph's operator trace ({len(workload.trace.forward)} forward and "
            f"{len(workload.trace.backward)} backward ops, the model's own operators on its variables), not the "
            "model's own code, which the service never imports"
        )
        if burned:
            shown = "; ".join(burned[:5]) + (f"; and {len(burned) - 5} more" if len(burned) > 5 else "")
            note += f"; ops replayed as FLOP burns: {shown}"
        return note

    def reap(self, owner: str) -> int:
        """Kill trial workers a crashed service left for `owner` (a job id); how many were found."""
        reap = getattr(self._backend, "reap", None)
        return int(reap(owner)) if callable(reap) else 0

    def run(
        self, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy, *, owner: str | None = None
    ) -> TrialRecord:
        runner = importlib.import_module("trial_runner")
        result = runner.run_trial(
            workload_for(graph),
            resources,
            strategy,
            warmup=self._warmup,
            steps=self._steps,
            timeout=self._timeout_s,
            backend=self._backend,
            owner=owner,
        )
        return record_from_result(result, strategy, simulator_version=self._simulator_version)


def record_from_result(result: Any, strategy: Strategy, *, simulator_version: str | None) -> TrialRecord:
    """A `trial_runner.TrialResult` as the row the database keeps: errors as a client may read them,
    secrets masked and this machine's paths reduced to file names."""
    peaks = [p for p in (result.peak_memory_bytes or []) if p is not None]
    predicted = _simulated_step_time(strategy)
    return TrialRecord(
        strategy=strategy,
        outcome=Outcome(result.outcome),
        backend=str(result.backend),
        step_times_s=list(result.step_times_s),
        median_s=result.median_s,
        p90_s=result.p90_s,
        samples_per_s=result.samples_per_s,
        peak_memory_bytes=max(peaks) if peaks else None,
        error=public_text(result.error) if result.error else None,
        predicted_step_time_s=predicted,
        simulator_version=simulator_version,
        details=_public_details(result.model_dump(mode="json")),
    )


def _public_details(details: dict[str, Any]) -> dict[str, Any]:
    details["error"] = public_text(details["error"]) if details.get("error") else details.get("error")
    for rank in details.get("ranks") or []:
        if rank.get("error"):
            rank["error"] = public_text(rank["error"])
    return details


def _simulated_step_time(strategy: Strategy) -> float | None:
    """The simulator's own prediction (the trial row studies its error), not the learned correction of it."""
    predicted = strategy.predicted
    if predicted is None:
        return None
    return predicted.simulated_step_time_s if predicted.simulated_step_time_s is not None else predicted.step_time_s


def _device_type() -> str:
    """Where the trials' ops would run, for the notes: this service's workers train on CPUs unless CUDA is here."""
    torch = importlib.import_module("torch")
    return "cuda" if torch.cuda.is_available() else "cpu"


def workload_for(graph: ModelGraph) -> Any:
    """The zoo model the graph was captured from when it is allow-listed (trained with the graph's
    optimizer), else a replay of the graph; the rule lives in `trial_runner.workloads`."""
    return importlib.import_module("trial_runner.workloads").workload_for_graph(graph)


def make_trial_executor(settings: Settings) -> TrialRunnerExecutor | None:
    """The executor the settings ask for; None when trials are off."""
    kind = settings.effective_trials_backend
    if kind == "none":
        return None
    runner = importlib.import_module("trial_runner")
    backend = runner.RayBackend(address=settings.ray_address) if kind == "ray" else runner.LocalBackend()
    return TrialRunnerExecutor(
        backend,
        name=kind,
        warmup=settings.trial_warmup,
        steps=settings.trial_steps,
        timeout_s=settings.trial_timeout_s,
        simulator_version=_simulator_version(),
    )


def _simulator_version() -> str | None:
    try:
        return str(importlib.import_module("simulator").SIMULATOR_VERSION)
    except (ImportError, AttributeError):
        return None
