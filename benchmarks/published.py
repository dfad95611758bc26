"""The simulator against published GPU measurements: every row re-predicted through the public API, as JSON.

    python -m benchmarks.published [--csv PATH] [--cache DIR | --no-cache] [--source NAME ...]
                                   [--export-trials rows.jsonl] [--no-learned | --loso-variants] [-o result.json]

For each row of `shared/published/gpu_measurements.csv` (its README says where every number comes from):
the architecture is captured on the meta device (`stratagem.capture_hf_config`, or the zoo's ResNet-50
v1.5), the cluster and `stratagem.Layout` are built from the row (`benchmarks/lib/published_layouts.py`), and
`stratagem.predict` prices it. Printed per row (predicted and measured step time, ratio, the breakdown's
main components, memory, capture time), per source and overall: MAPE of the step time, scaling error
over series of one model on growing GPU counts, Kendall tau within one model on one cluster, and
leave-one-source-out scores of the learned correction (with `--loso-variants`, also at two other seeds
and without place levels), and the peak memory priced against the peak a source reports (`memory`:
torchtitan's `max_reserved`). A row the project cannot express, or that the simulator refuses, is a miss
with its reason; misses are not scored.

Beside them, apart from every target (`deepspeed_engine_timed`): the DeepSpeed source's runs as
DeepSpeed's own timers measured them, forward, backward and step without the Trainer's loop
(`benchmarks/lib/published_engine_timed.py`), scored the same way, with what each end-to-end row spent
outside the engine.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stratagem
from benchmarks.lib import published_layouts as setup
from benchmarks.lib import published_rows as rows_
from benchmarks.lib.published_capture import Captured, GraphCache, default_cache_dir, describe
from benchmarks.lib.published_engine_timed import engine_timed_rows, outside_engine
from benchmarks.lib.published_learned import Priced, leave_one_source_out, loso_variants
from benchmarks.lib.published_models import model_spec, training_graph
from benchmarks.lib.published_rows import Row
from benchmarks.lib.published_scoring import kendall_tau_by_group, mape, max_abs_scaling_error, scaling_errors
from benchmarks.lib.published_trials import Exportable, export_trials
from stratagem import Layout, ModelGraph, Prediction, ResourceSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT.parent / "shared" / "published" / "gpu_measurements.csv"
GB = 1e9
GIB = 1024**3
TOP_COMPONENTS = 3


@dataclass
class RowResult:
    row: Row
    captured: Captured | None = None
    graph: ModelGraph | None = None
    """The captured graph as the row's framework trains it (`published_models.training_graph`)."""
    resources: ResourceSpec | None = None
    layout: Layout | None = None
    prediction: Prediction | None = None
    misses: list[str] = field(default_factory=list)
    """Why the row is not scored: what the IR cannot state, a mapping that failed, the simulator's refusal."""
    unexpressed: list[str] = field(default_factory=list)
    """The subset of `misses` the IR cannot state (such rows are priced anyway, for information)."""

    @property
    def scored(self) -> bool:
        return self.prediction is not None and not self.misses

    @property
    def predicted_s(self) -> float | None:
        return self.prediction.step_time_s if self.prediction is not None else None


def run_row(row: Row, cache: GraphCache) -> RowResult:
    result = RowResult(row)
    result.unexpressed = setup.expressibility_misses(row)
    result.misses += result.unexpressed
    try:
        result.resources = setup.cluster(row)
        result.layout = setup.layout(row)
        result.captured = cache.get(model_spec(row))
    except (ValueError, stratagem.StratagemError) as error:
        result.misses.append(f"mapping: {error}")
        return result
    result.graph = training_graph(result.captured.graph, row)
    try:
        result.prediction = stratagem.predict(result.graph, result.resources, result.layout)
    except stratagem.UnsupportedStrategyError as error:
        result.misses.append(f"simulator: {error}")
    except stratagem.StratagemError as error:
        result.misses.append(f"layout: {error}")
    return result


# --- per row ----------------------------------------------------------------------------------


