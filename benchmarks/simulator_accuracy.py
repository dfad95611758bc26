"""Simulator accuracy on this machine: real 2-rank gloo training steps against the calibrated simulator.

1. every zoo model in `--models` is captured at a size where a step takes tens to hundreds of
   milliseconds and synchronization is a real share of it;
2. each model gets the strategies that execute differently on one node (`strategies_for`): PS,
   AllReduce, DataParallel, Parallax (sparse models), one all-reduce per variable, fp16 / PowerSGD /
   top-k compression, ZeRO-style sharding; builders that coincide there (`SAME_ON_ONE_NODE`) only with
   `--all-builders`;
3. in each of `--rounds` rounds, for each model, one interleaved block (`--mode interleaved`, the
   default, `benchmarks/interleaved.py`): one pair of gloo ranks trains a model copy per strategy plus an undistributed copy, one
   step of each in turn (order rotated every step), and runs the calibration's probes after every
   timed round of steps, so the spec describes the machine those very steps ran on. `--mode trials`
   instead runs one trial-runner trial per strategy after a separate calibration;
4. the simulator (no learned correction) predicts every strategy with its block's spec; a strategy's
   measured and predicted step times are the medians over its rounds.

Interleaving matters on a shared machine: its neighbours' load changes its speed two- or threefold
within a minute, so strategies timed one after another are compared across different machines, and
a calibration taken before a block describes another machine than the one the block ran on.

Prints one JSON object: MAPE and Kendall tau overall and per model (tau within one model's
strategies is the ranking the search relies on), the rounds' spread and the round-to-round tau (the
ceiling noise puts on any predictor), the compute check (the undistributed step against the
simulator's compute + update), the strategy pairs the simulator orders against the measurement with
the share of rounds that agree (systematic misses against coin flips), tau over only the pairs whose
order the rounds establish (`resolved_pairs`), each strategy's measured and
predicted step time with its predicted breakdown beside the runtime's own timings of the step, and
the calibration figures; with `--ablation`, the scores with each CPU refinement reset
to its default. Every strategy-round is also written as one JSON line {graph, resources, strategy,
result} to `--out` (the format of `benchmarks/trials.py`), for the cost-model benchmark.
`--from-records` re-scores such a file, plain or compressed (`.xz`, `.gz`), without measuring anything
(to compare simulator versions on the same measurements).

    .venv/bin/python benchmarks/simulator_accuracy.py [--quick] [--models bert_large vgg16 dlrm] [--steps 16]
        [--rounds 3] [--mode interleaved|trials] [--calibrate block|once] [--all-builders] [--ablation]
        [--out /tmp/stratagem-bench/accuracy.jsonl] [--from-records FILE] [--priority 15]

The process lowers its niceness by `--priority` (default 15) when allowed; its calibrations and
ranks inherit it, so neighbours' processes disturb them less (they still share the cores' caches,
memory bandwidth and hyper-threads). The output says what niceness it ran at.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.interleaved import load_factors, measure_block
from benchmarks.records_file import read_lines
from stratagem import zoo
from stratagem.builders import AllReduce, all_builders
from stratagem.calibrate import DEVICE_KIND, reread, spec_from_figures
from stratagem.ir import Compressor, ModelGraph, Provenance, ResourceSpec, ShardedSynchronizer, Strategy, VariableConfig
from stratagem.tracing import capture

TARGETS = {"mape": 0.20, "kendall_tau": 0.80}
DEFAULT_OUT = "/tmp/stratagem-bench/accuracy.jsonl"


@dataclass(frozen=True)
class Case:
    """A zoo model at a size where one training step is compute worth timing on a CPU rank."""

    batch_size: int
    overrides: dict[str, int | float | bool | str] = field(default_factory=dict)
    optimizer: str = "adam"
    min_warmup: int = 0
    """Warm-up steps this model needs before its steps are representative (see `CASES`)."""


CASES: dict[str, Case] = {
    "bert_large": Case(4, {"hidden": 256, "ffn": 1024, "layers": 4, "seq": 32, "vocab": 8192}, min_warmup=5),
    "vgg16": Case(16, {"width": 16, "hidden": 2048}),
    "dlrm": Case(2048, {"dim": 32, "bottom": "256,128", "top": "256,128"}, optimizer="adagrad"),
    "gpt": Case(16, {"hidden": 128, "ffn": 512, "layers": 2, "seq": 64}, min_warmup=14),
    "resnet50": Case(16, {"width": 16}),
}
"""Sizes where synchronization is a real share of the step, so the strategies differ by more than the
machine's noise: few tokens per step for many parameters (BERT: 5M parameters, 128 tokens), VGG's
wide classifier (4.5M parameters behind cheap narrow convolutions), DLRM's sparse tables. The zoo's
language models start with saturated softmaxes whose backward is full of denormal floats, which a CPU
computes 10-20x slower until training moves away from them (GPT for about 12 steps at Adam's default
rate, BERT for 2-3), hence their longer warm-up. DLRM trains with Adagrad: Adam cannot apply its
sparse embedding gradients."""
DEFAULT_MODELS = ("bert_large", "vgg16", "dlrm")
QUICK_MODELS = ("bert_large", "dlrm")
QUICK_STRATEGIES = ("PS", "AllReduce", "Parallax", "DataParallel", "AllReduce-unfused", "AllReduce-fp16")


@dataclass
class Trial:
    """One real run of a strategy, with the spec calibrated just before it and the simulator's prediction."""

    resources: ResourceSpec
    strategy: Strategy
    median_s: float | None
    failure: str | None = None
    predicted_s: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    undistributed_s: float | None = None
    """The same model's step without synchronization, measured alongside (interleaved mode)."""
    sync_s: dict[str, float] = field(default_factory=dict)
    """The runtime's own timings of the step (waits per kind, launch, update; interleaved mode)."""
    optimizer_primed: bool = False
    """Whether the optimizer state was filled before timing (`TrialSpec.prime_optimizer`); older records were not."""


