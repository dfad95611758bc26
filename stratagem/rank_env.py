"""The environment a training rank's process starts with (the memory allocator's settings).

On a CPU, glibc's malloc serves a large request with a fresh mapping and hands it back to the kernel
when it is freed (its threshold adapts, up to 32 MiB), so every step's bucket flattens, casts and
error terms fault all their pages in again. On this project's 2-core machines that made a 24 MB
all-reduce bucket's flatten, divide and unflatten cost 22 ms instead of 4, and its fp16 compression
23 ms instead of 16 (`benchmarks/cpu_rank_settings.py`). Here the threshold is fixed, the heap is
never trimmed and grows 1 GiB at a time, so a rank reuses the memory its previous step freed, as
PyTorch's caching allocator does on a GPU. A threshold cannot exceed 32 MiB, so larger requests are
still mapped afresh; where they come from gloo's worker thread (a ZeRO bucket's reduce-scatter and
all-gather) that doubled a 32.1 MiB bucket's step (168 ms against 82 at 30.3 MiB), so mapping chunks
is switched off and the heap serves every size. Settings already in the environment are kept, so a
user who preloads jemalloc or tcmalloc, or tunes glibc otherwise, wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

MALLOC_SETTINGS: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
    "MALLOC_TOP_PAD_": str(1 << 30),
    "MALLOC_MMAP_MAX_": "0",
}
"""glibc's largest threshold (smaller requests come from the heap); freed memory kept up to 4 GiB; the
heap's spare top (only address space until touched) also serves larger requests; no request is
given a mapping of its own, whatever its size or thread."""


def rank_environment(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """`base` (default: this process's environment) with the allocator settings a rank should start
    with wherever `base` has none, then `extra`."""
    env = dict(os.environ if base is None else base)
    for name, value in MALLOC_SETTINGS.items():
        env.setdefault(name, value)
    env.update(extra)
    return env
