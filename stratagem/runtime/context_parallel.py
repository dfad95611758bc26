"""Context parallelism (`mesh.context` C > 1): each rank of a context group holds a piece of every
sequence and attends over the whole sequence by all-gathering keys and values.

This is the all-gather context parallelism Llama 3 was trained with ("The Llama 3 Herd of Models",
2024, §3.3.2), not ring attention: the sequence is cut into 2·C equal chunks and rank c holds chunks c
and 2·C−1−c, so under a causal mask every rank attends over the same number of (query, key) pairs;
each attention all-gathers K and V over the context group (the kv heads as they are, before grouped-
query heads are repeated, so only the small K/V travel) and computes its local queries against the
whole K/V with a boolean mask built from global positions (query position ≥ key position). The
gather's backward reduce-scatters dK/dV, so gradients are exact. Each K/V block crosses C−1 links,
the bytes of a ring or of torchtitan's default all-gather rotation, which issues the gather behind the
attention over the rank's own block (what the simulator prices: `simulator/context_parallel.py`); here
the attention waits for the whole gather.

Every other layer works token by token on the rank's own positions. What depends on where a token
sits is handed the global positions: Hugging Face models get `position_ids` through a forward pre-hook
on their base model (rotary tables and learned position embeddings index by it) and a registered
`AttentionInterface` function; the zoo's transformers get their attention core (`Attention.attend`)
and position indices (`Attention.positions`, `Transformer.position_ids`) set before each forward. No
other attention can be reached, so any other model is refused. An encoder (no causal mask) uses the
same chunks without a mask: unmasked attention does not depend on the keys' order.

The caller feeds each rank its positions of each sample (`context_shard`) and computes a loss on
position-aligned targets, averaged over its own tokens: equal token counts make the mean over the
context group's ranks the mean over the whole sequence. A loss that shifts labels inside the model
(Hugging Face's `labels=`) would pair a chunk's last token with the next rank's first: shift the
labels over the whole sequence before sharding them (Hugging Face takes them as `shift_labels=`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.errors import UnsupportedStrategyError
from stratagem.ir import Strategy
from stratagem.runtime.mesh_layout import context_parallel_rank

HF_ATTENTION = "stratagem_context_parallel"
"""The name under which the context-parallel attention is registered in transformers' AttentionInterface.
It is deliberately absent from `masking_utils.AttentionMaskInterface`: for a name it does not know,
`create_causal_mask` builds no mask and hands the caller's (none in training) through, where a
registered builder would read the chunks' non-consecutive `position_ids` as packed sequences."""
CONTEXT_ATTRIBUTE = "stratagem_context"
"""Attribute of each Hugging Face attention module: the `ContextGroup` its attention gathers over."""


def context_positions(seq_len: int, context: int, index: int) -> torch.Tensor:
    """The global positions rank `index` of a context group of `context` holds: chunks index and
    2·context−1−index of the sequence cut into 2·context equal chunks."""
    chunks = 2 * context
    if seq_len % chunks:
        raise UnsupportedStrategyError(
            f"mesh.context ({context}): a sequence of {seq_len} positions does not split into {chunks} equal "
            f"chunks (two per context rank, for causal load balance); use a sequence length divisible by {chunks}"
        )
    size = seq_len // chunks
    first, second = index * size, (chunks - 1 - index) * size
    return torch.cat([torch.arange(first, first + size), torch.arange(second, second + size)])


def context_shard(strategy: Strategy, rank: int, *tensors: torch.Tensor, seq_dim: int = 1) -> tuple[torch.Tensor, ...]:
    """Each tensor's positions that `rank` holds along `seq_dim`: the sequence counterpart of slicing the
    batch by `data_parallel_rank` (every rank of one context group is fed the same samples). Unchanged
    without context parallelism."""
    index, size = context_parallel_rank(strategy, rank)
    if size == 1:
        return tensors
    out = []
    for i, tensor in enumerate(tensors):
        if tensor.dim() <= seq_dim:
            raise UnsupportedStrategyError(
                f"mesh.context ({size}): input {i} has shape {tuple(tensor.shape)}, with no sequence dimension "
                f"{seq_dim} to split"
            )
        positions = context_positions(tensor.shape[seq_dim], size, index).to(tensor.device)
        out.append(tensor.index_select(seq_dim, positions))
    return tuple(out)


