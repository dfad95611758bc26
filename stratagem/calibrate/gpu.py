"""Measure a CUDA device into a ResourceSpec, so steps on it are priced with its own figures.

The catalog's GPU kinds (`stratagem/ir/catalog.py`) are data-sheet peaks with guessed efficiencies
and a 5 µs launch overhead per layer pass. Eager PyTorch pays far more than that per layer on the host,
and without TF32 an fp32 matmul runs at the fp32 peak, not the TF32 one the catalog quotes: with the
catalog's figures the simulator priced one-rank H100 steps of small zoo models 2.7-61x too fast
(docs/simulator.md, "A first GPU check").

This runs the CPU calibration's compute probes (`compute.probes`) on the device, at sizes that keep it
busy for milliseconds (`GPU_PROBES`), each repeat timed until the device has finished (`Stepper` with
an `agree` that synchronizes), and Adam's per-tensor loop besides its default multi-tensor step
(`optimizer_loop_tensor_s`: what a model with a sparse gradient updates through), and the GPU kernel
probes (`kernels`: GEMMs by shape and precision, fused attention). One process, one device: the figures
describe every device of the node that has the same name. With two or more such devices (CUDA devices 0
to k-1), one rank per device joined by NCCL sweeps all-reduce sizes and the node's link is fitted from
it (`links`: bus bandwidth and NCCL's Simple step, provenance `links: measured`, with the sweep); with
one GPU there is no peer to measure NCCL against, and the link is the catalog's for the matching kind
(`links: catalog`). A measured rate is what the kernels reach, so
matmul efficiency is 1.
"""

from __future__ import annotations

import re
import socket
import time
from typing import Any

import torch

from stratagem.calibrate.compute import ProbeShapes, compute_figures, optimizer_tensor_probe
from stratagem.calibrate.figures import fraction
from stratagem.calibrate.kernels import GPU_KERNEL_SHAPES, kernel_figures, kernel_probes
from stratagem.calibrate.timing import CacheEvictor, Stepper
from stratagem.errors import InvalidResourceSpecError, Problem
from stratagem.ir import DeviceSpec, Link, Node, ResourceSpec
from stratagem.ir.catalog import CATALOG, GPU_ALLOCATOR_OVERHEAD, GPU_COMM_OVERLAP, GPU_RESERVED_BYTES
from stratagem.ir.resources import DEFAULT_INTRA_NODE

GPU_PROBES = ProbeShapes(
    linear=(16384, 4096),
    bf16_side=8192,
    images=(64, 128, 56, 56),
    tokens=(32768, 4096),
    copy_elements=256 << 20,
    gradient_elements=64 << 20,
    optimizer_bytes=1 << 30,
    lowrank=((16, 2048), (1, 8192)),
    lookups=(262144, 320000),
)
"""Sizes at which each probe's kernels take hundreds of microseconds or more on a data-centre GPU (and
its tensors, about 1 GB at most, are far beyond its L2 cache), so their rate and not their launch is
timed."""


def calibrate_gpu(device_index: int = 0, *, address: str = "127.0.0.1") -> ResourceSpec:
    """A one-node ResourceSpec whose GPUs are this machine's devices named like `device_index`, with
    the figures measured on that one."""
    if not torch.cuda.is_available() or device_index >= torch.cuda.device_count():
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise InvalidResourceSpecError([Problem("device", f"no CUDA device {device_index}: torch sees {count}")])
    device = f"cuda:{device_index}"
    properties = torch.cuda.get_device_properties(device_index)
    figures = measure_gpu(device)
    figures["sm_count"] = float(properties.multi_processor_count)
    provenance = {
        "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "accelerator": properties.name,
        "torch": torch.__version__,
        "links": "catalog",
        **figures,
    }
    same = [i for i in range(torch.cuda.device_count()) if torch.cuda.get_device_name(i) == properties.name]
    link = None
    if len(same) >= 2 and same == list(range(len(same))):
        link, sweep = measure_link(len(same), catalog_link(properties.name, float(properties.total_memory)).kind)
        provenance |= {"links": "measured", **sweep}
    return gpu_spec(
        provenance,
        name=properties.name,
        memory_bytes=float(properties.total_memory),
        gpus=same,
        address=address,
        link=link,
    )


