"""Published rows as trials, in the JSON Lines format `stratagem trials import` reads.

The file is what `stratagem trials export` writes (stratagem/cli/trials.py): a header, then each graph,
resource spec and strategy before the first trial that uses it, then the trial. A trial's `backend`
names its source (`megatron_sc21_table1`, ...): the service stores and returns it, and it is part of
what makes two trials the same measurement, so importing the file twice records nothing new. A row the
IR cannot state (torch.compile, async TP, fp8 all-gather) is left out, with its reason: its measurement
would be filed under a strategy that did not run.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from benchmarks.lib.published_rows import Row, samples_per_s
from stratagem import Layout, ModelGraph, Prediction, ResourceSpec, Strategy

FORMAT = "stratagem-trials"
VERSION = 1
BACKEND_CHARS = 32
"""The longest `backend` the service stores (optimizer_service/core/inputs.py, TrialInput.backend)."""
NAMESPACE = uuid.UUID("6f0c1c52-3f4c-4f39-9d7a-0d5d4b2b6a11")


@dataclass(frozen=True)
class Exportable:
    row: Row
    graph: ModelGraph
    resources: ResourceSpec
    layout: Layout
    prediction: Prediction | None
    simulator_version: str | None


def export_trials(
    items: Sequence[Exportable], stream: TextIO, *, source: str, left_out: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Write the file; returns lines per kind and the rows left out (passed in) with their reasons."""
    _write(
        stream,
        {
            "kind": "header",
            "format": FORMAT,
            "version": VERSION,
            "source": source,
            "exported_at": datetime.datetime.now(datetime.UTC).isoformat(),
        },
    )
    written: set[tuple[str, str]] = set()
    counts = {"graph": 0, "resources": 0, "strategy": 0, "trial": 0}
    for item in items:
        strategy = _strategy(item)
        documents = (("graph", item.graph), ("resources", item.resources), ("strategy", strategy))
        for kind, document in documents:
            if (kind, str(document.id)) not in written:
                _write(stream, {"kind": kind, "id": str(document.id), "document": document.model_dump(mode="json")})
                written.add((kind, str(document.id)))
                counts[kind] += 1
        _write(stream, trial_line(item, strategy))
        counts["trial"] += 1
    return {"lines": counts, "left_out": list(left_out)}


def trial_line(item: Exportable, strategy: Strategy) -> dict[str, Any]:
    """The trial as `GET /v1/trials` shows one: the measured step, its source as the backend."""
    row = item.row
    if len(row.source) > BACKEND_CHARS:
        raise ValueError(
            f"source: {row.source!r} is longer than the {BACKEND_CHARS} characters a trial's backend holds"
        )
    predicted = item.prediction.step_time_s if item.prediction is not None else None
    return {
        "kind": "trial",
        "id": str(uuid.uuid5(NAMESPACE, f"{row.id}|{row.source_path}|{row.measured_step_s}")),
        "job_id": None,
        "graph_id": str(item.graph.id),
        "resource_id": str(item.resources.id),
        "strategy_id": str(strategy.id),
        "outcome": "ok",
        "step_times_s": [row.measured_step_s],
        "median_s": row.measured_step_s,
        "p90_s": row.measured_step_s,
        "samples_per_s": samples_per_s(row),
        "peak_memory_bytes": row.measured_memory_bytes,
        "error": None,
        "backend": row.source,
        "predicted_step_time_s": predicted if predicted and predicted > 0 else None,
        "simulator_version": item.simulator_version if predicted else None,
        "created_at": None,
    }


def _strategy(item: Exportable) -> Strategy:
    if item.prediction is not None and item.prediction.strategy is not None:
        return item.prediction.strategy
    return item.layout.build(item.graph, item.resources)


def _write(stream: TextIO, line: dict[str, Any]) -> None:
    stream.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
