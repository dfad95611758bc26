"""Trials: the replay of a captured operator trace against the real model, side by side, on 2 CPU ranks.

Three sections, one JSON object:

- `step_time`: every zoo model at its test size, Hugging Face GPT-2, Llama and T5 from small configs
  and ResNet-18 (`benchmarks/trial_models.py`), each under DataParallel, AllReduce and PS. One 2-rank
  gloo job per model: each rank holds the real model and its replay (`trial_runner.replay`, built from
  the graph and trace the parent captured), each distributed under the strategy, and alternates their
  steps (real-replay, then replay-real), so both meet the same load on this shared machine. A step
  counts as long as its slowest rank took. The ratio is the median over step pairs of replay step /
  real step (adjacent steps share the machine's load of the moment; the ratio of the two medians is
  reported too). Target: in [0.85, 1.18].
- `memory`: per model, the real model and the replay each alone in a fresh 2-rank DataParallel job;
  the resident high-water mark (VmHWM, reset just before the model is built) above the resident set
  at that moment (after imports, torch's lazily loaded compiler stack included, and for the replay
  after reading the trace), the larger rank. Target: within 15%.
- `capture`: a LLaMA-7B-like decoder (zoo `gpt`, size `7b`, on meta) captured without and with the
  trace, alternately: wall and CPU seconds, and the trace's gzip-compressed bytes. Targets: the
  trace adds under 2x (CPU time, which the machine's other load moves least) and weighs under 10 MB.

    python benchmarks/trials.py [--quick] [--models gpt hf_llama] [--sections step_time memory capture]

One thread per rank, fixed seeds (model init, per-rank per-step batches).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ZOO_BATCH = {"resnet50": 16, "vgg16": 16, "bert_large": 8, "gpt": 8, "dlrm": 64}
OTHER_BATCH = {"hf_gpt2": 8, "hf_llama": 8, "hf_t5": 8, "resnet18": 8}
OPTIMIZER = {"dlrm": "adagrad"}
"""Adam cannot apply DLRM's sparse embedding gradients; Adagrad is what DLRM is usually trained with."""
BUILDERS = ("DataParallel", "AllReduce", "PS")
QUICK_MODELS = ("gpt", "dlrm", "hf_gpt2")
STEP_TIME_RANGE = (0.85, 1.18)
MEMORY_TOLERANCE = 0.15
CAPTURE_RATIO_LIMIT, TRACE_BYTES_LIMIT = 2.0, 10_000_000


