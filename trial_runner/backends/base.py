"""The one-method interface every way of running a trial implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from stratagem.runtime.launch import free_port as free_port
from trial_runner.result import TrialResult
from trial_runner.spec import TrialSpec


@runtime_checkable
class TrialBackend(Protocol):
    name: str

    def run(self, spec: TrialSpec) -> TrialResult:
        """Run the trial to its end and return the result; failures are outcomes, never exceptions."""
        ...
