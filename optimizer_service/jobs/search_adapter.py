"""The pipeline's one door to the strategy search: budgets in, progress out, a plain outcome back.

The search itself is `optimizer_service.search.search`; tests pass a function with the same
signature (a slow one, one that fails) through `run_search(search=...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optimizer_service.core.inputs import JobOptions
from optimizer_service.search import SearchProgress, SearchResult
from optimizer_service.search import search as default_search
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

SearchFn = Callable[..., SearchResult]
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
    details: dict[str, Any]
    """The search's own summary (space size, budgets hit, evaluations per phase)."""


def run_search(
    graph: ModelGraph,
    resources: ResourceSpec,
    options: JobOptions,
    on_progress: SearchProgressFn,
    *,
    search: SearchFn | None = None,
) -> SearchOutcome:
    def progress(update: SearchProgress) -> None:
        on_progress(update.evaluated, update.best_step_time_s)

    result = (search or default_search)(
        graph,
        resources,
        time_budget_s=options.search.time_budget_s,
        max_candidates=options.search.max_candidates,
        top_k=options.search.top_k,
        seed=options.search.seed,
        progress=progress,
        allow_compression=options.search.allow_compression,
        allow_async=options.search.allow_async,
        allow_precision=options.search.allow_precision,
        precision=options.search.precision,
        compile=options.search.compile,
        allow_compile=options.search.allow_compile,
        global_batch=options.search.global_batch,
        runner=options.search.runner,
    )
    return SearchOutcome(
        candidates=list(result.candidates),
        baselines=dict(result.baselines),
        evaluated=result.evaluated,
        elapsed_s=result.elapsed_s,
        speedup_vs_data_parallel=result.speedup_vs_data_parallel,
        speedup_vs_best_builder=result.speedup_vs_best_builder,
        details=result.summary(),
    )