@dataclass
class Measured:
    """One (model, strategy) pair and its trials, one per round: measured and predicted are the
    medians over the successful trials, each predicted with the calibration that preceded it."""

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
        """(slowest - fastest round) / median: how far repeated measurements of it disagree."""
        medians = [t.median_s for t in self.ok]
        if len(medians) < 2:
            return None
        return (max(medians) - min(medians)) / statistics.median(medians)  # type: ignore[type-var, operator]


# -- metrics ------------------------------------------------------------------------------------------


def mape(measured: list[float], predicted: list[float]) -> float:
    """Mean |predicted - measured| / measured, as a fraction."""
    if not measured:
        return math.nan
    return sum(abs(p - m) / m for m, p in zip(measured, predicted, strict=True)) / len(measured)


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b (ties count for neither side); NaN when either side has no order at all."""
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    pairs_a, pairs_b = concordant + discordant + ties_b, concordant + discordant + ties_a
    if pairs_a == 0 or pairs_b == 0:
        return math.nan
    return (concordant - discordant) / math.sqrt(pairs_a * pairs_b)


def scores(pairs: list[Measured]) -> dict[str, Any]:
    """MAPE and Kendall tau over the pairs that were measured and predicted."""
    done = [p for p in pairs if p.measured is not None and p.predicted is not None]
    measured = [p.measured for p in done]
    predicted = [p.predicted for p in done]
    return {
        "n": len(done),
        "mape": _round(mape(measured, predicted)),
        "kendall_tau": _round(kendall_tau(measured, predicted)),
    }


def accuracy_report(pairs: list[Measured]) -> dict[str, Any]:
    """Overall and per-model scores; the overall tau pools models, `kendall_tau_within` averages per model."""
    by_model: dict[str, list[Measured]] = defaultdict(list)
    for pair in pairs:
        by_model[pair.model].append(pair)
    models = {name: scores(members) for name, members in by_model.items()}
    within = [s["kendall_tau"] for s in models.values() if s["kendall_tau"] is not None]
    overall = scores(pairs)
    overall["kendall_tau_within"] = _round(statistics.mean(within)) if within else None
    overall["meets_targets"] = bool(
        overall["mape"] is not None
        and overall["mape"] <= TARGETS["mape"]
        and overall["kendall_tau_within"] is not None
        and overall["kendall_tau_within"] >= TARGETS["kendall_tau"]
    )
    return {"overall": overall, "models": models}


def compute_check(pairs: list[Measured]) -> dict[str, Any]:
    """Per model, the step without synchronization: measured (the undistributed copy trained alongside)
    against the simulator's compute + optimizer update (from the AllReduce strategy's breakdown, where
    every rank updates everything). It tells a compute miss from a communication miss."""
    out = {}
    for pair in pairs:
        trials = [t for t in pair.ok if t.undistributed_s and t.breakdown]
        if pair.name != "AllReduce" or not trials:
            continue
        measured = statistics.median(t.undistributed_s for t in trials)  # type: ignore[misc]
        predicted = statistics.median(
            t.breakdown.get("compute", 0.0) + t.breakdown.get("optimizer_update", 0.0) for t in trials
        )
        out[pair.model] = {
            "measured_ms": round(measured * 1e3, 2),
            "predicted_ms": round(predicted * 1e3, 2),
            "error": round((predicted - measured) / measured, 3),
        }
    return out


def noise_report(pairs: list[Measured]) -> dict[str, Any]:
    """How well the measurements agree with themselves: the ceiling for any predictor's scores."""
    spreads = [p.spread for p in pairs if p.spread is not None]
    taus = []
    by_model: dict[str, list[Measured]] = defaultdict(list)
    for pair in pairs:
        if len(pair.ok) >= 2:
            by_model[pair.model].append(pair)
    halves = []
    for members in by_model.values():
        tau = kendall_tau([p.ok[0].median_s for p in members], [p.ok[1].median_s for p in members])  # type: ignore[misc]
        if not math.isnan(tau):
            taus.append(tau)
        half = split_half_tau(members)
        if half is not None:
            halves.append(half)
    return {
        "median_round_spread": _round(statistics.median(spreads)) if spreads else None,
        "max_round_spread": _round(max(spreads)) if spreads else None,
        "kendall_tau_round1_vs_round2_within": _round(statistics.mean(taus)) if taus else None,
        "kendall_tau_split_half_within": _round(statistics.mean(halves)) if halves else None,
    }


