"""A pause of Python's cyclic garbage collector around an allocation burst.

Capture and search allocate short-lived objects fast enough to trigger full collections, and a full
collection walks everything the process holds: every fake tensor of the model in capture (0.2 s a
time on a 7B decoder), a captured graph and a whole service in search (0.2-0.3 s, a sixth of a 2 s
budget at a random moment). Reference counting still frees nearly everything; the few cycles left
wait for the next collection after the burst.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