def row_json(result: RowResult) -> dict[str, Any]:
    row, prediction = result.row, result.prediction
    out: dict[str, Any] = {
        "id": row.id,
        "source": row.source,
        "model": row.model,
        "gpu": row.gpu,
        "n_gpus": row.n_gpus,
        "layout": str(result.layout) if result.layout is not None else None,
        "variant": row.other.get("variant"),
        "measured_step_s": row.measured_step_s,
        "predicted_step_s": _round(result.predicted_s),
        "ratio": _round(result.predicted_s / row.measured_step_s) if result.predicted_s else None,
        "scored": result.scored,
        "miss_reasons": result.misses,
    }
    if prediction is not None:
        top = sorted(prediction.breakdown.items(), key=lambda kv: -kv[1])[:TOP_COMPONENTS]
        out["breakdown_top_s"] = {key: _round(value) for key, value in top if value > 0}
        out["bottleneck"] = prediction.bottleneck
        out["mfu"] = _round(prediction.mfu)
        out["memory_gb_predicted"] = _round(prediction.memory_per_device_bytes / GB)
        out["memory_gb_capacity"] = _round(prediction.memory_capacity_bytes / GB)
        out["fits_predicted"] = prediction.feasible
    memory = row.measured_memory_bytes
    if memory is not None:
        out["memory_gb_measured"] = _round(memory / GB)
    if result.captured is not None:
        out["capture"] = {
            "seconds": _round(result.captured.capture_s),
            "this_run_s": _round(result.captured.load_s),
            "cached": result.captured.cached,
            **describe(result.captured.graph),
        }
    return out


# --- summaries --------------------------------------------------------------------------------


def scores(results: list[RowResult]) -> dict[str, Any]:
    """MAPE, Kendall tau within one model on one cluster, and scaling errors, over the scored rows."""
    scored = [r for r in results if r.scored]
    measured = [r.row.measured_step_s for r in scored]
    predicted = [float(r.predicted_s or 0.0) for r in scored]
    taus = kendall_tau_by_group(
        measured=measured, predicted=predicted, groups=[rows_.cluster_key(r.row) for r in scored]
    )
    scaling = scaling_errors(
        devices=[r.row.n_gpus for r in scored],
        measured=measured,
        predicted=predicted,
        series=[rows_.series_key(r.row) for r in scored],
    )
    return {
        "rows": len(results),
        "scored": len(scored),
        "missed": len(results) - len(scored),
        "mape": _round(mape(measured=measured, predicted=predicted)),
        "within_15pct": sum(abs(p / m - 1) <= 0.15 for m, p in zip(measured, predicted, strict=True)),
        "kendall_tau_mean": _round(sum(taus.values()) / len(taus)) if taus else None,
        "kendall_tau_by_model_cluster": {key: _round(value) for key, value in taus.items()},
        "scaling_error_max_abs": _round(max_abs_scaling_error(scaling)),
        "scaling_errors": {
            key: [{k: _round(v) if isinstance(v, float) else v for k, v in point.items()} for point in points]
            for key, points in scaling.items()
        },
    }


def memory_scores(results: list[RowResult]) -> dict[str, Any]:
    """The peak priced against the peak a source reports (torchtitan's `max_reserved`): the live tensors
    the simulator prices, times one plus the GPU's caching-allocator share (`DeviceSpec.allocator_overhead`),
    which is what the allocator reserves for them."""
    entries: dict[str, dict[str, Any]] = {}
    reported_bytes, priced_bytes = [], []
    for r in results:
        reported = r.row.measured_memory_bytes
        if reported is None or r.prediction is None or r.resources is None:
            continue
        spec = r.resources.node_device_spec(r.resources.nodes[0])
        reserved = r.prediction.memory_per_device_bytes * (1.0 + (spec.allocator_overhead or 0.0))
        entries[r.row.id] = {
            "layout": str(r.layout) if r.layout is not None else None,
            "predicted_gib": _round(reserved / GIB, 2),
            "reported_gib": _round(reported / GIB, 2),
            "ratio": _round(reserved / reported),
        }
        reported_bytes.append(reported)
        priced_bytes.append(reserved)
    return {
        "rows": len(entries),
        "mape": _round(mape(measured=reported_bytes, predicted=priced_bytes)) if entries else None,
        "per_row": entries,
    }


def summary(results: list[RowResult], capture_wall_s: float) -> dict[str, Any]:
    by_source: dict[str, list[RowResult]] = defaultdict(list)
    for result in results:
        by_source[result.row.source].append(result)
    reasons = Counter(reason for r in results for reason in r.misses)
    captures = {}
    for r in results:
        if r.captured is not None:
            key = f"{r.row.model} (batch {r.captured.graph.batch_size}, seq {r.row.seq})"
            captures[key] = {"capture_s": _round(r.captured.capture_s), "layers": len(r.captured.graph.layers)}
    unscored = [r for r in results if r.unexpressed and r.prediction is not None]
    return {
        "overall": scores(results),
        "per_source": {source: scores(items) for source, items in sorted(by_source.items())},
        "misses_by_reason": dict(reasons.most_common()),
        "misses": [{"id": r.row.id, "reasons": r.misses} for r in results if not r.scored],
        "priced_but_unexpressed": {
            "note": "rows with a knob the IR lacks, priced without it (not scored)",
            "mape": _round(
                mape(
                    measured=[r.row.measured_step_s for r in unscored],
                    predicted=[float(r.predicted_s or 0.0) for r in unscored],
                )
            ),
            "ids": [r.row.id for r in unscored],
        },
        "predicted_not_to_fit": [r.row.id for r in results if r.prediction is not None and not r.prediction.feasible],
        "memory": memory_scores(results),
        "captures": {
            "distinct_graphs": len(captures),
            "total_capture_s": _round(sum(c["capture_s"] or 0.0 for c in captures.values())),
            "slowest": dict(sorted(captures.items(), key=lambda kv: -(kv[1]["capture_s"] or 0.0))[:5]),
            "this_run_wall_s": _round(capture_wall_s),
        },
        "proposed_catalog_entries": setup.proposed_catalog_entries([r.row for r in results]),
    }


