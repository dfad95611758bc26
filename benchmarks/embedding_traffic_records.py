"""Rewrite a trial records file's graphs as one capture version or the other counted embedding traffic.

Capture before `principled-1.13` counted an embedding op's whole table in the layer's `bytes_moved`;
since then it counts the rows looked up. Records keep the graph captured when they were measured, so
comparing two simulator versions on the same measurements needs each version's graphs:

    --to rows   records captured before 1.13, as today's capture writes them (table out, rows in)
    --to table  records captured since, as capture wrote them before (rows out, table in)

Every embedding layer of a captured graph is rewritten (`bytes_moved ± table ∓ lookups · row bytes`,
exact for one lookup per table per step, as in the zoo); graphs built by hand
(`benchmarks/cost_model.py`'s replayed jobs, whose bytes never held a table) are copied as they are.
Graph ids are recomputed and each strategy follows its graph.

    python -m benchmarks.embedding_traffic_records --to rows IN.jsonl.xz OUT.jsonl.xz
"""

from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path
from typing import Any

from benchmarks.lib.records import read_lines
from stratagem.ir import ModelGraph, Strategy, Variable

HAND_BUILT = "benchmarks/cost_model.py"
"""`provenance.source` of the graphs `benchmarks/cost_model.py` builds by hand."""


def rewrite_graph(graph: dict[str, Any], to: str) -> int:
    """Rewrite `graph` (a document, in place); returns how many embedding layers changed."""
    variables = {v["name"]: v for v in graph["variables"]}
    sign = 1.0 if to == "table" else -1.0
    changed = 0
    for layer in graph["layers"]:
        if layer.get("kind") != "embedding":
            continue
        for name in layer.get("variables", []):
            variable = Variable.model_validate(variables[name])
            table = float(variable.nbytes)
            looked_up = (variable.lookups_per_step or 0) * variable.row_bytes
            layer["bytes_moved"] = layer["bytes_moved"] + sign * (table - looked_up)
            changed += 1
    return changed


def rewrite_line(line: dict[str, Any], to: str) -> int:
    graph = line["graph"]
    if (graph.get("provenance") or {}).get("source") == HAND_BUILT:
        return 0
    changed = rewrite_graph(graph, to)
    old = graph.pop("id", None)
    graph["id"] = ModelGraph.parse(graph).id
    strategy = line["strategy"]
    if strategy.get("graph_id") == old:
        strategy["graph_id"] = graph["id"]
        strategy.pop("id", None)
        strategy["id"] = Strategy.parse(strategy).id
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--to", choices=("rows", "table"), required=True)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path, help="written xz-compressed")
    args = parser.parse_args(argv)
    changed = 0
    with lzma.open(args.target, "wt") as out:
        for text in read_lines(args.source):
            if text.strip():
                line = json.loads(text)
                changed += rewrite_line(line, args.to)
                out.write(json.dumps(line) + "\n")
    print(json.dumps({"embedding_layers_rewritten": changed, "to": args.to}))


if __name__ == "__main__":
    main()
