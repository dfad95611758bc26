"""How much the learned correction helps, on trials really measured: a learning curve and low-shot answers.

Reads the JSON Lines that `benchmarks/trials.py` writes (one {graph, resources, strategy, result} per
line), simulates every trial's strategy, and reports, cross-validated by job (a job = one graph on one
cluster; its strategies are never split between training and test):

- the learning curve: MAPE, within-job Kendall tau and top-1 regret of the simulator alone and of the
  corrected model trained on 0, 5, 10, 20 and 50 trials of other jobs (averaged over seeds);
- low-shot: for each job, with a budget of 4 trials chosen by `TrialPlanner` (the model trained on
  every other job, refitted after each of this job's trials), how often the answer is the job's
  measured-fastest strategy, and its regret. The trials it "runs" are the recorded measurements.

    python benchmarks/trials.py --out trials.jsonl            # measure first (see that script)
    python benchmarks/cost_model.py --trials trials.jsonl
    python benchmarks/cost_model.py --generate trials.jsonl   # run benchmarks/trials.py, then this
    python benchmarks/cost_model.py --measure comm.jsonl --trials trials.jsonl

`--measure` adds jobs of its own (`COMM_JOBS`: replayed models whose gradients are large next to their
compute, so strategies differ by more than this machine's run-to-run noise), each run for real with
every builder on 2 local ranks. The zoo's small models on one 2-core node make nearly identical
strategies, and the benchmark reports that noise floor beside the scores (`measurement_noise`).

Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.model_selection import GroupKFold

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer_service.lowshot import (
    CostModelUpdater,
    SharedBiasUpdater,
    TrialPlanner,
    candidates_from_model,
    run_plan,
)
from simulator.learned import CostModel, TrainingRecord, build_features, make_record, score
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

SIZES = (0, 5, 10, 20, 50)
TARGETS = {"mape_ratio_at_20": 0.5, "kendall_tau_at_20": 0.9, "top1_regret_at_20": 0.05}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_trials(paths: list[Path]) -> tuple[list[TrainingRecord], dict[str, str], dict[str, Any]]:
    """Records of the successful trials, each strategy's builder (None for searched ones), and counts."""
    import simulator

    lines = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    jobs: dict[tuple[str, str, str], list[tuple[Strategy, float]]] = defaultdict(list)
    documents: dict[tuple[str, str, str], tuple[ModelGraph, ResourceSpec]] = {}
    outcomes: dict[str, int] = defaultdict(int)
    builders: dict[str, str] = {}
    for line in lines:
        result = line["result"]
        outcomes[result["outcome"]] += 1
        if result["outcome"] != "ok" or not result.get("median_s"):
            continue
        graph, resources = ModelGraph.parse(line["graph"]), ResourceSpec.parse(line["resources"])
        strategy = Strategy.parse(line["strategy"])
        # the zoo model and its replay are different programs: two jobs, even on the same graph
        key = (str(graph.id), str(resources.id), str(result.get("workload", "")).split(":")[0])
        documents[key] = (graph, resources)
        jobs[key].append((strategy, float(result["median_s"])))
        if strategy.provenance.builder:
            builders[str(strategy.id)] = strategy.provenance.builder
    records = []
    version = getattr(simulator, "SIMULATOR_VERSION", None)
    for key, trials in jobs.items():
        graph, resources = documents[key]
        predictions = simulator.simulate(graph, resources, [s for s, _ in trials])
        for (strategy, measured), prediction in zip(trials, predictions, strict=True):
            records.append(make_record(graph, resources, strategy, prediction, measured_step_time_s=measured,
                                       group_id=f"{graph.name}-{key[0][:8]}@{resources.name}/{key[2]}",
                                       simulator_version=version, source="benchmarks"))
    stats = {"lines": len(lines), "outcomes": dict(outcomes), "records": len(records), "jobs": len(jobs),
             "strategies_per_job": sorted(len(t) for t in jobs.values())}
    return records, builders, stats


def noise_floor(records: list[TrainingRecord]) -> dict[str, Any]:
    """How far apart two measurements of the very same strategy in the same job are.

    Builders sometimes emit identical strategies (on one server PS and PSLoadBalancing coincide), so
    some strategies were measured twice. No model can predict closer than the measurements agree.
    """
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        times[(r.group_id, str(r.strategy_id))].append(float(r.measured_step_time_s))
    gaps = [abs(a - b) / min(a, b) for t in times.values() if len(t) > 1 for a, b in pairwise(t)]
    return {"repeated_pairs": len(gaps), "mean_relative_gap": float(np.mean(gaps)) if gaps else None,
            "max_relative_gap": float(np.max(gaps)) if gaps else None}


def job_spread(records: list[TrainingRecord]) -> dict[str, float]:
    """Slowest over fastest strategy per job (simulated and measured), and the regret of a random pick:
    the yardsticks for the ranking scores."""
    by_job: dict[str, list[float]] = defaultdict(list)
    measured: dict[str, list[float]] = defaultdict(list)
    for r in records:
        by_job[r.group_id].append(r.simulated_step_time_s)
        measured[r.group_id].append(float(r.measured_step_time_s))
    return {
        "simulated_max_over_min": float(np.mean([max(t) / min(t) for t in by_job.values()])),
        "measured_max_over_min": float(np.mean([max(t) / min(t) for t in measured.values()])),
        "random_pick_regret": float(np.mean([np.mean(t) / min(t) - 1 for t in measured.values()])),
    }


