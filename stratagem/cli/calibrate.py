"""`stratagem calibrate [-o spec.json] [--ranks 2] [--threads 1]`: measure this machine into a ResourceSpec."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine (FLOP/s, memory bandwidth, gloo loopback) into a resource spec",
        description="Measure matmul FLOP/s, memory bandwidth and gloo all-reduce latency/bandwidth between "
        "local ranks, and write a one-node ResourceSpec for predicting trials on this machine.",
    )
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks (CPU devices) to describe (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank, as trials run them (default 1)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="where to write the JSON (default: stdout)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stratagem.calibrate import DEVICE_KIND, calibrate

    spec = calibrate(ranks=args.ranks, threads=args.threads)
    device = spec.devices[DEVICE_KIND]
    link = spec.intra_node
    print(
        f"{DEVICE_KIND}: {device.peak_flops['float32'] / 1e9:.1f} GFLOP/s fp32, "
        f"{device.memory_bandwidth / 1e9:.1f} GB/s memory, {device.launch_overhead_s * 1e6:.1f} us per layer; "
        f"gloo loopback: {link.latency_us:.1f} us, {link.bandwidth_gbps:.2f} Gbit/s" if link else "",
        file=sys.stderr,
    )
    if args.output is None:
        print(spec.to_json())
    else:
        spec.save(args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0
