"""Transformers: a BERT-large-like encoder and a GPT-like decoder (GPT-2, LLaMA-style, Megatron's GPTs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.zoo.common import (
    Built,
    DeviceLike,
    MakeTensors,
    batch_maker,
    check_materializable,
    config_error,
    finish,
    on_device,
    resolve_config,
)


@dataclass(frozen=True)
class TransformerConfig:
    vocab: int = 30522
    hidden: int = 1024
    layers: int = 24
    heads: int = 16
    ffn: int = 4096
    seq: int = 128
    causal: bool = False
    """Decoder (causal attention, next-token loss) or encoder (bidirectional, masked-LM-style loss)."""
    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    positions: Literal["learned", "rope"] = "learned"
    tie_embeddings: bool = True
    bias: bool = True
    dropout: float = 0.1
    sparse_embeddings: bool = False
    """The token embedding built with `sparse=True`: its gradient is the rows a step looked up, as
    TensorFlow's gather makes it (AutoDist's BERT under Parallax); needs `tie_embeddings` off."""


BERT_PRESETS = {
    "small": TransformerConfig(vocab=1000, hidden=64, layers=2, heads=4, ffn=256, seq=32),
    "full": TransformerConfig(),
}


def _megatron(heads: int, hidden: int, layers: int) -> TransformerConfig:
    """The GPT configs of Narayanan et al. 2021 (Megatron-LM, Table 1): vocab 51200, seq 2048, ffn 4h."""
    return TransformerConfig(
        vocab=51200, hidden=hidden, layers=layers, heads=heads, ffn=4 * hidden, seq=2048, causal=True, dropout=0.0
    )


GPT_PRESETS = {
    "small": TransformerConfig(vocab=1000, hidden=64, layers=2, heads=4, ffn=256, seq=32, causal=True, dropout=0.0),
    "full": TransformerConfig(vocab=50257, hidden=768, layers=12, heads=12, ffn=3072, seq=1024, causal=True),
    "7b": TransformerConfig(
        vocab=32000,
        hidden=4096,
        layers=32,
        heads=32,
        ffn=11008,
        seq=2048,
        causal=True,
        mlp="swiglu",
        norm="rmsnorm",
        positions="rope",
        tie_embeddings=False,
        bias=False,
        dropout=0.0,
    ),
    "1.7b": _megatron(24, 2304, 24),
    "3.6b": _megatron(32, 3072, 30),
    "7.5b": _megatron(32, 4096, 36),
    "18b": _megatron(48, 6144, 40),
    "39b": _megatron(64, 8192, 48),
    "76b": _megatron(80, 10240, 60),
    "145b": _megatron(96, 12288, 80),
    "310b": _megatron(128, 16384, 96),
    "530b": _megatron(128, 20480, 105),
    "1t": _megatron(160, 25600, 128),
}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float, is_causal: bool) -> torch.Tensor:
    """The attention core over whole sequences (context parallelism puts its own in `Attention.attend`)."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)


class Attention(nn.Module):
    cos: torch.Tensor  # rotary tables, registered as buffers when positions are "rope"
    sin: torch.Tensor
    positions: torch.Tensor | None = None
    """Where in the sequence each token of the input sits (rotary rows); None: 0..seq-1. Set by the
    runtime when the input is a piece of each sequence (context parallelism)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.causal = config.causal
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden, bias=config.bias)
        self.out = nn.Linear(config.hidden, config.hidden, bias=config.bias)
        self.rope = config.positions == "rope"
        self.attend: Callable[..., torch.Tensor] = attend
        if self.rope:
            head_dim = config.hidden // config.heads
            inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
            angles = torch.outer(torch.arange(config.seq, dtype=torch.float32), inverse).repeat(1, 2)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Views sized by the head count and the local tensors, so a tensor-parallel split (fewer heads per rank) just works.
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.rope:
            rows = slice(0, seq) if self.positions is None else self.positions
            cos, sin = self.cos[rows], self.sin[rows]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        dropout = self.dropout if self.training else 0.0
        y = self.attend(q, k, v, dropout_p=dropout, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        self.fc = nn.Linear(config.hidden, config.ffn, bias=config.bias)
        if self.swiglu:
            self.gate = nn.Linear(config.hidden, config.ffn, bias=config.bias)
        self.act = nn.SiLU() if self.swiglu else nn.GELU()
        self.proj = nn.Linear(config.ffn, config.hidden, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.act(self.gate(x)) * self.fc(x) if self.swiglu else self.act(self.fc(x))
        return self.proj(hidden)


def _norm(config: TransformerConfig) -> nn.Module:
    return nn.RMSNorm(config.hidden, eps=1e-5) if config.norm == "rmsnorm" else nn.LayerNorm(config.hidden)


class Block(nn.Module):
    """Pre-norm block for decoders (GPT, LLaMA), post-norm for the BERT-style encoder."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.causal
        self.ln1 = _norm(config)
        self.attn = Attention(config)
        self.ln2 = _norm(config)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.ln1(x)))
            return x + self.drop(self.mlp(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.mlp(x)))


