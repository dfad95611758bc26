"""Capture a PyTorch model's training step as a ModelGraph and its OperatorTrace (see `docs/capture.md`).

Users call `stratagem.capture(...)`; the package has its own name so that importing it never shadows
that function on the `stratagem` namespace.
"""

from stratagem.tracing.optrace import OperatorTrace
from stratagem.tracing.trace import capture

__all__ = ["OperatorTrace", "capture"]
