"""The search: baselines, structured proposals, sampling, local search, then a guarded, diverse top-K.

    result = search(graph, resources, time_budget_s=2.0, max_candidates=20000, top_k=5, seed=0)
    result.candidates[0]          # the best Strategy, .predicted set, provenance.search says why

The phases run in this order, each on whatever budget the previous ones left:

1. baselines — every pre-built builder (AutoDist's and plain data parallel), always evaluated, at the
   request's precision and compile (and, under a global batch, training it);
2. proposals — structured strategies (`proposals.py`), the layouts of `meshes.py` among them;
3. descent — every one-dimension neighbour of the best layouts, until the best are all explored
   (`descent.py`);
4. sampling — AutoSync-style random per-class choices, a share of what is left;
5. local_search — batched simulated annealing from the best so far (`local_search.py`).

Reproducibility: the same inputs and seed give the same result whenever the candidate budget, not
the clock, ends the search. A time budget stops at a batch boundary that depends on machine speed,
so pass `time_budget_s=None` (or a generous one) when runs must be comparable.
"""

from __future__ import annotations

import time

import numpy as np

from optimizer_service.search.answer import Baselines, SearchResult, answer
from optimizer_service.search.descent import descend
from optimizer_service.search.difference import difference
from optimizer_service.search.evaluate import Evaluator, ProgressCallback
from optimizer_service.search.local_search import anneal
from optimizer_service.search.proposals import autosync_samples, structured_proposals
from optimizer_service.search.space import SearchOptions, Space, option_problems
from simulator import SimContext, context_for, encode, to_strategy
from stratagem.builders import all_builders
from stratagem.collector import collector_paused
from stratagem.errors import InvalidDocumentError, Problem, StratagemError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

SAMPLE_SHARE = 0.2
"""Share of the candidate budget left after the proposals that goes to AutoSync-style sampling."""
MAX_SAMPLES = 4000
BATCH = 512
"""Rows per simulated batch in the sampling phase (progress and the clock are checked between batches)."""


ANSWER_MARGIN = 2.0
"""Safety factor on the timed decode: the top-K rows differ in size (a probe of the best row ran 2-3x
faster than the answer's own decodes on a loaded machine), and each is also copied and annotated."""


EXPLAIN_MARGIN = 1.5
"""Safety factor on the timed explanation of the best row (`difference`): its neighbours are simulated
again for each candidate, and candidates have about as many neighbours as the best."""


class SearchCancelled(StratagemError):
    """Raise from a progress callback to stop a search; it propagates to the caller of `search`."""


def search(
    graph: ModelGraph,
    resources: ResourceSpec,
    *,
    time_budget_s: float | None = 2.0,
    max_candidates: int = 20000,
    top_k: int = 5,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    allow_compression: bool = False,
    allow_async: bool = False,
    allow_precision: bool = False,
    precision: str = "fp32",
    compile: bool = False,
    allow_compile: bool = False,
    global_batch: int | None = None,
    runner: str = "stratagem",
) -> SearchResult:
    """Find the fastest predicted strategies for `graph` on `resources` within the budgets.

    `precision` is the numerics the user trains in, searched only with `allow_precision`; `compile`
    whether the user's trainer compiles its blocks, searched only with `allow_compile`; `global_batch`
    fixes the samples per optimizer step (the graph is then read at the micro-batch, and the search
    chooses the data degree, micro-batch size and count); `runner` says who runs the answer
    (`dimensions.py`: `stratagem`, or `engine` for the trainers a strategy exports to)."""
    options = SearchOptions(
        allow_compression=allow_compression,
        allow_async=allow_async,
        allow_precision=allow_precision,
        precision=precision,
        compile=compile,
        allow_compile=allow_compile,
        global_batch=global_batch,
        runner=runner,
    )
    with collector_paused():
        return _search(
            graph,
            resources,
            time_budget_s=time_budget_s,
            max_candidates=max_candidates,
            top_k=top_k,
            seed=seed,
            progress=progress,
            options=options,
        )


def _search(
    graph: ModelGraph,
    resources: ResourceSpec,
    *,
    time_budget_s: float | None,
    max_candidates: int,
    top_k: int,
    seed: int,
    progress: ProgressCallback | None,
    options: SearchOptions,
) -> SearchResult:
    started = time.perf_counter()
    _check_arguments(time_budget_s, max_candidates, top_k, seed, options)
    context = context_for(graph, resources)
    space = Space(context, options)
    _check_layouts(space)
    baselines = _baselines(graph, resources, context, space)
    evaluator = Evaluator(
        context,
        max_candidates=max_candidates,
        progress=progress,
        started=started,
        time_budget_s=_search_budget(time_budget_s, baselines.build_seconds, top_k),
        archive_size=max(256, 32 * top_k),
        reference_samples=space.reference_samples,
    )
    rng = np.random.default_rng(seed)
    shards = baselines.batch.max_shards
    evaluator.evaluate(baselines.batch, [f"builder:{name}" for name in baselines.names], "baselines", force=True)
    if space.num_variables and (not evaluator.exhausted or evaluator.needs_a_feasible_row):
        proposals = structured_proposals(space, shards)
        evaluator.evaluate_in_pieces(proposals.batch, proposals.labels, "proposals", until_feasible=True)
        _reserve_for_answer(evaluator, space, time_budget_s, top_k)
        descend(space, evaluator)
        _sample(space, evaluator, rng, shards)
        anneal(space, evaluator, rng)
    evaluator.report("finalizing")
    return answer(graph, resources, space, evaluator, baselines, top_k=top_k, seed=seed)


