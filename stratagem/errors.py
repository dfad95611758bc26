"""One rooted exception tree, so callers can catch everything Stratagem raises with one clause.

StratagemError
├── InvalidDocumentError          a document (graph, resources, strategy) breaks a rule
│   ├── InvalidGraphError
│   ├── InvalidResourceSpecError
│   ├── InvalidStrategyError
│   └── InvalidLayoutError        a layout's degrees, batch or knobs do not add up (the arithmetic says how)
├── CaptureError                  a module could not be traced into a ModelGraph
├── UnsupportedStrategyError      valid, but this consumer (runtime, AutoDist) cannot express it
├── InfeasibleStrategyError       valid, but it does not fit the cluster (memory)
├── TrialFailedError              a trial crashed, hung, ran out of memory or timed out
└── ServiceError                  the service answered with an error (client SDK)
    ├── NotFoundError
    ├── RequestRejectedError      4xx other than 404: bad input, too large, unauthorized
    └── ServiceUnavailableError   5xx, timeouts, queue full
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One broken rule: where (a JSON-path-like location) and why, in words a user can act on."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class StratagemError(Exception):
    """Root of every error Stratagem raises on purpose."""


class InvalidDocumentError(StratagemError, ValueError):
    """A document breaks one or more rules; `problems` lists each with its field path."""

    def __init__(self, problems: list[Problem] | str, *, document: str = "document") -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        self.problems: list[Problem] = list(problems)
        self.document = document
        shown = "; ".join(str(p) for p in self.problems[:10])
        more = f" (and {len(self.problems) - 10} more)" if len(self.problems) > 10 else ""
        super().__init__(f"invalid {document}: {shown}{more}")


class InvalidGraphError(InvalidDocumentError):
    def __init__(self, problems: list[Problem] | str) -> None:
        super().__init__(problems, document="graph")


class InvalidResourceSpecError(InvalidDocumentError):
    def __init__(self, problems: list[Problem] | str) -> None:
        super().__init__(problems, document="resource spec")


class InvalidStrategyError(InvalidDocumentError):
    def __init__(self, problems: list[Problem] | str) -> None:
        super().__init__(problems, document="strategy")


class InvalidLayoutError(InvalidDocumentError):
    def __init__(self, problems: list[Problem] | str) -> None:
        super().__init__(problems, document="layout")


class CaptureError(StratagemError):
    """Capture failed; the message names the layer (module path) and the reason."""


class UnsupportedStrategyError(StratagemError):
    """The strategy is valid but the consumer (runtime, AutoDist export) cannot execute or express it."""


class InfeasibleStrategyError(StratagemError):
    """The strategy does not fit the cluster, e.g. it needs more memory than a device has."""


class TrialFailedError(StratagemError):
    """A trial ended without a measurement: crash, out of memory, hang or timeout."""


class ServiceError(StratagemError):
    """The service answered with an error; `status` is the HTTP status, `detail` its message."""

    def __init__(self, message: str, *, status: int | None = None, detail: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class NotFoundError(ServiceError):
    pass


class RequestRejectedError(ServiceError):
    pass


class ServiceUnavailableError(ServiceError):
    pass
