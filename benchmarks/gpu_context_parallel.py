"""One rank's attention under torchtitan's all-gather context parallelism, on a CUDA device, beside its price.

The published torchtitan rows at context parallelism 4 and 8 (Llama 3.1 8B at 131k and 262k tokens) run
about half again as long as priced, while the row at degree 2 nearly fits, although every block is 16k x 16k tokens
at all three degrees: each rank holds two chunks of 16k queries (load balancing gives rank r chunks r
and 2C-1-r), and each query chunk attends to every key chunk up to its own, the last block causal. So
the blocks' flash kernels alone cannot explain the gap; what grows with the degree is the number of
blocks a rank runs (2C + 1) and what joins them: PyTorch's context parallelism merges each block's
output into the running one in fp32 by their log-sum-exps (`_SDPAMerger`:
out - sigmoid(lse_b - lse) * (out - out_b), lse - logsigmoid(lse - lse_b)).

For each degree this times rank 0's forward three ways at the clock the power limit holds: the blocks'
flash kernels alone, the same with the merges, and the simulator's price for the blocks' FLOPs (the
kind's attention efficiency of the bf16 peak). Forward only. Needs CUDA; prints one JSON object.

    python -m benchmarks.gpu_context_parallel [--kind H100]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu_kernel_shapes import HEAD_DIM, HEADS, board, cuda_device, timed
from simulator.api import SIMULATOR_VERSION
from simulator.encoding import Precision
from simulator.kernels import CAUSAL_SHARE
from simulator.precision import peaks
from stratagem.ir import DeviceSpec
from stratagem.ir.catalog import CATALOG

CHUNK = 16384
"""Tokens per chunk at every degree of the published rows (2C chunks of 65k, 131k and 262k tokens)."""
DEGREES = (2, 4, 8)


def rank_blocks(degree: int, rank: int = 0) -> list[tuple[int, list[int]]]:
    """(query chunk, the key chunks it attends to) for `rank` of `degree`: chunks r and 2C-1-r, each
    attending to every chunk up to its own."""
    return [(chunk, list(range(chunk + 1))) for chunk in (rank, 2 * degree - 1 - rank)]


def flash_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash kernel's output and its rows' log-sum-exp (the CPU's flash kernel where there is no GPU)."""
    if q.is_cuda:
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse


def merged_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """`q` against key and value blocks, the last on the diagonal (causal), merged in fp32 block by block."""
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    last = len(keys) - 1
    for index, (k, v) in enumerate(zip(keys, values, strict=True)):
        block_out, block_lse = flash_with_lse(q, k, v, causal=index == last)
        block_out, block_lse = block_out.float(), block_lse.float().unsqueeze(-1)
        if out is None or lse is None:
            out, lse = block_out, block_lse
            continue
        out = out - torch.sigmoid(block_lse - lse) * (out - block_out)
        lse = lse - F.logsigmoid(lse - block_lse)
    assert out is not None
    return out.to(q.dtype)


def flash_only(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    last = len(keys) - 1
    for index, (k, v) in enumerate(zip(keys, values, strict=True)):
        flash_with_lse(q, k, v, causal=index == last)


def priced_seconds(spec: DeviceSpec, blocks: int, diagonal: int) -> float:
    """The simulator's forward price for `blocks` flash blocks of CHUNK x CHUNK, `diagonal` of them causal."""
    priced = peaks([spec], "bfloat16")
    rate = spec.flops_for("bfloat16") * float(priced.attention_efficiency[0, Precision.BF16])
    flops_per_block = 4.0 * HEADS * CHUNK * CHUNK * HEAD_DIM
    return flops_per_block * ((blocks - diagonal) + diagonal * CAUSAL_SHARE) / rate


def degree_case(spec: DeviceSpec, degree: int) -> dict[str, Any]:
    shape = (1, HEADS, CHUNK, HEAD_DIM)
    keys = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2 * degree)]
    values = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2 * degree)]
    plan = rank_blocks(degree)
    queries = {chunk: torch.randn(shape, device="cuda", dtype=torch.bfloat16) for chunk, _ in plan}

    def merged() -> None:
        for chunk, attended in plan:
            merged_attention(queries[chunk], [keys[j] for j in attended], [values[j] for j in attended])

    def alone() -> None:
        for chunk, attended in plan:
            flash_only(queries[chunk], [keys[j] for j in attended], [values[j] for j in attended])

    blocks = sum(len(attended) for _, attended in plan)
    with torch.no_grad():
        kernels, whole = timed(alone), timed(merged)
    priced = priced_seconds(spec, blocks, diagonal=len(plan))
    return {
        "degree": degree,
        "tokens": 2 * degree * CHUNK,
        "blocks_on_rank_0": blocks,
        "flash_only_ms": round(kernels * 1e3, 3),
        "merged_ms": round(whole * 1e3, 3),
        "merge_share": round((whole - kernels) / kernels, 3),
        "priced_ms": round(priced * 1e3, 3),
        "merged_over_priced": round(whole / priced, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", help="catalog kind to price with (default: the device's own)")
    args = parser.parse_args(argv)
    properties, kind = cuda_device("gpu_context_parallel", args.kind)
    started = time.perf_counter()
    cases = [degree_case(CATALOG[kind], degree) for degree in DEGREES]
    print(
        json.dumps(
            {
                "benchmark": "gpu_context_parallel",
                "device": properties.name,
                "board": board(),
                "catalog_kind": kind,
                "simulator_version": SIMULATOR_VERSION,
                "torch": torch.__version__,
                "seconds": round(time.perf_counter() - started, 1),
                "cases": cases,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
