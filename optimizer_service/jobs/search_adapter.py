"""The pipeline's one door to the strategy search, and a clearly marked stand-in while it is missing.

The search lives in `optimizer_service.search` (its own engineer): `search(graph, resources, *,
time_budget_s, max_candidates, top_k, seed, progress) -> SearchResult`. When that package cannot be
imported, `builders_fallback` ranks AutoDist's pre-built strategies with the simulator instead.
TEMPORARY: the fallback exists so the service answers during development; once the search ships it
is never used (and a job says in its notes which engine answered).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optimizer_service.core.errors import unavailable
from optimizer_service.jobs.types import PipelineOptions
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

log = logging.getLogger(__name__)

SearchFn = Callable[..., Any]
SearchProgressFn = Callable[[int, float | None], None]
"""Called with (candidates evaluated, best predicted step time so far)."""


@dataclass
class SearchOutcome:
    candidates: list[Strategy]
    """Ranked best first, each with `predicted` set."""
    baselines: dict[str, Strategy]
    """Every pre-built builder's strategy (and plain data parallel), predicted, by builder name."""
    evaluated: int
    elapsed_s: float
    speedup_vs_data_parallel: float | None
    speedup_vs_best_builder: float | None
    engine: str
    details: dict[str, Any]
    """The search's own summary (space size, budgets hit, evaluations per phase) when it gives one."""


def resolve_search() -> tuple[SearchFn, str]:
    """The real search when importable, else the TEMPORARY builders fallback."""
    try:
        search = getattr(importlib.import_module("optimizer_service.search"), "search", None)
    except ImportError as error:
        search, reason = None, str(error)
    else:
        reason = "it has no search() yet"
    if callable(search):
        return search, "search"
    log.warning("optimizer_service.search is not usable (%s); ranking pre-built strategies only", reason)
    return builders_fallback, "builders-fallback"


def run_search(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: PipelineOptions,
    on_progress: SearchProgressFn,
    *,
    search: SearchFn,
    engine: str,
) -> SearchOutcome:
    def progress(update: Any) -> None:
        on_progress(int(getattr(update, "evaluated", 0)), getattr(update, "best_step_time_s", None))

    kwargs: dict[str, Any] = {
        "time_budget_s": options.time_budget_s,
        "max_candidates": options.max_candidates,
        "top_k": options.top_k,
        "seed": options.seed,
        "progress": progress,
    }
    accepted = inspect.signature(search).parameters
    for name in ("allow_compression", "allow_async"):
        if name in accepted:
            kwargs[name] = getattr(options, name)
    started = time.perf_counter()
    result = search(graph, resources, **kwargs)
    return SearchOutcome(
        candidates=list(result.candidates),
        baselines=dict(getattr(result, "baselines", {}) or {}),
        evaluated=int(getattr(result, "evaluated", len(result.candidates))),
        elapsed_s=float(getattr(result, "elapsed_s", time.perf_counter() - started)),
        speedup_vs_data_parallel=_float_or_none(getattr(result, "speedup_vs_data_parallel", None)),
        speedup_vs_best_builder=_float_or_none(getattr(result, "speedup_vs_best_builder", None)),
        engine=engine,
        details=_summary_of(result),
    )


def _summary_of(result: Any) -> dict[str, Any]:
    summary = getattr(result, "summary", None)
    if not callable(summary):
        return {}
    data = summary()
    return data if isinstance(data, dict) else {}


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


@dataclass
class _FallbackResult:
    candidates: list[Strategy]
    baselines: dict[str, Strategy]
    evaluated: int
    elapsed_s: float
    speedup_vs_data_parallel: float | None
    speedup_vs_best_builder: float | None


def builders_fallback(
    graph: ModelGraph,
    resources: ResourceSpec,
    *,
    time_budget_s: float,
    max_candidates: int,
    top_k: int,
    seed: int,
    progress: Callable[[Any], None] | None = None,
) -> _FallbackResult:
    """TEMPORARY stand-in for the search: every pre-built strategy, ranked by the simulator."""
    try:
        builders_module = importlib.import_module("stratagem.builders")
        simulator = importlib.import_module("simulator")
    except ImportError as error:
        raise unavailable(f"no search engine: optimizer_service.search, stratagem.builders or simulator is missing ({error})") from None
    started = time.perf_counter()
    baselines = {type(b).__name__: b.build(graph, resources) for b in builders_module.all_builders()}
    predictions = simulator.simulate(graph, resources, list(baselines.values()))
    predicted = {name: s.replace(predicted=p.to_predicted()) for (name, s), p in zip(baselines.items(), predictions, strict=True)}
    ranked = sorted(predicted.values(), key=_predicted_key)
    step = {name: s.predicted.step_time_s for name, s in predicted.items() if s.predicted and s.predicted.feasible}
    best_time = ranked[0].predicted.step_time_s if ranked and ranked[0].predicted else None
    if progress is not None:
        progress(_Progress(evaluated=len(ranked), best_step_time_s=best_time))
    data_parallel = step.get("DataParallel")
    builder_times = [t for name, t in step.items() if name != "DataParallel"]
    return _FallbackResult(
        candidates=ranked[:top_k],
        baselines=predicted,
        evaluated=len(ranked),
        elapsed_s=time.perf_counter() - started,
        speedup_vs_data_parallel=data_parallel / best_time if data_parallel and best_time else None,
        speedup_vs_best_builder=min(builder_times) / best_time if builder_times and best_time else None,
    )


@dataclass
class _Progress:
    evaluated: int
    best_step_time_s: float | None


def _predicted_key(strategy: Strategy) -> tuple[int, float]:
    predicted = strategy.predicted
    if predicted is None:
        return (2, float("inf"))
    return (0 if predicted.feasible else 1, predicted.step_time_s)
