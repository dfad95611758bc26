"""The accuracy benchmark's scores: how far the simulator's step times are from measured ones, and how
well it orders one model's strategies, judged against how well the measurements agree with themselves.

MAPE and Kendall tau come from `simulator.metrics`. Beside them: the noise of the rounds (split-half
tau), the pairs whose measured order the rounds establish (`resolved_pairs`, a sign test), the pairs
the simulator orders against the measurement (`discordant_pairs`), a truth with each block's shared
load divided out (`load_adjusted`), ablations of the calibrated CPU figures, and pools of several
runs' printed reports.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from benchmarks.lib.records import Measured, Trial
from simulator.metrics import kendall_tau, mape
from stratagem.ir import ResourceSpec

TARGETS = {"mape": 0.20, "kendall_tau": 0.80}
"""MAPE at most 20% and a mean within-model Kendall tau of at least 0.8."""


def scores(pairs: list[Measured]) -> dict[str, Any]:
    """MAPE and Kendall tau over the pairs that were measured and predicted."""
    done = [p for p in pairs if p.measured is not None and p.predicted is not None]
    measured = [p.measured for p in done]
    predicted = [p.predicted for p in done]
    return {
        "n": len(done),
        "mape": _round(mape(measured=measured, predicted=predicted)),
        "kendall_tau": _round(kendall_tau(measured=measured, predicted=predicted)),
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
        tau = kendall_tau(
            measured=[p.ok[0].median_s for p in members],  # type: ignore[misc]
            predicted=[p.ok[1].median_s for p in members],  # type: ignore[misc]
        )
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
    """The same trials with each block's shared load divided out (`load_factors`): a
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
        measured=[statistics.median(r[:count:2]) for r in rounds],
        predicted=[statistics.median(r[1:count:2]) for r in rounds],
    )
    return None if math.isnan(tau) else tau


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


def load_factors(times: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per block, the factor by which the machine's load moved every step time in it.

    `times` maps each strategy of one job to its step time per block (one block per round). A block's
    factor is the geometric mean over the strategies measured in every block, divided by the median of
    those means, so dividing a block's times by it judges the job's order without the load's drift
    between rounds, at the job's typical level. Empty when fewer than two blocks or no strategy
    measured in all of them.
    """
    blocks = {block for per_block in times.values() for block in per_block}
    complete = [per_block for per_block in times.values() if set(per_block) == blocks]
    if len(blocks) < 2 or not complete:
        return {}
    means = {block: math.exp(statistics.mean(math.log(per_block[block]) for per_block in complete)) for block in blocks}
    scale = statistics.median(means.values())
    return {block: mean / scale for block, mean in means.items()}


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
    "full_select_efficiency",
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
    "stream_efficiency as elementwise (compression's plain passes at an activation's rate)": {
        "stream_efficiency": None
    },
    "cast, select and lowrank efficiency as elementwise": {
        "cast_efficiency": None,
        "select_efficiency": None,
        "full_select_efficiency": None,
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


def ablation(pairs: list[Measured]) -> dict[str, dict[str, Any]]:
    """The scores with each refinement switched off, on the same trials and calibrations."""
    out = {}
    for label, change in ABLATIONS.items():
        variant = with_specs(pairs, _device_change(change))
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


def optimizer_primed(pairs: list[Measured]) -> bool | str:
    """The trials' protocol: whether each timed its steps over filled optimizer state ("mixed" if some did)."""
    values = {trial.optimizer_primed for pair in pairs for trial in pair.trials}
    return values.pop() if len(values) == 1 else "mixed"


def pair_summary(pair: Measured) -> dict[str, Any]:
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


# -- pools of printed reports --------------------------------------------------------------------------


def pooled_rounds(reports: list[dict[str, Any]]) -> Rounds:
    """Per model and strategy, every round's measured median and prediction (ms), over all reports."""
    rounds: Rounds = defaultdict(dict)
    for report in reports:
        for pair in report["pairs"]:
            measured, predicted = rounds[pair["model"]].setdefault(pair["strategy"], ([], []))
            measured.extend(pair["round_medians_ms"])
            predicted.extend(pair["round_predicted_ms"])
    return rounds


def pooled_scores(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE and within-model Kendall tau of the pooled medians, as `accuracy_report` computes them."""
    models: dict[str, dict[str, Any]] = {}
    all_measured: list[float] = []
    all_predicted: list[float] = []
    for model, strategies in pooled_rounds(reports).items():
        done = [(statistics.median(m), statistics.median(p)) for m, p in strategies.values() if m and p]
        measured, predicted = [m for m, _ in done], [p for _, p in done]
        models[model] = {
            "n": len(done),
            "mape": round(mape(measured=measured, predicted=predicted), 4),
            "kendall_tau": round(kendall_tau(measured=measured, predicted=predicted), 4),
            "rounds": min(len(m) for m, _ in strategies.values()),
        }
        all_measured += measured
        all_predicted += predicted
    within = statistics.mean(s["kendall_tau"] for s in models.values())
    overall = {
        "n": len(all_measured),
        "mape": round(mape(measured=all_measured, predicted=all_predicted), 4),
        "kendall_tau_within": round(within, 4),
    }
    overall["meets_targets"] = overall["mape"] <= TARGETS["mape"] and within >= TARGETS["kendall_tau"]
    return {"overall": overall, "models": models}


def pooled_split_half_tau(reports: list[dict[str, Any]]) -> float:
    """Mean within models of `split_half_of` over the pooled rounds."""
    halves = [split_half_of([m for m, _ in strategies.values()]) for strategies in pooled_rounds(reports).values()]
    taus = [t for t in halves if t is not None]
    return round(statistics.mean(taus), 4) if taus else float("nan")