def learning_curve(records: list[TrainingRecord], sizes: tuple[int, ...], seeds: int) -> list[dict[str, Any]]:
    """Out-of-fold scores for each training-set size, sampling that many trials from the other jobs."""
    matrix = build_features(records)
    n_jobs = len(set(matrix.groups))
    folds = list(GroupKFold(n_splits=min(5, n_jobs)).split(matrix.X, groups=matrix.groups))
    simulator_scores = score(matrix.measured_s, matrix.simulated_s, matrix.groups).to_dict()
    curve = []
    for size in sizes:
        per_seed, used = [], []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            predicted = np.empty(len(matrix))
            for train, test in folds:
                chosen = rng.choice(train, size=min(size, len(train)), replace=False)
                used.append(len(chosen))
                model = CostModel(random_state=seed).fit(matrix.take(chosen))
                predicted[test] = model.predict(matrix.take(test))
            per_seed.append(score(matrix.measured_s, predicted, matrix.groups).to_dict())
        corrected = {k: float(np.nanmean([s[k] for s in per_seed])) for k in ("mape", "log_error", "kendall_tau", "top1_regret")}
        curve.append({"train_trials": size, "train_trials_used": float(np.mean(used)),
                      "simulator": {k: simulator_scores[k] for k in corrected}, "corrected": corrected})
        log(f"n={size}: {corrected}")
    return curve


LOWSHOT_MODES = {
    "simulator_only": (False, False),
    "cost_model": (True, False),
    "cost_model_refit": (True, True),
}
"""mode: (train on the other jobs' trials first, refit the cost model after each of this job's trials).
Without a refit, the default update scales every prediction by the job's shared measured/predicted bias."""


def lowshot(records: list[TrainingRecord], builders: dict[str, str], budget: int, mode: str, noise: float) -> dict[str, Any]:
    """Leave one job out: plan its trials with a model of the other jobs; replay its measurements.

    `noise` is the planner's relative measurement noise, estimated from repeated strategies: a
    measurement is not trusted closer than that when deciding that the best is clear.
    """
    use_history, refit = LOWSHOT_MODES[mode]
    by_job: dict[str, list[TrainingRecord]] = defaultdict(list)
    for record in records:
        by_job[record.group_id].append(record)
    hits, close, regrets, trials_used, sources = 0, 0, [], [], defaultdict(int)
    for job, job_records in by_job.items():
        history = [r for r in records if r.group_id != job] if use_history else []
        # builders can emit the same strategy (one server: PS == PSLoadBalancing): one candidate, mean time
        queries = {str(r.strategy_id): r.model_copy(update={"measured_step_time_s": None}) for r in job_records}
        times: dict[str, list[float]] = defaultdict(list)
        for r in job_records:
            times[str(r.strategy_id)].append(float(r.measured_step_time_s))
        truth = {cid: float(np.mean(samples)) for cid, samples in times.items()}
        baselines = [cid for cid in queries if cid in builders]
        candidates = candidates_from_model(CostModel().fit(history), queries, baselines=baselines, families=builders)
        update = CostModelUpdater(history, queries) if refit else SharedBiasUpdater(candidates)
        planner = TrialPlanner(candidates, budget=budget, update=update, measurement_noise=noise)
        answer = run_plan(planner, truth.__getitem__)
        regret = truth[answer.candidate_id] / min(truth.values()) - 1
        hits += regret == 0
        close += regret <= 0.05
        regrets.append(regret)
        trials_used.append(len(planner.trial_order))
        sources[answer.source] += 1
    return {
        "mode": mode,
        "measurement_noise": noise,
        "jobs": len(by_job),
        "budget": budget,
        "answer_is_fastest": hits / len(by_job),
        "answer_within_5pct": close / len(by_job),
        "mean_regret": float(np.mean(regrets)),
        "max_regret": float(np.max(regrets)),
        "mean_trials_used": float(np.mean(trials_used)),
        "answer_sources": dict(sources),
    }


def targets(curve: list[dict[str, Any]]) -> dict[str, Any]:
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
    }


def generate(path: Path, extra: list[str]) -> None:
    """Measure trials with `benchmarks/trials.py` (real runs on this machine), writing `path`."""
    script = Path(__file__).with_name("trials.py")
    if not script.exists():
        raise SystemExit(f"{script} does not exist: measure trials with it, or pass --trials FILE")
    log(f"measuring trials with {script.name} -> {path} (this takes minutes)")
    stdout = subprocess.run([sys.executable, str(script), "--out", str(path), *extra], check=True,
                            stdout=subprocess.PIPE, text=True).stdout
    log(stdout.strip()[-2000:])


