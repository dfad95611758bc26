"""How much the learned correction helps, on trials really measured: a learning curve and low-shot answers.

Reads JSON Lines of real trials (one {graph, resources, strategy, result} per line, as
`benchmarks/simulator_accuracy.py --out` and `--measure` here write them), simulates every trial with
the resource spec it was measured under, and reports, cross-validated by job (a job = one graph and
workload; its strategies are never split between training and test):

- the noise floor: how far repeated measurements of one strategy disagree, and the scores a single
  round of measurements gets against the median of the other rounds (no predictor can be judged
  more finely than that);
- the learning curve: MAPE, within-job Kendall tau and top-1 regret of the simulator alone and of the
  corrected model trained on 0, 5, 10, 20 and 50 trials of other jobs (averaged over seeds);
- low-shot: for each job, with a budget of 4 trials chosen by `TrialPlanner` (the model trained on
  every other job), how often the answer is the job's measured-fastest strategy, and its regret.

A strategy measured in several rounds is one strategy: its measured step time is the median over the
rounds, its simulated step time the median of the predictions (each with the spec calibrated before
its round), and its features those of the round whose prediction is that median.

    python benchmarks/cost_model.py --measure /tmp/stratagem-bench/cost-jobs.jsonl --jobs mlp-wide embedding
    python benchmarks/cost_model.py --trials /tmp/stratagem-bench/accuracy-final.jsonl /tmp/stratagem-bench/cost-*.jsonl

`--measure` runs jobs of its own (`JOBS`: zoo models at sizes where synchronization is a real share of
the step, and replayed models whose gradients are large next to their compute) in `--rounds` rounds.
In each round every job is one block: all its strategies trained side by side by one pair of gloo
ranks, one step of each in turn, with `stratagem.calibrate`'s probes between the timed steps (the
interleaved protocol of `benchmarks/interleaved.py`), so every strategy sees the same load and
the block's spec describes the machine its steps ran on. Never run it beside another real-trial
benchmark on the same cores.

Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import GroupKFold

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.interleaved import load_factors, measure_block
from benchmarks.records_file import read_lines
from benchmarks.simulator_accuracy import Case, strategies_for, strategy_name
from optimizer_service.lowshot import (
    CostModelUpdater,
    SharedBiasUpdater,
    TrialPlanner,
    candidates_from_model,
    run_plan,
)
from simulator.learned import (
    CostModel,
    FeatureMatrix,
    TrainingRecord,
    build_features,
    cross_validate,
    make_record,
    promotion,
    score,
)
from simulator.learned.metrics import kendall_tau_within_groups, top1_regret
from stratagem.calibrate import reread
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

SIZES = (0, 5, 10, 20, 50)
TARGETS = {"mape_ratio_at_20": 0.5, "kendall_tau_at_20": 0.9, "top1_regret_at_20": 0.05}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- jobs measured here -------------------------------------------------------------------------------

COMM_JOBS: dict[str, tuple[int, int, int, int]] = {
    # name: (dense layers, width, batch, embedding rows): gradients large next to their compute
    "mlp-wide": (4, 1536, 8, 0),
    "mlp-deep": (12, 768, 8, 0),
    "mlp-compute": (4, 1024, 128, 0),
    "embedding": (2, 256, 256, 65_536),
}
"""Replayed models (`trial_runner.ReplayWorkload`): the graph's FLOPs and bytes, burnt for real."""

ZOO_JOBS: dict[str, tuple[str, Case]] = {
    "bert_large-h384": (
        "bert_large",
        Case(2, {"hidden": 384, "ffn": 1536, "layers": 2, "seq": 32, "vocab": 8192}, min_warmup=30),
    ),
    "gpt-h256": ("gpt", Case(8, {"hidden": 256, "ffn": 1024, "layers": 2, "seq": 32, "vocab": 8192}, min_warmup=14)),
    "vgg16-wide-fc": ("vgg16", Case(8, {"width": 8, "hidden": 3072})),
    "dlrm-dim64": ("dlrm", Case(512, {"dim": 64, "bottom": "256,128", "top": "256,128"}, optimizer="adagrad")),
}
"""Zoo models at other sizes than `benchmarks/simulator_accuracy.py`'s CASES, chosen the same way: few
tokens per step for many parameters, a wide classifier, sparse tables. BERT at width 384 with 64 tokens
a step leaves its denormal start slowly: alone on one rank its step fell from 357 ms at step 2 to 150
at step 12 and about 106 from step 30 on, so it warms up 30 steps (5 had timed the slow start)."""

