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

    python -m benchmarks.cost_model --measure /tmp/stratagem-bench/cost-jobs.jsonl --jobs mlp-wide embedding
    python -m benchmarks.cost_model --trials /tmp/stratagem-bench/accuracy.jsonl /tmp/stratagem-bench/cost-*.jsonl

`--measure` runs jobs of its own (`JOBS`: zoo models at sizes where synchronization is a real share of
the step, and replayed models whose gradients are large next to their compute) in `--rounds` rounds.
In each round every job is one block: all its strategies trained side by side by one pair of gloo
ranks, one step of each in turn, with `stratagem.calibrate`'s probes between the timed steps (the
interleaved protocol of `benchmarks.lib.interleaved`), so every strategy sees the same load and
the block's spec describes the machine its steps ran on. Never run it beside another real-trial
benchmark on the same cores.

Prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.cases import JOBS, job_workload, placeholder_spec, strategies_for
from benchmarks.lib.interleaved import measure_block
from benchmarks.lib.learned import (
    LOWSHOT_MODES,
    SIZES,
    VARIANTS,
    job_spread,
    learning_curve,
    load_adjusted,
    load_trials,
    log,
    lowshot,
    noise_floor,
    per_job,
    separable_pairs,
    targets,
)
from benchmarks.lib.records import record_line


def measure(path: Path, jobs: list[str], *, rounds: int, steps: int, warmup: int, timeout: float) -> None:
    """Interleaved rounds: in each, every job's strategies are measured side by side in one block."""
    workloads = {name: job_workload(name) for name in jobs}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for round_index in range(rounds):
            for name in jobs:
                work = workloads[name]
                chosen = strategies_for(work.graph, placeholder_spec())
                block = measure_block(work.spec, chosen, warmup=max(warmup, work.warmup), steps=steps, timeout=timeout)
                resources = block.resources
                if resources is None:
                    log(f"round {round_index + 1} {name}: the block failed: {block.failure}")
                    continue
                for label, strategy in chosen.items():
                    strategy = strategy.replace(resources_id=resources.id)
                    result = block.result(label, strategy)
                    out.write(
                        record_line(work.graph, resources, strategy, result, job=name, round=round_index + 1) + "\n"
                    )
                    shown = f"{result['median_s'] * 1e3:8.1f} ms" if result["median_s"] else result["outcome"]
                    log(f"round {round_index + 1} {name:16s} {label:20s} {shown}")
                out.flush()


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
