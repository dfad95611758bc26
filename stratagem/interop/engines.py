"""What the four engine modules share: the versions followed, refusals, and the strategy entry point.

A strategy reaches an engine through its layout (`stratagem.layout.layout_of`): what no layout states
(parameter servers, mixed synchronizers, compression, partitions, SSP/ASP) no engine config states
either, and each engine module refuses the knobs its own trainer lacks, naming them and saying why.
Key names follow each engine's source at the commit in `ENGINE_SOURCES` (docs/layouts.md).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any, Literal

from stratagem.errors import InvalidLayoutError, Problem, UnsupportedStrategyError
from stratagem.ir import ModelGraph, Strategy

Engine = Literal["torchtitan", "deepspeed", "megatron", "accelerate"]
ENGINES: tuple[Engine, ...] = ("torchtitan", "deepspeed", "megatron", "accelerate")
ENGINE_SOURCES: dict[str, str] = {
    "torchtitan": "pytorch/torchtitan@e347b1e5e6b6941d789d16d340145294d82dc71e (2026-02-15, the last TOML job config)",
    "deepspeed": "microsoft/DeepSpeed@38327e07f6cd39b63418f60cedd1651b0be3e7c3 (v0.16.5)",
    "megatron": "NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22)",
    "accelerate": "huggingface/accelerate@16cb6eb80dd9aa8b4df1a63ef57863e455d53b83 (2026-07-24)",
}
"""The engine source each module's key names were checked against."""
TF32_REASON = (
    "tf32: no config key turns on TF32 matmuls; train in fp32 with "
    "`torch.backends.cuda.matmul.allow_tf32 = True` in the training script"
)


def refuse(engine: str, reasons: list[str]) -> None:
    """Raise UnsupportedStrategyError listing every knob the engine cannot express, if any."""
    if reasons:
        raise UnsupportedStrategyError(f"{engine} cannot express this layout: " + "; ".join(reasons))


def config_error(engine: str, where: str, reason: str) -> InvalidLayoutError:
    """A config that cannot be read as a layout, naming the engine's key."""
    return InvalidLayoutError([Problem(f"{engine}.{where}" if where else engine, reason)])


def strategy_to(engine: Engine, strategy: Strategy, graph: ModelGraph | None) -> Any:
    """`Strategy.to_<engine>()`: the strategy's layout in the engine's language."""
    from stratagem.architecture import architecture_of
    from stratagem.interop import accelerate, deepspeed, megatron, torchtitan
    from stratagem.layout import layout_of, node_count

    try:
        layout = layout_of(strategy, graph)
    except UnsupportedStrategyError as error:
        raise UnsupportedStrategyError(f"{engine} cannot express this strategy: {error}") from None
    arch = architecture_of(graph) if graph is not None else None
    layers = arch.layers if arch is not None else None
    clip = graph_clip(graph)
    exports: dict[str, Callable[[], Any]] = {
        "torchtitan": lambda: torchtitan.layout_to_torchtitan(layout, layers=layers, clip=clip),
        "deepspeed": lambda: deepspeed.layout_to_deepspeed(layout, clip=clip),
        "megatron": lambda: megatron.layout_to_megatron(layout, layers=layers, clip=clip),
        "accelerate": lambda: accelerate.layout_to_accelerate(layout, machines=node_count(strategy), clip=clip),
    }
    return exports[engine]()


def graph_clip(graph: ModelGraph | None) -> float | None:
    """The global norm the graph's run clips to, as the engines write it: 0.0 where the graph does not clip
    (DeepSpeed's `gradient_clipping` and Megatron-LM's `--clip-grad` turn off at 0), None without a graph
    (the engine keeps its own default)."""
    if graph is None:
        return None
    return graph.optimizer.max_grad_norm or 0.0


def positive_int(engine: str, where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise config_error(engine, where, f"must be a positive integer, got {value!r}")
    return value


FILES: dict[str, tuple[str, str]] = {
    "torchtitan": ("application/toml", "toml"),
    "deepspeed": ("application/json", "json"),
    "megatron": ("text/x-shellscript", "sh"),
    "accelerate": ("application/yaml", "yaml"),
}
"""Media type and file suffix of each engine's config as the service serves it."""


def render(engine: str, config: Any) -> str:
    """An exported config as the text of its file: TOML and YAML as they are, DeepSpeed's dict as JSON,
    Megatron-LM's arguments one flag (with its value) per line, continued with backslashes."""
    if engine == "deepspeed":
        return json.dumps(config, indent=2) + "\n"
    if engine == "megatron":
        lines: list[str] = []
        for word in config:
            if word.startswith("--") or not lines:
                lines.append(word)
            else:
                lines[-1] += " " + shlex.quote(word)
        return " \\\n".join(lines) + "\n"
    return str(config)
