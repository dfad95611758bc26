"""Trial records files: one JSON line {graph, resources, strategy, result} per trial, plain or compressed.

The accuracy and cost-model benchmarks write them while they measure and re-score them later
(`--from-records`, `--trials`), so one set of measurements can judge any simulator. A record is read
under today's schema: its documents' ids are recomputed from their content (the strategy's references
follow), and a calibrated spec is rebuilt from the figures it recorded (`calibrate.reread`).
"""

from __future__ import annotations

import gzip
import json
import lzma
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratagem.calibrate import reread
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

OPENERS = {".xz": lzma.open, ".gz": gzip.open}


def read_lines(path: Path) -> list[str]:
    """The file's lines, decompressed by its suffix (`.xz`, `.gz`, else plain text)."""
    opener = OPENERS.get(path.suffix)
    if opener is None:
        return path.read_text().splitlines()
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def record_line(
    graph: ModelGraph, resources: ResourceSpec, strategy: Strategy, result: dict[str, Any], **extra: Any
) -> str:
    """One trial as a records line (`extra`: fields beside the documents, such as the job and round)."""
    return json.dumps(
        {
            **extra,
            "graph": graph.model_dump(mode="json"),
            "resources": resources.model_dump(mode="json"),
            "strategy": strategy.model_dump(mode="json"),
            "result": result,
        }
    )


def trial_documents(line: dict[str, Any]) -> tuple[ModelGraph, ResourceSpec, Strategy]:
    """The trial's three documents, their ids recomputed from their content; the spec re-read as
    today's calibration reads its figures. The strategy ran on the record's graph and spec, so its
    references follow their ids."""
    graph_doc, resources_doc, strategy_doc = (
        {key: value for key, value in line[name].items() if key != "id"} for name in ("graph", "resources", "strategy")
    )
    graph, resources = ModelGraph.parse(graph_doc), reread(ResourceSpec.parse(resources_doc))
    return graph, resources, Strategy.parse({**strategy_doc, "graph_id": graph.id, "resources_id": resources.id})


def strategy_name(strategy: Strategy) -> str:
    """The builder's name, or the mix's name for the search-style strategies the benchmarks make."""
    search = strategy.provenance.search or {}
    return strategy.provenance.builder or str(search.get("mix") or strategy.id)


@dataclass
class Trial:
    """One real run of a strategy, with the spec calibrated alongside it and the simulator's prediction."""

    resources: ResourceSpec
    strategy: Strategy
    median_s: float | None
    failure: str | None = None
    predicted_s: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    undistributed_s: float | None = None
    """The same model's step without synchronization, measured alongside (interleaved blocks)."""
    sync_s: dict[str, float] = field(default_factory=dict)
    """The runtime's own timings of the step (waits per kind, launch, update; interleaved blocks)."""
    optimizer_primed: bool = False
    """Whether the optimizer state was filled before timing (`TrialSpec.prime_optimizer`)."""


@dataclass
class Measured:
    """One (model, strategy) pair and its trials, one per round: measured and predicted are the
    medians over the successful trials, each predicted with the calibration of its own round."""

    model: str
    name: str
    graph: ModelGraph
    trials: list[Trial] = field(default_factory=list)

    @property
    def ok(self) -> list[Trial]:
        return [t for t in self.trials if t.median_s is not None]

    @property
    def measured(self) -> float | None:
        return statistics.median([t.median_s for t in self.ok]) if self.ok else None  # type: ignore[misc]

    @property
    def predicted(self) -> float | None:
        values = [t.predicted_s for t in self.ok if t.predicted_s is not None]
        return statistics.median(values) if values else None

    @property
    def spread(self) -> float | None:
        """(slowest − fastest round) / median: how far repeated measurements of it disagree."""
        medians = [t.median_s for t in self.ok]
        if len(medians) < 2:
            return None
        return (max(medians) - min(medians)) / statistics.median(medians)  # type: ignore[type-var, operator]


def trial_from_result(resources: ResourceSpec, strategy: Strategy, result: dict[str, Any]) -> Trial:
    """A trial from a trial runner's (or an interleaved block's) result."""
    ok = result.get("outcome") == "ok" and result.get("median_s")
    error = (result.get("error") or "").strip()[:200]
    return Trial(
        resources,
        strategy,
        float(result["median_s"]) if ok else None,
        None if ok else f"{result.get('outcome')}: {error}" if error else str(result.get("outcome")),
        undistributed_s=result.get("undistributed_step_s"),
        sync_s=result.get("sync_s") or {},
        optimizer_primed=bool(result.get("optimizer_primed")),
    )


def read_records(*paths: Path) -> list[Measured]:
    """Pairs from records files: one per (graph, strategy name), every trial of it one round (several
    files pool their rounds)."""
    pairs: dict[tuple[str, str], Measured] = {}
    for path in paths:
        for number, text in enumerate(read_lines(path), start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                graph, resources, strategy = trial_documents(line)
                result = line["result"]
            except (ValueError, KeyError, TypeError) as error:
                raise SystemExit(f"{path}:{number}: not a trial record: {error}") from None
            model = str((graph.provenance.get("zoo") or {}).get("name") or graph.name)
            name = strategy_name(strategy)
            pair = pairs.setdefault((str(graph.id), name), Measured(model, name, graph))
            pair.trials.append(trial_from_result(resources, strategy, result))
    return list(pairs.values())
