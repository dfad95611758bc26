"""A transformer's shape (`ModelGraph.architecture`) from where a graph came from.

Layouts are checked against it (heads by the tensor degree, blocks by the pipeline chunks, the
sequence by the context degree) and predictions read the sequence from it (tokens per second). Capture
records a zoo model's config in `provenance.zoo`, and a Hugging Face model is built from its config,
so both shapes are known without looking at the modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stratagem.ir import Architecture, ModelGraph

TRANSFORMER_KEYS = ("layers", "hidden", "heads", "ffn", "seq", "vocab")
"""Config fields every zoo transformer has (`stratagem.zoo.transformer.TransformerConfig`)."""


def architecture_of(graph: ModelGraph) -> Architecture | None:
    """The graph's architecture, or the one its zoo provenance implies; None for other models."""
    if graph.architecture is not None:
        return graph.architecture
    return zoo_architecture(graph.provenance.get("zoo"))


def zoo_architecture(zoo_spec: Any) -> Architecture | None:
    """A zoo transformer's architecture from its `zoo_spec` (name, size, overrides, config); None otherwise."""
    config = zoo_spec.get("config") if isinstance(zoo_spec, Mapping) else None
    if not isinstance(config, Mapping) or not all(isinstance(config.get(key), int) for key in TRANSFORMER_KEYS):
        return None
    return Architecture(
        layers=config["layers"],
        hidden=config["hidden"],
        heads=config["heads"],
        ffn=config["ffn"],
        seq=config["seq"],
        vocab=config["vocab"],
        causal=bool(config.get("causal", True)),
    )


def hf_architecture(config: Any, *, seq: int, causal: bool) -> Architecture:
    """A Hugging Face config's shape. The canonical names (`num_hidden_layers`, `hidden_size`, ...)
    resolve through each config's `attribute_map` (GPT-2's `n_layer` reads as `num_hidden_layers`);
    the feed-forward width is `intermediate_size`, else GPT-2's `n_inner`, else 4 × hidden."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = getattr(config, "num_key_value_heads", None)
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return Architecture(
        layers=int(config.num_hidden_layers),
        hidden=hidden,
        heads=heads,
        kv_heads=int(kv_heads) if kv_heads and int(kv_heads) != heads else None,
        ffn=int(ffn),
        seq=seq,
        vocab=int(config.vocab_size),
        causal=causal,
    )