def load_adjusted(pairs: list[Measured]) -> list[Measured]:
    """The same trials with each block's shared load divided out (`interleaved.load_factors`): a
    second truth for the ranking, which the machine's drift between rounds moves less."""
    by_model: dict[str, list[Measured]] = defaultdict(list)
    for pair in pairs:
        by_model[pair.model].append(pair)
    out = []
    for members in by_model.values():
        factor = load_factors({p.name: {str(t.resources.id): t.median_s for t in p.ok} for p in members})  # type: ignore[misc]
        for pair in members:
            trials = [
                replace(t, median_s=t.median_s / factor[str(t.resources.id)]) if factor and t.median_s else t
                for t in pair.trials
            ]
            out.append(replace(pair, trials=trials))
    return out


def load_adjusted_report(pairs: list[Measured]) -> dict[str, Any]:
    adjusted = load_adjusted(pairs)
    return {**accuracy_report(adjusted), "noise": noise_report(adjusted)}


SYSTEMATIC_SHARE = 0.75
"""A pair of strategies the prediction orders against at least this share of the rounds is a miss of the
model, not of the measurement."""


def discordant_pairs(pairs: list[Measured]) -> list[dict[str, Any]]:
    """Within each model, the strategy pairs the simulator orders against the measured medians, with the
    share of rounds that agree with the measurement: near 1 a systematic miss worth a formula, near 1/2
    a coin flip no predictor can call."""
    by_model: dict[str, list[Measured]] = defaultdict(list)
    for pair in pairs:
        if pair.measured is not None and pair.predicted is not None:
            by_model[pair.model].append(pair)
    out = []
    for model, members in by_model.items():
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                faster, slower = (a, b) if a.measured < b.measured else (b, a)  # type: ignore[operator]
                if faster.predicted <= slower.predicted:  # type: ignore[operator]
                    continue
                rounds = [
                    (x.median_s, y.median_s)
                    for x, y in zip(faster.trials, slower.trials, strict=False)
                    if x.median_s and y.median_s
                ]
                share = sum(x < y for x, y in rounds) / len(rounds) if rounds else None
                out.append(
                    {
                        "model": model,
                        "faster": faster.name,
                        "slower": slower.name,
                        "rounds_agreeing": _round(share, 2),
                        "systematic": share is not None and share >= SYSTEMATIC_SHARE,
                    }
                )
    return sorted(out, key=lambda d: -(d["rounds_agreeing"] or 0.0))


RESOLVED_ALPHA = 0.05
"""A pair's measured order counts as established when a two-sided sign test over its rounds rejects a
tie at this level (all 8 of 8 rounds agreeing; 36 or more of 56)."""

Rounds = dict[str, dict[str, tuple[list[float | None], list[float | None]]]]
"""Per model and strategy, each round's measured median and prediction (None where the round failed),
rounds aligned by position across a model's strategies."""


def sign_test_p(agreeing: int, rounds: int) -> float:
    """Two-sided sign test: the chance that a true tie splits `rounds` at least this unevenly."""
    fewer = min(agreeing, rounds - agreeing)
    return min(1.0, 2 * sum(math.comb(rounds, k) for k in range(fewer + 1)) / 2**rounds) if rounds else 1.0


def resolved_pairs(rounds: Rounds) -> dict[str, Any]:
    """Kendall tau over only the pairs whose order the measurements establish (`RESOLVED_ALPHA`).

    Tau over every pair charges the simulator for near-ties that the rounds themselves order at random;
    this separates the misses a formula could fix from the coin flips: how many pairs the rounds
    resolve, and how many of those the predicted medians order as the measured medians do (a pair
    priced as a tie is ordered neither way)."""
    models: dict[str, dict[str, Any]] = {}
    for model, strategies in rounds.items():
        names = list(strategies)
        verdicts = [_resolved_order(strategies[a], strategies[b]) for i, a in enumerate(names) for b in names[i + 1 :]]
        models[model] = _resolved_summary(
            len(verdicts), verdicts.count(1), verdicts.count(-1), len(verdicts) - verdicts.count(None)
        )
    totals = [sum(m[key] for m in models.values()) for key in ("pairs", "ordered_right", "ordered_wrong", "resolved")]
    return {"alpha": RESOLVED_ALPHA, "overall": _resolved_summary(*totals), "models": models}


