"""The model zoo: the workloads Stratagem is exercised on, each with a size knob.

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

from collections.abc import Callable
from typing import Any

from stratagem.zoo.common import Built, DeviceLike, MakeBatch, config_error, resolve_config
from stratagem.zoo.densenet import DENSENET_PRESETS, DenseNetConfig, densenet121
from stratagem.zoo.dlrm import DLRM_PRESETS, DLRMConfig, dlrm
from stratagem.zoo.inception import INCEPTION_PRESETS, InceptionConfig, inception_v3
from stratagem.zoo.resnet import RESNET_PRESETS, ResNetConfig, resnet50
from stratagem.zoo.transformer import (
    BERT_PRESETS,
    GPT_PRESETS,
    TransformerConfig,
    bert_large,
    gpt,
    transformer_parameters,
)
from stratagem.zoo.vgg import VGG_PRESETS, VGGConfig, vgg16

ZOO: dict[str, Callable[..., Built]] = {
    "resnet50": resnet50,
    "vgg16": vgg16,
    "bert_large": bert_large,
    "gpt": gpt,
    "dlrm": dlrm,
    "densenet121": densenet121,
    "inception_v3": inception_v3,
}

PRESETS: dict[str, dict[str, Any]] = {
    "resnet50": RESNET_PRESETS,
    "vgg16": VGG_PRESETS,
    "bert_large": BERT_PRESETS,
    "gpt": GPT_PRESETS,
    "dlrm": DLRM_PRESETS,
    "densenet121": DENSENET_PRESETS,
    "inception_v3": INCEPTION_PRESETS,
}
"""Each zoo model's config per size name, for callers that need shapes without building anything."""

SIZES: dict[str, tuple[str, ...]] = {name: tuple(presets) for name, presets in PRESETS.items()}


def build(name: str, size: str = "small", *, device: DeviceLike = None, **overrides: Any) -> Built:
    """Build a zoo model by name: `build("gpt", "7b", device="meta", layers=4)`."""
    if name not in ZOO:
        raise config_error("name", f"unknown zoo model {name!r}; known: {', '.join(ZOO)}")
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
    "DenseNetConfig",
    "InceptionConfig",
    "ResNetConfig",
    "TransformerConfig",
    "VGGConfig",
    "count_parameters",
    "bert_large",
    "build",
    "densenet121",
    "inception_v3",
    "dlrm",
    "gpt",
    "resnet50",
    "resolve_config",
    "Built",
    "DeviceLike",
    "MakeBatch",
    "transformer_parameters",
    "vgg16",
]
