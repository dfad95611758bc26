"""The cost-model benchmark's analysis: trials folded into one record per (job, strategy), the noise
floor of the measurements, the learning curve of the correction, and low-shot replays.

A job is one graph run one way (zoo model or replay); its strategies are never split between
training and test (GroupKFold by job). Scores come from `simulator.metrics` through
`simulator.learned.score`.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import GroupKFold

from benchmarks.lib.records import read_lines, strategy_name, trial_documents
from benchmarks.lib.scoring import load_factors
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
from simulator.metrics import kendall_tau_on_pairs, kendall_tau_within_groups, mape, top1_regret
from stratagem.builders import BUILDERS
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

SIZES = (0, 5, 10, 20, 50)
"""Training-set sizes of the learning curve (trials drawn from the other jobs)."""
TARGETS = {"mape_ratio_at_20": 0.5, "kendall_tau_at_20": 0.9, "top1_regret_at_20": 0.05}
"""At 20 training trials: MAPE halved against the simulator alone, tau within jobs 0.9, regret under 5%."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
    """The same trials with each block's shared load divided out (`scoring.load_factors`).

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
    one graph run one way, whatever file its rounds came from."""
    zoo = (graph.provenance or {}).get("zoo") or {}
    kind = str(line["result"].get("workload", "")).split(":")[0]
    return f"{line.get('job') or zoo.get('name') or graph.name}-{str(graph.id)[:8]}/{kind}"


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
                "mape": mape(measured=rest_a, predicted=one_a),
                "kendall_tau": kendall_tau_within_groups(measured=rest_a, predicted=one_a, groups=groups),
                "top1_regret": top1_regret(measured=rest_a, predicted=one_a, groups=groups),
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
        scores = score(measured=matrix.measured_s, predicted=predicted, groups=matrix.groups).to_dict()
        if separable:
            scores["kendall_tau_separable"] = kendall_tau_on_pairs(
                measured=matrix.measured_s, predicted=predicted, pairs=separable
            )
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

BASELINE_BUILDERS = frozenset(BUILDERS)
"""Candidates named after a registered builder are baselines: a low-shot plan measures one of them early."""


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
