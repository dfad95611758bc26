"""The one-method interface every way of running a trial implements."""

from __future__ import annotations

import socket
from typing import Protocol, runtime_checkable

from trial_runner.result import TrialResult
from trial_runner.spec import TrialSpec


@runtime_checkable
class TrialBackend(Protocol):
    name: str

    def run(self, spec: TrialSpec) -> TrialResult:
        """Run the trial to its end and return the result; failures are outcomes, never exceptions."""
        ...


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, for rank 0's rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
