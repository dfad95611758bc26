"""Plain PyTorch DDP as a strategy: the baseline every search result must beat.

DDP all-reduces gradients in buckets. After its first iteration it rebuilds the buckets in the
order gradients become ready in backward (roughly reverse graph order): the first bucket closes
at 1 MiB so communication starts early, later ones at `bucket_cap_mb` (25 MiB); a bucket closes
once it reaches its cap (the variable that crosses the cap is still inside), each dtype fills its
own buckets, and a sparse gradient gets a bucket of its own. Each bucket is one fusion group,
numbered in the order it becomes ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stratagem.builders.base import Builder
from stratagem.ir import AllReduceSynchronizer, ModelGraph, ResourceSpec, Strategy, Variable, VariableConfig

MIB = 1024 * 1024


@dataclass(frozen=True)
class DataParallel(Builder):
    bucket_cap_mb: float = 25.0
    """DDP's `bucket_cap_mb` (MiB)."""
    first_bucket_mb: float = 1.0
    """DDP's first-bucket cap (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB)."""
    algorithm: Literal["auto", "ring"] = "auto"
    """`auto` (NCCL chooses ring or tree, as DDP does) or `ring`."""

    def __post_init__(self) -> None:
        if self.bucket_cap_mb <= 0:
            raise self.argument_error("bucket_cap_mb", f"must be positive, got {self.bucket_cap_mb}")
        if self.first_bucket_mb <= 0:
            raise self.argument_error("first_bucket_mb", f"must be positive, got {self.first_bucket_mb}")
        if self.algorithm not in ("auto", "ring"):
            raise self.argument_error("algorithm", f"must be 'auto' or 'ring', got {self.algorithm!r}")

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        variables = graph.trainable_variables
        ready_order = variables[::-1]
        buckets = ddp_buckets(
            ready_order, first_cap_bytes=int(self.first_bucket_mb * MIB), cap_bytes=int(self.bucket_cap_mb * MIB)
        )
        group_of = {ready_order[i].name: group for group, bucket in enumerate(buckets) for i in bucket}
        configs = [
            VariableConfig(
                var_name=var.name,
                synchronizer=AllReduceSynchronizer(algorithm=self.algorithm, group=group_of[var.name]),
            )
            for var in variables
        ]
        return self._strategy(graph, resources, configs)


def ddp_buckets(variables: list[Variable], *, first_cap_bytes: int, cap_bytes: int) -> list[list[int]]:
    """DDP's `_compute_bucket_assignment_by_size` over variables in gradient-ready order.

    Returns buckets as lists of indices into `variables`, ordered by their first member, i.e. in
    the order they become ready.
    """
    buckets: list[list[int]] = []
    open_members: dict[str, list[int]] = {}
    open_bytes: dict[str, int] = {}
    closed: dict[str, int] = {}
    for index, var in enumerate(variables):
        if var.sparse:
            buckets.append([index])
            continue
        key = var.dtype.value
        open_members.setdefault(key, []).append(index)
        open_bytes[key] = open_bytes.get(key, 0) + var.nbytes
        cap = cap_bytes if closed.get(key, 0) else first_cap_bytes
        if open_bytes[key] >= cap:
            buckets.append(open_members.pop(key))
            open_bytes.pop(key)
            closed[key] = closed.get(key, 0) + 1
    buckets.extend(open_members.values())
    return sorted(buckets, key=min)
