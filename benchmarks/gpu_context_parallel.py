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
kind's attention efficiency of the bf16 peak). Its backward is timed as PyTorch's ring backward runs it:
each block's flash backward against the merged output and log-sum-exp, the gradients summed in fp32,
beside the price (2.5 times the forward FLOPs at the backward efficiency). The communication between
ranks is not timed. Needs CUDA; prints one JSON object.

    python -m benchmarks.gpu_context_parallel [--kind H100]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu_kernel_shapes import HEAD_DIM, HEADS, cuda_device, report_header, timed
from simulator.encoding import Precision
from simulator.kernels import CAUSAL_SHARE, FLASH_BACKWARD_FLOPS
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
) -> tuple[torch.Tensor, torch.Tensor, tuple[Any, ...]]:
    """The flash kernel's output, its rows' log-sum-exp, and what its backward takes besides (the CPU's
    flash kernel where there is no GPU)."""
    if q.is_cuda:
        out, lse, *rest = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return out, lse, tuple(rest[:6])
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse, ()


def flash_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    rest: tuple[Any, ...],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of the query, key and value gradients, given the merged output and log-sum-exp."""
    if q.is_cuda:
        cum_q, cum_k, max_q, max_k, seed, offset = rest
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset
        )
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0, causal)


def merged_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """`q` against key and value blocks, the last on the diagonal (causal), merged in fp32 block by block."""
    return merged_with_lse(q, keys, values)[0]


def merged_with_lse(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[Any, ...]]]:
    """The merged output (in `q`'s dtype), its fp32 log-sum-exp, and each block's backward arguments."""
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    rests = []
    last = len(keys) - 1
    for index, (k, v) in enumerate(zip(keys, values, strict=True)):
        block_out, block_lse, rest = flash_with_lse(q, k, v, causal=index == last)
        rests.append(rest)
        block_out, block_lse = block_out.float(), block_lse.float().unsqueeze(-1)
        if out is None or lse is None:
            out, lse = block_out, block_lse
            continue
        out = out - torch.sigmoid(block_lse - lse) * (out - block_out)
        lse = lse - F.logsigmoid(lse - block_lse)
    assert out is not None and lse is not None
    return out.to(q.dtype), lse.squeeze(-1), rests


def ring_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    merged: tuple[torch.Tensor, torch.Tensor, list[tuple[Any, ...]]],
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The query's gradient and each key and value block's share, summed in fp32 as PyTorch's ring
    backward accumulates them."""
    out, lse, rests = merged
    grad_q = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    grad_keys, grad_values = [], []
    last = len(keys) - 1
    for index, (k, v, rest) in enumerate(zip(keys, values, rests, strict=True)):
        dq, dk, dv = flash_backward(grad, q, k, v, out, lse, index == last, rest)
        grad_q += dq
        grad_keys.append(dk.float())
        grad_values.append(dv.float())
    return grad_q, grad_keys, grad_values


def flash_only(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    last = len(keys) - 1
    for index, (k, v) in enumerate(zip(keys, values, strict=True)):
        flash_with_lse(q, k, v, causal=index == last)


def priced_seconds(spec: DeviceSpec, blocks: int, diagonal: int, *, backward: bool = False) -> float:
    """The simulator's price for `blocks` flash blocks of CHUNK x CHUNK, `diagonal` of them causal: their
    forward, or their backward (2.5 times the FLOPs at the backward efficiency)."""
    priced = peaks([spec], "bfloat16")
    efficiency = priced.attention_backward_efficiency if backward else priced.attention_efficiency
    rate = spec.flops_for("bfloat16") * float(efficiency[0, Precision.BF16])
    flops_per_block = 4.0 * HEADS * CHUNK * CHUNK * HEAD_DIM * (FLASH_BACKWARD_FLOPS if backward else 1.0)
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

    forwards = {
        chunk: merged_with_lse(queries[chunk], [keys[j] for j in attended], [values[j] for j in attended])
        for chunk, attended in plan
    }
    grads = {chunk: torch.randn(shape, device="cuda", dtype=torch.bfloat16) for chunk, _ in plan}

    def backward() -> None:
        for chunk, attended in plan:
            ring_backward(
                grads[chunk],
                queries[chunk],
                [keys[j] for j in attended],
                [values[j] for j in attended],
                forwards[chunk],
            )

    blocks = sum(len(attended) for _, attended in plan)
    with torch.no_grad():
        kernels, whole, back = timed(alone), timed(merged), timed(backward)
    priced = priced_seconds(spec, blocks, diagonal=len(plan))
    priced_back = priced_seconds(spec, blocks, diagonal=len(plan), backward=True)
    return {
        "degree": degree,
        "tokens": 2 * degree * CHUNK,
        "blocks_on_rank_0": blocks,
        "flash_only_ms": round(kernels * 1e3, 3),
        "merged_ms": round(whole * 1e3, 3),
        "merge_share": round((whole - kernels) / kernels, 3),
        "priced_ms": round(priced * 1e3, 3),
        "merged_over_priced": round(whole / priced, 3),
        "backward_ms": round(back * 1e3, 3),
        "priced_backward_ms": round(priced_back * 1e3, 3),
        "backward_over_priced": round(back / priced_back, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", help="catalog kind to price with (default: the device's own)")
    args = parser.parse_args(argv)
    properties, kind = cuda_device("gpu_context_parallel", args.kind)
    started = time.perf_counter()
    cases = [degree_case(CATALOG[kind], degree) for degree in DEGREES]
    print(
        json.dumps({**report_header("gpu_context_parallel", properties.name, kind, started), "cases": cases}, indent=2)
    )


if __name__ == "__main__":
    main()
