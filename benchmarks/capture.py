"""Capture cost on full-size configs: seconds and peak memory, each case in a fresh subprocess.

Targets: a LLaMA-7B-like decoder (hidden 4096, 32 layers, seq 2048, batch 1) captures in under 20 s
with under 3 GB peak RSS on a 2-core machine. Peak RSS is the child's `ru_maxrss`, so it includes
importing torch. FLOPs are compared with the 6·N·tokens rule of thumb (which ignores attention).

Usage: python -m benchmarks.capture   (prints one JSON object)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 20.0
TARGET_RSS_BYTES = 3 * 1024**3

CASES = [
    {"model": "gpt", "size": "7b", "batch": 1},
    {"model": "bert_large", "size": "full", "batch": 32},
]

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
started = time.perf_counter()
import torch
from stratagem.zoo import build
from stratagem.tracing import capture
imported = time.perf_counter()
model, make_batch = build({model!r}, {size!r}, device="meta")
batch = make_batch({batch})
built = time.perf_counter()
graph = capture(model, batch, batch_size={batch})
done = time.perf_counter()
config = model.zoo_spec["config"]
print(json.dumps({{
    "import_seconds": imported - started,
    "build_seconds": built - imported,
    "capture_seconds": done - built,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "parameters": graph.num_parameters,
    "layers": len(graph.layers),
    "total_flops": graph.total_flops,
    "tokens": {batch} * config["seq"],
    "activation_bytes": sum(layer.activation_bytes for layer in graph.layers),
}}))
"""


def run_case(model: str, size: str, batch: int) -> dict[str, object]:
    code = CHILD.format(root=str(ROOT), model=model, size=size, batch=batch)
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    if completed.returncode != 0:
        return {"model": model, "size": size, "batch": batch, "error": completed.stderr.strip()[-2000:]}
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    rule_of_thumb = 6.0 * result["parameters"] * result["tokens"]
    return {
        "model": model,
        "size": size,
        "batch": batch,
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()},
        "peak_rss_gib": round(result["peak_rss_bytes"] / 1024**3, 3),
        "six_n_tokens_flops": rule_of_thumb,
        "flops_over_six_n_tokens": round(result["total_flops"] / rule_of_thumb, 4),
        "meets_targets": result["capture_seconds"] < TARGET_SECONDS and result["peak_rss_bytes"] < TARGET_RSS_BYTES,
    }


def main() -> None:
    results = [run_case(**case) for case in CASES]
    print(
        json.dumps(
            {
                "benchmark": "capture",
                "targets": {"capture_seconds_below": TARGET_SECONDS, "peak_rss_gib_below": TARGET_RSS_BYTES / 1024**3},
                "cases": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