def main() -> None:
    args = _arguments()
    if args.worker is not None:
        _worker(Path(args.worker))
        return
    models = args.models or (QUICK_MODELS if args.quick else (*ZOO_BATCH, *OTHER_BATCH))
    started = time.perf_counter()
    report: dict[str, Any] = {"benchmark": "trials", "ranks": 2, "threads_per_rank": 1, "models": list(models)}
    if "step_time" in args.sections:
        report["step_time"] = _step_time(models, args)
    if "memory" in args.sections:
        report["memory"] = _memory(models, args)
    if "capture" in args.sections:
        report["capture"] = _capture_cost(rounds=2 if args.quick else 3)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_MODELS}")
    parser.add_argument("--models", nargs="*", choices=(*ZOO_BATCH, *OTHER_BATCH))
    parser.add_argument("--sections", nargs="*", default=["step_time", "memory", "capture"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


# -- the parent: capture, launch, compare --------------------------------------------------------------


def _real_model(name: str) -> tuple[Any, Callable[[int], Any], Callable[[Any], Any]]:
    """(model, make_batch, loss of the output), seeded so every rank builds the same model."""
    import torch

    torch.manual_seed(0)
    if name in ZOO_BATCH:
        from stratagem import zoo
        from trial_runner.build import output_loss

        model, make_batch = zoo.build(name, "small")
        return model, make_batch, output_loss
    from trial_models import OTHER_MODELS

    return OTHER_MODELS[name]()


def _capture(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from stratagem.tracing import capture

    model, make_batch, loss = _real_model(name)
    batch = ZOO_BATCH.get(name) or OTHER_BATCH[name]
    graph = capture(model, make_batch(batch), batch_size=batch, optimizer=OPTIMIZER.get(name, "adam"), loss_fn=loss)
    return graph.model_dump(mode="json"), graph.trace.model_dump(mode="json")


def _strategies(graph_json: dict[str, Any], builders: tuple[str, ...]) -> dict[str, Any]:
    from stratagem.builders import all_builders
    from stratagem.ir import ModelGraph, Node, ResourceSpec

    graph = ModelGraph.parse(graph_json)
    resources = ResourceSpec(
        name="local-2cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")]
    )
    return {b.name: b.build(graph, resources).model_dump(mode="json") for b in all_builders() if b.name in builders}


def _step_time(models: tuple[str, ...], args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for name in models:
        graph, trace = _capture(name)
        job = {"model": name, "mode": "step_time", "steps": args.steps, "warmup": args.warmup}
        results = _launch({**job, "graph": graph, "trace": trace, "strategies": _strategies(graph, BUILDERS)}, args)
        for builder in BUILDERS:
            if "error" in results:
                rows.append({"model": name, "builder": builder, "error": results["error"]})
                continue
            real, replay = results[builder]["real"], results[builder]["replay"]
            ratio = statistics.median(b / a for a, b in zip(real, replay, strict=True))
            rows.append(
                {
                    "model": name,
                    "builder": builder,
                    "real_median_ms": round(statistics.median(real) * 1e3, 3),
                    "replay_median_ms": round(statistics.median(replay) * 1e3, 3),
                    "replay_over_real": round(ratio, 3),
                    "ratio_of_medians": round(statistics.median(replay) / statistics.median(real), 3),
                    "within_target": STEP_TIME_RANGE[0] <= ratio <= STEP_TIME_RANGE[1],
                    "notes": results.get("notes") or None,
                }
            )
            print(f"{name:10s} {builder:14s} {_row_text(rows[-1])}", file=sys.stderr, flush=True)
    ratios = [r["replay_over_real"] for r in rows if "replay_over_real" in r]
    return {
        "target": list(STEP_TIME_RANGE),
        "pairs": len(rows),
        "within_target": sum(1 for r in rows if r.get("within_target")),
        "geometric_mean": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 3) if ratios else None,
        "min": min(ratios, default=None),
        "max": max(ratios, default=None),
        "rows": rows,
    }


def _row_text(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"error: {row['error'][:200]}"
    return f"real {row['real_median_ms']:8.2f} ms  replay {row['replay_median_ms']:8.2f} ms  ratio {row['replay_over_real']}"


def _memory(models: tuple[str, ...], args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for name in models:
        graph, trace = _capture(name)
        strategies = _strategies(graph, ("DataParallel",))
        peaks = {}
        for kind in ("real", "replay"):
            job = {"model": name, "mode": kind, "steps": 5, "warmup": 2, "graph": graph, "trace": trace}
            result = _launch({**job, "strategies": strategies}, args)
            peaks[kind] = result.get("model_peak_bytes")
        if peaks["real"] and peaks["replay"]:
            ratio = peaks["replay"] / peaks["real"]
            row = {
                "model": name,
                "real_mb": round(peaks["real"] / 2**20, 1),
                "replay_mb": round(peaks["replay"] / 2**20, 1),
                "replay_over_real": round(ratio, 3),
                "within_target": abs(ratio - 1) <= MEMORY_TOLERANCE,
            }
        else:
            row = {"model": name, "error": "a run failed", "peaks": peaks}
        rows.append(row)
        print(f"{name:10s} memory {row}", file=sys.stderr, flush=True)
    return {
        "target": f"within {MEMORY_TOLERANCE:.0%}",
        "within_target": sum(1 for r in rows if r.get("within_target")),
        "rows": rows,
    }


def _capture_cost(*, rounds: int) -> dict[str, Any]:
    from stratagem import zoo
    from stratagem.tracing import capture

    model, make_batch = zoo.build("gpt", "7b", device="meta")
    batch = make_batch(1)
    capture(model, batch, batch_size=1, trace=False)
    samples: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    graph = None
    for _ in range(rounds):
        for trace in (False, True):
            wall, cpu = time.perf_counter(), time.process_time()
            captured = capture(model, batch, batch_size=1, trace=trace)
            samples[trace].append((time.perf_counter() - wall, time.process_time() - cpu))
            graph = captured if trace else graph
    assert graph is not None and graph.trace is not None
    wall = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
    cpu = {k: statistics.median(s[1] for s in v) for k, v in samples.items()}
    compressed = len(graph.trace.to_bytes())
    return {
        "model": "zoo gpt 7b (meta), batch 1",
        "ops": graph.trace.num_ops,
        "tensors": len(graph.trace.tensors),
        "without_trace_s": {"wall": round(wall[False], 3), "cpu": round(cpu[False], 3)},
        "with_trace_s": {"wall": round(wall[True], 3), "cpu": round(cpu[True], 3)},
        "ratio_cpu": round(cpu[True] / cpu[False], 3),
        "ratio_wall": round(wall[True] / wall[False], 3),
        "trace_bytes_compressed": compressed,
        "trace_bytes_json": len(graph.trace.model_dump_json()),
        "within_target": cpu[True] / cpu[False] < CAPTURE_RATIO_LIMIT and compressed < TRACE_BYTES_LIMIT,
    }


def _launch(job: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Run the job on two gloo ranks (this file, `--worker`); rank 0's result, or the first error."""
    from stratagem.runtime.launch import free_port

    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        (directory / "job.json").write_text(json.dumps(job))
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            WORLD_SIZE="2",
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(directory)],
                env=dict(env, RANK=str(rank)),
                stdout=subprocess.DEVNULL,
                stderr=open(directory / f"log{rank}.txt", "w"),  # noqa: SIM115 - closed with the process
            )
            for rank in range(2)
        ]
        deadline = time.monotonic() + args.timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        out = directory / "rank0.json"
        if not out.exists():
            return {
                "error": (directory / "log0.txt").read_text()[-1500:] or (directory / "log1.txt").read_text()[-1500:]
            }
        return json.loads(out.read_text())


# -- a rank ------------------------------------------------------------------------------------------


def _worker(directory: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    job = json.loads((directory / "job.json").read_text())
    result = _step_time_rank(job, rank) if job["mode"] == "step_time" else _memory_rank(job, rank)
    (directory / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _replay_parts(job: dict[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    from stratagem.ir import ModelGraph
    from stratagem.tracing.optrace import OperatorTrace
    from trial_runner.replay import replay_batch_maker

    graph = ModelGraph.parse(job["graph"]).attach_trace(OperatorTrace.parse(job["trace"]))
    return graph, replay_batch_maker(graph)


def _build(job: dict[str, Any], kind: str, graph: Any, strategy_json: dict[str, Any]) -> dict[str, Any]:
    """One model of the pair, distributed under the strategy, with its batch maker and loss."""
    import torch

    from stratagem.ir import Strategy
    from stratagem.runtime import distribute
    from trial_runner.build import make_optimizer
    from trial_runner.replay import ReplayModel, replay_batch_maker, replay_loss

    if kind == "real":
        model, make_batch, loss = _real_model(job["model"])
    else:
        torch.manual_seed(0)
        model, make_batch, loss = ReplayModel(graph), replay_batch_maker(graph), replay_loss
    optimizer = make_optimizer(graph.optimizer.kind, model)
    model, optimizer = distribute(model, optimizer, Strategy.parse(strategy_json))
    return {
        "model": model,
        "optimizer": optimizer,
        "make_batch": make_batch,
        "loss": loss,
        "notes": getattr(model, "notes", {}),
    }


def _step(part: dict[str, Any], batch: Any) -> float:
    started = time.perf_counter()
    part["optimizer"].zero_grad(set_to_none=True)
    output = part["model"](**batch) if isinstance(batch, dict) else part["model"](*batch)
    part["loss"](output).backward()
    part["optimizer"].step()
    return time.perf_counter() - started


def _batch(part: dict[str, Any], batch_size: int, rank: int, step: int) -> Any:
    import torch

    from trial_runner.build import derive_seed

    torch.manual_seed(derive_seed(0, rank, step))
    return part["make_batch"](batch_size)


def _slowest(values: list[float]) -> list[float]:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def _step_time_rank(job: dict[str, Any], rank: int) -> dict[str, Any]:
    graph, _ = _replay_parts(job)
    results: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for builder, strategy in job["strategies"].items():
        parts = {kind: _build(job, kind, graph, strategy) for kind in ("real", "replay")}
        times: dict[str, list[float]] = {"real": [], "replay": []}
        for step in range(job["warmup"] + job["steps"]):
            order = ("real", "replay") if step % 2 == 0 else ("replay", "real")
            for kind in order:
                seconds = _step(parts[kind], _batch(parts[kind], graph.batch_size, rank, step))
                if step >= job["warmup"]:
                    times[kind].append(seconds)
        results[builder] = {kind: _slowest(values) for kind, values in times.items()}
        notes.update(parts["replay"]["notes"])
    return {**results, "notes": notes}


def _memory_rank(job: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch._dynamo  # noqa: F401 - loaded lazily by the first attention or compiled call, 140 MB of RSS

    import stratagem.runtime  # noqa: F401
    import trial_runner.build  # noqa: F401
    from trial_runner.measure import current_memory_bytes

    graph, _ = _replay_parts(job)
    if job["mode"] == "real":
        from trial_models import import_code

        import_code(job["model"])  # the model's code is loaded before the baseline, as the replay's trace is
    baseline = current_memory_bytes(_cpu())
    _reset_peak()
    part = _build(job, job["mode"], graph, job["strategies"]["DataParallel"])
    for step in range(job["warmup"] + job["steps"]):
        _step(part, _batch(part, graph.batch_size, rank, step))
    return {"model_peak_bytes": max(_slowest([_peak() - baseline]))}


def _reset_peak() -> None:
    """Start the high-water mark afresh (Linux `clear_refs` 5), so that reading the job's JSON, which
    peaks before the baseline, is not counted as the model's."""
    with open("/proc/self/clear_refs", "w") as control:
        control.write("5")


def _peak() -> float:
    """The resident high-water mark since `_reset_peak` (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) * 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


if __name__ == "__main__":
    main()
