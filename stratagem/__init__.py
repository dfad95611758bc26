"""Stratagem: find the fastest way to train a model on a cluster, and run it.

The public surface is `__all__`, pinned by a test. Heavy parts (capture and the runtime need torch)
load on first use, so `import stratagem` stays cheap for a client that only talks to the service.
"""

from __future__ import annotations

import importlib
from typing import Any

from stratagem.errors import (
    CaptureError,
    InfeasibleStrategyError,
    InvalidDocumentError,
    InvalidGraphError,
    InvalidResourceSpecError,
    InvalidStrategyError,
    NotFoundError,
    RequestRejectedError,
    ServiceError,
    ServiceUnavailableError,
    StratagemError,
    TrialFailedError,
    UnsupportedStrategyError,
)
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

__version__ = "0.1.0"

_LAZY = {
    "capture": "stratagem.tracing",
    "distribute": "stratagem.runtime",
    "launch": "stratagem.runtime",
    "Client": "stratagem.client",
    "Job": "stratagem.client",
    "optimize": "stratagem.client",
    "trial": "stratagem.trials",
}

__all__ = [
    "CaptureError",
    "Client",
    "Job",
    "InfeasibleStrategyError",
    "InvalidDocumentError",
    "InvalidGraphError",
    "InvalidResourceSpecError",
    "InvalidStrategyError",
    "ModelGraph",
    "NotFoundError",
    "RequestRejectedError",
    "ResourceSpec",
    "ServiceError",
    "ServiceUnavailableError",
    "StratagemError",
    "Strategy",
    "TrialFailedError",
    "UnsupportedStrategyError",
    "__version__",
    "capture",
    "distribute",
    "launch",
    "optimize",
    "trial",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stratagem' has no attribute {name!r}")