JOBS = (*ZOO_JOBS, *COMM_JOBS)


def comm_graph(name: str, layers: int, width: int, batch: int, rows: int) -> ModelGraph:
    """A model whose gradients are large next to its compute, replayed for real by the trial runner."""
    act = float(batch * width * 4)
    graph_layers: list[dict[str, Any]] = []
    variables: list[dict[str, Any]] = []
    if rows:
        variables.append(
            {
                "name": "embedding.weight",
                "shape": [rows, width],
                "sparse": True,
                "lookups_per_step": batch * 16,
                "consumer": "embedding",
            }
        )
        graph_layers.append(
            {
                "name": "embedding",
                "kind": "embedding",
                "bytes_moved": act * 16,
                "activation_bytes": act,
                "output_bytes": act,
                "variables": ["embedding.weight"],
            }
        )
    for i in range(layers):
        flops = 2.0 * batch * width * width
        variables.append({"name": f"layers.{i}.weight", "shape": [width, width], "consumer": f"layers.{i}"})
        graph_layers.append(
            {
                "name": f"layers.{i}",
                "kind": "matmul",
                "fwd_flops": flops,
                "bwd_flops": 2 * flops,
                "bytes_moved": 4.0 * width * width + 2 * act,
                "activation_bytes": act,
                "output_bytes": act,
                "inputs": [graph_layers[-1]["name"]] if graph_layers else [],
                "variables": [f"layers.{i}.weight"],
            }
        )
    return ModelGraph.parse(
        {
            "name": name,
            "batch_size": batch,
            "optimizer": {"kind": "sgd", "state_bytes_per_param": 0},
            "layers": graph_layers,
            "variables": variables,
            "provenance": {"source": "benchmarks/cost_model.py"},
        }
    )


@dataclass(frozen=True)
class Workload:
    graph: ModelGraph
    spec: Any
    """The trial runner's workload (zoo model or replay)."""
    warmup: int
    """Warm-up steps at least (the zoo's language models need more, see simulator_accuracy.CASES)."""


def job_workload(name: str) -> Workload:
    from trial_runner import ReplayWorkload, ZooWorkload

    if name in COMM_JOBS:
        graph = comm_graph(name, *COMM_JOBS[name])
        return Workload(graph, ReplayWorkload(graph), 0)
    from stratagem import zoo
    from stratagem.tracing import capture

    model, case = ZOO_JOBS[name]
    module, make_batch = zoo.build(model, "small", **case.overrides)
    graph = capture(module, make_batch(case.batch_size), batch_size=case.batch_size, optimizer=case.optimizer)
    spec = ZooWorkload(model, batch_size=case.batch_size, overrides=case.overrides, optimizer=case.optimizer)
    return Workload(graph, spec, case.min_warmup)


