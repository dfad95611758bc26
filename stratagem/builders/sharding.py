"""AutoDist's shard counts and its greedy server load balancer."""

from __future__ import annotations

import math


def smallest_divisor(n: int) -> int:
    """AutoDist's `get_num_shards`: the smallest divisor >= 2 of `n`, or `n` itself (prime, 2 or 1).

    Not capped by the number of servers: AutoDist places extra shards round-robin instead.
    """
    for i in range(2, n):
        if n % i == 0:
            return i
    return n


def smallest_non_divisor(n: int) -> int:
    """UnevenPartitionedPS's shard count: the smallest i >= 2 that does *not* divide `n`, or `n`."""
    for i in range(2, n):
        if n % i:
            return i
    return n


class GreedyLoads:
    """Bytes placed on each parameter server so far; new work goes to the least loaded.

    Ties go to the server listed first (Python's `min` and stable `sorted`, as in AutoDist), and a
    variable split into shards adds `bytes / shards` to each server it lands on, even for uneven shards.
    """

    def __init__(self, servers: list[str]) -> None:
        self.loads: dict[str, float] = {server: 0.0 for server in servers}

    def place(self, nbytes: float) -> str:
        """PSLoadBalancing: the whole variable to the least-loaded server."""
        server = min(self.loads, key=self.loads.__getitem__)
        self.loads[server] += nbytes
        return server

    def place_shards(self, shards: int, nbytes: float) -> list[str]:
        """PartitionedPS: shard i to the i-th least-loaded server, wrapping round when shards outnumber servers."""
        order = sorted(self.loads, key=self.loads.__getitem__)
        if shards > len(order):
            order = order * math.ceil(shards / len(order))
        chosen = order[:shards]
        for server in chosen:
            self.loads[server] += nbytes / shards
        return chosen
