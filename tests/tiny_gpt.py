"""The small nn.Sequential GPT the hybrid runtime tests train on gloo ranks, and its Megatron split."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

STEPS, BATCH, SEQ, VOCAB, HIDDEN, HEADS = 3, 8, 8, 64, 32, 4


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(SEQ, HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class Attention(nn.Module):
    """Megatron-friendly: views are sized by `self.heads` and the local tensors, so a split just works."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = HEADS
        self.q, self.k, self.v, self.out = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn = Attention()
        self.fc, self.proj = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(HIDDEN)
        self.out = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def tiny_gpt() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Embed(), Block(), Block(), Head())


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def split_plan() -> list[dict[str, Any]]:
    plan: list[dict[str, Any]] = [{"name": "0.tok", "style": "vocab"}, {"name": "3.out", "style": "vocab"}]
    for block in ("1", "2"):
        plan += [
            {"name": f"{block}.attn", "style": "heads", "heads": HEADS},
            {"name": f"{block}.fc", "style": "colwise"},
            {"name": f"{block}.proj", "style": "rowwise"},
        ]
    return plan
