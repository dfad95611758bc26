"""A model zoo: the workloads Stratagem is exercised on, each with a size knob.

Every builder returns `(module, make_batch)`. `make_batch(batch_size)` returns the positional arguments
of `module(...)` as a tuple of random tensors on the builder's device, targets included, and the
module's forward returns the scalar training loss, so one training step anywhere is
`module(*make_batch(b)).backward()`. `size="small"` trains for real on a CPU in milliseconds;
`"full"` (and the GPT presets) are the real shapes, meant for `device="meta"`, where nothing is
allocated. Keyword overrides change any config field (`gpt(size="7b", layers=4)`).

Each module carries `zoo_spec` (name, size, overrides, resolved config), which `stratagem.capture`
copies into the graph's provenance, so a trial runner can rebuild the same model from a graph.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stratagem.errors import InvalidDocumentError, Problem

MakeBatch = Callable[[int], tuple[torch.Tensor, ...]]
Built = tuple[nn.Module, MakeBatch]
DeviceLike = torch.device | str | None

_MATERIALIZE_LIMIT = 2_000_000_000
"""Parameters above which a builder refuses any device but meta: 8 GB of fp32 weights."""


# -- configs and their presets -------------------------------------------------------------------------


@dataclass(frozen=True)
class ResNetConfig:
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    """Bottleneck blocks per stage (ResNet-50: 3, 4, 6, 3)."""
    width: int = 64
    """Channels of the first stage; each later stage doubles it, bottlenecks expand 4x."""
    image_size: int = 224
    num_classes: int = 1000
    stem: Literal["imagenet", "cifar"] = "imagenet"
    """`imagenet`: 7x7 stride-2 conv and max-pool; `cifar`: one 3x3 conv, for 32x32 images."""


@dataclass(frozen=True)
class VGGConfig:
    convs: tuple[int, ...] = (2, 2, 3, 3, 3)
    """3x3 convolutions per stage, each stage ending in a 2x2 max-pool (VGG-16: 2, 2, 3, 3, 3)."""
    width: int = 64
    """Channels of the first stage; doubled per stage up to 8x."""
    hidden: int = 4096
    image_size: int = 224
    pool_size: int = 7
    num_classes: int = 1000


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


@dataclass(frozen=True)
class DLRMConfig:
    tables: tuple[int, ...] = (10_000_000, 2_000_000, 500_000, 100_000)
    """Rows of each embedding table (one categorical feature each)."""
    dim: int = 64
    dense_features: int = 13
    bottom: tuple[int, ...] = (512, 256)
    """Hidden widths of the bottom MLP (dense features to `dim`)."""
    top: tuple[int, ...] = (512, 256)
    """Hidden widths of the top MLP (interactions to one logit)."""
    pooling: int = 10
    """Indices looked up per sample in each table (multi-hot, summed)."""


_RESNET = {
    "small": ResNetConfig(blocks=(1, 1, 1, 1), width=8, image_size=32, num_classes=10, stem="cifar"),
    "full": ResNetConfig(),
}
_VGG = {
    "small": VGGConfig(width=8, hidden=64, image_size=32, pool_size=1, num_classes=10),
    "full": VGGConfig(),
}
_BERT = {
    "small": TransformerConfig(vocab=1000, hidden=64, layers=2, heads=4, ffn=256, seq=32),
    "full": TransformerConfig(),
}


def _megatron(heads: int, hidden: int, layers: int) -> TransformerConfig:
    """The GPT configs of Narayanan et al. 2021 (Megatron-LM, Table 1): vocab 51200, seq 2048, ffn 4h."""
    return TransformerConfig(
        vocab=51200, hidden=hidden, layers=layers, heads=heads, ffn=4 * hidden, seq=2048, causal=True, dropout=0.0
    )


_GPT = {
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
_DLRM = {
    "small": DLRMConfig(tables=(20_000, 5_000, 1_000, 200), dim=16, bottom=(32,), top=(32,), pooling=2),
    "full": DLRMConfig(),
}


# -- config resolution ---------------------------------------------------------------------------------


def _config_error(path: str, reason: str) -> InvalidDocumentError:
    return InvalidDocumentError([Problem(path, reason)], document="zoo config")


def _coerce(value: Any, annotation: Any, path: str) -> Any:
    """Command-line strings (`--set layers=4`, `--set tables=100,50`) to the field's type."""
    origin = typing.get_origin(annotation)
    try:
        if origin is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(int(item) for item in items)
        if origin is Literal:
            if value not in typing.get_args(annotation):
                raise ValueError(f"must be one of {list(typing.get_args(annotation))}")
            return value
        if annotation is bool:
            if isinstance(value, str):
                if value.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                    raise ValueError("must be true or false")
                return value.lower() in {"true", "1", "yes"}
            return bool(value)
        if annotation is int and isinstance(value, float) and not value.is_integer():
            raise ValueError("must be an integer")
        return annotation(value)
    except (TypeError, ValueError) as error:
        raise _config_error(path, f"cannot use {value!r}: {error}") from None


