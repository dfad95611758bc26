"""Near-copies of one candidate are one candidate with variants, not several places in the top-K.

The search often finds a strategy several times over, differing only in where a few small variables
live (a bias on another server, a norm in the neighbouring fusion group) and predicted within a
rounding error of each other. Shown as five candidates they crowd out different ideas and suggest a
choice that does not matter. So candidates are grouped before the top-K is picked:

- the **key** is everything about a candidate except the placement of its small variables: every
  field of the candidate's row, with the per-variable placement fields (synchronizer, fusion group,
  algorithm, compressor, partition, servers, replication) kept for the large variables only, and the
  fusion groups read as which large variables share one (so relabelling a group changes nothing). A
  variable is **small** when it holds less than `SMALL_SHARE` of the bytes of the largest trainable
  variable. The key is a hash of those bytes, stable across runs and machines;
- rows with one key whose scores lie within `TOLERANCE` (0.1%) of the best of them form a group; the
  best is the **representative**, the others its **variants**. A row of that key further off starts
  a group of its own.

Only representatives compete for the top-K; each returned candidate lists its variants (count, and
for the first few, which small variables live elsewhere and the predicted step time).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from simulator import SimContext
from simulator.encoding import CandidateBatch

SMALL_SHARE = 0.01
"""A variable below this share of the largest trainable variable's bytes is small."""
TOLERANCE = 0.001
"""Scores within this relative distance of a group's best are one candidate."""
PLACEMENT = (
    "kind",
    "group",
    "algorithm",
    "compressor",
    "compressor_param",
    "shards",
    "partition_axis",
    "local_replication",
    "server",
)
"""The per-variable fields of a row that say where and how a variable is synchronized."""


def small_variables(context: SimContext) -> np.ndarray:
    """[V] True for variables below SMALL_SHARE of the largest one's bytes."""
    sizes = np.asarray(context.var_bytes, dtype=np.float64)
    if sizes.size == 0:
        return np.zeros(0, dtype=bool)
    return sizes < SMALL_SHARE * float(sizes.max())


def variant_keys(context: SimContext, batch: CandidateBatch) -> list[str]:
    """One key per row: equal keys differ at most in where small variables live."""
    large = ~small_variables(context)
    backward = np.asarray(context.order, dtype=np.intp)
    large_backward = backward[large[backward]]
    parts: list[np.ndarray] = []
    for name, array in batch.arrays().items():
        if name == "group":
            group, kind = array[:, large_backward], batch.kind[:, large_backward]
            parts.append((group[:, 1:] == group[:, :-1]) & (kind[:, 1:] == kind[:, :-1]))
        elif name in PLACEMENT:
            parts.append(array[:, large])
        else:
            parts.append(array)
    keys = []
    for i in range(len(batch)):
        digest = hashlib.blake2b(digest_size=8)
        for part in parts:
            digest.update(np.ascontiguousarray(part[i]).tobytes())
        keys.append(digest.hexdigest())
    return keys


@dataclass(frozen=True)
class Group:
    key: str
    members: list[int]
    """Row indices, the representative (best score) first."""

    @property
    def representative(self) -> int:
        return self.members[0]

    @property
    def variants(self) -> list[int]:
        return self.members[1:]


def group_variants(keys: list[str], scores: np.ndarray, *, tolerance: float = TOLERANCE) -> list[Group]:
    """Groups of finite-scored rows, best representative first; see the module docstring."""
    groups: list[Group] = []
    open_groups: dict[str, Group] = {}
    for i in np.argsort(scores, kind="stable"):
        row = int(i)
        if not np.isfinite(scores[row]):
            continue
        group = open_groups.get(keys[row])
        if group is not None and scores[row] <= scores[group.representative] * (1.0 + tolerance):
            group.members.append(row)
            continue
        group = Group(keys[row], [row])
        groups.append(group)
        open_groups[keys[row]] = group
    return groups