class Transformer(nn.Module):
    """Token (and position, token-type) embeddings, blocks, and a language-model head with its loss."""

    position_ids: torch.Tensor | None = None
    """The learned position of each input token; None: 0..seq-1 (see `Attention.positions`)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if config.sparse_embeddings and config.tie_embeddings:
            raise config_error("overrides.sparse_embeddings", "a sparse token embedding cannot be tied to the head")
        self.embed = nn.Embedding(config.vocab, config.hidden, sparse=config.sparse_embeddings)
        self.positions = nn.Embedding(config.seq, config.hidden) if config.positions == "learned" else None
        self.token_types = None if config.causal else nn.Embedding(2, config.hidden)
        self.embed_norm = None if config.causal else _norm(config)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = _norm(config) if config.causal else None
        self.head = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        tokens, labels = batch[0], batch[-1]
        x = self.embed(tokens)
        if self.positions is not None:
            ids = (
                torch.arange(tokens.shape[1], device=tokens.device) if self.position_ids is None else self.position_ids
            )
            x = x + self.positions(ids)
        if self.token_types is not None:
            x = x + self.token_types(batch[1])
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def transformer_parameters(config: TransformerConfig) -> int:
    """Exact parameter count without building the model (to refuse materializing a 1T model)."""
    h, f = config.hidden, config.ffn
    mlp_inputs = 2 if config.mlp == "swiglu" else 1
    norm = 2 * h if config.norm == "layernorm" else h
    per_layer = 4 * h * h + (mlp_inputs + 1) * h * f + 2 * norm
    if config.bias:
        per_layer += 3 * h + h + mlp_inputs * f + h
    embeddings = config.vocab * h * (1 if config.tie_embeddings else 2)
    if config.positions == "learned":
        embeddings += config.seq * h
    if not config.causal:
        embeddings += 2 * h
    return config.layers * per_layer + embeddings + norm


def _check_transformer(config: TransformerConfig) -> None:
    if config.hidden % config.heads:
        raise config_error("overrides.heads", f"hidden({config.hidden}) % heads({config.heads}) != 0")
    if config.positions == "rope" and (config.hidden // config.heads) % 2:
        raise config_error("overrides.heads", "rope needs an even head dimension")


def _token_batch(config: TransformerConfig) -> MakeTensors:
    def make(batch_size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        shape = (batch_size, config.seq)
        tokens = torch.randint(0, config.vocab, shape, device=device)
        labels = torch.randint(0, config.vocab, shape, device=device)
        if config.causal:
            return tokens, labels
        return tokens, torch.randint(0, 2, shape, device=device), labels

    return make


def _transformer(
    name: str, presets: dict[str, TransformerConfig], size: str, device: DeviceLike, overrides: dict[str, Any]
) -> Built:
    config = resolve_config(presets, size, overrides)
    _check_transformer(config)
    check_materializable(name, size, transformer_parameters(config), device)
    with on_device(device):
        module = Transformer(config)
    return finish(module, batch_maker(device, _token_batch(config)), name, size, overrides, config)


def bert_large(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """BERT-large-like encoder (24 layers, hidden 1024, 16 heads, seq 128) with a tied masked-LM head.

    Batch: (token ids, token-type ids, labels).
    """
    return _transformer("bert_large", BERT_PRESETS, size, device, overrides)


def gpt(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """GPT-like decoder with causal SDPA attention. Sizes: small, full (GPT-2 124M), 7b (LLaMA-7B-like:
    SwiGLU, RMSNorm, rotary, untied head) and the Megatron-LM paper's 1.7b ... 1t (configs for meta only).

    Batch: (token ids, labels).
    """
    return _transformer("gpt", GPT_PRESETS, size, device, overrides)