def measure_link(count: int, kind: str) -> tuple[Link, dict[str, Any]]:
    """The node's link from an NCCL all-reduce sweep over CUDA devices 0..count-1, and the sweep itself."""
    from stratagem.calibrate.figures import combine
    from stratagem.calibrate.links import LINK_SIZES, busbw, fit_nccl_link
    from stratagem.calibrate.workers import RankJob, run_ranks

    seconds = combine(run_ranks(RankJob(ranks=count, backend="nccl", probes="links")))["link_seconds"]
    sweep = {
        "link_ranks": count,
        "link_bytes": list(LINK_SIZES),
        "link_seconds": seconds,
        "link_busbw": busbw(LINK_SIZES, seconds, count),
    }
    return fit_nccl_link(LINK_SIZES, seconds, count, kind), sweep


def measure_gpu(device: str) -> dict[str, float]:
    """The compute figures of one CUDA device, every repeat from a cold L2 cache."""

    def finished(go: bool) -> bool:
        torch.cuda.synchronize(device)
        return go

    return gpu_figures(Stepper(finished, evict=CacheEvictor.for_device(device)), device)


def gpu_figures(stepper: Stepper, device: str) -> dict[str, float]:
    """The compute probes at `GPU_PROBES`, and Adam's per-tensor loop, timed by `stepper` (whose
    agreement waits for the device)."""
    figures = compute_figures(stepper, GPU_PROBES, device)
    figures["optimizer_loop_tensor_s"] = optimizer_tensor_probe(stepper, device, foreach=False)()
    figures |= {name: probe() for name, probe in kernel_probes(stepper, GPU_KERNEL_SHAPES, device).items()}
    return figures


def catalog_kind(name: str, memory_bytes: float) -> str | None:
    """The catalog's kind for a CUDA device name ("NVIDIA H100 80GB HBM3" -> "H100"): the longest kind
    named in it as a word of its own (a T400 is no T4), A100s told apart by memory."""
    upper = name.upper()
    kinds = [kind for kind, spec in CATALOG.items() if spec.is_gpu and re.search(rf"\b{kind.split('-')[0]}\b", upper)]
    if not kinds:
        return None
    return min(kinds, key=lambda kind: (-len(kind.split("-")[0]), abs(CATALOG[kind].memory_bytes - memory_bytes)))


def catalog_link(name: str, memory_bytes: float) -> Link:
    """The catalog's intra-node link for a CUDA device name (PCIe for a kind it does not know)."""
    base = catalog_kind(name, memory_bytes)
    return DEFAULT_INTRA_NODE.get(base or "", Link(kind="pcie", bandwidth_gbps=128, latency_us=5.7, efficiency=0.8))


def gpu_spec(
    provenance: dict[str, Any],
    *,
    name: str,
    memory_bytes: float,
    gpus: list[int],
    address: str = "127.0.0.1",
    link: Link | None = None,
) -> ResourceSpec:
    """The ResourceSpec a GPU calibration's figures describe: one node, its `gpus` of the calibrated kind,
    joined by the measured `link` (else the catalog's)."""
    base = catalog_kind(name, memory_bytes)
    kind = f"{base or 'GPU'}-calibrated"
    link = link or catalog_link(name, memory_bytes)
    return ResourceSpec(
        name=f"calibrated-{socket.gethostname()}-gpu",
        nodes=[Node(address=address, chief=True, gpus=gpus, device=kind)],
        intra_node=link,
        devices={
            kind: gpu_device_spec(provenance, kind=kind, memory_bytes=memory_bytes, catalog=CATALOG.get(base or ""))
        },
        provenance=provenance,
    )


