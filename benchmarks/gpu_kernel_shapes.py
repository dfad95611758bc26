"""The kernels of the published torchtitan Llama 3.1 8B rows at their own shapes on a CUDA device: each
projection's GEMM (forward and its two backward GEMMs) whole and narrowed by tensor parallelism 8, in
bf16 and as fp8 `_scaled_mm`, and SDPA's flash attention forward and backward, causal over the whole
sequence and on the blocks all-gather context parallelism cuts it into. Needs CUDA; prints one JSON
object.

Each case is timed at the clock the power limit holds (a second of back-to-back kernels before the
timed ones) and reported as achieved TFLOP/s, as a share of the catalog kind's data-sheet peak, and
beside the share the simulator prices it at (`simulator.kernels`: a GEMM at the kind's efficiency times
`sustained_matmul` times its wave utilisation, attention at its own efficiency). It measures what the
published rows cannot separate, and what set Hopper's GEMM efficiencies (`stratagem.ir.catalog`).

    python -m benchmarks.gpu_kernel_shapes
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from simulator.api import SIMULATOR_VERSION
from simulator.encoding import Precision
from simulator.kernels import CAUSAL_SHARE, FLASH_BACKWARD_FLOPS, wave_utilisation
from simulator.precision import peaks
from stratagem.calibrate.gpu import catalog_kind
from stratagem.ir import DeviceSpec
from stratagem.ir.catalog import CATALOG

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336
"""Llama 3.1 8B (meta-llama/Llama-3.1-8B config.json)."""
PROJECTIONS = {
    "wq": (HIDDEN, HEADS * HEAD_DIM, "column"),
    "wkv": (HIDDEN, KV_HEADS * HEAD_DIM, "column"),
    "wo": (HEADS * HEAD_DIM, HIDDEN, "row"),
    "w13": (HIDDEN, FFN, "column"),
    "w2": (FFN, HIDDEN, "row"),
}
"""Each projection's (in, out) features and how tensor parallelism splits it (Megatron's column/row)."""
TOKENS = {"tp1": (16384, 1), "tp8": (98304, 8)}
"""Tokens per GEMM and tensor degree of the rows measured: 2 x 8192 on 8 GPUs of FSDP; 12 x 8192 at TP 8."""
ATTENTION = [
    ("causal-8k", 2, 8192, 8192, True),
    ("causal-32k", 1, 32768, 32768, True),
    ("cp-diagonal", 1, 16384, 16384, True),
    ("cp-block", 1, 16384, 16384, False),
    ("cp-rows", 1, 32768, 16384, False),
]
"""(name, batch, queries, keys, causal): whole sequences; and the blocks all-gather context parallelism
cuts 131k tokens on 4 ranks, or 262k on 8, into (each rank's 32k queries are two chunks of 16k, each
key chunk 16k: a causal block on the diagonal, full blocks below it, a rank's two query chunks at once)."""
HOLD_S = 1.0
"""Seconds of back-to-back kernels before timing, so the clock settles where the power limit holds it."""


def timed(run: Callable[[], Any], *, hold_s: float = HOLD_S, reps: int = 20) -> float:
    """Median seconds of one `run` at the sustained clock, by CUDA events."""
    end = time.perf_counter() + hold_s
    while time.perf_counter() < end:
        run()
        torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1e3)
    return float(np.median(samples))


def modelled_gemm_share(spec: DeviceSpec, m: int, n: int, k: int, precision: str = "bfloat16") -> float:
    """The share of the data-sheet peak (bf16's, or fp8's for "float8") the simulator prices this GEMM at."""
    waves = wave_utilisation(
        np.array([float(m)]), np.array([float(n)]), np.array([float(k)]), float(spec.sm_count or 0)
    )
    column = Precision.FP8 if precision == "float8" else Precision.BF16
    return float(peaks([spec], "bfloat16").matmul_efficiency[0, column] * waves[0])


