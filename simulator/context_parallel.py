"""Context parallelism: ring attention's key/value exchange and what of it the attention hides.

With c ranks in the context-parallel group, each rank holds 1/c of every sequence. An attention core
runs c steps: in each, a rank attends its queries to the key/value block it holds while sending that
block on to the next rank and receiving the previous rank's (Liu et al. 2023, "Ring Attention with
Blockwise Transformers"; torchtitan's `context_parallel`, `torch.distributed.tensor.experimental`).
The c − 1 transfers overlap the c blocks' compute; what a transfer takes beyond its step's compute is
exposed. Backward passes the key/value blocks again with their gradients, twice the bytes. With causal
masking the sequence is sharded round-robin (zig-zag) so every rank does 1/c of the attention work
(load balanced, as torchtitan does by default).

Per attention layer and micro-batch, with the rank's block of keys and values `kv` bytes (the layer's
k and v, ÷ c for the sequence, ÷ t for the heads) and one send `α + n/B` over the group's link:

    exposed = (c − 1) · [max(0, α + kv/B − f/c) + max(0, α + 2·kv/B − b/c)]

f and b being the rank's forward and backward seconds of the core. Every other layer simply works on
1/c of the tokens (`simulator.compute`). Gradients are reduced over data × context ranks, since every
context rank holds a full replica of the parameters (`simulator.topology`).
"""

from __future__ import annotations

import numpy as np

from simulator.context import SimContext

BACKWARD_KV_FACTOR = 2.0
"""Backward's ring carries each key/value block and its gradient."""


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
    """Forward and backward exposed seconds per micro-batch of each layer's ring (0 off attention and
    where `degree` is 1); arguments broadcast ([L] times with scalars, or [n, L] with [n, 1] columns)."""
    kv = context.attention_kv_bytes * activation_scale / (degree * tensor * micro_batches)
    steps = np.maximum(np.asarray(degree, dtype=np.float64) - 1, 0.0)
    forward = steps * np.maximum(latency + kv * per_byte - fwd / degree, 0.0)
    backward = steps * np.maximum(latency + BACKWARD_KV_FACTOR * kv * per_byte - bwd / degree, 0.0)
    attention = context.layer_attention
    return np.where(attention, forward, 0.0), np.where(attention, backward, 0.0)