def _search_budget(time_budget_s: float | None, build_seconds: list[float], top_k: int) -> float | None:
    """The share of the time budget the evaluation phases may use. The rest is kept for building the
    answer, whose cost is mostly making top_k Strategy objects: about what a typical builder took to
    make one (the median, which a first call's one-time costs do not skew), plus three for the
    predictions and words."""
    if time_budget_s is None or not build_seconds:
        return time_budget_s
    return max(time_budget_s - float(np.median(build_seconds)) * (top_k + 3), 1e-3)


def _reserve_for_answer(evaluator: Evaluator, space: Space, time_budget_s: float | None, top_k: int) -> None:
    """Re-cut the evaluation budget by timing what the answer will do top_k times: decode and check the
    best row so far, and explain what made its difference (its neighbours simulated again). Builders' strategies, the first estimate, have far fewer sub-objects than a
    searched one with partitioned shards (a BERT-large decode costs 25-60 ms, a builder 7), so without
    this a 2 s search ends a tenth of a second late."""
    archive = evaluator.archive
    if time_budget_s is None or archive is None:
        return
    started = time.perf_counter()
    to_strategy(space.context, archive.batch, 0).validate_for(space.context.graph, space.context.resources)
    decode_s = time.perf_counter() - started
    difference(space, archive.batch, 0)
    explain_s = time.perf_counter() - started - decode_s
    reserve = ANSWER_MARGIN * decode_s * (top_k + 3) + EXPLAIN_MARGIN * explain_s * top_k
    evaluator.time_budget_s = max(time_budget_s - reserve, 1e-3)


def _check_arguments(
    time_budget_s: float | None, max_candidates: int, top_k: int, seed: int, options: SearchOptions
) -> None:
    problems = [Problem(f"search.{text.split(':', 1)[0]}", text.split(": ", 1)[1]) for text in option_problems(options)]

    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if time_budget_s is not None and (
        isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float)) or not time_budget_s > 0
    ):
        problems.append(
            Problem("search.time_budget_s", f"must be a positive number of seconds or null, got {time_budget_s!r}")
        )
    if not whole(max_candidates) or max_candidates < 1:
        problems.append(Problem("search.max_candidates", f"must be a positive integer, got {max_candidates!r}"))
    if not whole(top_k) or top_k < 1:
        problems.append(Problem("search.top_k", f"must be a positive integer, got {top_k!r}"))
    if not whole(seed) or seed < 0:
        problems.append(Problem("search.seed", f"must be a non-negative integer, got {seed!r}"))
    if problems:
        raise InvalidDocumentError(problems, document="search options")


def _check_layouts(space: Space) -> None:
    """Under a global batch, some layout must train it."""
    if space.meshes:
        return
    rules = space.rules
    raise InvalidDocumentError(
        [
            Problem(
                "search.global_batch",
                f"no layout of the {rules.devices} devices trains {rules.global_batch} samples per step: the "
                "data degree (devices / (tensor × pipeline × context)) must divide it",
            )
        ],
        document="search options",
    )


ENGINE_BUILDERS = frozenset({"AllReduce", "DataParallel"})
"""The builders whose strategies an engine runs (`stratagem.layout.layout_of`: every variable all-reduced,
none partitioned); the others place variables on parameter servers or partition them, which no
exported trainer does, and building them for a large model costs most of a short search's budget."""


def _baselines(graph: ModelGraph, resources: ResourceSpec, context: SimContext, space: Space) -> Baselines:
    """Every builder's strategy (for the `engine` runner, every one an engine runs) at the request's
    precision and compile; under a global batch, each replica's step is its share of it in one micro-batch,
    and where the devices do not divide the batch the builders (plain data parallelism over every device)
    cannot train it and are not built."""
    names, strategies, seconds = [], [], []
    options = space.options
    devices = len(context.compute_device_indices)
    fits_batch = options.global_batch is None or options.global_batch % devices == 0
    builders = [b for b in all_builders() if options.runner != "engine" or b.name in ENGINE_BUILDERS]
    for builder in builders if fits_batch else []:
        started = time.perf_counter()
        strategy = builder.build(graph, resources)
        if (
            options.precision != strategy.precision
            or options.compile != strategy.compile
            or options.global_batch is not None
        ):
            size = options.global_batch // devices if options.global_batch is not None else None
            strategy = _restated(strategy, precision=options.precision, compile=options.compile, micro_batch_size=size)
        seconds.append(time.perf_counter() - started)
        strategies.append(strategy)
        names.append(builder.name)
    batch = encode(context, strategies, validate=False)
    return Baselines(
        names, strategies, batch.with_max_shards(max(batch.max_shards, space.max_shards)), build_seconds=seconds
    )


def _restated(strategy: Strategy, *, precision: str, compile: bool, micro_batch_size: int | None) -> Strategy:
    """The strategy at another precision, compile and micro-batch size, with its content id re-derived.
    The values are checked (`space.option_problems`, a positive step share), so the copy skips
    re-validating a large model's thousands of variable configs, three times the cost of the id."""
    update = {"precision": precision, "compile": compile, "micro_batch_size": micro_batch_size, "id": None}
    copy = strategy.model_copy(update=update)
    object.__setattr__(copy, "id", copy.compute_id())
    return copy


def _sample(space: Space, evaluator: Evaluator, rng: np.random.Generator, shards: int) -> None:
    """AutoSync-style samples until they have used SAMPLE_SHARE of what was left, in candidates or time."""
    total = min(MAX_SAMPLES, int(SAMPLE_SHARE * evaluator.remaining))
    started = evaluator.fraction_used()
    stop_at = started + SAMPLE_SHARE * (1.0 - started)
    done = 0
    while done < total and evaluator.fraction_used() < stop_at and not evaluator.exhausted:
        n = evaluator.affordable(min(BATCH, total - done))
        samples = autosync_samples(space, n, rng, shards)
        evaluator.evaluate(samples.batch, samples.labels, "sampling")
        done += n
