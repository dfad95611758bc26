"""Pipeline schedules: which rank runs each model chunk, how long the pipeline idles, and how many
micro-batches' activations each rank holds.

With p ranks, v chunks per rank and m micro-batches, per micro-batch a rank computes f + b (its chunks'
forward and backward) and the slowest rank paces the steady state; the schedule adds the bubble:

| schedule | chunk c on rank | bubble | micro-batches in flight on rank r (in units of its own activations) |
|---|---|---|---|
| GPipe (Huang et al. 2019) | c | (p − 1)·(f + b) | m |
| 1F1B (Narayanan et al. 2019, PipeDream-Flush) | c | (p − 1)·(f + b) | min(m, p − r) |
| interleaved 1F1B (Narayanan et al. 2021, §2.2.2) | c mod p | (p − 1)·(f + b)_chunk, i.e. (p − 1)/v of a rank's | min(m·v, 2(p − r − 1) + (v − 1)·p + 1) / v |
| zero-bubble, v = 1 (ZB-H1, Qi et al. 2024) | c | (p − 1)·(F + B − 2W) | min(m, p − r) |
| zero-bubble, v = 2 (ZBV, Qi et al. 2024b) | c for c < p, else 2p − 1 − c | (p − 1)·max(0, F + B − 3W)_chunk | min(m, p) |

The interleaved warm-up count is Megatron-LM's (`megatron/core/pipeline_parallel/schedules.py`,
`forward_backward_pipelining_with_interleaving`: `(p − r − 1)·2 + (v − 1)·p` warm-up forwards, plus the
one in its 1F1B phase), counted in chunk micro-batches of 1/v of the rank's activations. Zero-bubble
splits backward into B (input gradients) and W (weight gradients: half the backward of layers with
weights, equal FLOPs to B for a Linear layer) and schedules W into the bubble: ZB-H1 keeps 1F1B's
memory and leaves (p − 1)(T_F + T_B − T_W), a third of 1F1B's bubble when T_F = T_B = T_W (here F = f,
B + W = b, so T_F + T_B − T_W = F + B − 2W); ZBV's V-shaped placement of two chunks keeps 1F1B's peak
memory and leaves (p − 1)(T_F + T_B − 2T_W) per chunk, zero when T_F = T_B = T_W. Both need m ≥ p to fill
the pipe; with fewer micro-batches the schedule is priced as 1F1B (or interleaved for v = 2).
The stage imbalance shows because the slowest rank (and chunk) sets every term.

Point-to-point: every micro-batch crosses each chunk boundary forward (activations) and backward
(gradients), so interleaving moves v times the 1F1B traffic; the part on the critical path is the fill
and drain, one crossing of each of the p·v − 1 boundaries each way.
"""

from __future__ import annotations

import numpy as np

from simulator.encoding import Schedule


def chunk_rank(chunk: np.ndarray, pipeline: np.ndarray, schedule: np.ndarray, virtual: np.ndarray) -> np.ndarray:
    """Pipeline rank of each chunk ([n, L] chunks, [n] degrees): round robin, or V-shaped for ZBV."""
    p = pipeline[:, None].astype(np.int64)
    c = chunk.astype(np.int64)
    v_shape = ((schedule == Schedule.ZERO_BUBBLE) & (virtual == 2))[:, None] & (c >= p)
    return np.where(v_shape, 2 * p - 1 - c, c % p)


def bubble(
    schedule: np.ndarray,
    virtual: np.ndarray,
    p: np.ndarray,
    m: np.ndarray,
    rank_step: np.ndarray,
    chunk_step: np.ndarray,
    forward: np.ndarray,
    backward: np.ndarray,
    weight: np.ndarray,
) -> np.ndarray:
    """[n] idle seconds of the slowest rank. `rank_step`: the slowest rank's f + b per micro-batch;
    `chunk_step`: the slowest chunk's; `forward`, `backward`, `weight`: the slowest rank's (v = 1) or
    chunk's (v = 2) F, B + W and W per micro-batch."""
    plain = (p - 1) * rank_step
    interleaved = (p - 1) * chunk_step
    zb_h1 = (p - 1) * np.maximum(forward + backward - 2 * weight, 0.0)
    zbv = (p - 1) * np.maximum(forward + backward - 3 * weight, 0.0)
    filled = m >= p
    zero_bubble = np.where(virtual >= 2, np.where(filled, zbv, interleaved), np.where(filled, zb_h1, plain))
    out = np.where(schedule == Schedule.INTERLEAVED, interleaved, plain)
    return np.where(schedule == Schedule.ZERO_BUBBLE, zero_bubble, out)


def in_flight(schedule: np.ndarray, virtual: np.ndarray, p: np.ndarray, m: np.ndarray, ranks: int) -> np.ndarray:
    """[n, ranks] micro-batches' worth of its own activations each rank holds at its peak."""
    rank = np.arange(ranks, dtype=np.float64)[None, :]
    p, m, v = p[:, None], m[:, None], virtual[:, None].astype(np.float64)
    one_f_one_b = np.minimum(m, p - rank)
    warmup = 2 * (p - rank - 1) + (v - 1) * p + 1
    interleaved = np.minimum(m * v, warmup) / v
    zero_bubble = np.where(v >= 2, np.minimum(m, p), one_f_one_b)
    schedule = schedule[:, None]
    out = np.where(schedule == Schedule.GPIPE, m, one_f_one_b)
    out = np.where(schedule == Schedule.INTERLEAVED, interleaved, out)
    return np.maximum(np.where(schedule == Schedule.ZERO_BUBBLE, zero_bubble, out), 0.0)
