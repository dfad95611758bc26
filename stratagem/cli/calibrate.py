"""`stratagem calibrate [-o spec.json] [--ranks 2] [--threads 1] [--gpu [N]]`: measure this machine into a ResourceSpec."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from stratagem.cli.files import check_output, write_text
from stratagem.cli.jobs import int_at_least, positive_int
from stratagem.errors import StratagemError
from stratagem.ir import ResourceSpec


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine (FLOP/s, memory bandwidth, gloo loopback) into a resource spec",
        description="Measure matmul FLOP/s, memory bandwidth and gloo all-reduce latency/bandwidth between "
        "local ranks, and write a one-node ResourceSpec for predicting trials on this machine.",
    )
    parser.add_argument(
        "--ranks", type=positive_int, default=2, help="gloo ranks (CPU devices) to describe (default 2)"
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="CPU threads per rank, as trials run them (default 1)"
    )
    parser.add_argument(
        "--gpu",
        type=device_index,
        nargs="?",
        const=0,
        default=None,
        metavar="N",
        help="measure CUDA device N (default 0) instead of CPU ranks, and the NCCL link between the node's GPUs "
        "of its kind when there are several (else the link is the catalog's)",
    )
    parser.add_argument("-o", "--output", type=Path, default=None, help="where to write the JSON (default: stdout)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output(args.output, "--output")
    spec = measure_gpu(args.gpu) if args.gpu is not None else measure_cpus(args.ranks, args.threads)
    if args.output is None:
        print(spec.to_json())
    else:
        write_text(args.output, spec.to_json() + "\n", "--output")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def measure_cpus(ranks: int, threads: int) -> ResourceSpec:
    from stratagem.calibrate import DEVICE_KIND, calibrate

    check_machine(ranks, threads)
    spec = calibrate(ranks=ranks, threads=threads)
    device = spec.devices[DEVICE_KIND]
    link = spec.intra_node
    print(
        f"{DEVICE_KIND}: {device.peak_flops['float32'] / 1e9:.1f} GFLOP/s fp32, "
        f"{device.memory_bandwidth / 1e9:.1f} GB/s memory, {device.launch_overhead_s * 1e6:.1f} us per layer; "
        f"gloo loopback: {link.latency_us:.1f} us, {link.bandwidth_gbps:.2f} Gbit/s"
        if link
        else "",
        file=sys.stderr,
    )
    return spec


def measure_gpu(index: int) -> ResourceSpec:
    from stratagem.calibrate import calibrate_gpu

    spec = calibrate_gpu(index)
    kind = spec.nodes[0].device
    device = spec.devices[kind]
    print(
        f"{kind} ({len(spec.nodes[0].gpus)} on this node): {device.peak_flops['float32'] / 1e12:.1f} TFLOP/s fp32, "
        f"{device.peak_flops['bfloat16'] / 1e12:.1f} bf16, {device.memory_bandwidth / 1e9:.0f} GB/s memory, "
        f"{device.launch_overhead_s * 1e6:.1f} us per layer; link {_link_words(spec)}",
        file=sys.stderr,
    )
    return spec


def _link_words(spec: ResourceSpec) -> str:
    link = spec.intra_node
    source = "measured" if spec.provenance.get("links") == "measured" else "from the catalog"
    if link is None:
        return source
    return f"{source}: {link.bytes_per_s / 1e9:.0f} GB/s bus bandwidth, {link.latency_us:.1f} us per step"


def check_machine(ranks: int, threads: int) -> None:
    """Refuse more ranks or threads than this machine has CPUs for (each rank is one CPU device of the spec),
    before starting that many processes; two ranks are always allowed, as a collective needs them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if ranks > max(2, cpus):
        raise StratagemError(
            f"--ranks: this machine has {cpus} usable CPU(s), and each rank is one CPU device; got {ranks}"
        )
    if threads > cpus:
        raise StratagemError(f"--threads: this machine has {cpus} usable CPU(s); got {threads} threads per rank")


def device_index(text: str) -> int:
    """An argparse type for `--gpu`, so a bad value is a usage error naming the option."""
    return int_at_least(text, 0, "a CUDA device index")