def _resolved_order(
    a: tuple[list[float | None], list[float | None]], b: tuple[list[float | None], list[float | None]]
) -> int | None:
    """None when the rounds do not establish which is faster; else 1 if the prediction orders the pair
    as measured, -1 if against it, 0 if it prices the two the same."""
    both = [(x, y) for x, y in zip(a[0], b[0], strict=False) if x is not None and y is not None and x != y]
    if sign_test_p(sum(x < y for x, y in both), len(both)) >= RESOLVED_ALPHA:
        return None
    measured_a, measured_b, predicted_a, predicted_b = (_median(values) for values in (a[0], b[0], a[1], b[1]))
    if predicted_a == predicted_b:
        return 0
    return 1 if (measured_a < measured_b) == (predicted_a < predicted_b) else -1


def _median(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else math.nan


def _resolved_summary(pairs: int, right: int, wrong: int, resolved: int) -> dict[str, Any]:
    return {
        "pairs": pairs,
        "resolved": resolved,
        "ordered_right": right,
        "ordered_wrong": wrong,
        "kendall_tau_resolved": _round((right - wrong) / resolved) if resolved else None,
    }


def measured_rounds(pairs: list[Measured]) -> Rounds:
    """The per-round figures of `resolved_pairs` from this run's trials."""
    rounds: Rounds = defaultdict(dict)
    for pair in pairs:
        rounds[pair.model][pair.name] = (
            [t.median_s for t in pair.trials],
            [t.predicted_s if t.median_s else None for t in pair.trials],
        )
    return rounds


def split_half_tau(members: list[Measured]) -> float | None:
    """Within one model, the tau between the medians of the even and of the odd rounds: how well half
    the measurements rank the strategies like the other half. A predictor scored against the median of
    all rounds is judged by a truth about that reliable (somewhat more, having twice the rounds)."""
    return split_half_of([[t.median_s for t in p.ok] for p in members])  # type: ignore[misc]


def split_half_of(rounds: list[list[float]]) -> float | None:
    """`split_half_tau` on each strategy's per-round times (rounds beyond the shortest list dropped)."""
    count = min((len(r) for r in rounds), default=0)
    if count < 2:
        return None
    tau = kendall_tau(
        [statistics.median(r[:count:2]) for r in rounds], [statistics.median(r[1:count:2]) for r in rounds]
    )
    return None if math.isnan(tau) else tau


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


# -- records ------------------------------------------------------------------------------------------


def record_line(graph: ModelGraph, resources: ResourceSpec, strategy: Strategy, result: dict[str, Any]) -> str:
    """One trial as `benchmarks/trials.py` writes it."""
    return json.dumps(
        {
            "graph": graph.model_dump(mode="json"),
            "resources": resources.model_dump(mode="json"),
            "strategy": strategy.model_dump(mode="json"),
            "result": result,
        }
    )


def strategy_name(strategy: Strategy) -> str:
    """The builder's name, or the mix's name for the search-style strategies made here."""
    search = strategy.provenance.search or {}
    return strategy.provenance.builder or str(search.get("mix") or strategy.id)


def read_records(path: Path) -> list[Measured]:
    """Pairs from a records file: one per (graph, strategy name), every trial of it one round. Each
    calibrated spec is rebuilt from the figures it recorded (`calibrate.reread`), and gets a fresh id
    (the strategy follows it), so old measurements re-score with today's calibration and simulator."""
    pairs: dict[tuple[str, str], Measured] = {}
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            graph, result = ModelGraph.parse(data["graph"]), data["result"]
            resources = reread(ResourceSpec.parse({k: v for k, v in data["resources"].items() if k != "id"}))
            strategy = Strategy.parse(
                {**{k: v for k, v in data["strategy"].items() if k != "id"}, "resources_id": resources.id}
            )
        except (ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"{path}:{number}: not a trial record: {error}") from None
        model = str((graph.provenance.get("zoo") or {}).get("name") or graph.name)
        name = strategy_name(strategy)
        pair = pairs.setdefault((str(graph.id), name), Measured(model, name, graph))
        ok = result.get("outcome") == "ok" and result.get("median_s")
        pair.trials.append(
            Trial(
                resources,
                strategy,
                float(result["median_s"]) if ok else None,
                None if ok else str(result.get("outcome")),
                undistributed_s=result.get("undistributed_step_s"),
                sync_s=result.get("sync_s") or {},
                optimizer_primed=bool(result.get("optimizer_primed")),
            )
        )
    return list(pairs.values())


# -- strategies and measurement -----------------------------------------------------------------------


def build_graph(model: str) -> ModelGraph:
    case = CASES[model]
    module, make_batch = zoo.build(model, "small", **case.overrides)
    return capture(module, make_batch(case.batch_size), batch_size=case.batch_size, optimizer=case.optimizer)


SAME_ON_ONE_NODE = ("PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS", "PartitionedAR", "RandomAxisPartitionAR")
"""Builders that execute like another one on a single node, and are measured only with `--all-builders`:
AutoDist puts one server on each node, so the load-balanced and partitioned PS builders place every
shard on the same server as PS, where the runtime fuses them into the same bucket; the partitioned
all-reduce builders cut variables into pieces of the same fusion groups as AllReduce. Their trials
measure the machine's noise twice, not another strategy, and tie pairs that no ranking can order."""


def strategies_for(graph: ModelGraph, resources: ResourceSpec, *, all_builders_: bool = False) -> dict[str, Strategy]:
    """The builders that differ on this cluster, plus mixes a search would propose that cost differently
    on it: one all-reduce per variable (latency-bound), fp16, PowerSGD and top-k compression of the
    dense gradients (less wire, more arithmetic), ZeRO-style sharding. Coinciding strategies (on a
    dense model Parallax is AllReduce) keep the first name."""
    out: dict[str, Strategy] = {
        b.name: b.build(graph, resources) for b in all_builders() if all_builders_ or b.name not in SAME_ON_ONE_NODE
    }
    out["AllReduce-unfused"] = _mix(AllReduce(chunk_size=1).build(graph, resources), "AllReduce-unfused")
    for name, compressor in (
        ("AllReduce-fp16", Compressor(kind="fp16")),
        ("AllReduce-powersgd", Compressor(kind="powersgd", rank=4)),
        ("AllReduce-topk", Compressor(kind="topk", ratio=0.01)),
    ):
        out[name] = _mix(_compressed(out["AllReduce"], graph, compressor), name)
    dense = [v for v in graph.trainable_variables if not v.sparse]
    if len(dense) == len(graph.trainable_variables):
        sharded = [VariableConfig(var_name=v.name, synchronizer=ShardedSynchronizer()) for v in dense]
        out["Sharded"] = _mix(
            out["AllReduce"].replace(variables=[c.model_dump(mode="json") for c in sharded]), "Sharded"
        )
    unique: dict[str, Strategy] = {}
    seen: set[str] = set()
    for name, strategy in out.items():
        if strategy.id not in seen:
            seen.add(str(strategy.id))
            unique[name] = strategy
    return unique


def _compressed(strategy: Strategy, graph: ModelGraph, compressor: Compressor) -> Strategy:
    """`strategy` with `compressor` on the all-reduce of every dense variable (sparse rows travel as they are)."""
    sparse = {v.name for v in graph.variables if v.sparse}
    configs = []
    for config in strategy.variables:
        data = config.model_dump(mode="json")
        if config.var_name not in sparse and data["synchronizer"]["kind"] == "allreduce":
            data["synchronizer"]["compressor"] = compressor.model_dump(mode="json")
        configs.append(data)
    return strategy.replace(variables=configs)


def _mix(strategy: Strategy, name: str) -> Strategy:
    return strategy.replace(provenance=Provenance(search={"benchmark": "simulator_accuracy", "mix": name}))


def measure(models: list[str], args: argparse.Namespace, out: Any) -> tuple[list[Measured], list[dict[str, Any]]]:
    """Rounds of every model's strategies; the machine is calibrated before each model's block, or
    once with `--calibrate once`. A block is one interleaved run of all the model's strategies
    (`--mode interleaved`), or one trial per strategy in an order rotated every round (`--mode trials`)."""
    graphs = {model: build_graph(model) for model in models}
    pairs: dict[tuple[str, str], Measured] = {}
    calibrations: list[dict[str, Any]] = []
    resources: ResourceSpec | None = None
    for round_index in range(args.rounds):
        for model in models:
            if resources is None or (args.calibrate == "block" and args.mode == "trials"):
                resources = _calibrated(resources)
            chosen = {
                n: s
                for n, s in strategies_for(graphs[model], resources, all_builders_=args.all_builders).items()
                if not args.quick or n in QUICK_STRATEGIES
            }
            if args.mode == "interleaved":
                results, block_spec = measure_interleaved(model, chosen, args)
                if block_spec is not None and args.calibrate == "block":
                    resources = block_spec
                    chosen = {name: strategy.replace(resources_id=resources.id) for name, strategy in chosen.items()}
            else:
                names = list(chosen)
                shift = round_index % len(names)
                results = {name: _run(model, chosen[name], resources, args) for name in names[shift:] + names[:shift]}
            calibrations.append({"round": round_index + 1, "model": model, **calibration_summary(resources)})
            for name, result in results.items():
                out.write(record_line(graphs[model], resources, chosen[name], result) + "\n")
                ok = result.get("outcome") == "ok" and result.get("median_s")
                trial = Trial(
                    resources,
                    chosen[name],
                    float(result["median_s"]) if ok else None,
                    None if ok else f"{result.get('outcome')}: {(result.get('error') or '').strip()[:200]}",
                    undistributed_s=result.get("undistributed_step_s"),
                    sync_s=result.get("sync_s") or {},
                    optimizer_primed=bool(result.get("optimizer_primed")),
                )
                pairs.setdefault((model, name), Measured(model, name, graphs[model])).trials.append(trial)
                shown = f"{trial.median_s * 1e3:8.1f} ms" if trial.median_s else trial.failure
                print(f"round {round_index + 1} {model:10s} {name:22s} {shown}", file=sys.stderr, flush=True)
            out.flush()
    return list(pairs.values()), calibrations


def _calibrated(previous: ResourceSpec | None) -> ResourceSpec:
    """A fresh calibration; after two failed attempts the previous one (there must be one)."""
    from stratagem.calibrate import CalibrationError, calibrate

    for attempt in (1, 2):
        try:
            return calibrate(ranks=2, threads=1)
        except CalibrationError as error:
            print(f"calibration attempt {attempt} failed: {error}", file=sys.stderr, flush=True)
    if previous is None:
        raise SystemExit("could not calibrate this machine")
    return previous


def _run(model: str, strategy: Strategy, resources: ResourceSpec, args: argparse.Namespace) -> dict[str, Any]:
    """One trial through the trial runner's local backend (a process pair per strategy)."""
    from trial_runner import LocalBackend, ZooWorkload, run_trial

    case = CASES[model]
    workload = ZooWorkload(model, batch_size=case.batch_size, overrides=case.overrides, optimizer=case.optimizer)
    result = run_trial(
        workload,
        resources,
        strategy,
        warmup=max(args.warmup, case.min_warmup),
        steps=args.steps,
        timeout=args.timeout,
        backend=LocalBackend(),
        threads_per_rank=1,
        prime_optimizer=not args.unprimed,
    )
    return result.model_dump(mode="json")


# -- interleaved measurement ----------------------------------------------------------------------------


def measure_interleaved(
    model: str, strategies: dict[str, Strategy], args: argparse.Namespace
) -> tuple[dict[str, dict[str, Any]], ResourceSpec | None]:
    """Every strategy of one model in one interleaved block (`benchmarks/interleaved.py`), beside an
    undistributed copy of the model: a trial-like result per strategy and the spec calibrated alongside
    (None when the ranks failed)."""
    from trial_runner import ZooWorkload

    case = CASES[model]
    workload = ZooWorkload(model, batch_size=case.batch_size, overrides=case.overrides, optimizer=case.optimizer)
    block = measure_block(
        workload,
        strategies,
        warmup=max(args.warmup, case.min_warmup),
        steps=args.steps,
        timeout=args.timeout,
        undistributed=True,
        prime_optimizer=not args.unprimed,
    )
    return {name: block.result(name, strategy) for name, strategy in strategies.items()}, block.resources


def predict(pairs: list[Measured]) -> None:
    """The calibrated simulator's step time for every trial (one `simulate` call per graph and spec)."""
    from simulator import simulate

    groups: dict[tuple[str, str], list[tuple[Measured, Trial]]] = defaultdict(list)
    for pair in pairs:
        for trial in pair.trials:
            groups[(str(pair.graph.id), str(trial.resources.id))].append((pair, trial))
    for members in groups.values():
        graph, resources = members[0][0].graph, members[0][1].resources
        predictions = simulate(graph, resources, [trial.strategy for _, trial in members])
        for (_, trial), prediction in zip(members, predictions, strict=True):
            trial.predicted_s = prediction.step_time_s
            trial.breakdown = dict(prediction.breakdown)


CPU_FIGURES = (
    "conv_efficiency",
    "norm_efficiency",
    "optimizer_efficiency",
    "optimizer_knee_bytes",
    "stream_efficiency",
    "cast_efficiency",
    "select_efficiency",
    "lowrank_efficiency",
    "lowrank_knee_bytes",
    "coalesce_efficiency",
    "scatter_efficiency",
    "gather_efficiency",
    "half_reduce_efficiency",
    "reduce_efficiency",
    "broadcast_efficiency",
    "optimizer_tensor_s",
    "lowrank_round_s",
)
ABLATIONS: dict[str, dict[str, Any]] = {
    "conv_efficiency as matmul": {"conv_efficiency": None},
    "norm_efficiency as elementwise": {"norm_efficiency": None},
    "optimizer_efficiency as elementwise": {"optimizer_efficiency": None},
    "no optimizer_knee_bytes (update and compression passes independent of tensor size)": {
        "optimizer_knee_bytes": None
    },
    "stream_efficiency as elementwise (compression's plain passes at an activation's rate, as before principled-1.11)": {
        "stream_efficiency": None
    },
    "cast, select and lowrank efficiency as elementwise": {
        "cast_efficiency": None,
        "select_efficiency": None,
        "lowrank_efficiency": None,
        "lowrank_knee_bytes": None,
    },
    "scatter_efficiency 1 (reduce-scatter as fast as the ring formula)": {"scatter_efficiency": None},
    "coalesce_efficiency as elementwise (sorting sparse rows as fast as a copy)": {"coalesce_efficiency": None},
    "gather_efficiency 1 (sparse rows and top-k gathered at the ring formula's speed)": {"gather_efficiency": None},
    "reduce_efficiency and broadcast_efficiency 1 (PS pushes and pulls at the all-reduce's speed)": {
        "reduce_efficiency": None,
        "broadcast_efficiency": None,
    },
    "optimizer_tensor_s 0 (an update costs its bytes only)": {"optimizer_tensor_s": None},
    "half_reduce_efficiency 1 (fp16 all-reduce as fast per byte as fp32)": {"half_reduce_efficiency": None},
    "lowrank_round_s unset (a PowerSGD bucket's rounds at two link latencies)": {"lowrank_round_s": None},
    "comm_overlap 1 and no latency contention (as on GPUs)": {"comm_overlap": 1.0, "comm_latency_contention": 0.0},
    "none of them": {**dict.fromkeys(CPU_FIGURES), "comm_overlap": 1.0, "comm_latency_contention": 0.0},
}
"""Device figures reset to their defaults, one CPU refinement at a time, to show what each contributes."""


def before_1_11(resources: ResourceSpec) -> ResourceSpec:
    """The spec that calibrations before `principled-1.11` built from the same figures: no stream rate
    (compression's plain passes at the element-wise rate) and the bare fp16 wire (kept in the provenance
    as `half_wire_efficiency`) as `half_reduce_efficiency`. A spec without that figure predates 1.11
    and already reads that way."""
    figures = dict(resources.provenance or {})
    if "half_wire_efficiency" not in figures or not resources.nodes:
        return resources
    figures["half_reduce_efficiency"] = figures.pop("half_wire_efficiency")
    figures.pop("stream_rate", None)
    return spec_from_figures(figures, address=resources.nodes[0].address)


SPEC_ABLATIONS = {
    "both as before principled-1.11 (plain passes at the element-wise rate, fp16 credited with the bare wire)": before_1_11
}
"""Ablations that read more than constants: each rewrites a spec."""


def ablation(pairs: list[Measured]) -> dict[str, dict[str, Any]]:
    """The scores with each refinement switched off, on the same trials and calibrations."""
    out = {}
    changes = {**{label: _device_change(change) for label, change in ABLATIONS.items()}, **SPEC_ABLATIONS}
    for label, rewrite in changes.items():
        variant = with_specs(pairs, rewrite)
        predict(variant)
        report = accuracy_report(variant)
        out[label] = {"overall": report["overall"], "models": report["models"]}
    return out


def with_specs(pairs: list[Measured], rewrite: Callable[[ResourceSpec], ResourceSpec]) -> list[Measured]:
    """The same trials, each calibrated spec passed through `rewrite` (once per spec), predictions unset."""
    adjusted: dict[str, ResourceSpec] = {}

    def trial_with(trial: Trial) -> Trial:
        key = str(trial.resources.id)
        if key not in adjusted:
            adjusted[key] = rewrite(trial.resources)
        spec = adjusted[key]
        return replace(
            trial, resources=spec, strategy=trial.strategy.replace(resources_id=spec.id), predicted_s=None, breakdown={}
        )

    return [replace(pair, trials=[trial_with(t) for t in pair.trials]) for pair in pairs]


def _device_change(change: dict[str, Any]) -> Callable[[ResourceSpec], ResourceSpec]:
    def rewrite(resources: ResourceSpec) -> ResourceSpec:
        devices = {k: d.model_copy(update=change) for k, d in resources.devices.items()}
        return resources.replace(devices={k: d.model_dump(mode="json") for k, d in devices.items()})

    return rewrite


# -- main ---------------------------------------------------------------------------------------------


def main() -> None:
    args = _arguments()
    started = time.perf_counter()
    calibrations: list[dict[str, Any]] = []
    niceness = None
    if args.from_records:
        pairs = read_records(Path(args.from_records))
    else:
        niceness = _lower_niceness(args.priority)
        models = args.models or list(QUICK_MODELS if args.quick else DEFAULT_MODELS)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as out:
            pairs, calibrations = measure(models, args, out)
    if args.before_1_11:
        pairs = with_specs(pairs, before_1_11)
    predict(pairs)
    report = {
        "benchmark": "simulator_accuracy",
        "simulator_version": _simulator_version(),
        "targets": TARGETS,
        **accuracy_report(pairs),
        "noise": noise_report(pairs),
        "load_adjusted": load_adjusted_report(pairs),
        "compute_check": compute_check(pairs),
        "discordant_pairs": discordant_pairs(pairs),
        "resolved_pairs": resolved_pairs(measured_rounds(pairs)),
        "ablation": ablation(pairs) if args.ablation else None,
        "pairs": [_pair_summary(p) for p in pairs],
        "calibrations": calibrations,
        "settings": {
            "rounds": args.rounds,
            "steps": args.steps,
            "warmup": args.warmup,
            "calibrate": args.calibrate,
            "niceness": niceness,
            "records": args.from_records or args.out,
            "threads_per_rank": 1,
            "ranks": 2,
            "optimizer_primed": optimizer_primed(pairs),
        },
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))


