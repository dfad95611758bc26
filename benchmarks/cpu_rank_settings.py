"""What four CPU-side choices of the runtime buy, each measured side by side in one run.

1. Top-k selection: `torch.topk` over a whole bucket against the runtime's `select_largest` (a
   sampled threshold, then `topk` among about 1.3·k candidates), on the same magnitudes, in turns.
2. The allocator settings ranks start with (`stratagem.rank_env`): the same per-step bucket work
   (the fp32 all-reduce bucket's flatten/divide/unflatten, the fp16 compressor's, and an Adam step
   over the bucket's parameters) timed in child processes started with and without them, in
   alternating rounds, so a change of the machine's load touches both alike.
3. PowerSGD's products: the textbook order (P = MQ with Q stored cols x r, Q' = MᵀP) against the
   runtime's (Q stored transposed, P = M(Qᵀ)ᵀ, Q'ᵀ = PᵀM): the same numbers, in turns, on the matrix
   shapes of the accuracy benchmark's BERT and VGG.
4. With `--block-jobs`, no mappings of their own for large requests (`MALLOC_MMAP_MAX_=0`): every
   strategy of the named cost-model jobs (`benchmarks/cost_model.py`) trained in interleaved blocks
   (`benchmarks.lib.interleaved`) by ranks started with and without it, in alternating order. The
   requests that cross glibc's 32 MiB threshold come from gloo's worker thread inside a step, which
   comparison 2's children never run. `--strategies` keeps only the named strategies in each block
   (one alone is what a trial runs; with all of them, their buffers share one heap);
   `--setting LABEL:NAME=VALUE` adds a setting to compare (the tuned settings plus those variables).

Prints one JSON object: the medians in ms and the speed-ups (default over tuned).

    python -m benchmarks.cpu_rank_settings [--bucket-mb 24] [--rounds 4] [--repeats 9]
    python -m benchmarks.cpu_rank_settings --block-jobs mlp-wide,vgg16-wide-fc,mlp-deep --rounds 2
    python -m benchmarks.cpu_rank_settings --block-jobs mlp-wide --strategies Sharded --setting arena1:MALLOC_ARENA_MAX=1
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.system import ROOT, module_command
from stratagem.rank_env import MALLOC_SETTINGS, rank_environment


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return 1e3 * statistics.median(samples)


def selection(entries: int, ratio: float, repeats: int) -> dict[str, Any]:
    import torch

    from stratagem.runtime.compression import select_largest

    torch.set_num_threads(1)
    magnitudes = torch.randn(entries, generator=torch.Generator().manual_seed(0)).abs()
    k = int(ratio * entries)
    full, sampled = [], []
    for _ in range(repeats):
        full.append(_median_ms(lambda: magnitudes.topk(k, sorted=False), 1))
        sampled.append(_median_ms(lambda: select_largest(magnitudes, k), 1))
    torch_ms, runtime_ms = statistics.median(full), statistics.median(sampled)
    return {
        "entries": entries,
        "k": k,
        "torch_topk_ms": round(torch_ms, 2),
        "select_largest_ms": round(runtime_ms, 2),
        "speedup": round(torch_ms / runtime_ms, 2),
    }


POWERSGD_SHAPES: dict[str, list[tuple[int, int]]] = {
    "bert": [(8192, 256)] + [(768, 256), (256, 256), (1024, 256), (256, 1024)] * 4,
    "vgg_classifier": [(2048, 2048), (2048, 512)],
}
"""The (rows, cols) matrices PowerSGD compresses in the accuracy benchmark's BERT (word embedding, then
per block qkv, output, MLP up and down) and VGG (its classifier)."""


def textbook_products(ms: list[Any], qs: list[Any]) -> list[Any]:
    """Q' = Mᵀ(MQ) per matrix (P left unorthogonalized: the products are what is timed)."""
    return [m.T @ (m @ q) for m, q in zip(ms, qs, strict=True)]


def runtime_products(ms: list[Any], qts: list[Any]) -> list[Any]:
    """Q'ᵀ = (M(Qᵀ)ᵀ)ᵀM per matrix: the runtime's layouts."""
    return [(m @ qt.T).T @ m for m, qt in zip(ms, qts, strict=True)]