# --- the command ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="the published rows (default: %(default)s)")
    parser.add_argument("--cache", type=Path, default=None, help="graph cache folder (default: the user's cache)")
    parser.add_argument("--no-cache", action="store_true", help="capture every graph, store nothing")
    parser.add_argument("--source", action="append", default=None, help="only this source's rows (repeatable)")
    parser.add_argument("--export-trials", type=Path, default=None, help="write the rows as trials (JSON Lines)")
    parser.add_argument("--no-learned", action="store_true", help="skip the leave-one-source-out correction")
    parser.add_argument(
        "--loso-variants",
        action="store_true",
        help="also score leave-one-source-out at other seeds and without place levels",
    )
    parser.add_argument("-o", "--output", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    if not args.csv.is_file():
        parser.error(f"--csv: {args.csv} is not a file; pass the published rows (gpu_measurements.csv)")
    rows = rows_.read_rows(args.csv)
    if args.source:
        unknown = sorted(set(args.source) - {r.source for r in rows})
        if unknown:
            parser.error(f"--source: no rows from {', '.join(unknown)}")
        rows = [r for r in rows if r.source in args.source]
    cache = GraphCache(None if args.no_cache else (args.cache or default_cache_dir()))
    started = time.perf_counter()
    results = [run_row(row, cache) for row in rows]
    wall = time.perf_counter() - started

    from simulator import SIMULATOR_VERSION

    document: dict[str, Any] = {
        "benchmark": "published",
        "csv": args.csv.name,
        "simulator_version": SIMULATOR_VERSION,
        "summary": summary(results, wall),
    }
    if not args.no_learned:
        priced = [
            Priced(r.row, r.graph, r.resources, r.prediction)
            for r in results
            if r.scored and r.graph is not None and r.resources is not None and r.prediction is not None
        ]
        document["leave_one_source_out"] = leave_one_source_out(priced)
        if args.loso_variants:
            document["leave_one_source_out"]["variants"] = loso_variants(priced)
    engine_rows = engine_timed_rows(rows)
    if engine_rows:
        document["deepspeed_engine_timed"] = engine_timed(rows, [run_row(row, cache) for row in engine_rows])
    if args.export_trials is not None:
        document["export"] = write_trials(
            results, args.export_trials, csv_name=args.csv.name, version=SIMULATOR_VERSION
        )
    document["rows"] = [row_json(r) for r in results]
    text = json.dumps(document, indent=2, allow_nan=False)
    if args.output is not None:
        args.output.write_text(text + "\n")
    print(text)
    return 0


def engine_timed(rows: list[Row], results: list[RowResult]) -> dict[str, Any]:
    """The engine-timed DeepSpeed runs: scores, each run's ratio, and the end-to-end rows' time outside the engine."""
    return {
        "note": "DeepSpeed's forward + backward + step timers (the autotuner's metric), not the Trainer's end to end",
        "scores": scores(results),
        "outside_engine": outside_engine(rows, [r.row for r in results]),
        "rows": [row_json(r) | {"zero_stage": r.row.zero_stage, "micro_batch": r.row.micro_batch} for r in results],
    }


def write_trials(results: list[RowResult], path: Path, *, csv_name: str, version: str) -> dict[str, Any]:
    items, left_out = [], []
    for r in results:
        if r.unexpressed:
            left_out.append({"id": r.row.id, "reasons": r.unexpressed})
        elif r.graph is None or r.resources is None or r.layout is None:
            left_out.append({"id": r.row.id, "reasons": r.misses})
        else:
            items.append(
                Exportable(r.row, r.graph, r.resources, r.layout, r.prediction, version if r.prediction else None)
            )
    with path.open("w", encoding="utf-8") as stream:
        report = export_trials(items, stream, source=f"published:{csv_name}", left_out=left_out)
    return {"file": path.name, **report}


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return round(float(value), digits)


if __name__ == "__main__":
    raise SystemExit(main())