def resolve_config(presets: dict[str, Any], size: str, overrides: dict[str, Any]) -> Any:
    """The preset for `size` with `overrides` applied and type-checked; errors name the field."""
    if size not in presets:
        raise _config_error("size", f"unknown size {size!r}; known: {', '.join(presets)}")
    config = presets[size]
    hints = typing.get_type_hints(type(config))
    fields = {f.name for f in dataclasses.fields(config)}
    changes = {}
    for key, value in overrides.items():
        if key not in fields:
            raise _config_error(f"overrides.{key}", f"unknown field; known: {', '.join(sorted(fields))}")
        changes[key] = _coerce(value, hints[key], f"overrides.{key}")
    config = dataclasses.replace(config, **changes)
    for name in fields:
        value = getattr(config, name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, int) and not isinstance(v, bool) and v <= 0 for v in values):
            raise _config_error(f"overrides.{name}", f"must be positive, got {value!r}")
    return config


def _check_materializable(name: str, size: str, parameters: int, device: DeviceLike) -> None:
    if parameters > _MATERIALIZE_LIMIT and torch.device(device or "cpu").type != "meta":
        raise _config_error(
            "device",
            f"{name} size {size!r} has {parameters / 1e9:.1f}B parameters; build it with device='meta' "
            "(capture needs no real weights)",
        )


def _finish(
    module: nn.Module, make_batch: MakeBatch, name: str, size: str, overrides: dict[str, Any], config: Any
) -> Built:
    module.zoo_spec = {  # type: ignore[assignment]
        "name": name,
        "builder": f"examples.zoo:{name}",
        "size": size,
        "overrides": dict(overrides),
        "config": dataclasses.asdict(config),
    }
    return module, make_batch


def _batch_maker(device: DeviceLike, make: Callable[[int, torch.device], tuple[torch.Tensor, ...]]) -> MakeBatch:
    target = torch.device(device or "cpu")

    def make_batch(batch_size: int) -> tuple[torch.Tensor, ...]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise _config_error("batch_size", f"must be a positive integer, got {batch_size!r}")
        return make(batch_size, target)

    return make_batch


def _on(device: DeviceLike) -> Any:
    return torch.device(device) if device is not None else nullcontext()


# -- ResNet-50 -----------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        w = config.width
        if config.stem == "imagenet":
            self.stem = nn.Sequential(
                nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(w),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)
            )
        stages: list[nn.Module] = []
        channels = w
        for index, count in enumerate(config.blocks):
            width = w * 2**index
            blocks = []
            for block in range(count):
                blocks.append(Bottleneck(channels, width, stride=2 if index > 0 and block == 0 else 1))
                channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, config.num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.pool(self.stages(self.stem(images))).flatten(1)
        return F.cross_entropy(self.fc(features), labels)


