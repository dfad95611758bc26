"""Write the JSON Schemas of the documents (`python -m stratagem.ir.schemas docs/schemas`): the three IR
documents and the Layout users state their configurations in."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stratagem.ir.graph import ModelGraph
from stratagem.ir.resources import ResourceSpec
from stratagem.ir.strategy import Strategy
from stratagem.layout import Layout

DOCUMENTS: dict[str, type[BaseModel]] = {
    "model_graph": ModelGraph,
    "resource_spec": ResourceSpec,
    "strategy": Strategy,
    "layout": Layout,
}


def schema_of(name: str) -> dict[str, Any]:
    return DOCUMENTS[name].model_json_schema()


def render(name: str) -> str:
    return json.dumps(schema_of(name), indent=2, sort_keys=True) + "\n"


def write_all(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in DOCUMENTS:
        path = folder / f"{name}.schema.json"
        path.write_text(render(name))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
        print(written)