def measure(path: Path, jobs: list[str], *, rounds: int, steps: int, warmup: int, timeout: float) -> None:
    """Interleaved rounds: in each, every job's strategies are measured side by side in one block."""
    workloads = {name: job_workload(name) for name in jobs}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for round_index in range(rounds):
            for name in jobs:
                work = workloads[name]
                chosen = strategies_for(work.graph, _placeholder_spec())
                block = measure_block(work.spec, chosen, warmup=max(warmup, work.warmup), steps=steps, timeout=timeout)
                resources = block.resources
                if resources is None:
                    log(f"round {round_index + 1} {name}: the block failed: {block.failure}")
                    continue
                for label, strategy in chosen.items():
                    strategy = strategy.replace(resources_id=resources.id)
                    result = block.result(label, strategy)
                    out.write(
                        json.dumps(
                            {
                                "job": name,
                                "round": round_index + 1,
                                "graph": work.graph.model_dump(mode="json"),
                                "resources": resources.model_dump(mode="json"),
                                "strategy": strategy.model_dump(mode="json"),
                                "result": result,
                            }
                        )
                        + "\n"
                    )
                    shown = f"{result['median_s'] * 1e3:8.1f} ms" if result["median_s"] else result["outcome"]
                    log(f"round {round_index + 1} {name:16s} {label:20s} {shown}")
                out.flush()


def _placeholder_spec() -> ResourceSpec:
    """Two CPU ranks on one node: all the builders need (devices and nodes) before the block calibrates."""
    from stratagem.ir import Node

    return ResourceSpec(name="local-2cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")])


# -- loading: one record per (job, strategy), its rounds folded into medians --------------------------