def _image_batch(image_size: int, num_classes: int) -> Callable[[int, torch.device], tuple[torch.Tensor, ...]]:
    def make(batch_size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        images = torch.randn(batch_size, 3, image_size, image_size, device=device)
        return images, torch.randint(0, num_classes, (batch_size,), device=device)

    return make


def resnet50(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """ResNet-50-like CNN with bottleneck blocks; small: 8 base channels, one block per stage, 32x32."""
    config = resolve_config(_RESNET, size, overrides)
    with _on(device):
        module = ResNet(config)
    make = _batch_maker(device, _image_batch(config.image_size, config.num_classes))
    return _finish(module, make, "resnet50", size, overrides, config)


# -- VGG-16 --------------------------------------------------------------------------------------------


class VGG(nn.Module):
    def __init__(self, config: VGGConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for index, count in enumerate(config.convs):
            width = config.width * 2 ** min(index, 3)
            for _ in range(count):
                layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
                channels = width
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(config.pool_size)
        self.classifier = nn.Sequential(
            nn.Linear(channels * config.pool_size**2, config.hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(config.hidden, config.hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(config.hidden, config.num_classes),
        )

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.pool(self.features(images)).flatten(1)
        return F.cross_entropy(self.classifier(features), labels)


def vgg16(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """VGG-16-like CNN: 13 3x3 convolutions in 5 stages and a 3-layer classifier; small: 8 base channels."""
    config = resolve_config(_VGG, size, overrides)
    with _on(device):
        module = VGG(config)
    make = _batch_maker(device, _image_batch(config.image_size, config.num_classes))
    return _finish(module, make, "vgg16", size, overrides, config)


# -- transformers (BERT-large-like encoder, GPT-like decoder) -----------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.causal = config.causal
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden, bias=config.bias)
        self.out = nn.Linear(config.hidden, config.hidden, bias=config.bias)
        self.rope = config.positions == "rope"
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
            cos, sin = self.cos[:seq], self.sin[:seq]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=self.causal)
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

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.hidden)
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
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
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
        raise _config_error("overrides.heads", f"hidden({config.hidden}) % heads({config.heads}) != 0")
    if config.positions == "rope" and (config.hidden // config.heads) % 2:
        raise _config_error("overrides.heads", "rope needs an even head dimension")


def _token_batch(config: TransformerConfig) -> Callable[[int, torch.device], tuple[torch.Tensor, ...]]:
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
    _check_materializable(name, size, transformer_parameters(config), device)
    with _on(device):
        module = Transformer(config)
    return _finish(module, _batch_maker(device, _token_batch(config)), name, size, overrides, config)


def bert_large(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """BERT-large-like encoder (24 layers, hidden 1024, 16 heads, seq 128) with a tied masked-LM head.

    Batch: (token ids, token-type ids, labels).
    """
    return _transformer("bert_large", _BERT, size, device, overrides)


def gpt(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """GPT-like decoder with causal SDPA attention. Sizes: small, full (GPT-2 124M), 7b (LLaMA-7B-like:
    SwiGLU, RMSNorm, rotary, untied head) and the Megatron-LM paper's 1.7b ... 1t (configs for meta only).

    Batch: (token ids, labels).
    """
    return _transformer("gpt", _GPT, size, device, overrides)


# -- DLRM ----------------------------------------------------------------------------------------------


def _mlp(widths: list[int], *, last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for index, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if last_activation or index < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Sparse embedding tables of different sizes, a dense bottom MLP, pairwise dot interactions, a top MLP."""

    def __init__(self, config: DLRMConfig) -> None:
        super().__init__()
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(rows, config.dim, mode="sum", sparse=True) for rows in config.tables
        )
        self.bottom = _mlp([config.dense_features, *config.bottom, config.dim], last_activation=True)
        features = len(config.tables) + 1
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        interactions = features * (features - 1) // 2
        self.top = _mlp([config.dim + interactions, *config.top, 1], last_activation=False)

    def forward(
        self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [table(indices[i], offsets) for i, table in enumerate(self.tables)]
        stacked = torch.stack([x, *pooled], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        logits = self.top(torch.cat([x, dots], dim=1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(logits, labels)


def dlrm(size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """DLRM-like recommendation model; full: tables of 10M/2M/500k/100k rows x 64 (sparse gradients).

    Batch: (dense features [b, 13], indices [tables, b*pooling], offsets [b], labels [b]).
    """
    config = resolve_config(_DLRM, size, overrides)
    _check_materializable("dlrm", size, sum(config.tables) * config.dim, device)
    with _on(device):
        module = DLRM(config)

    def make(batch_size: int, target: torch.device) -> tuple[torch.Tensor, ...]:
        lookups = batch_size * config.pooling
        dense = torch.randn(batch_size, config.dense_features, device=target)
        indices = torch.stack([torch.randint(0, rows, (lookups,), device=target) for rows in config.tables])
        offsets = torch.arange(0, lookups, config.pooling, device=target)
        labels = torch.randint(0, 2, (batch_size,), device=target).float()
        return dense, indices, offsets, labels

    return _finish(module, _batch_maker(device, make), "dlrm", size, overrides, config)


# -- registry ------------------------------------------------------------------------------------------

ZOO: dict[str, Callable[..., Built]] = {
    "resnet50": resnet50,
    "vgg16": vgg16,
    "bert_large": bert_large,
    "gpt": gpt,
    "dlrm": dlrm,
}

PRESETS: dict[str, dict[str, Any]] = {
    "resnet50": _RESNET,
    "vgg16": _VGG,
    "bert_large": _BERT,
    "gpt": _GPT,
    "dlrm": _DLRM,
}
"""Each zoo model's config per size name, for callers that need shapes without building anything."""

SIZES: dict[str, tuple[str, ...]] = {name: tuple(presets) for name, presets in PRESETS.items()}


def build(name: str, size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """Build a zoo model by name: `build("gpt", "7b", device="meta", layers=4)`."""
    if name not in ZOO:
        raise _config_error("name", f"unknown zoo model {name!r}; known: {', '.join(ZOO)}")
    return ZOO[name](size, device=device, **overrides)


def count_parameters(name: str, size: str = "small", **overrides: Any) -> int:
    """Parameters of a zoo model, counted on meta (nothing allocated)."""
    module, _ = build(name, size, device="meta", **overrides)
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "PRESETS",
    "SIZES",
    "ZOO",
    "DLRMConfig",
    "ResNetConfig",
    "TransformerConfig",
    "VGGConfig",
    "count_parameters",
    "bert_large",
    "build",
    "dlrm",
    "gpt",
    "resnet50",
    "resolve_config",
    "transformer_parameters",
    "vgg16",
]
