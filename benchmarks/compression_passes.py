"""Whether compression's passes cost more per byte in a bucket holding one large tensor.

The runtime's reducers (`stratagem.runtime.compression`) flatten a bucket's gradients into one buffer
and make every pass (adding the error, casting, selecting, scattering) over that buffer, so what a pass
costs per byte should depend on the bucket's size, not on the sizes of the tensors in it. The
simulator scales each variable's passes by the optimizer's size law (`1 + bytes / optimizer_knee_bytes`),
which prices a bucket holding VGG's 16 MB classifier about 17% dearer per byte than BERT's bucket of
1 MB layers. This benchmark finds no such effect in the passes themselves (within 6%), yet pricing
them flat ranked an independent accuracy run worse (VGG's top-k priced below Sharded, measured above
it in 8 of 8 rounds), so the law stays as a fitted figure whose cause lies outside the passes
(docs/simulator.md, "Calibrated figures").

Measured in turns on one rank (one thread, a rank's allocator settings): the uncompressed bucket and
the fp16 and top-k (1%) reducers with error feedback, on a one-rank team (every pass but the
collective), over two gradient sets of the same bytes: one large tensor with small ones, and small
tensors only. Prints one JSON object: per set and reducer the median milliseconds, each compressor's
extra over the uncompressed bucket, and the ratio of the large set's extra to the small set's beside
the ratio the size law prices (its knee from this run's optimizer probes) and a flat buffer's (1);
and, beside each measured extra, what the simulator's pass counts price it at this run's probe rates.

    python -m benchmarks.compression_passes [--repeats 25]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.lib.system import reexec_with
from stratagem.rank_env import MALLOC_SETTINGS, rank_environment

MIB = 1 << 20
SETS = {"one_large": [16 * MIB] + [MIB] * 4, "small_only": [MIB] * 20}
"""Bytes per tensor; both sets hold 20 MiB, about a zoo model's bucket in the accuracy benchmark."""


def bucket_runs(torch: Any) -> dict[str, Callable[[], object]]:
    from stratagem.runtime.comm import Team
    from stratagem.runtime.compression import CastReducer, TopKReducer

    runs: dict[str, Callable[[], object]] = {}
    for set_name, sizes in SETS.items():
        reducers = {
            "plain": CastReducer(Team([0], [0], None), wire_dtype=None, error_feedback=False),
            "fp16": CastReducer(Team([0], [0], None), wire_dtype=torch.float16, error_feedback=True),
            "topk": TopKReducer(Team([0], [0], None), ratio=0.01, error_feedback=True),
        }
        for reducer_name, reducer in reducers.items():
            grads = [torch.randn(size // 4) for size in sizes]
            runs[f"{set_name}/{reducer_name}"] = _bucket_step(reducer, grads)
    return runs


def _bucket_step(reducer: Any, grads: list[Any]) -> Callable[[], None]:
    """One step of a bucket as the runtime runs it: reduce, then copy the result into each gradient."""

    def run() -> None:
        reducer.start(grads)
        for grad, result in zip(grads, reducer.finish(), strict=True):
            grad.copy_(result)

    return run


def measure(repeats: int) -> dict[str, Any]:
    import torch

    from stratagem.calibrate.compute import probes
    from stratagem.calibrate.figures import optimizer_size_law
    from stratagem.calibrate.timing import Stepper

    torch.set_num_threads(1)
    runs = bucket_runs(torch)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            samples[name].append(1e3 * (time.perf_counter() - started))
    ms = {name: statistics.median(values) for name, values in samples.items()}
    measured = probes(Stepper())
    _, knee = optimizer_size_law(measured["optimizer_rate"](), measured["optimizer_large_rate"]())
    rates = {name: measured[name]() for name in ("stream_rate", "cast_rate", "select_rate")}
    return {**report(ms, knee), "rates": rates, "priced_extra_ms": priced_extra_ms(rates)}


COMPRESSOR_ROWS = {"fp16": 1, "topk": 4}
"""Each compressor's row in `simulator.compression.CompressionTables`."""


def priced_extra_ms(rates: dict[str, float]) -> dict[str, float]:
    """What the simulator's pass counts (`simulator.compression.tables`) at this run's probe rates price
    each set's compressor beyond the uncompressed bucket, without the size law. The copy back is left
    out: the uncompressed bucket in `_bucket_step` makes it too."""
    import numpy as np

    from simulator.compression import COPY_BACK_PASSES, VariableFigures, tables

    priced = {}
    for set_name, sizes in SETS.items():
        nbytes = np.array(sizes, dtype=float)
        ones = np.ones_like(nbytes)
        t = tables(VariableFigures(nbytes=nbytes, numel=nbytes / 4, rows=nbytes / 4, cols=ones, itemsize=4 * ones))
        for compressor, row in COMPRESSOR_ROWS.items():
            streamed = t.byte_passes[row].sum() - COPY_BACK_PASSES * nbytes.sum()
            seconds = (
                streamed / rates["stream_rate"]
                + t.cast_bytes[row].sum() / rates["cast_rate"]
                + t.select_bytes[row].sum() / rates["select_rate"]
            )
            priced[f"{set_name}/{compressor}"] = round(1e3 * seconds, 3)
    return priced


def report(ms: dict[str, float], knee: float | None) -> dict[str, Any]:
    """Each compressor's extra over the uncompressed bucket per set, and the large set's extra over the
    small set's: measured, as the size law prices it, and as a flat buffer would (1)."""
    extra = {f"{s}/{c}": ms[f"{s}/{c}"] - ms[f"{s}/plain"] for s in SETS for c in ("fp16", "topk")}
    law = _law_ratio(knee)
    return {
        "ms": {name: round(value, 3) for name, value in ms.items()},
        "extra_ms": {name: round(value, 3) for name, value in extra.items()},
        "optimizer_knee_bytes": knee,
        "large_over_small": {
            compressor: {
                "measured": round(extra[f"one_large/{compressor}"] / extra[f"small_only/{compressor}"], 3),
                "priced_by_size_law": round(law, 3),
                "flat_buffer": 1.0,
            }
            for compressor in ("fp16", "topk")
        },
    }


def _law_ratio(knee: float | None) -> float:
    """How much dearer the size law prices the large set's passes than the small set's (equal bytes)."""
    if not knee:
        return 1.0
    scaled = {name: sum(size * (1 + size / knee) for size in sizes) for name, sizes in SETS.items()}
    return scaled["one_large"] / scaled["small_only"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if any(name not in os.environ for name in MALLOC_SETTINGS):
        reexec_with(rank_environment(), "benchmarks.compression_passes")
    print(json.dumps({"benchmark": "compression_passes", "repeats": args.repeats, **measure(args.repeats)}, indent=2))


if __name__ == "__main__":
    main()