class ContextGroup:
    """One rank's place in its context group, and the attention over the group's gathered keys and values."""

    def __init__(self, group: Any, index: int, size: int) -> None:
        self.group = group
        self.index = index
        self.size = size
        self._masks: dict[tuple[int, torch.device], torch.Tensor] = {}

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """Global positions of this rank's `local_len` tokens of each sequence."""
        return context_positions(local_len * self.size, self.size, self.index).to(device)

    def causal_mask(self, local_len: int, device: torch.device) -> torch.Tensor:
        """(local queries × gathered keys): True where the query's position is at or after the key's."""
        key = (local_len, device)
        if key not in self._masks:
            keys = torch.cat([context_positions(local_len * self.size, self.size, c) for c in range(self.size)])
            queries = context_positions(local_len * self.size, self.size, self.index)
            self._masks[key] = (queries[:, None] >= keys[None, :]).to(device)
        return self._masks[key]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        dropout_p: float = 0.0,
        is_causal: bool = True,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Local queries (batch, heads, L, dim) against every rank's keys and values (batch, kv heads, L,
        dim); grouped-query kv heads are repeated after the gather."""
        from torch.distributed._functional_collectives import all_gather_single

        local = q.shape[2]
        if k.shape[2] != local:
            raise UnsupportedStrategyError(
                f"mesh.context ({self.size}): keys of length {k.shape[2]} beside queries of length {local} "
                "(a cache or cross-attention) cannot be gathered by position"
            )
        # One collective for K and V: (2, batch, kv heads, L, dim) per rank, stacked along dim 0.
        gathered = all_gather_single(torch.stack([k, v]).contiguous(), 0, self.group)
        gathered = gathered.view(self.size, 2, *k.shape).permute(1, 2, 3, 0, 4, 5)
        keys, values = gathered.reshape(2, k.shape[0], k.shape[1], self.size * local, k.shape[3]).unbind(0)
        if q.shape[1] != k.shape[1]:
            repeat = q.shape[1] // k.shape[1]
            keys, values = keys.repeat_interleave(repeat, dim=1), values.repeat_interleave(repeat, dim=1)
        mask = self.causal_mask(local, q.device) if is_causal else None
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def context_refusal(model: nn.Module) -> str | None:
    """Why this model's attention cannot run context-parallel here, or None."""
    from stratagem.zoo.transformer import Attention as ZooAttention

    others = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.MultiheadAttention)})
    if others:
        return (
            f"mesh.context: {type(model).__name__} computes attention in {', '.join(others)}, which context "
            "parallelism cannot reach (it replaces the attention of Hugging Face models and of the zoo's transformers)"
        )
    hf = _hugging_face_models(model)
    for name, module in hf:
        if not getattr(module, "_supports_attention_backend", False):
            return (
                f"mesh.context: {name or 'the model'} ({type(module).__name__}) does not compute its attention "
                "through transformers' AttentionInterface, where context parallelism puts its own"
            )
        if getattr(module.config, "is_encoder_decoder", False):
            return (
                f"mesh.context: {type(module).__name__} is an encoder-decoder; context parallelism here splits one "
                "sequence per sample (decoders and encoders)"
            )
    if hf or any(isinstance(m, ZooAttention) for m in model.modules()):
        return None
    return (
        f"mesh.context: {type(model).__name__} holds no attention context parallelism can reach: it replaces the "
        "attention of Hugging Face models (AttentionInterface) and of the zoo's transformers, and every other "
        "layer would see only its rank's piece of each sequence"
    )


def apply_context_parallel(model: nn.Module, group: ContextGroup) -> None:
    """Make `model`'s attention gather over `group` and its positions global (after `context_refusal`)."""
    from stratagem.zoo.transformer import Attention as ZooAttention
    from stratagem.zoo.transformer import Transformer as ZooTransformer

    for _, hf in _hugging_face_models(model):
        _apply_hugging_face(hf, group)
    zoo_attentions = [m for m in model.modules() if isinstance(m, ZooAttention)]
    for attention in zoo_attentions:
        attention.attend = group.attend
    for module in model.modules():
        if isinstance(module, ZooTransformer):
            module.register_forward_pre_hook(_ZooPositions(group, zoo_attentions))


class _ZooPositions:
    """Forward pre-hook of a zoo Transformer: the global positions of this forward's tokens."""

    def __init__(self, group: ContextGroup, attentions: Sequence[nn.Module]) -> None:
        self.group = group
        self.attentions = attentions

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        tokens = args[0]
        positions = self.group.positions(tokens.shape[1], tokens.device)
        module.position_ids = positions
        for attention in self.attentions:
            attention.positions = positions


def _hugging_face_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost Hugging Face models inside `model` (or `model` itself)."""
    if not any(type(m).__module__.startswith("transformers.") for m in model.modules()):
        return []
    from transformers import PreTrainedModel

    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, PreTrainedModel) and not any(
            name.startswith(f"{outer}.") or not outer for outer, _ in found
        ):
            found.append((name, module))
    return found


def _apply_hugging_face(model: Any, group: ContextGroup) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(HF_ATTENTION, _hugging_face_attention)
    model.set_attn_implementation(HF_ATTENTION)
    for module in model.modules():
        if hasattr(module, "is_causal"):
            setattr(module, CONTEXT_ATTRIBUTE, group)
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", False) is True:
            config.use_cache = False  # a cache of this rank's keys alone means nothing
    base = getattr(model, "base_model", model)
    base.register_forward_pre_hook(_HuggingFacePositions(group), with_kwargs=True)


class _HuggingFacePositions:
    """Forward pre-hook of a Hugging Face base model: `position_ids` are the tokens' global positions
    (unless the caller passes them)."""

    def __init__(self, group: ContextGroup) -> None:
        self.group = group

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if kwargs.get("position_ids") is not None:
            return args, kwargs
        inputs = kwargs.get("input_ids", args[0] if args else None)
        if inputs is None:
            inputs = kwargs["inputs_embeds"]
        kwargs["position_ids"] = self.group.positions(inputs.shape[1], inputs.device)[None]
        return args, kwargs


def _hugging_face_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature; returns (batch, L, heads, dim) as its `sdpa` does."""
    group = getattr(module, CONTEXT_ATTRIBUTE, None)
    if group is None:
        raise UnsupportedStrategyError(
            f"mesh.context: {type(module).__name__} reached the context-parallel attention without a context group"
        )
    if attention_mask is not None:
        raise UnsupportedStrategyError(
            f"mesh.context ({group.size}): an attention_mask (padding) is not split with the sequence; "
            "train on unpadded sequences"
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = group.attend(query, key, value, dropout_p=dropout, is_causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None
