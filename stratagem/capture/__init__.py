"""Capture a PyTorch model's training step as a ModelGraph (see `docs/capture.md`).

`stratagem.capture` names both this package and the function users call. Importing the package binds
the package (not the function) as `stratagem.capture`, so the package forwards calls to the function:
`stratagem.capture(model, ...)` works whichever was loaded first.
"""

import sys
import types
from typing import Any

from stratagem.capture.trace import capture
from stratagem.ir import ModelGraph

__all__ = ["capture"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> ModelGraph:
        return capture(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__wrapped__ = capture