def powersgd_products(repeats: int, rank: int = 4) -> dict[str, Any]:
    """Milliseconds of the two products per step, textbook order against the runtime's, per model."""
    import torch

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for model, shapes in POWERSGD_SHAPES.items():
        ms = [torch.randn(rows, cols) for rows, cols in shapes]
        qs = [torch.randn(cols, rank) for _, cols in shapes]
        qts = [q.T.contiguous() for q in qs]
        samples: dict[str, list[float]] = {"textbook_ms": [], "runtime_ms": []}
        for _ in range(repeats):
            samples["textbook_ms"].append(_median_ms(functools.partial(textbook_products, ms, qs), 1))
            samples["runtime_ms"].append(_median_ms(functools.partial(runtime_products, ms, qts), 1))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        out[model] = {
            **{name: round(value, 2) for name, value in medians.items()},
            "gradient_mb": round(sum(m.nbytes for m in ms) / 2**20, 1),
            "speedup": round(medians["textbook_ms"] / medians["runtime_ms"], 2),
        }
    return out


def bucket_work(bucket_mb: float, repeats: int) -> dict[str, float]:
    """One process's medians of the per-step work on a bucket of `bucket_mb` (a BERT-like mix of tensors)."""
    import torch

    from stratagem.runtime.comm import Team
    from stratagem.runtime.compression import CastReducer

    torch.set_num_threads(1)
    rows = max(1, int(bucket_mb * 2**20 / 4 / 256 / 24))
    params = [torch.nn.Parameter(torch.randn(rows, 256)) for _ in range(24)]
    for p in params:
        p.grad = torch.randn_like(p)
    solo = Team([0], [0], None)
    adam = torch.optim.Adam(params)
    out = {}
    for name, dtype in (("fp32_bucket_ms", None), ("fp16_bucket_ms", torch.float16)):
        reducer = CastReducer(solo, wire_dtype=dtype, error_feedback=True)
        grads = [p.grad for p in params]
        out[name] = _median_ms(lambda r=reducer, g=grads: (r.start(g), r.finish()), repeats)
    out["adam_step_ms"] = _median_ms(adam.step, repeats)
    return out


def _child(env: dict[str, str], bucket_mb: float, repeats: int) -> dict[str, float]:
    done = subprocess.run(
        module_command("benchmarks.cpu_rank_settings", "--child", str(bucket_mb), str(repeats)),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def allocator(bucket_mb: float, rounds: int, repeats: int) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if k not in MALLOC_SETTINGS}
    tuned_env = rank_environment(base, OMP_NUM_THREADS="1")
    default_env = {**base, "OMP_NUM_THREADS": "1"}
    runs: dict[str, list[dict[str, float]]] = {"default": [], "tuned": []}
    for _ in range(rounds):
        runs["default"].append(_child(default_env, bucket_mb, repeats))
        runs["tuned"].append(_child(tuned_env, bucket_mb, repeats))
    medians = {
        label: {k: round(statistics.median(r[k] for r in results), 2) for k in results[0]}
        for label, results in runs.items()
    }
    return {
        "bucket_mb": bucket_mb,
        "settings": MALLOC_SETTINGS,
        **medians,
        "speedup": {k: round(medians["default"][k] / medians["tuned"][k], 2) for k in medians["default"]},
    }


GLIBC_MMAP_MAX = "65536"
"""glibc's own `MALLOC_MMAP_MAX_`: what ranks started with before `stratagem.rank_env` set it to 0."""


@dataclass
class BlockJob:
    """A job measured in blocks: its graph, the trial runner's workload and the strategies side by side."""

    graph: Any
    workload: Any
    strategies: dict[str, Any]
    warmup: int = 4


def _block_medians(job: BlockJob, *, steps: int, extra_env: dict[str, str]) -> dict[str, dict[str, float]]:
    """One interleaved block under `extra_env`: each strategy's measured and simulated step in ms."""
    import simulator
    from benchmarks.lib.interleaved import measure_block

    block = measure_block(job.workload, job.strategies, warmup=job.warmup, steps=steps, timeout=900, env=extra_env)
    if block.resources is None:
        raise RuntimeError(f"the block failed: {block.failure}")
    placed = [s.replace(resources_id=block.resources.id) for s in job.strategies.values()]
    predictions = simulator.simulate(job.graph, block.resources, placed)
    return {
        name: {
            "measured_ms": 1e3 * block.result(name, strategy)["median_s"],
            "simulated_ms": 1e3 * prediction.step_time_s,
        }
        for (name, strategy), prediction in zip(job.strategies.items(), predictions, strict=True)
    }


