"""The guard between the search and its caller: what may be returned, whatever the search found.

Three rules, checked on the final candidates rather than trusted from the search's construction:
1. Never return a strategy predicted slower than the best pre-built one (AutoDist's builders and
   plain data parallel): the service must never make a user worse off than picking a builder.
2. Lossy compression, non-BSP consistency and another precision change the training math (gradients
   perturbed, parameters read stale, matmuls rounded differently), and compiling or not changes the
   user's training script, so they are returned only when the caller allowed them.
3. A global batch the caller fixed is part of its numerics: every candidate trains exactly that many
   samples per step (data degree × micro-batch size × micro-batches).
"""

from __future__ import annotations

import numpy as np

from optimizer_service.search.space import SearchOptions
from simulator.encoding import CandidateBatch, CompressorKind, ConsistencyKind

RELATIVE_TOLERANCE = 1e-9
"""A candidate equal to the best builder within float noise is not 'slower'."""


def respects_options(batch: CandidateBatch, options: SearchOptions) -> np.ndarray:
    """[N] True where a row uses only what the caller allowed."""
    ok = np.ones(len(batch), dtype=bool)
    if not options.allow_compression:
        ok &= ~(batch.compressor != CompressorKind.NONE).any(axis=1)
    if not options.allow_async:
        ok &= batch.consistency == ConsistencyKind.BSP
    if not options.allow_precision:
        ok &= batch.precision == options.precision_value
    if not options.allow_compile:
        ok &= batch.compile == options.compile
    if options.global_batch is not None:
        ok &= trains_global_batch(batch, options.global_batch)
    return ok


def trains_global_batch(batch: CandidateBatch, global_batch: int) -> np.ndarray:
    """[N] True where a row states its micro-batch size and trains `global_batch` samples per step."""
    samples = batch.data.astype(np.int64) * batch.micro_batch_size * batch.micro_batches
    return (batch.micro_batch_size > 0) & (samples == global_batch)


def not_slower(scores: np.ndarray, best_prebuilt: float) -> np.ndarray:
    """[N] True where a row is feasible and predicted no slower than the best pre-built strategy."""
    finite = np.isfinite(scores)
    if not np.isfinite(best_prebuilt):
        return finite
    return finite & (scores <= best_prebuilt * (1.0 + RELATIVE_TOLERANCE))


def admissible(batch: CandidateBatch, scores: np.ndarray, options: SearchOptions, best_prebuilt: float) -> np.ndarray:
    return respects_options(batch, options) & not_slower(scores, best_prebuilt)