def optimizer_primed(pairs: list[Measured]) -> bool | str:
    """The trials' protocol: whether each timed its steps over filled optimizer state ("mixed" if some did)."""
    values = {trial.optimizer_primed for pair in pairs for trial in pair.trials}
    return values.pop() if len(values) == 1 else "mixed"


def calibration_summary(resources: ResourceSpec) -> dict[str, Any]:
    """The calibrated figures worth reading at a glance."""
    device = (
        resources.device_spec(DEVICE_KIND)
        if DEVICE_KIND in resources.devices
        else next(iter(resources.devices.values()))
    )
    link = resources.intra_node or resources.network
    return {
        "resources_id": resources.id,
        "matmul_gflops": round(device.flops_for("float32") / 1e9, 2),
        "copy_gbps": round(device.memory_bandwidth / 1e9, 2),
        "conv_efficiency": device.conv_efficiency,
        "norm_efficiency": device.norm_efficiency,
        "elementwise_efficiency": round(device.elementwise_efficiency, 3),
        "optimizer_efficiency": device.optimizer_efficiency,
        "launch_overhead_us": round(device.launch_overhead_s * 1e6, 1),
        "comm_overlap": round(device.comm_overlap, 3),
        "lowrank_round_ms": None if device.lowrank_round_s is None else round(device.lowrank_round_s * 1e3, 2),
        "latency_us": round(link.latency_us, 1),
        "bandwidth_gbps": round(link.bandwidth_gbps, 2),
    }