@dataclass
class StrategyRounds:
    """One strategy of one job and its successful rounds, each simulated with the spec it ran under."""

    job: str
    name: str
    records: list[TrainingRecord] = field(default_factory=list)

    @property
    def measured(self) -> list[float]:
        return [float(r.measured_step_time_s) for r in self.records]  # type: ignore[arg-type]

    @property
    def spread(self) -> float | None:
        """(slowest − fastest round) / median round: how far repeated measurements of it disagree."""
        times = self.measured
        return (max(times) - min(times)) / statistics.median(times) if len(times) > 1 else None

    def folded(self) -> TrainingRecord:
        """Median measured time; the features and simulated time of the round whose prediction is the median."""
        ordered = sorted(self.records, key=lambda r: r.simulated_step_time_s)
        middle = ordered[(len(ordered) - 1) // 2]
        return middle.model_copy(update={"measured_step_time_s": statistics.median(self.measured)})


def load_adjusted(strategies: list[StrategyRounds]) -> list[StrategyRounds]:
    """The same trials with each block's shared load divided out (`interleaved.load_factors`).

    A block is one job's strategies measured under one calibration (one round, minutes long): the
    machine's other load moves every step time in it alike.
    """
    by_job: dict[str, list[StrategyRounds]] = defaultdict(list)
    for s in strategies:
        by_job[s.job].append(s)
    out = []
    for members in by_job.values():
        factor = load_factors(
            {
                s.name: {r.resources_id: float(r.measured_step_time_s) for r in s.records}  # type: ignore[arg-type]
                for s in members
            }
        )
        if not factor:
            out.extend(members)
            continue
        for s in members:
            adjusted = [
                r.model_copy(update={"measured_step_time_s": float(r.measured_step_time_s) / factor[r.resources_id]})  # type: ignore[arg-type]
                for r in s.records
            ]
            out.append(StrategyRounds(s.job, s.name, adjusted))
    return out


def strategy_key(strategy: Strategy) -> str:
    """The strategy's content without the spec it was built for: the same plan in every round."""
    return strategy.model_copy(update={"resources_id": None}).compute_id()


def job_name(line: dict[str, Any], graph: ModelGraph) -> str:
    """The job `--measure` named (else the zoo model or graph name), the graph id and the workload kind:
    one graph run one way, whatever file or session its rounds came from."""
    zoo = (graph.provenance or {}).get("zoo") or {}
    kind = str(line["result"].get("workload", "")).split(":")[0]
    return f"{line.get('job') or zoo.get('name') or graph.name}-{str(graph.id)[:8]}/{kind}"


def trial_documents(line: dict[str, Any]) -> tuple[ModelGraph, ResourceSpec, Strategy]:
    """The trial's three documents, their ids recomputed from their content.

    A record outlives schema additions: a spec written before a device field was added carries an id
    computed without it, which today's parser refuses. The content is what was measured, so the ids are
    recomputed and the strategy's references to its graph and spec follow them. A calibrated spec is
    rebuilt from the figures it recorded (`calibrate.reread`), read as today's calibration reads them.
    """
    graph_doc, resources_doc, strategy_doc = dict(line["graph"]), dict(line["resources"]), dict(line["strategy"])
    old_graph, old_resources = graph_doc.pop("id", None), resources_doc.pop("id", None)
    strategy_doc.pop("id", None)
    graph, resources = ModelGraph.parse(graph_doc), reread(ResourceSpec.parse(resources_doc))
    if strategy_doc.get("graph_id") == old_graph:
        strategy_doc["graph_id"] = graph.id
    if strategy_doc.get("resources_id") == old_resources:
        strategy_doc["resources_id"] = resources.id
    return graph, resources, Strategy.parse(strategy_doc)


def load_trials(paths: list[Path]) -> tuple[list[StrategyRounds], dict[str, Any]]:
    """Every successful trial, simulated with its own spec and grouped by job and strategy."""
    import simulator

    outcomes: dict[str, int] = defaultdict(int)
    by_spec: dict[tuple[str, str, str], list[tuple[Strategy, float, str]]] = defaultdict(list)
    documents: dict[tuple[str, str, str], tuple[ModelGraph, ResourceSpec]] = {}
    primed: set[bool] = set()
    for path in paths:
        for number, text in enumerate(read_lines(path), start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                result = line["result"]
                outcomes[result["outcome"]] += 1
                if result["outcome"] != "ok" or not result.get("median_s"):
                    continue
                graph, resources, strategy = trial_documents(line)
            except (ValueError, KeyError, TypeError) as error:
                raise SystemExit(f"{path}:{number}: not a trial record: {error}") from None
            primed.add(bool(result.get("optimizer_primed")))
            job = job_name(line, graph)
            key = (job, str(graph.id), str(resources.id))
            documents[key] = (graph, resources)
            by_spec[key].append((strategy, float(result["median_s"]), strategy_name(strategy)))
    if len(primed) > 1:
        raise SystemExit(
            "the records mix trials timed over primed and over empty optimizer state "
            "(TrialSpec.prime_optimizer): score each protocol's records on their own"
        )
    strategies: dict[tuple[str, str], StrategyRounds] = {}
    version = getattr(simulator, "SIMULATOR_VERSION", None)
    for key, trials in by_spec.items():
        graph, resources = documents[key]
        predictions = simulator.simulate(graph, resources, [s for s, _, _ in trials])
        for (strategy, measured, name), prediction in zip(trials, predictions, strict=True):
            record = make_record(
                graph,
                resources,
                strategy,
                prediction,
                measured_step_time_s=measured,
                group_id=key[0],
                simulator_version=version,
                source="benchmarks",
            )
            entry = strategies.setdefault((key[0], strategy_key(strategy)), StrategyRounds(key[0], name))
            entry.records.append(record)
    members = list(strategies.values())
    rounds = [len(s.records) for s in members]
    per_job: dict[str, int] = defaultdict(int)
    for s in members:
        per_job[s.job] += 1
    stats = {
        "lines": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        "trials_ok": sum(rounds),
        "strategies": len(members),
        "optimizer_primed": primed.pop() if primed else None,
        "jobs": len(per_job),
        "strategies_per_job": dict(sorted(per_job.items())),
        "rounds_per_strategy": {str(k): rounds.count(k) for k in sorted(set(rounds))},
    }
    return members, stats


# -- the noise floor ---------------------------------------------------------------------------------


def noise_floor(strategies: list[StrategyRounds]) -> dict[str, Any]:
    """How well the measurements agree with themselves: the finest any predictor can be judged.

    With k rounds, each round in turn plays a predictor of the median of the other rounds: its MAPE,
    within-job tau and top-1 regret are what a perfect model of one round's measurement would score.
    A pair of strategies is `separable` when their medians differ by more than either one's spread.
    """
    spreads = [s.spread for s in strategies if s.spread is not None]
    by_job: dict[str, list[StrategyRounds]] = defaultdict(list)
    for s in strategies:
        by_job[s.job].append(s)
    rounds = min((len(s.records) for s in strategies), default=0)
    leave_one_out = []
    for held in range(rounds if rounds >= 2 else 0):
        one, rest, groups = [], [], []
        for s in strategies:
            times = s.measured
            one.append(times[held])
            rest.append(statistics.median(times[:held] + times[held + 1 :]))
            groups.append(s.job)
        rest_a, one_a = np.array(rest), np.array(one)
        leave_one_out.append(
            {
                "mape": float(np.mean(np.abs(one_a - rest_a) / rest_a)),
                "kendall_tau": kendall_tau_within_groups(rest_a, one_a, groups),
                "top1_regret": top1_regret(rest_a, one_a, groups),
            }
        )
    total = sum(len(members) * (len(members) - 1) // 2 for members in by_job.values())
    separable = len(separable_pairs(strategies))
    return {
        "strategies_with_rounds": len(spreads),
        "median_round_spread": _maybe(statistics.median, spreads),
        "mean_round_spread": _maybe(statistics.mean, spreads),
        "max_round_spread": _maybe(max, spreads),
        "one_round_vs_others": {
            k: float(np.nanmean([x[k] for x in leave_one_out])) for k in ("mape", "kendall_tau", "top1_regret")
        }
        if leave_one_out
        else None,
        "separable_pairs": separable / total if total else None,
    }


def separable_pairs(strategies: list[StrategyRounds]) -> list[tuple[int, int]]:
    """Index pairs of one job's strategies whose medians differ by more than either one's spread: the
    pairs whose order the measurements establish, so a predictor that orders them wrong is wrong."""
    by_job: dict[str, list[int]] = defaultdict(list)
    for index, s in enumerate(strategies):
        by_job[s.job].append(index)
    pairs = []
    for members in by_job.values():
        for position, i in enumerate(members):
            for j in members[position + 1 :]:
                a, b = strategies[i], strategies[j]
                ma, mb = statistics.median(a.measured), statistics.median(b.measured)
                if abs(ma - mb) / min(ma, mb) > max(a.spread or 0.0, b.spread or 0.0):
                    pairs.append((i, j))
    return pairs


def tau_on_pairs(measured: np.ndarray, predicted: np.ndarray, pairs: list[tuple[int, int]]) -> float:
    """Kendall tau over the given pairs only (a pair predicted as a tie counts neither way)."""
    if not pairs:
        return math.nan
    votes = [np.sign(measured[i] - measured[j]) * np.sign(predicted[i] - predicted[j]) for i, j in pairs]
    return float(np.mean(votes))


def job_spread(records: list[TrainingRecord]) -> dict[str, float]:
    """Slowest over fastest strategy per job (simulated and measured), and the regret of a random pick:
    the yardsticks for the ranking scores."""
    simulated: dict[str, list[float]] = defaultdict(list)
    measured: dict[str, list[float]] = defaultdict(list)
    for r in records:
        simulated[r.group_id].append(r.simulated_step_time_s)
        measured[r.group_id].append(float(r.measured_step_time_s))  # type: ignore[arg-type]
    return {
        "simulated_max_over_min": float(np.mean([max(t) / min(t) for t in simulated.values()])),
        "measured_max_over_min": float(np.mean([max(t) / min(t) for t in measured.values()])),
        "random_pick_regret": float(np.mean([np.mean(t) / min(t) - 1 for t in measured.values()])),
    }


def per_job(strategies: list[StrategyRounds]) -> dict[str, list[dict[str, Any]]]:
    """Each job's strategies, fastest measured first: the rounds behind every median, and the simulator's view."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in strategies:
        folded = s.folded()
        out[s.job].append(
            {
                "strategy": s.name,
                "measured_ms": round(1e3 * float(folded.measured_step_time_s), 1),  # type: ignore[arg-type]
                "rounds_ms": [round(1e3 * t, 1) for t in s.measured],
                "simulated_ms": round(1e3 * folded.simulated_step_time_s, 1),
            }
        )
    return {job: sorted(rows, key=lambda row: row["measured_ms"]) for job, rows in sorted(out.items())}


def _maybe(function: Any, values: list[float]) -> float | None:
    return float(function(values)) if values else None


# -- the learning curve ------------------------------------------------------------------------------


def learning_curve(
    records: list[TrainingRecord],
    sizes: tuple[int, ...],
    seeds: int,
    params: dict[str, Any] | None = None,
    without: frozenset[str] = frozenset(),
    *,
    gate: bool = True,
    separable: list[tuple[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Out-of-fold scores for each training-set size, sampling that many trials from the other jobs.
    Features named in `without` are blanked (missing everywhere, so no tree can split on them).
    With `separable` (`separable_pairs` of the records' strategies), also tau over those pairs alone.

    With `gate`, also what the service would serve (`served`): each fitted correction is
    cross-validated by job on its own training trials, and where `promotion` refuses it the simulator
    alone answers; `served_share` is how often the correction was put in use."""
    matrix = build_features(records)
    matrix.X[:, [i for i, name in enumerate(matrix.names) if name in without]] = math.nan
    folds = list(GroupKFold(n_splits=min(5, len(set(matrix.groups)))).split(matrix.X, groups=matrix.groups))

    def scored(predicted: np.ndarray) -> dict[str, Any]:
        scores = score(matrix.measured_s, predicted, matrix.groups).to_dict()
        if separable:
            scores["kendall_tau_separable"] = tau_on_pairs(matrix.measured_s, predicted, separable)
        return scores

    simulator_scores = scored(matrix.simulated_s)
    curve = []
    for size in sizes:
        corrected, served, used, promoted = [], [], [], []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            predicted, answered = np.empty(len(matrix)), np.empty(len(matrix))
            for train, test in folds:
                chosen = rng.choice(train, size=min(size, len(train)), replace=False)
                used.append(len(chosen))
                training, make = matrix.take(chosen), partial(CostModel, random_state=seed, **(params or {}))
                predicted[test] = make().fit(training).predict(matrix.take(test))
                if gate:
                    serves = _serves(make, training)
                    promoted.append(serves)
                    answered[test] = predicted[test] if serves else matrix.simulated_s[test]
            corrected.append(scored(predicted))
            if gate:
                served.append(scored(answered))
        row = {
            "train_trials": size,
            "train_trials_used": float(np.mean(used)),
            "simulator": _curve_scores([simulator_scores]),
            "corrected": _curve_scores(corrected),
        }
        if gate:
            row.update(served=_curve_scores(served), served_share=float(np.mean(promoted)))
        curve.append(row)
        log(
            f"n={size} {params or ''}: {row['corrected']}"
            + (f" served {row['served']} ({row['served_share']:.0%})" if gate else "")
        )
    return curve


CURVE_KEYS = ("mape", "log_error", "kendall_tau", "top1_regret", "kendall_tau_separable")


def _curve_scores(per_seed: list[dict[str, Any]]) -> dict[str, float]:
    return {key: float(np.nanmean([s[key] for s in per_seed])) for key in CURVE_KEYS if key in per_seed[0]}


def _serves(make: Callable[[], CostModel], training: FeatureMatrix) -> bool:
    """Whether the service would put a correction fitted on `training` in use (`promotion` on its
    cross-validation by job); with fewer than two jobs there is nothing to validate and it serves."""
    if len(set(training.groups)) < 2:
        return True
    return promotion(cross_validate(make, training).to_dict())[0]


SCALE_FREE_FEATURES = frozenset(
    {f"exposed_{kind}_share" for kind in ("allreduce", "ps", "sharded", "tensor", "pipeline")}
    | {"strategy_groups_per_variable", "strategy_shards_per_variable"}
)

VARIANTS: dict[str, tuple[dict[str, Any], frozenset[str]]] = {
    "monotone": ({"monotone": True}, frozenset()),
    "without_scale_free_features": ({}, SCALE_FREE_FEATURES),
    "weaker_regularisation": ({"min_child_weight": 1.0, "reg_lambda": 1.0}, frozenset()),
    "stronger_regularisation": ({"max_depth": 2, "min_child_weight": 4.0, "reg_lambda": 10.0}, frozenset()),
}
"""(hyper-parameters, features left out) compared against the defaults with `--variants`: the evidence
for the defaults (no monotone constraint, the scale-free features, the regularisation)."""


def targets(curve: list[dict[str, Any]], noise: dict[str, Any]) -> dict[str, Any]:
    at20 = next((row for row in curve if row["train_trials"] == 20), None)
    if at20 is None:
        return {}
    sim, cor = at20["simulator"], at20["corrected"]
    ratio = cor["mape"] / sim["mape"] if sim["mape"] > 0 else math.nan
    return {
        "log_error_ratio_at_20": cor["log_error"] / sim["log_error"] if sim["log_error"] > 0 else math.nan,
        "mape_ratio_at_20": ratio,
        "mape_halved": ratio <= TARGETS["mape_ratio_at_20"],
        "kendall_tau_at_20": cor["kendall_tau"],
        "tau_target_met": cor["kendall_tau"] >= TARGETS["kendall_tau_at_20"],
        "top1_regret_at_20": cor["top1_regret"],
        "regret_target_met": cor["top1_regret"] < TARGETS["top1_regret_at_20"],
        "noise_ceiling": noise.get("one_round_vs_others"),
        "kendall_tau_separable_at_20": {
            "simulator": sim.get("kendall_tau_separable"),
            "corrected": cor.get("kendall_tau_separable"),
        },
    }


# -- low-shot ----------------------------------------------------------------------------------------

LOWSHOT_MODES = {
    "simulator_only": (False, False),
    "cost_model": (True, False),
    "cost_model_refit": (True, True),
}
"""mode: (train on the other jobs' trials first, refit the cost model after each of this job's trials).
Without a refit, the default update scales every prediction by the job's shared measured/predicted bias."""

BASELINE_BUILDERS = frozenset(
    {
        "PS",
        "PSLoadBalancing",
        "PartitionedPS",
        "UnevenPartitionedPS",
        "AllReduce",
        "PartitionedAR",
        "RandomAxisPartitionAR",
        "Parallax",
        "DataParallel",
    }
)


def lowshot(
    records: list[TrainingRecord], names: dict[str, str], budget: int, mode: str, noise: float
) -> dict[str, Any]:
    """Leave one job out: plan its trials with a model of the other jobs; replay its median measurements.

    `noise` is the planner's relative measurement noise (the median round spread): a measurement is
    not trusted closer than that when deciding that the best is clear.
    """
    use_history, refit = LOWSHOT_MODES[mode]
    by_job: dict[str, list[TrainingRecord]] = defaultdict(list)
    for record in records:
        by_job[record.group_id].append(record)
    hits, close, regrets, trials_used, sources = 0, 0, [], [], defaultdict(int)
    per_job = []
    for job, job_records in by_job.items():
        history = [r for r in records if r.group_id != job] if use_history else []
        queries = {str(r.strategy_id): r.model_copy(update={"measured_step_time_s": None}) for r in job_records}
        truth = {str(r.strategy_id): float(r.measured_step_time_s) for r in job_records}  # type: ignore[arg-type]
        baselines = [cid for cid in queries if names.get(cid) in BASELINE_BUILDERS]
        candidates = candidates_from_model(CostModel().fit(history), queries, baselines=baselines, families=names)
        update = CostModelUpdater(history, queries) if refit else SharedBiasUpdater(candidates)
        planner = TrialPlanner(candidates, budget=budget, update=update, measurement_noise=noise)
        answer = run_plan(planner, truth.__getitem__)
        regret = truth[answer.candidate_id] / min(truth.values()) - 1
        hits += regret == 0
        close += regret <= 0.05
        regrets.append(regret)
        trials_used.append(len(planner.trial_order))
        sources[answer.source] += 1
        per_job.append(
            {
                "job": job,
                "trials": [names.get(cid, cid) for cid in planner.trial_order],
                "answer": names.get(answer.candidate_id),
                "fastest": names.get(min(truth, key=truth.__getitem__)),
                "regret": round(regret, 4),
            }
        )
    return {
        "mode": mode,
        "measurement_noise": noise,
        "jobs": len(by_job),
        "budget": budget,
        "answer_is_fastest": hits / len(by_job),
        "random_trials_find_fastest": float(np.mean([min(1.0, budget / len(rs)) for rs in by_job.values()])),
        "answer_within_5pct": close / len(by_job),
        "answer_within_noise": float(np.mean([r <= noise for r in regrets])),
        "mean_regret": float(np.mean(regrets)),
        "max_regret": float(np.max(regrets)),
        "mean_trials_used": float(np.mean(trials_used)),
        "answer_sources": dict(sources),
        "per_job": per_job,
    }


# -- main --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--trials",
        type=Path,
        nargs="*",
        default=[],
        help="JSON Lines of {graph, resources, strategy, result} (plain, .xz or .gz)",
    )
    parser.add_argument(
        "--measure", type=Path, metavar="OUT", help="first measure `--jobs` for real, append to OUT, and use OUT"
    )
    parser.add_argument("--jobs", nargs="*", choices=JOBS, default=list(JOBS), help="jobs for --measure")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds for --measure")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per trial for --measure")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps at least (some zoo models need more)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--seeds", type=int, default=5, help="random draws of the training trials per size")
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument(
        "--truth",
        choices=("median", "load-adjusted"),
        default="median",
        help="a strategy's time: the median over its rounds, or that median with each block's shared load divided out",
    )
    parser.add_argument("--variants", action="store_true", help=f"also the learning curve of {sorted(VARIANTS)}")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.seeds < 1 or args.budget < 1:
        parser.error("--rounds, --steps, --seeds and --budget must be at least 1, --warmup at least 0")
    paths = list(args.trials)
    if args.measure:
        measure(args.measure, args.jobs, rounds=args.rounds, steps=args.steps, warmup=args.warmup, timeout=args.timeout)
        paths.append(args.measure)
    if not paths:
        parser.error("give --trials FILE... or --measure OUT")
    started = time.perf_counter()
    strategies, stats = load_trials(paths)
    if stats["jobs"] < 2:
        raise SystemExit(f"{stats['jobs']} job(s) with a successful trial; cross-validation by job needs 2")
    adjusted = load_adjusted(strategies)
    noise_raw, noise_adjusted = noise_floor(strategies), noise_floor(adjusted)
    noise = noise_raw
    if args.truth == "load-adjusted":
        strategies, noise = adjusted, noise_adjusted
    records = [s.folded() for s in strategies]
    names = {str(r.strategy_id): s.name for s, r in zip(strategies, records, strict=True)}
    curve = learning_curve(records, SIZES, args.seeds, separable=separable_pairs(strategies))
    planner_noise = min(0.5, noise["median_round_spread"] or 0.05)
    result: dict[str, Any] = {
        "benchmark": "cost_model",
        "trials_files": [str(p) for p in paths],
        "data": stats,
        "truth": args.truth,
        "measurement_noise": noise_raw,
        "measurement_noise_load_adjusted": noise_adjusted,
        "within_jobs": job_spread(records),
        "jobs": per_job(strategies),
        "learning_curve": curve,
        "targets": targets(curve, noise),
        "lowshot": [lowshot(records, names, args.budget, mode, planner_noise) for mode in LOWSHOT_MODES],
    }
    if args.variants:
        result["variants"] = {
            label: learning_curve(records, SIZES, args.seeds, params, without, gate=False)
            for label, (params, without) in VARIANTS.items()
        }
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
