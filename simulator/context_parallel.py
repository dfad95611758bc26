"""Context parallelism: the key/value exchange of blockwise ("ring") attention and what of it the attention hides.

With c ranks in the context-parallel group, each rank holds 1/c of every sequence. An attention core
runs c block computations, its queries against each rank's keys and values in turn (Liu et al. 2023,
"Ring Attention with Blockwise Transformers"). The blocks are exchanged as torchtitan does by default
(`context_parallel_rotate_method = "allgather"`, torch's `_AllGatherRotater`) and as this project's
runtime does: forward all-gathers the other c − 1 blocks in one collective issued before the first block
computation, which is all it overlaps; backward gathers them again the same way, and passes each
block's key/value gradient on to its owner one step at a time behind the block computations (torch
rotates gradients all-to-all). With causal masking the sequence is sharded round-robin (zig-zag) so
every rank does 1/c of the attention work (load balanced, as torchtitan does by default).

Per attention layer and micro-batch, with the rank's block of keys and values `kv` bytes (the layer's
k and v, ÷ c for the sequence, ÷ t for the heads) and one block's send `α + kv/B` over the group's link:

    gather   = (c − 1) · (α + kv/B)
    forward  = max(0, gather − f/c)
    backward = max(0, gather − b/c) + (c − 1) · max(0, α + kv/B − b/c)

f and b being the rank's forward and backward seconds of the core. Every other layer simply works on
1/c of the tokens (`simulator.compute`). Gradients are reduced over data × context ranks, since every
context rank holds a full replica of the parameters (`simulator.topology`).
"""

from __future__ import annotations

import numpy as np

from simulator.context import SimContext

Number = float | np.ndarray


def exposed_per_layer(
    context: SimContext,
    fwd: np.ndarray,
    bwd: np.ndarray,
    *,
    degree: Number,
    tensor: Number,
    micro_batches: Number,
    activation_scale: Number,
    latency: Number,
    per_byte: Number,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward exposed seconds per micro-batch of each layer's key/value exchange (0 off attention and
    where `degree` is 1); arguments broadcast ([L] times with scalars, or [n, L] with [n, 1] columns)."""
    kv = context.attention_kv_bytes * activation_scale / (degree * tensor * micro_batches)
    steps = np.maximum(np.asarray(degree, dtype=np.float64) - 1, 0.0)
    send = latency + kv * per_byte
    gather = steps * send
    forward = np.maximum(gather - fwd / degree, 0.0)
    backward = np.maximum(gather - bwd / degree, 0.0) + steps * np.maximum(send - bwd / degree, 0.0)
    attention = context.layer_attention
    return np.where(attention, forward, 0.0), np.where(attention, backward, 0.0)
