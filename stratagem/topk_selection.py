"""Which way the runtime's top-k selection (`stratagem.runtime.compression.select_largest`) runs a
bucket: one full `torch.topk`, or a threshold from a random sample first and a selection among the
candidates it keeps. Torch-free, so that the simulator prices each bucket by the path it takes: on a
CPU the full path costs several times the sampled one per entry."""

from __future__ import annotations

import numpy as np

SAMPLE_WINNERS = 512
"""Entries of the sample above its threshold: the candidate count's relative spread is about 1/sqrt of it."""
CANDIDATE_MARGIN = 1.3
"""Candidates aimed for, as a multiple of k, so that too few (and a full selection) are rare."""
SMALL_SELECTION = 1 << 16
"""Below this many entries one full `topk` is as fast as sampling first."""
SAMPLE_SHARE_LIMIT = 4
"""A sample of more than 1/this of the entries costs more than one full `topk`: the sample's own
selection is a fixed cost (about 51,200 entries at 1%), which a DLRM's 85,000 dense gradients paid
twice over (1.35 ms sampled, 0.69 ms in one `topk`)."""


def sample_size(n: np.ndarray | int, k: np.ndarray | int) -> np.ndarray | int:
    """Entries the sampled path draws to set its threshold (elementwise over arrays)."""
    return np.minimum(n, -(-SAMPLE_WINNERS * np.asarray(n, dtype=np.int64) // np.maximum(k, 1)))


def full_selection(n: np.ndarray | int, k: np.ndarray | int) -> np.ndarray | bool:
    """Whether selecting the k largest of n entries runs one full `topk` (elementwise over arrays)."""
    n, k = np.asarray(n, dtype=np.int64), np.maximum(np.asarray(k, dtype=np.int64), 1)
    full = (n <= SMALL_SELECTION) | (k * CANDIDATE_MARGIN >= n / 4) | (sample_size(n, k) * SAMPLE_SHARE_LIMIT >= n)
    return bool(full) if full.ndim == 0 else full