COMM_JOBS: dict[str, tuple[int, int, int, int]] = {
    # name: (dense layers, width, batch, embedding rows): where strategies differ by more than the noise
    "mlp-wide": (4, 2048, 8, 0),
    "mlp-deep": (12, 1024, 8, 0),
    "mlp-compute": (4, 1024, 128, 0),
    "embedding": (2, 512, 64, 262_144),
    "mlp-wide-b32": (4, 2048, 32, 0),
    "embedding-small": (2, 256, 256, 65_536),
}


def comm_graph(name: str, layers: int, width: int, batch: int, rows: int) -> ModelGraph:
    """A model whose gradients are large next to its compute, replayed for real by the trial runner."""
    act = float(batch * width * 4)
    graph_layers: list[dict[str, Any]] = []
    variables: list[dict[str, Any]] = []
    if rows:
        variables.append({"name": "embedding.weight", "shape": [rows, width], "sparse": True,
                          "lookups_per_step": batch * 16, "consumer": "embedding"})
        graph_layers.append({"name": "embedding", "kind": "embedding", "bytes_moved": act * 16,
                             "activation_bytes": act, "output_bytes": act, "variables": ["embedding.weight"]})
    for i in range(layers):
        flops = 2.0 * batch * width * width
        variables.append({"name": f"layers.{i}.weight", "shape": [width, width], "consumer": f"layers.{i}"})
        graph_layers.append({"name": f"layers.{i}", "kind": "matmul", "fwd_flops": flops, "bwd_flops": 2 * flops,
                             "bytes_moved": 4.0 * width * width + 2 * act, "activation_bytes": act, "output_bytes": act,
                             "inputs": [graph_layers[-1]["name"]] if graph_layers else [], "variables": [f"layers.{i}.weight"]})
    return ModelGraph.parse({"name": name, "batch_size": batch, "optimizer": {"kind": "sgd", "state_bytes_per_param": 0},
                             "layers": graph_layers, "variables": variables, "provenance": {"source": "benchmarks/cost_model.py"}})


def measure(path: Path, *, steps: int, warmup: int, jobs: tuple[str, ...] = tuple(COMM_JOBS)) -> None:
    """Run every builder on each communication-heavy job, 2 ranks on this machine; append JSON lines."""
    from stratagem.builders import all_builders
    from trial_runner import LocalBackend, ReplayWorkload, run_trial

    resources = ResourceSpec.parse({"name": "local-2cpu", "nodes": [{"address": "127.0.0.1", "chief": True,
                                                                      "cpus": [0, 1], "device": "CPU"}]})
    backend = LocalBackend()
    with path.open("a") as out:
        for name in jobs:
            graph = comm_graph(name, *COMM_JOBS[name])
            for builder in all_builders():
                strategy = builder.build(graph, resources)
                result = run_trial(ReplayWorkload(graph), resources, strategy, warmup=warmup, steps=steps,
                                   timeout=300.0, backend=backend, threads_per_rank=1)
                out.write(json.dumps({"graph": graph.model_dump(mode="json"), "resources": resources.model_dump(mode="json"),
                                      "strategy": strategy.model_dump(mode="json"),
                                      "result": result.model_dump(mode="json")}) + "\n")
                out.flush()
                log(f"{name:12s} {builder.name:22s} {result.outcome.value} {result.median_s}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=Path, nargs="*", default=[], help="JSON Lines written by benchmarks/trials.py --out")
    parser.add_argument("--generate", type=Path, metavar="OUT", help="run benchmarks/trials.py --out OUT first, and use OUT")
    parser.add_argument("--generate-args", default="", help="extra arguments for benchmarks/trials.py, e.g. '--quick'")
    parser.add_argument("--measure", type=Path, metavar="OUT",
                        help="first measure the communication-heavy jobs (COMM_JOBS x every builder), append to OUT, and use OUT")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per trial for --measure")
    parser.add_argument("--seeds", type=int, default=5, help="random draws of the training trials per size")
    parser.add_argument("--budget", type=int, default=4)
    args = parser.parse_args(argv)
    paths = list(args.trials)
    if args.generate:
        generate(args.generate, args.generate_args.split())
        paths.append(args.generate)
    if args.measure:
        measure(args.measure, steps=args.steps, warmup=3)
        paths.append(args.measure)
    if not paths:
        parser.error("give --trials FILE..., --generate OUT or --measure OUT")
    started = time.perf_counter()
    records, builders, stats = load_trials(paths)
    if stats["jobs"] < 2:
        raise SystemExit(f"{stats['jobs']} job(s) with a successful trial; cross-validation by job needs 2")
    curve = learning_curve(records, SIZES, args.seeds)
    noise = noise_floor(records)
    planner_noise = min(0.5, noise["mean_relative_gap"]) if noise["mean_relative_gap"] is not None else 0.05
    result = {
        "benchmark": "cost_model",
        "trials_files": [str(p) for p in paths],
        "data": stats,
        "measurement_noise": noise,
        "within_jobs": job_spread(records),
        "learning_curve": curve,
        "targets": targets(curve),
        "lowshot": [lowshot(records, builders, args.budget, mode, planner_noise) for mode in LOWSHOT_MODES],
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
