"""Stratagem: find the fastest way to train a model on a cluster, and run it.

The public surface is `__all__`, pinned by a test. Heavy parts (capture and the runtime need torch,
`predict` the simulator) load on first use, so `import stratagem` stays cheap for a client that only
talks to the service; so do the subpackages a user reaches by attribute (`stratagem.builders.PS()`).
"""

from __future__ import annotations

import importlib
from typing import Any

from stratagem.errors import (
    CaptureError,
    InfeasibleStrategyError,
    InvalidDocumentError,
    InvalidGraphError,
    InvalidLayoutError,
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
    "Layout": "stratagem.layout",
    "Prediction": "stratagem.prediction",
    "predict": "stratagem.prediction",
    "capture_hf_config": "stratagem.hf",
    "trial": "stratagem.trials",
}
_SUBPACKAGES = ("builders", "zoo")
"""Subpackages `stratagem.<name>` reaches without importing them first."""

__all__ = [
    "CaptureError",
    "Client",
    "Job",
    "InfeasibleStrategyError",
    "InvalidDocumentError",
    "InvalidGraphError",
    "InvalidLayoutError",
    "InvalidResourceSpecError",
    "InvalidStrategyError",
    "Layout",
    "ModelGraph",
    "NotFoundError",
    "Prediction",
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
    "capture_hf_config",
    "distribute",
    "launch",
    "optimize",
    "predict",
    "trial",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"stratagem.{name}")
    raise AttributeError(f"module 'stratagem' has no attribute {name!r}")
