"""Built-in device kinds, from vendor data sheets (dense peak, no sparsity).

Efficiencies are what well-tuned kernels reach in practice; calibration (`stratagem calibrate`)
replaces them with measured figures for a machine.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from stratagem.ir.document import Strict

TERA = 1e12
GIGA = 1e9


class DeviceSpec(Strict):
    name: str
    peak_flops: dict[str, float]
    """Peak FLOP/s per dtype name: `float32` (IEEE fp32, what PyTorch's matmuls run at by default),
    `tf32` (TF32 tensor cores, where the device has them), `float16`, `bfloat16` and `float8` (fp8 tensor
    cores, where the device has them)."""
    memory_bytes: float = Field(gt=0)
    memory_bandwidth: float = Field(gt=0)
    """Bytes per second between the device's memory and its cores."""
    matmul_efficiency: float = Field(default=0.6, gt=0, le=1)
    """Fraction of peak that matrix multiplies and convolutions reach."""
    elementwise_efficiency: float = Field(default=0.7, gt=0, le=1)
    """Fraction of memory bandwidth that element-wise kernels reach."""
    launch_overhead_s: float = Field(default=5e-6, ge=0)
    """Fixed cost per layer and pass (kernel launches, framework dispatch)."""
    norm_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of memory bandwidth normalization layers reach (several passes over their input: mean,
    variance, normalize), where it differs from other element-wise layers; None means
    `elementwise_efficiency`."""
    conv_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of peak that convolutions reach, where it differs from matrix multiplies (on a CPU,
    im2col and narrow channels cost more than a GEMM); None means `matmul_efficiency`."""
    optimizer_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of memory bandwidth an unfused optimizer update of small tensors (PyTorch's default: each
    operation its own kernel) reaches on the bytes the simulator counts for it (parameter and gradient
    in, parameter out, state in and out); its kernels move more than that. None means, on a GPU, an
    element-wise kernel's rate over the bytes they move (`simulator.devices.UNFUSED_UPDATE_BYTES`), and on a
    CPU, whose caches hold a small tensor between the passes, `elementwise_efficiency`. A `fused` update
    is one pass over the counted bytes, at `elementwise_efficiency`."""
    optimizer_knee_bytes: float | None = Field(default=None, gt=0)
    """Parameter bytes of one tensor at which the optimizer update's time per byte has doubled: the
    update makes several passes over each tensor with temporaries of its size, and a tensor far
    beyond the caches pays each pass (and fresh pages for the temporaries) from memory; per-byte cost
    is `1 + bytes / knee` times the small-tensor figure. None means no such growth (GPUs stream
    everything from memory anyway)."""
    optimizer_tensor_s: float | None = Field(default=None, ge=0)
    """Seconds an optimizer update pays per tensor beyond its bytes: a per-tensor (not multi-tensor)
    update launches a dozen small operations for each parameter, so a model of many small tensors
    updates slower than its bytes say, and a flat buffer (a ZeRO shard, a server's bucket) pays once.
    None means 0 (fused multi-tensor updates on GPUs)."""
    optimizer_loop_tensor_s: float | None = Field(default=None, ge=0)
    """Seconds per tensor of the per-tensor (for-loop) update: a graph's `OptimizerSpec.implementation`
    `for-loop`, or the loop PyTorch's optimizers fall back to for a parameter group holding a sparse
    gradient, where `optimizer_tensor_s` was measured on their multi-tensor path (the default on CUDA).
    None means `optimizer_tensor_s` on a CPU, and on a GPU the loop's kernels at `launch_overhead_s` each
    (`simulator.devices.LOOP_UPDATE_KERNELS`)."""
    cast_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of memory bandwidth a dtype conversion (fp32 to fp16/bf16 and back, as fp16 compression
    does) reaches; a CPU without vector conversion units converts element by element. None means
    `elementwise_efficiency`."""
    stream_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of memory bandwidth a plain streaming pass reaches (an add, a scale, a copy over a
    bucket-sized tensor), as gradient compression makes around its casts and selections. It is near a
    copy's speed, where `elementwise_efficiency` is an activation's (GELU computes an erf per element)
    and on a CPU runs at half a copy's rate or less. None means `elementwise_efficiency`."""
    select_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of memory bandwidth at which top-k selection consumes its input, counted as one pass (a
    CPU's partial sort costs tens of nanoseconds per element). None means `elementwise_efficiency`."""
    full_select_efficiency: float | None = Field(default=None, gt=0, le=1)
    """The same for a bucket the runtime selects from in one full `topk` (small buckets, few entries
    kept: `stratagem.topk_selection.full_selection`), which on a CPU sorts every entry where the
    sampled path of large buckets streams them once. None means `select_efficiency`."""
    lowrank_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of memory bandwidth at which PowerSGD's passes (rank-r products, QR, error feedback)
    stream the gradient; skinny matrix products run far below a copy's rate on a CPU. None means
    `elementwise_efficiency`."""
    lowrank_knee_bytes: float | None = Field(default=None, gt=0)
    """Bytes of one matrix at which PowerSGD's time per byte has doubled (`optimizer_knee_bytes`' law:
    `1 + bytes / knee`): a rank-r product over a matrix beyond the caches reads it from memory.
    None means no such growth."""
    coalesce_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of memory bandwidth at which coalescing a sparse gradient (sorting its row indices and
    summing repeated rows, as every sparse exchange and sparse optimizer step does) streams its indices
    and values. None means `elementwise_efficiency`."""
    scatter_efficiency: float | None = Field(default=None, gt=0, le=8)
    """How fast reduce-scatter plus all-gather move their bytes relative to the link bandwidth
    all-reduce buckets reach (the fitted link, a bucket's copies included) with this device's
    collective library: 1 for NCCL; gloo on CPU has no ring reduce-scatter and reaches about half.
    None means 1."""
    gather_efficiency: float | None = Field(default=None, gt=0, le=8)
    """The same for an all-gather into one tensor per rank: the exchanges whose sizes differ per rank
    (a sparse gradient's touched rows, top-k's values and indices) gather that way, and gloo on CPU
    pays a copy into each rank's tensor and their fresh pages. None means 1."""
    half_reduce_efficiency: float | None = Field(default=None, gt=0, le=8)
    """How fast a half-precision bucket moves its bytes relative to the fitted link (whose buckets
    include their copies): NCCL reduces fp16 at full speed, while gloo on CPU converts every element
    to fp32 to add it, so fp16 compression halves the bytes but not the time (about 0.5). None means 1."""
    reduce_efficiency: float | None = Field(default=None, gt=0, le=8)
    """How fast a reduce to one rank (a parameter server receiving and summing every worker's push)
    moves its bytes relative to the link bandwidth all-reduce buckets reach. That bandwidth is fitted
    with a bucket's arithmetic and copies, so a transfer that does less of them can exceed 1. None
    means 1."""
    broadcast_efficiency: float | None = Field(default=None, gt=0, le=8)
    """The same for a broadcast from one rank (a parameter server's pull): no arithmetic, one copy, so
    gloo on CPU moves its bytes about twice as fast as its all-reduce buckets do. None means 1."""
    lowrank_round_s: float | None = Field(default=None, ge=0, le=1)
    """Seconds a PowerSGD bucket's two dependent all-reduces take beyond their bytes (P, then Q after
    both ranks' QR), as the runtime runs them. Each starts only once every rank has finished the
    compute before it and wakes a blocked thread on every rank; on CPU ranks sharing their cores with
    gloo's threads that costs several times an idle round trip. None means two link latencies."""
    comm_overlap: float = Field(default=1.0, ge=0, le=1)
    """Fraction of communication time that can run alongside this device's compute without slowing it.
    On a GPU, NCCL's kernels hold SMs and stream through the same memory as the compute they overlap,
    which runs 18.9 % slower on average while they do (Lee et al. 2025, arXiv:2507.03114, measured on
    A100, H100, MI250 and MI210): 0.81 for the catalog's GPUs. Lower where the same cores copy and reduce
    the bytes (CPU ranks under gloo), as calibration measures. 1: communication costs compute nothing."""
    comm_latency_contention: float = Field(default=0.0, ge=0, le=8)
    """Latencies a collective that runs during compute takes from that compute, beyond the share of its
    time `comm_overlap` leaves: 0 where communication has engines of its own (GPUs); above 0 on CPU ranks
    whose cores the compute threads hold, where every hand-off of a collective (its launch, each
    wake-up of gloo's thread) waits for a core and preempts the compute to get one."""
    nvlink_sharp: float | None = Field(default=None, gt=0, le=4)
    """All-reduce bus bandwidth with NVLink SHARP (NCCL's NVLS algorithm: the NVSwitch sums the buffers)
    over the ring's, for a group inside one node: 1.3 on H100 and H200 SXM (480 against 370 GB/s;
    sjeaugey in NVIDIA/nccl-tests#212 and NVIDIA/nccl#1442). None: no NVLink SHARP (before Hopper, PCIe)."""
    is_gpu: bool = True

    # -- GPU kernels by shape and precision (simulator.compute; docs/simulator.md, "GPU compute") ----------
    sm_count: int | None = Field(default=None, ge=1, le=4096)
    """Streaming multiprocessors: a GEMM runs its output as tiles spread over them in waves, and a last
    wave that fills few of them wastes the rest (NVIDIA, Matrix Multiplication Background User's Guide,
    "Wave Quantization"). None: no wave quantization (CPUs, unknown parts)."""
    fp32_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the fp32 peak that IEEE fp32 matmuls (CUDA cores, no tensor cores) reach; None means
    `matmul_efficiency`, which is then the tensor cores' figure (fp16, bf16, tf32, fp8)."""
    fp8_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the fp8 peak that scaled fp8 GEMMs (`torch._scaled_mm`, as torchao's float8 training
    runs them) reach. Twice the bf16 rate per clock is harder to feed and draws more power, so the same
    shapes reach a smaller share of it. None means `matmul_efficiency`."""
    sustained_matmul: float | None = Field(default=None, gt=0, le=1)
    """Rate a dense tensor-core kernel holds once the board sits at its power limit over the rate it
    reaches in a short burst at the boost clock (MSMF / MAMF: Bekman, ml-engineering, "Maximum Achievable
    and Sustainable Matmul FLOPS"). A training step keeps the tensor cores busy for seconds, so the clock
    settles where the power limit holds it; the matmul efficiencies are burst figures (short benchmark
    loops), and this scales each of them (and so every convolution). Attention kernels keep the tensor
    cores less busy and draw less power, so the board holds its clock under them: their efficiencies are
    their sustained rates, not scaled. None means 1 (no power-limited clock)."""
    attention_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the half-precision peak a fused attention kernel (FlashAttention-style SDPA) reaches
    in forward, on the FLOPs it does (causal: half the score matrix), as a training step sustains it.
    None means `matmul_efficiency` (then scaled by `sustained_matmul`)."""
    attention_backward_efficiency: float | None = Field(default=None, gt=0, le=1)
    """The same for its backward, counted as 2.5 times the forward FLOPs (the kernel recomputes the
    scores: Dao 2023, FlashAttention-2). None means `attention_efficiency`."""
    reserved_memory_bytes: float | None = Field(default=None, ge=0)
    """Device memory a training process holds outside its tensors: the CUDA context, cuBLAS and cuDNN
    workspaces, NCCL's channel buffers. A candidate fits when its peak plus this fits. None means 0."""
    allocator_overhead: float | None = Field(default=None, ge=0, le=1)
    """What the framework's caching allocator holds beyond a step's peak of live tensors, as a share of
    that peak: blocks rounded up to their size classes, and cached blocks split so that a later request
    cannot use what is left of them. A candidate fits when its peak times one plus this, plus
    `reserved_memory_bytes`, fits. None means 0."""

    def flops_for(self, dtype: str) -> float:
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype == "bfloat16" and "float16" in self.peak_flops:
            return self.peak_flops["float16"]
        return self.peak_flops["float32"]


GPU_COMM_OVERLAP = 0.81
"""`comm_overlap` of the catalog's GPUs: compute overlapped by NCCL's kernels runs 18.9 % slower on average
(Lee et al. 2025, arXiv:2507.03114)."""
NVLINK_SHARP = 1.3
"""`nvlink_sharp` of NVSwitch Hopper parts (H100/H200 SXM): NVLS all-reduce at 480 GB/s bus bandwidth
against the ring's 370 (NVIDIA/nccl-tests#212)."""


def _gpu(
    name: str,
    fp32: float,
    fp16: float,
    memory_gb: float,
    bandwidth_gbs: float,
    tf32: float | None = None,
    fp8: float | None = None,
    nvlink_sharp: float | None = None,
) -> DeviceSpec:
    flops = {"float32": fp32 * TERA, "float16": fp16 * TERA, "bfloat16": fp16 * TERA}
    if tf32 is not None:
        flops["tf32"] = tf32 * TERA
    if fp8 is not None:
        flops["float8"] = fp8 * TERA
    if name == "T4" or name.startswith("V100"):
        flops["bfloat16"] = fp32 * TERA
    return DeviceSpec(
        name=name,
        peak_flops=flops,
        memory_bytes=memory_gb * GIGA,
        memory_bandwidth=bandwidth_gbs * GIGA,
        comm_overlap=GPU_COMM_OVERLAP,
        nvlink_sharp=nvlink_sharp,
        reserved_memory_bytes=GPU_RESERVED_BYTES,
        allocator_overhead=GPU_ALLOCATOR_OVERHEAD,
        **GPU_KERNELS.get(name, {}),
    )


# -- GPU kernel figures (simulator.kernels; docs/simulator.md, "GPU compute") ---------------------------
GPU_RESERVED_BYTES = 1e9
"""The CUDA context (a few hundred MB with lazily loaded modules), cuBLAS/cuDNN workspaces (tens of MB per
stream) and NCCL's buffers (`NCCL_BUFFSIZE`, 4 MiB per channel and peer: a few hundred MB): about 1 GB.
On an H200 a training process held 0.75 GB beyond what PyTorch's allocator reserved
(`benchmarks.gpu_memory_reserve`, benchmarks/results/gpu_memory_reserve_h200.json)."""
GPU_ALLOCATOR_OVERHEAD = 0.054
"""`allocator_overhead` of the catalog's GPUs: PyTorch's caching allocator (default settings) reserved
1.029, 1.054 and 1.179 times its peak allocated memory while an 8B-wide Llama of two blocks trained on an
H200 at 1, 2 and 4 sequences of 8k tokens (`benchmarks.gpu_memory_reserve`); the median. The largest
would refuse micro-batches DeepSpeed's autotuner ran: BERT-large at 93 sequences per V100, priced at
27.8 GB, fits 32 GB with the median (30.3 GB) and not with 1.179 (33.8)."""
SUSTAINED_MATMUL = 708.5 / 841.9
"""`sustained_matmul` of the catalog's Ampere and Hopper parts: an H200 SXM's bf16 GEMM sustains 708.5 TFLOP/s
at its 700 W limit (1465 MHz) against 841.9 in a boost burst (1980 MHz), one run of mamf-finder (Bekman,
ml-engineering@082816f, compute/accelerator/README.md, "MAMF" and "MSMF"); a B200 at 1000 W keeps 0.82 of
its burst. No A100 was measured; a dense GEMM runs it at its 400 W limit too, and the Hopper ratio stands in."""
_VOLTA = {
    "sm_count": 80,
    "matmul_efficiency": 0.75,
    "fp32_matmul_efficiency": 0.9,
}
"""V100: 80 SMs (NVIDIA Tesla V100 white paper). Tensor-core GEMMs: no published MAMF measurement; 0.75,
below the A100's and H100's measured 0.80-0.86. IEEE fp32 GEMMs on CUDA cores keep their FMA pipes busier
than tensor cores can be fed: 0.9 of the 15.7 TFLOP/s peak, fitted on the DeepSpeed BERT rows (docs/simulator.md)."""
LAYER_SHAPE_GEMMS = 39.09 / 41.37
"""A transformer layer's GEMMs against mamf-finder's best shape: the 20 bf16 GEMMs of a Llama 3.1 8B layer
(forward, input and weight gradients of its five projections, at 16k tokens and at tensor degree 8) took
41.37 ms on an H200 at its power limit where 0.851 of the burst peak, sustained, prices 39.09
(`benchmarks.gpu_kernel_shapes`, benchmarks/results/gpu_kernel_shapes_h200.json). The A100's figure is
mamf-finder's best shape too and takes the same ratio (no A100 was measured), as it takes
`SUSTAINED_MATMUL`."""
_AMPERE = {
    "sm_count": 108,
    "matmul_efficiency": 0.869 * LAYER_SHAPE_GEMMS,
    "sustained_matmul": SUSTAINED_MATMUL,
    "attention_efficiency": 0.6,
    "attention_backward_efficiency": 0.5,
}
"""A100: 108 SMs; bf16 GEMMs reach 271.2 of 312 TFLOP/s in a burst at their best shape (Bekman, ml-engineering,
"Maximum Achievable Matmul FLOPS", A100 SXM, torch 2.6), a layer's shapes `LAYER_SHAPE_GEMMS` of that,
`SUSTAINED_MATMUL` of it at the power limit; FlashAttention-2 reaches 50-73% of peak forward and less
backward (Dao 2023, Figs. 4-7; 0.6 and 0.5 for head dimensions 64-128)."""
HOPPER_FP8_OVER_BF16 = 0.868
"""Share of the fp8 peak over the share of the bf16 peak that the same GEMMs reach: the ten forward
projections of that layer as `torch._scaled_mm` took 8.01 ms where bf16 took 13.92, against half of it
at twice the rate (the same run)."""
_HOPPER = {
    "sm_count": 132,
    "matmul_efficiency": 0.851 * LAYER_SHAPE_GEMMS,
    "fp8_matmul_efficiency": 0.851 * LAYER_SHAPE_GEMMS * HOPPER_FP8_OVER_BF16,
    "sustained_matmul": SUSTAINED_MATMUL,
    "attention_efficiency": 0.35,
    "attention_backward_efficiency": 0.3,
}
"""H100/H200: 132 SMs; bf16 GEMMs reach 841.9 of 989 TFLOP/s in a burst at their best shape (the same table,
H200 SXM, torch 2.13; 792-795 on H100 SXM with older stacks), a layer's shapes `LAYER_SHAPE_GEMMS` of
that, `SUSTAINED_MATMUL` of it at the power limit; fp8 GEMMs `HOPPER_FP8_OVER_BF16` of bf16's share. The
FlashAttention-2 kernel that SDPA runs reaches about 35% of peak on H100 forward and 30% backward (Shah
et al. 2024, FlashAttention-3, abstract and Fig. 5); on an H200 at its power limit SDPA's flash kernel
held 0.32-0.35 forward and 0.29-0.31 backward on the published rows' shapes, at a clock of 1875 MHz where
the GEMMs held 1560 (`gpu_kernel_shapes_h200.json`): attention is not power-limited."""
GPU_KERNELS: dict[str, dict[str, Any]] = {
    "V100": _VOLTA,
    "V100-16GB": _VOLTA,
    "A100-40GB": _AMPERE,
    "A100-80GB": _AMPERE,
    "H100": _HOPPER,
    "H200": _HOPPER,
    "H100-SXM-96GB-HBM2e": _HOPPER,
}
"""Per catalog kind: SM count and kernel efficiencies; T4 keeps the defaults."""
H100_500W_CLOCK = (500.0 / 700.0) ** (1.0 / 3.0)
"""torchtitan's H100 (96 GB HBM2e, 2.4 TB/s) runs capped at 500 W (pytorch/torchtitan docs/performance.md).
The data sheet's 989 TFLOP/s bf16 is 540,672 FLOP per clock (528 tensor cores x 1,024) at 1.83 GHz; a dense
GEMM holds the 700 W part at about 1.47 GHz (`SUSTAINED_MATMUL`). Dynamic power goes as f·V² with V about
proportional to f near the top of the DVFS curve, so 500 W holds (500/700)^(1/3) = 0.894 of the clock a
dense GEMM holds at 700 W: the peaks scale by it and `sustained_matmul` applies on top, their product being
the sustained rate at 500 W."""


CATALOG: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in [
        _gpu("T4", 8.1, 65, 16, 320),
        _gpu("V100", 15.7, 125, 32, 900),
        _gpu("V100-16GB", 15.7, 125, 16, 900),
        _gpu("A100-40GB", 19.5, 312, 40, 1555, tf32=156),
        _gpu("A100-80GB", 19.5, 312, 80, 2039, tf32=156),
        _gpu("H100", 67, 989, 80, 3350, tf32=494, fp8=1979, nvlink_sharp=NVLINK_SHARP),
        _gpu("H200", 67, 989, 141, 4800, tf32=494, fp8=1979, nvlink_sharp=NVLINK_SHARP),
        _gpu(
            "H100-SXM-96GB-HBM2e",
            67 * H100_500W_CLOCK,
            989 * H100_500W_CLOCK,
            96,
            2400,
            tf32=494 * H100_500W_CLOCK,
            fp8=1979 * H100_500W_CLOCK,
            nvlink_sharp=NVLINK_SHARP,
        ),
        DeviceSpec(
            name="CPU",
            peak_flops={"float32": 0.5 * TERA, "float16": 0.1 * TERA, "bfloat16": 0.25 * TERA},
            memory_bytes=64 * GIGA,
            memory_bandwidth=20 * GIGA,
            matmul_efficiency=0.5,
            elementwise_efficiency=0.5,
            launch_overhead_s=20e-6,
            is_gpu=False,
        ),
    ]
}

ALIASES = {
    "A100": "A100-40GB",
    "V100-32GB": "V100",
    "H100-80GB": "H100",
    "H200-141GB": "H200",
    "H100-96GB": "H100-SXM-96GB-HBM2e",
}


def lookup(name: str) -> DeviceSpec | None:
    return CATALOG.get(ALIASES.get(name, name))
