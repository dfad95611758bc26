"""Simulator accuracy on this machine: real 2-rank gloo training steps against the calibrated simulator.

1. every zoo model in `--models` is captured at a size where a step takes tens to hundreds of
   milliseconds and synchronization is a real share of it;
2. each model gets the strategies that execute differently on one node (`strategies_for`): PS,
   AllReduce, DataParallel, Parallax (sparse models), one all-reduce per variable, fp16 / PowerSGD /
   top-k compression, ZeRO-style sharding; builders that coincide there (`SAME_ON_ONE_NODE`) only with
   `--all-builders`;
3. in each of `--rounds` rounds, for each model, one interleaved block (`--mode interleaved`, the
   default, `benchmarks.lib.interleaved`): one pair of gloo ranks trains a model copy per strategy
   plus an undistributed copy, one step of each in turn (order rotated every step), and runs the
   calibration's probes after every timed round of steps, so the spec describes the machine those
   very steps ran on. `--mode trials` instead runs one trial-runner trial per strategy after a
   separate calibration;
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
order the rounds establish (`resolved_pairs`), each strategy's measured and predicted step time with
its predicted breakdown beside the runtime's own timings of the step, and the calibration figures;
with `--ablation`, the scores with each CPU refinement reset to its default. Every strategy-round is also written as one JSON line {graph, resources, strategy,
result} to `--out` (the format of `benchmarks/trials.py`), for the cost-model benchmark.
`--from-records` re-scores such files, plain or compressed (`.xz`, `.gz`), without measuring anything
(several files pool their rounds), so any simulator can be judged on the same measurements.

    python -m benchmarks.simulator_accuracy [--quick] [--models bert_large vgg16 dlrm] [--steps 16]
        [--rounds 3] [--mode interleaved|trials] [--calibrate block|once] [--all-builders] [--ablation]
        [--out /tmp/stratagem-bench/accuracy.jsonl] [--from-records FILE ...] [--priority 15]

The process lowers its niceness by `--priority` (default 15) when allowed; its calibrations and
ranks inherit it, so neighbours' processes disturb them less (they still share the cores' caches,
memory bandwidth and hyper-threads). The output says what niceness it ran at.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.cases import (
    CASES,
    DEFAULT_MODELS,
    QUICK_MODELS,
    QUICK_STRATEGIES,
    SAME_ON_ONE_NODE,
    build_graph,
    strategies_for,
)
from benchmarks.lib.interleaved import measure_block
from benchmarks.lib.records import Measured, read_records, record_line, trial_from_result
from benchmarks.lib.scoring import (
    TARGETS,
    ablation,
    accuracy_report,
    compute_check,
    discordant_pairs,
    load_adjusted_report,
    measured_rounds,
    noise_report,
    optimizer_primed,
    pair_summary,
    predict,
    resolved_pairs,
)
from benchmarks.lib.system import lower_niceness
from stratagem.calibrate import DEVICE_KIND
from stratagem.ir import ResourceSpec, Strategy

DEFAULT_OUT = "/tmp/stratagem-bench/accuracy.jsonl"


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
                trial = trial_from_result(resources, chosen[name], result)
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
    """Every strategy of one model in one interleaved block (`benchmarks.lib.interleaved`), beside an
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


def main() -> None:
    args = _arguments()
    started = time.perf_counter()
    calibrations: list[dict[str, Any]] = []
    niceness = None
    if args.from_records:
        pairs = read_records(*(Path(p) for p in args.from_records))
    else:
        niceness = lower_niceness(args.priority)
        models = args.models or list(QUICK_MODELS if args.quick else DEFAULT_MODELS)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as out:
            pairs, calibrations = measure(models, args, out)
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
        "pairs": [pair_summary(p) for p in pairs],
        "calibrations": calibrations,
        "settings": {
            "rounds": args.rounds,
            "steps": args.steps,
            "warmup": args.warmup,
            "calibrate": args.calibrate,
            "niceness": niceness,
            "records": args.from_records or [args.out],
            "threads_per_rank": 1,
            "ranks": 2,
            "optimizer_primed": optimizer_primed(pairs),
        },
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))


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
    parser.add_argument(
        "--from-records",
        nargs="+",
        metavar="FILE",
        help="score these records files (plain, .xz or .gz) instead of measuring",
    )
    parser.add_argument("--ablation", action="store_true", help="also score with each CPU refinement switched off")
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
        help="time steps from an empty optimizer state (default: primed, as long training has it)",
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