def gpu_device_spec(
    figures: dict[str, Any], *, kind: str, memory_bytes: float, catalog: DeviceSpec | None = None
) -> DeviceSpec:
    """The measured rates as a GPU kind: the fp32 peak is the faster of matmul and convolution (cuDNN
    convolves in TF32 by default where PyTorch's matmul does not), the TF32, half-precision and fp8 peaks
    are the measured GEMM rates (tensor cores at `matmul_efficiency` 1; convolutions, priced against the
    TF32 peak where there is one, keep their measured rate), efficiencies are relative to them and
    to the copy bandwidth, clamped into (0, 1]. Without size laws (its probes all stream from device memory) and
    with the catalog's communication figures for the kind (what NCCL's kernels take from overlapped
    compute, NVLink SHARP) and its memory held beyond the tensors (the CUDA context, the caching
    allocator), which these probes do not measure."""
    matmul, conv, bandwidth = figures["matmul_flops"], figures["conv_flops"], figures["copy_bandwidth"]
    peak = max(matmul, conv)
    peaks = {"float32": peak, "bfloat16": figures["bf16_flops"], "float16": figures["bf16_flops"]}
    if "gemm_fp8_flops" in figures:
        peaks["float8"] = figures["gemm_fp8_flops"]
    if "gemm_tf32_flops" in figures:
        peaks["tf32"] = figures["gemm_tf32_flops"]
    conv_peak = peaks.get("tf32", peak)

    def share(key: str) -> float:
        return fraction(figures[key] / bandwidth)

    return DeviceSpec(
        name=kind,
        peak_flops=peaks,
        memory_bytes=memory_bytes,
        memory_bandwidth=bandwidth,
        matmul_efficiency=1.0,
        fp32_matmul_efficiency=matmul / peak,
        conv_efficiency=fraction(conv / conv_peak),
        elementwise_efficiency=share("elementwise_rate"),
        norm_efficiency=share("norm_rate"),
        launch_overhead_s=max(figures["layer_overhead_s"], 0.0),
        optimizer_efficiency=share("optimizer_rate"),
        optimizer_tensor_s=max(figures["optimizer_tensor_s"], 0.0),
        optimizer_loop_tensor_s=max(figures["optimizer_loop_tensor_s"], 0.0)
        if "optimizer_loop_tensor_s" in figures
        else None,
        stream_efficiency=share("stream_rate"),
        cast_efficiency=share("cast_rate"),
        select_efficiency=share("select_rate"),
        full_select_efficiency=share("full_select_rate") if "full_select_rate" in figures else None,
        lowrank_efficiency=share("lowrank_rate"),
        coalesce_efficiency=share("coalesce_rate"),
        comm_overlap=catalog.comm_overlap if catalog is not None else GPU_COMM_OVERLAP,
        nvlink_sharp=catalog.nvlink_sharp if catalog is not None else None,
        reserved_memory_bytes=catalog.reserved_memory_bytes if catalog is not None else GPU_RESERVED_BYTES,
        allocator_overhead=catalog.allocator_overhead if catalog is not None else GPU_ALLOCATOR_OVERHEAD,
        is_gpu=True,
        **_kernel_fields(figures),
    )


def _kernel_fields(figures: dict[str, Any]) -> dict[str, Any]:
    """SM count and fused attention's efficiencies against the measured bf16 GEMM rate (the spec's bf16
    peak), where the kernel probes ran (`stratagem.calibrate.kernels`)."""
    if "attention_flops" not in figures:
        return {}
    efficiencies = kernel_figures(figures, bf16_peak=figures["bf16_flops"], fp32_peak=1.0, sms=1)
    fields: dict[str, Any] = {
        "attention_efficiency": efficiencies["attention_efficiency"],
        "attention_backward_efficiency": efficiencies["attention_backward_efficiency"],
    }
    if figures.get("sm_count"):
        fields["sm_count"] = int(figures["sm_count"])
    return fields
