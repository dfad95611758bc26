"""The step as a timeline: transfers queue on a channel in the order their gradients become ready.

A channel (the collective stream, a node's NIC) serves one transfer at a time, first come first served.
A transfer starts when its gradients are ready *and* the channel is free; backward compute keeps
running meanwhile, so transfers overlap the rest of backward. For arrival times a_i (non-decreasing)
and service times d_i, such a queue finishes at

    finish = max_i ( a_i + d_i + d_{i+1} + ... + d_last )

(the last busy period starts at some arrival and runs to the end). That closed form is a cumulative
sum and a max along the variables, vectorized over all candidates at once: `fifo_dense` on [N, V]
arrays in ready order, `fifo_segments` on a flat list of transfers grouped by candidate.
"""

from __future__ import annotations

import numpy as np


def fifo_dense(arrival: np.ndarray, service: np.ndarray) -> np.ndarray:
    """[N] finish of N queues; [N, V] arrivals (non-decreasing along V) and service times.

    A position that launches nothing may carry any arrival no later than the next launch's (its
    term is then dominated) or, past the last launch, any time the caller treats as a lower bound.
    """
    if arrival.shape[1] == 0:
        return np.zeros(arrival.shape[0])
    remaining = np.cumsum(service[:, ::-1], axis=1)[:, ::-1]
    remaining += arrival
    return remaining.max(axis=1)


def fifo_segments(row: np.ndarray, arrival: np.ndarray, service: np.ndarray, n: int) -> np.ndarray:
    """[n] finish per candidate of transfers listed flat, sorted by (row, arrival); 0 where none."""
    out = np.zeros(n)
    if row.size == 0:
        return out
    remaining = np.cumsum(service[::-1])[::-1]
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    ends = np.r_[starts[1:], row.size]
    after = np.r_[remaining[ends[:-1]], 0.0] if starts.size > 1 else np.zeros(1)
    tail = np.repeat(after, ends - starts)
    out[row[starts]] = np.maximum.reduceat(arrival + remaining - tail, starts)
    return out
