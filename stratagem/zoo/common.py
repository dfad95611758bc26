"""What every zoo builder shares: config resolution with field-named errors, the batch maker and
the `zoo_spec` a built module carries."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Literal

import torch
from torch import nn

from stratagem.errors import InvalidDocumentError, Problem

MakeBatch = Callable[[int], tuple[torch.Tensor, ...]]
Built = tuple[nn.Module, MakeBatch]
DeviceLike = torch.device | str | None
MakeTensors = Callable[[int, torch.device], tuple[torch.Tensor, ...]]
Stem = Literal["imagenet", "cifar"]

MATERIALIZE_LIMIT = 2_000_000_000
"""Parameters above which a builder refuses any device but meta: 8 GB of fp32 weights."""


def config_error(path: str, reason: str) -> InvalidDocumentError:
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
        raise config_error(path, f"cannot use {value!r}: {error}") from None


def resolve_config(presets: dict[str, Any], size: str, overrides: dict[str, Any]) -> Any:
    """The preset for `size` with `overrides` applied and type-checked; errors name the field."""
    if size not in presets:
        raise config_error("size", f"unknown size {size!r}; known: {', '.join(presets)}")
    config = presets[size]
    hints = typing.get_type_hints(type(config))
    fields = {f.name for f in dataclasses.fields(config)}
    changes = {}
    for key, value in overrides.items():
        if key not in fields:
            raise config_error(f"overrides.{key}", f"unknown field; known: {', '.join(sorted(fields))}")
        changes[key] = _coerce(value, hints[key], f"overrides.{key}")
    config = dataclasses.replace(config, **changes)
    for name in fields:
        value = getattr(config, name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, int) and not isinstance(v, bool) and v <= 0 for v in values):
            raise config_error(f"overrides.{name}", f"must be positive, got {value!r}")
    return config


def check_materializable(name: str, size: str, parameters: int, device: DeviceLike) -> None:
    if parameters > MATERIALIZE_LIMIT and torch.device(device or "cpu").type != "meta":
        raise config_error(
            "device",
            f"{name} size {size!r} has {parameters / 1e9:.1f}B parameters; build it with device='meta' "
            "(capture needs no real weights)",
        )


def finish(
    module: nn.Module, make_batch: MakeBatch, name: str, size: str, overrides: dict[str, Any], config: Any
) -> Built:
    module.zoo_spec = {  # type: ignore[assignment]
        "name": name,
        "builder": f"stratagem.zoo:{name}",
        "size": size,
        "overrides": dict(overrides),
        "config": dataclasses.asdict(config),
    }
    return module, make_batch


def batch_maker(device: DeviceLike, make: MakeTensors) -> MakeBatch:
    target = torch.device(device or "cpu")

    def make_batch(batch_size: int) -> tuple[torch.Tensor, ...]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise config_error("batch_size", f"must be a positive integer, got {batch_size!r}")
        return make(batch_size, target)

    return make_batch


def on_device(device: DeviceLike) -> Any:
    return torch.device(device) if device is not None else nullcontext()


def image_batch(image_size: int, num_classes: int) -> MakeTensors:
    def make(batch_size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        images = torch.randn(batch_size, 3, image_size, image_size, device=device)
        return images, torch.randint(0, num_classes, (batch_size,), device=device)

    return make


def build_image_classifier(
    name: str,
    model: Callable[[Any], nn.Module],
    presets: dict[str, Any],
    size: str,
    device: DeviceLike,
    overrides: dict[str, Any],
) -> Built:
    """A CNN builder: `model(config)` built on `device`, fed random images of the config's `image_size`
    and labels below its `num_classes`."""
    config = resolve_config(presets, size, overrides)
    with on_device(device):
        module = model(config)
    make = batch_maker(device, image_batch(config.image_size, config.num_classes))
    return finish(module, make, name, size, overrides, config)


def image_stem(channels: int, stem: Stem) -> nn.Sequential:
    """ResNet's and DenseNet's first layers: `imagenet`, a 7x7 stride-2 convolution and a 3x3 stride-2
    max-pool; `cifar`, one 3x3 convolution, which keeps a 32x32 image's resolution."""
    if stem == "imagenet":
        return nn.Sequential(
            nn.Conv2d(3, channels, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(inplace=True)
    )
