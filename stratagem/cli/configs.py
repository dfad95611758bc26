"""Trainer configs read as layouts: `stratagem predict --config` and `stratagem optimize --current-config`
accept the same files, read the same way, so both take their options from here."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stratagem.cli.files import read_text

ENGINES = ("torchtitan", "deepspeed", "megatron", "accelerate")
ENGINE_SUFFIXES = {".toml": "torchtitan", ".json": "deepspeed", ".yaml": "accelerate", ".yml": "accelerate"}
"""A config file's engine by suffix; anything else is read as Megatron-LM arguments."""
CONFIG_FILES = "torchtitan .toml, DeepSpeed .json, Accelerate .yaml, or a file of Megatron-LM arguments"


def add_format_argument(parser: argparse.ArgumentParser, option: str, reads: str) -> None:
    """`{option}-format`, which overrides the engine the suffix of the files `reads` names would pick."""
    parser.add_argument(
        f"{option}-format", choices=ENGINES, default=None, help=f"read {reads} as this engine's (default: by suffix)"
    )


def config_layout(path: Path, engine: str | None, option: str = "--config") -> Any:
    """The layout the trainer config at `path` runs; a file that cannot be read names `option`."""
    from stratagem.layout import Layout

    text = read_text(path, option)
    engine = engine or ENGINE_SUFFIXES.get(path.suffix.lower(), "megatron")
    readers = {
        "torchtitan": Layout.from_torchtitan,
        "deepspeed": Layout.from_deepspeed,
        "megatron": lambda words: Layout.from_megatron(words.replace("\\\n", " ")),
        "accelerate": Layout.from_accelerate,
    }
    return readers[engine](text)
