"""benchmarks/embedding_lookups.py and embedding_traffic_records.py: embedding tables priced by their
lookups, and old records rewritten as today's capture counts them."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import torch
from conftest import make_t4_cluster
from torch import nn

from benchmarks import embedding_lookups as lookups
from benchmarks import embedding_traffic_records as records
from stratagem.builders import AllReduce
from stratagem.tracing import capture


def test_a_sparse_tables_measured_and_priced_step_do_not_grow_with_its_rows() -> None:
    spec = make_t4_cluster(1)
    small, large = (lookups.one_table(rows, 16, 256, sparse=True) for rows in (1_000, 1_000_000))
    assert lookups.priced_seconds(*small, spec) == lookups.priced_seconds(*large, spec)
    forward, backward = lookups.timed_steps(*large, repeats=3)
    assert forward > 0 and backward > 0


def _line(rows: int) -> dict:
    model = nn.Sequential(nn.Embedding(rows, 8), nn.Linear(8, 2))
    graph = capture(model, (torch.randint(0, rows, (4, 3)),), batch_size=4)
    spec = make_t4_cluster(1)
    strategy = AllReduce().build(graph, spec)
    return {"graph": graph.model_dump(mode="json"), "strategy": strategy.model_dump(mode="json")}


def test_a_record_rewritten_to_the_table_and_back_is_todays_capture(tmp_path: Path) -> None:
    line = _line(5_000)
    today = json.loads(json.dumps(line))
    assert records.rewrite_line(line, "table") == 1
    embedding = next(layer for layer in line["graph"]["layers"] if layer["kind"] == "embedding")
    before = next(layer for layer in today["graph"]["layers"] if layer["kind"] == "embedding")
    assert embedding["bytes_moved"] == before["bytes_moved"] + 5_000 * 8 * 4 - 12 * 8 * 4
    assert line["strategy"]["graph_id"] == line["graph"]["id"] != today["graph"]["id"]
    source, target = tmp_path / "old.jsonl", tmp_path / "new.jsonl.xz"
    source.write_text(json.dumps(line) + "\n")
    records.main(["--to", "rows", str(source), str(target)])
    with lzma.open(target, "rt") as written:
        back = json.loads(written.read())
    assert back["graph"] == today["graph"] and back["strategy"]["id"] == today["strategy"]["id"]