def _pair_summary(pair: Measured) -> dict[str, Any]:
    measured, predicted = pair.measured, pair.predicted
    breakdowns = [t.breakdown for t in pair.ok if t.breakdown]
    mean = {
        k: round(1e3 * statistics.mean(b.get(k, 0.0) for b in breakdowns), 2)
        for k in (breakdowns[0] if breakdowns else {})
    }
    syncs = [t.sync_s for t in pair.ok if t.sync_s]
    sync = {
        k: round(1e3 * statistics.median(s.get(k, 0.0) for s in syncs), 2)
        for k in sorted({k for s in syncs for k in s})
    }
    return {
        "model": pair.model,
        "strategy": pair.name,
        "measured_ms": _round(measured * 1e3 if measured else None, 2),
        "predicted_ms": _round(predicted * 1e3 if predicted is not None else None, 2),
        "error": _round((predicted - measured) / measured if measured and predicted is not None else None, 3),
        "round_medians_ms": [round(t.median_s * 1e3, 2) if t.median_s else None for t in pair.trials],
        "round_predicted_ms": [round(t.predicted_s * 1e3, 2) if t.predicted_s else None for t in pair.trials],
        "spread": _round(pair.spread, 3),
        "predicted_breakdown_ms": {k: v for k, v in mean.items() if v > 0},
        "measured_sync_ms": sync,
        "failures": [t.failure for t in pair.trials if t.failure],
    }


