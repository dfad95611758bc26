"""Activations a rank holds for backward, per layer, under the step's knobs.

The captured `activation_bytes` are one replica's saved tensors for its whole batch at the captured
dtype. Per rank they shrink by:

- tensor parallelism: 1/t for layers reading activations a tensor split left sharded (attention cores,
  the activation between a column- and a row-parallel matmul); norms, dropout, residuals and the inputs
  of column-parallel matmuls stay whole (Korthikanti et al. 2022, eq. 2: 10·s·b·h of a layer's
  34·s·b·h + 5·a·s²·b are not split);
- sequence parallelism: 1/t for those too (eq. 4: everything divided by t), the embedding lookup's
  indices excepted;
- context parallelism: 1/c for every layer (each rank holds 1/c of the sequence);
- precision: the precision's activation bytes per captured byte (`simulator.precision`);
- selective recomputation: an attention core drops what it saves beyond its inputs and output
  (`context.selective_dropped`), rebuilt for one layer at a time during backward;
- full recomputation: a numbered block keeps only its input, and the largest block is rebuilt once
  during its backward;
- per-op selective checkpointing: a numbered block keeps its input and the outputs of its attention
  cores and of every other matmul (`context.op_kept`); the largest block is rebuilt in its backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.context import SimContext


@dataclass(frozen=True)
class Shape:
    """The knobs that decide a rank's activations."""

    tensor: int
    context_parallel: int = 1
    sequence_parallel: bool = False
    precision: int = 0
    selective: bool = False
    recompute: bool = False
    selective_op: bool = False
    gpu: bool = False
    """On a GPU, whose fused kernels save less than the captured CPU step (`context.gpu_activation_bytes`)."""


def per_layer(context: SimContext, shape: Shape) -> np.ndarray:
    """[L] bytes each layer keeps for backward without full recomputation (selective applied)."""
    divided = context.layer_sharded_input
    if shape.sequence_parallel:
        divided = divided | ~context.layer_embedding
    scale = context.var_precision.activation[shape.precision] / shape.context_parallel
    saved = context.gpu_activation_bytes if shape.gpu else context.activation_bytes
    acts = saved / np.where(divided, shape.tensor, 1.0)
    if shape.selective:
        acts = acts - context.selective_dropped / np.where(divided, shape.tensor, 1.0)
    return acts * scale if scale != 1.0 else acts


def rebuilt(context: SimContext, shape: Shape) -> float:
    """Bytes rebuilt at once during backward: the largest block's activations under full recomputation,
    the largest attention core's dropped activations under selective recomputation."""
    if shape.recompute or shape.selective_op:
        return float(block_peak(context, per_layer(context, shape))[0])
    if shape.selective:
        scale = context.var_precision.activation[shape.precision] / shape.context_parallel
        dropped = context.selective_dropped * scale / np.where(context.layer_sharded_input, shape.tensor, 1.0)
        return float(dropped.max(initial=0.0))
    return 0.0


def held(context: SimContext, shape: Shape) -> np.ndarray:
    """[L] bytes each layer keeps through the forward: `per_layer`, or under full recomputation a
    numbered block's input at its first layer and nothing for its other layers."""
    acts = per_layer(context, shape)
    scale = context.var_precision.activation[shape.precision] / shape.context_parallel
    if shape.selective_op:
        divided = context.layer_sharded_input | (context.layer_tensor_split & ~context.layer_tp_allreduce)
        if shape.sequence_parallel:
            divided = divided | ~context.layer_embedding
        kept = context.op_kept * scale / np.where(divided, shape.tensor, 1.0)
        return np.where(context.layer_recomputed, kept, acts)
    if not shape.recompute:
        return acts
    kept = context.recompute_kept * scale / (shape.tensor if shape.sequence_parallel else 1.0)
    return np.where(context.layer_recomputed, kept, acts)


def block_peak(context: SimContext, activations: np.ndarray) -> np.ndarray:
    """[n] the largest recomputed block's activations, from [n, L] (or [L]) per-layer activations."""
    per_unit = np.add.reduceat(np.atleast_2d(activations), context.unit_starts, axis=1)
    recomputed = context.layer_recomputed[context.unit_starts]
    return np.where(recomputed, per_unit, 0.0).max(axis=1, initial=0.0)


def backward_extra(context: SimContext, shape: Shape, held_layers: np.ndarray) -> float:
    """Bytes beyond everything held that backward needs at its fullest: when it reaches layer l, the layers
    after l have freed what they saved, and l holds its gradients (`context.gradient_bytes`) beside what
    the layers up to l still hold. The loss of a language model (its logits' gradients in fp32) is
    usually where this peaks."""
    divided = context.layer_sharded_input
    if shape.sequence_parallel:
        divided = divided | ~context.layer_embedding
    scale = context.var_precision.activation[shape.precision] / shape.context_parallel
    gradients = context.gradient_bytes * scale / np.where(divided, shape.tensor, 1.0)
    total = float(held_layers.sum())
    reached = np.cumsum(held_layers) + gradients
    return max(float(reached.max(initial=0.0)) - total, 0.0)
