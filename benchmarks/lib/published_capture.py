"""Capture each published row's model on the meta device, once: graphs are cached on disk between runs.

The cache lives under the user's cache folder (`$XDG_CACHE_HOME/stratagem/published`, else
`~/.cache/stratagem/published`) or `--cache DIR`, never in the repository. A graph's key hashes what it
was captured from (the config, batch, sequence, optimizer) and what captured it (torch's and transformers'
versions and the bytes of stratagem's capture code), so a change to any of them captures again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stratagem
from benchmarks.lib.published_models import ModelSpec
from stratagem import ModelGraph

CAPTURE_CODE = ("tracing", "hf.py", "architecture.py", "zoo")
"""The parts of the library whose bytes decide a captured graph."""


@dataclass(frozen=True)
class Captured:
    graph: ModelGraph
    capture_s: float
    """Seconds the capture took when it ran (building the model on meta and tracing one step)."""
    load_s: float
    """Seconds this run spent getting the graph (the capture itself, or reading the cache)."""
    cached: bool


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stratagem" / "published"


class GraphCache:
    """Captured graphs by content key; `directory=None` captures every time and stores nothing."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._memory: dict[str, Captured] = {}
        self._code = _code_digest()

    def key(self, spec: ModelSpec) -> str:
        import torch
        import transformers

        identity = {**spec.key(), "torch": torch.__version__, "transformers": transformers.__version__}
        identity["code"] = self._code
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, spec: ModelSpec) -> Captured:
        key = self.key(spec)
        if key in self._memory:
            hit = self._memory[key]
            return Captured(hit.graph, hit.capture_s, 0.0, True)
        started = time.perf_counter()
        found = self._read(key)
        if found is not None:
            graph, capture_s = found
            result = Captured(graph, capture_s, time.perf_counter() - started, True)
        else:
            graph = capture(spec)
            capture_s = time.perf_counter() - started
            self._write(key, graph, capture_s)
            result = Captured(graph, capture_s, capture_s, False)
        self._memory[key] = result
        return result

    def _read(self, key: str) -> tuple[ModelGraph, float] | None:
        if self.directory is None:
            return None
        graph_path, meta_path = self.directory / f"{key}.json", self.directory / f"{key}.meta.json"
        if not (graph_path.is_file() and meta_path.is_file()):
            return None
        try:
            meta = json.loads(meta_path.read_text())
            return ModelGraph.load(graph_path), float(meta["capture_s"])
        except (OSError, ValueError, KeyError, stratagem.InvalidGraphError):
            return None  # a damaged entry is captured again and overwritten

    def _write(self, key: str, graph: ModelGraph, capture_s: float) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, text in ((f"{key}.json", graph.to_json(indent=None)), (f"{key}.meta.json", _meta(capture_s))):
            partial = self.directory / f".{name}.{os.getpid()}.tmp"
            partial.write_text(text)
            partial.replace(self.directory / name)


def capture(spec: ModelSpec) -> ModelGraph:
    """The spec's model captured on meta at its micro-batch (and sequence)."""
    if spec.kind == "hf":
        assert spec.seq is not None
        return stratagem.capture_hf_config(
            spec.config,
            batch=spec.batch,
            seq=spec.seq,
            optimizer=spec.optimizer,
            name=spec.name,
            attn_implementation=spec.attn_implementation,  # type: ignore[arg-type]
            dtype=spec.dtype,  # type: ignore[arg-type]
        )
    if spec.kind == "zoo":
        module, make_batch = stratagem.zoo.build(spec.config["zoo"], spec.config["size"], device="meta")
        return stratagem.capture(
            module, make_batch(spec.batch), batch_size=spec.batch, optimizer=spec.optimizer, name=spec.name
        )
    raise ValueError(f"unknown model kind {spec.kind!r}")


def _meta(capture_s: float) -> str:
    return json.dumps({"capture_s": round(capture_s, 3), "captured_at": time.strftime("%Y-%m-%dT%H:%M:%S")})


def _code_digest() -> str:
    root = Path(stratagem.__file__).resolve().parent
    digest = hashlib.sha256()
    for part in CAPTURE_CODE:
        path = root / part
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def describe(graph: ModelGraph) -> dict[str, Any]:
    """What a row's JSON says about its graph."""
    arch = graph.architecture
    return {
        "graph_id": str(graph.id)[:16],
        "layers": len(graph.layers),
        "parameters": graph.num_parameters,
        "gflop_per_micro_batch": round(graph.total_flops / 1e9, 1),
        "attn_implementation": graph.provenance.get("attn_implementation"),
        "architecture": arch.model_dump(mode="json") if arch is not None else None,
    }