BASE_SETTINGS: dict[str, dict[str, str]] = {"mapped": {"MALLOC_MMAP_MAX_": GLIBC_MMAP_MAX}, "tuned": {}}
"""Comparison 4's two settings: ranks that may map large buffers afresh (`mapped`), and ranks with
Stratagem's settings (`tuned`)."""


def mappings_in_blocks(
    jobs: dict[str, BlockJob], *, rounds: int, steps: int, extra_settings: dict[str, dict[str, str]] | None = None
) -> dict[str, Any]:
    """Per job and strategy: the median over rounds of its measured and simulated step under each
    setting, and each setting's speed-up over mapped (ranks rotate through the settings, the order
    reversed every other round)."""
    clashing = sorted(set(BASE_SETTINGS) & set(extra_settings or {}))
    if clashing:
        raise ValueError(f"extra settings: {clashing} would replace comparison 4's own; choose other labels")
    settings = {**BASE_SETTINGS, **(extra_settings or {})}
    runs: dict[str, dict[str, list[dict[str, dict[str, float]]]]] = {
        job: {label: [] for label in settings} for job in jobs
    }
    for round_index in range(rounds):
        order = list(settings.items()) if round_index % 2 == 0 else list(settings.items())[::-1]
        for name, job in jobs.items():
            for label, extra in order:
                runs[name][label].append(_block_medians(job, steps=steps, extra_env=extra))
    report: dict[str, Any] = {}
    for job, per_setting in runs.items():
        report[job] = {}
        for name in jobs[job].strategies:
            figures = {
                label: {
                    key: round(statistics.median(block[name][key] for block in blocks), 1)
                    for key in ("measured_ms", "simulated_ms")
                }
                for label, blocks in per_setting.items()
            }
            mapped = figures["mapped"]["measured_ms"]
            speedups = {label: round(mapped / f["measured_ms"], 2) for label, f in figures.items() if label != "mapped"}
            report[job][name] = {**figures, "speedups": speedups}
    return {"settings": settings, "rounds": rounds, "steps": steps, "jobs": report}


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    """`LABEL:NAME=VALUE[,NAME=VALUE]` (the variables are added to the tuned settings)."""
    label, sep, assignments = text.partition(":")
    pairs = [item.partition("=") for item in assignments.split(",") if item]
    if not sep or not label or any(not name or not eq for name, eq, _ in pairs):
        raise argparse.ArgumentTypeError(f"--setting {text!r}: expected LABEL:NAME=VALUE[,NAME=VALUE]")
    return label, {name: value for name, _, value in pairs}


def _cost_model_jobs(names: list[str], only: list[str]) -> dict[str, BlockJob]:
    from benchmarks.lib.cases import job_workload, placeholder_spec, strategies_for

    jobs = {}
    for name in names:
        work = job_workload(name)
        strategies = strategies_for(work.graph, placeholder_spec())
        if only:
            unknown = sorted(set(only) - set(strategies))
            if unknown:
                raise SystemExit(f"--strategies: {unknown} not among {sorted(strategies)}")
            strategies = {key: strategies[key] for key in only}
        jobs[name] = BlockJob(work.graph, work.spec, strategies, max(4, work.warmup))
    return jobs


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(bucket_work(float(sys.argv[2]), int(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--bucket-mb", type=float, default=24.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--block-jobs", default="", help="comma-separated cost-model jobs: measure comparison 4 only")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per block (comparison 4)")
    parser.add_argument(
        "--strategies", default="", help="comma-separated strategy names: only these in each block (comparison 4)"
    )
    parser.add_argument(
        "--setting",
        type=parse_setting,
        action="append",
        default=[],
        help="LABEL:NAME=VALUE[,NAME=VALUE]: one more setting beside mapped and tuned (comparison 4)",
    )
    args = parser.parse_args()
    if args.block_jobs:
        jobs = _cost_model_jobs(
            [n for n in args.block_jobs.split(",") if n], [n for n in args.strategies.split(",") if n]
        )
        blocks = mappings_in_blocks(jobs, rounds=args.rounds, steps=args.steps, extra_settings=dict(args.setting))
        report = {"benchmark": "cpu_rank_settings", "mappings_in_blocks": blocks}
        print(json.dumps(report, indent=2))
        return
    report = {
        "benchmark": "cpu_rank_settings",
        "selection": selection(int(args.bucket_mb * 2**20 / 4), 0.01, args.repeats),
        "allocator": allocator(args.bucket_mb, args.rounds, args.repeats),
        "powersgd_products": powersgd_products(args.repeats),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