def gemm_cases(spec: DeviceSpec) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    fp8 = hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability() >= (8, 9)
    for label, (tokens, tensor) in TOKENS.items():
        for name, (fan_in, fan_out, split) in PROJECTIONS.items():
            k_dim, n_dim = (fan_in, fan_out // tensor) if split == "column" else (fan_in // tensor, fan_out)
            for gemm, (m, n, k) in {
                "forward": (tokens, n_dim, k_dim),
                "input-grad": (tokens, k_dim, n_dim),
                "weight-grad": (n_dim, k_dim, tokens),
            }.items():
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
                seconds = timed(partial(torch.mm, a, b))
                rows.append(_gemm_row(spec, f"{label}/{name}/{gemm}", "bfloat16", m, n, k, seconds))
                if fp8 and gemm == "forward":
                    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
                    one = torch.ones((), device="cuda")
                    seconds = timed(
                        partial(torch._scaled_mm, a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                    )
                    rows.append(_gemm_row(spec, f"{label}/{name}/{gemm}", "float8", m, n, k, seconds))
                del a, b
    return rows


def _gemm_row(spec: DeviceSpec, case: str, precision: str, m: int, n: int, k: int, seconds: float) -> dict[str, Any]:
    flops = 2.0 * m * n * k
    peak = spec.peak_flops.get(precision, spec.flops_for("bfloat16"))
    return {
        "case": case,
        "precision": precision,
        "mnk": [m, n, k],
        "ms": round(seconds * 1e3, 4),
        "tflops": round(flops / seconds / 1e12, 1),
        "share_of_peak": round(flops / seconds / peak, 3),
        "modelled_share": round(modelled_gemm_share(spec, m, n, k, precision), 3),
    }


def attention_cases(spec: DeviceSpec) -> list[dict[str, Any]]:
    rows = []
    peak = spec.flops_for("bfloat16")
    priced = peaks([spec], "bfloat16")
    forward_share = float(priced.attention_efficiency[0, Precision.BF16])
    backward_share = float(priced.attention_backward_efficiency[0, Precision.BF16])
    for name, batch, queries, keys, causal in ATTENTION:
        q = torch.randn(batch, HEADS, queries, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(batch, HEADS, keys, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(batch, HEADS, keys, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(batch, HEADS, queries, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            forward = timed(partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal))
            both = timed(partial(_attention_step, q, k, v, grad, causal))
        flops = 4.0 * batch * HEADS * queries * keys * HEAD_DIM * (CAUSAL_SHARE if causal else 1.0)
        backward = max(both - forward, 1e-9)
        rows.append(
            {
                "case": name,
                "batch_queries_keys": [batch, queries, keys],
                "causal": causal,
                "forward_ms": round(forward * 1e3, 3),
                "backward_ms": round(backward * 1e3, 3),
                "forward_tflops": round(flops / forward / 1e12, 1),
                "backward_tflops": round(FLASH_BACKWARD_FLOPS * flops / backward / 1e12, 1),
                "forward_share_of_peak": round(flops / forward / peak, 3),
                "backward_share_of_peak": round(FLASH_BACKWARD_FLOPS * flops / backward / peak, 3),
                "modelled_forward_share": round(forward_share, 3),
                "modelled_backward_share": round(backward_share, 3),
            }
        )
        del q, k, v, grad
    return rows


def _attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, causal: bool) -> None:
    F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad)


def board() -> dict[str, str]:
    """The board's name, power limit and clocks as nvidia-smi reports them (empty where it is missing)."""
    fields = "name,power.limit,clocks.max.sm,clocks.sm,memory.total"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return (
        dict(zip(fields.split(","), (v.strip() for v in out.splitlines()[0].split(",")), strict=False)) if out else {}
    )


def cuda_device(benchmark: str, kind: str | None) -> tuple[Any, str]:
    """The first CUDA device's properties and the catalog kind to compare with (`kind`, else the device's
    own); exits with the reason when there is no device or no kind."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{benchmark} needs a CUDA device")
    properties = torch.cuda.get_device_properties(0)
    kind = kind or catalog_kind(properties.name, properties.total_memory)
    if kind is None or kind not in CATALOG:
        raise SystemExit(f"{properties.name}: no catalog kind to compare with; pass --kind")
    return properties, kind


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", help="catalog kind to compare with (default: the device's own)")
    args = parser.parse_args(argv)
    properties, kind = cuda_device("gpu_kernel_shapes", args.kind)
    spec = CATALOG[kind]
    started = time.perf_counter()
    attention = attention_cases(spec)
    gemms = gemm_cases(spec)
    print(
        json.dumps(
            {
                **report_header("gpu_kernel_shapes", properties.name, kind, started),
                "attention": attention,
                "gemm": gemms,
            },
            indent=2,
        )
    )


def report_header(benchmark: str, device: str, kind: str, started: float) -> dict[str, Any]:
    """What a GPU probe's report says of itself: the board and its clocks, the catalog kind it prices
    with, the simulator and torch versions, and the seconds since `started`."""
    return {
        "benchmark": benchmark,
        "device": device,
        "board": board(),
        "catalog_kind": kind,
        "simulator_version": SIMULATOR_VERSION,
        "torch": torch.__version__,
        "seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    main()
