"""What PyTorch's caching allocator reserves beyond what a training step holds, on a CUDA device: a
Llama 3.1 8B-wide decoder (two blocks, the full vocabulary) trained in bf16 with a foreach AdamW, at
8192 tokens per sequence and one to four sequences. Needs CUDA; prints one JSON object.

torchtitan reports `max_reserved` (82.4 GiB for its Llama 8B on 8 H100); the simulator prices what the
step holds, and a candidate fits when that, times one plus `allocator_overhead`, plus
`reserved_memory_bytes` (the CUDA context and libraries) fits. Reserved over allocated at the peak is
the allocator's share (block rounding, cached free blocks), which sets the catalog's
`allocator_overhead`; the context is measured as what the device reports in use beyond the allocator's
reservation.

    python -m benchmarks.gpu_memory_reserve
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

LLAMA_8B_WIDTH: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
"""meta-llama/Llama-3.1-8B's config.json widths; the block count is the benchmark's."""
BLOCKS = 2
SEQ = 8192
BATCHES = (1, 2, 4)
STEPS = 3
GIB = 1024**3


def measure(batch: int) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    config = LlamaConfig(**LLAMA_8B_WIDTH, num_hidden_layers=BLOCKS)
    model = torch.nn.Module.to(LlamaForCausalLM(config), device="cuda", dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(0, config.vocab_size, (batch, SEQ), device="cuda")
    started = time.perf_counter()
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    in_use = total - free
    row = {
        "batch": batch,
        "parameters": sum(p.numel() for p in model.parameters()),
        "step_s": round((time.perf_counter() - started) / STEPS, 4),
        "max_allocated_gib": round(allocated / GIB, 3),
        "max_reserved_gib": round(reserved / GIB, 3),
        "reserved_over_allocated": round(reserved / allocated, 4),
        "device_in_use_beyond_reserved_gib": round((in_use - torch.cuda.memory_reserved()) / GIB, 3),
    }
    del model, optimizer, ids
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_memory_reserve needs a CUDA device")
    rows = []
    for batch in BATCHES:
        try:
            rows.append(measure(batch))
        except torch.OutOfMemoryError as error:
            rows.append({"batch": batch, "error": f"out of memory: {str(error).splitlines()[0]}"})
            torch.cuda.empty_cache()
    print(
        json.dumps(
            {
                "benchmark": "gpu_memory_reserve",
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "blocks": BLOCKS,
                "seq": SEQ,
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