def _lower_niceness(boost: int) -> int:
    """Raise this process's priority by `boost` (inherited by calibrations and trial ranks) where permitted."""
    try:
        return os.nice(-boost)
    except PermissionError:
        return os.nice(0)


def _simulator_version() -> str:
    from simulator import SIMULATOR_VERSION

    return SIMULATOR_VERSION


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"models {QUICK_MODELS}, strategies {QUICK_STRATEGIES}, 1 round"
    )
    parser.add_argument("--models", nargs="*", choices=tuple(CASES))
    parser.add_argument("--steps", type=int, default=16, help="timed steps per strategy and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, 1 with --quick)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for one block (interleaved) or one trial")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON Lines file of {graph, resources, strategy, result}")
    parser.add_argument(
        "--calibrate",
        choices=("block", "once"),
        default="block",
        help="calibrate before each model's block of trials in every round (default), or once",
    )
    parser.add_argument("--from-records", help="score this records file (plain, .xz or .gz) instead of measuring")
    parser.add_argument("--ablation", action="store_true", help="also score with each CPU refinement switched off")
    parser.add_argument(
        "--before-1.11",
        dest="before_1_11",
        action="store_true",
        help="price every trial as principled-1.10 and earlier read its spec (`before_1_11`)",
    )
    parser.add_argument(
        "--mode",
        choices=("interleaved", "trials"),
        default="interleaved",
        help="all of a model's strategies side by side in one process pair (default), or one trial each",
    )
    parser.add_argument("--all-builders", action="store_true", help=f"also measure {', '.join(SAME_ON_ONE_NODE)}")
    parser.add_argument(
        "--unprimed",
        action="store_true",
        help="time steps from an empty optimizer state, as before session 15 (default: primed)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=15,
        choices=range(21),
        metavar="0..20",
        help="lower the niceness by this much while measuring (default 15)",
    )
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--steps and --rounds must be at least 1, --warmup at least 0")
    return args


if __name__ == "__main__":
    main()
