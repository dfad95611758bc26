"""What the simulator knows about the machines, as arrays: devices `d` (`resources.all_devices`, node by
node), nodes `j`, their links, and device kinds `k` with the figures the roofline and memory model read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import collectives
from simulator.precision import Peaks, peaks
from stratagem.errors import InvalidResourceSpecError, Problem
from stratagem.ir import DeviceSpec, Node, ResourceSpec
from stratagem.ir.graph import OPTIMIZER_STATE_SLOTS, OptimizerSpec


@dataclass(frozen=True)
class DeviceKinds:
    """Per device kind k: the figures the roofline and memory model read (all from the resource spec)."""

    specs: list[DeviceSpec]
    peak_flops: np.ndarray
    """FLOP/s at the graph's dtype."""
    memory_bandwidth: np.ndarray
    matmul_efficiency: np.ndarray
    elementwise_efficiency: np.ndarray
    launch_overhead_s: np.ndarray
    memory_bytes: np.ndarray
    conv_efficiency: np.ndarray
    """Convolutions' fraction of peak (the spec's `conv_efficiency`, else `matmul_efficiency`)."""
    norm_efficiency: np.ndarray
    """Normalizations' fraction of memory bandwidth (the spec's `norm_efficiency`, else `elementwise_efficiency`)."""
    optimizer_efficiency: np.ndarray
    """The optimizer update's fraction of memory bandwidth (else `elementwise_efficiency`)."""
    stream_efficiency: np.ndarray
    """Plain streaming passes' fraction of memory bandwidth (else `elementwise_efficiency`)."""
    cast_efficiency: np.ndarray
    """Dtype conversions' fraction of memory bandwidth (else `elementwise_efficiency`)."""
    select_efficiency: np.ndarray
    """Top-k selection's fraction of memory bandwidth, per pass over its input (else `elementwise_efficiency`)."""
    full_select_efficiency: np.ndarray
    """The same where the runtime selects in one full `topk` (else `select_efficiency`)."""
    lowrank_efficiency: np.ndarray
    """PowerSGD's passes' fraction of memory bandwidth (else `elementwise_efficiency`)."""
    coalesce_efficiency: np.ndarray
    """Coalescing a sparse gradient's fraction of memory bandwidth (else `elementwise_efficiency`)."""
    scatter_efficiency: np.ndarray
    """Reduce-scatter's and all-gather's fraction of the link bandwidth all-reduce reaches (else 1)."""
    gather_efficiency: np.ndarray
    """An all-gather into one tensor per rank (sparse rows, top-k): its fraction of the link bandwidth (else 1)."""
    half_reduce_efficiency: np.ndarray
    """A half-precision all-reduce's speed per byte relative to fp32 (else 1)."""
    optimizer_tensor_s: np.ndarray
    """Seconds an update pays per tensor stepped, beyond its bytes (else 0)."""
    clip_tensor_s: np.ndarray
    """Seconds a gradient clip pays per tensor stepped, beyond its bytes (`_clip_tensor_seconds`)."""
    reduce_efficiency: np.ndarray
    """A reduce to one rank (a PS push): its speed per byte relative to the link's all-reduce bandwidth (else 1)."""
    broadcast_efficiency: np.ndarray
    """A broadcast from one rank (a PS pull): the same (else 1)."""
    lowrank_round_s: np.ndarray
    """A PowerSGD bucket's two dependent all-reduces beyond their bytes, seconds (else 0: two link latencies)."""
    comm_overlap: np.ndarray
    """Share of communication time that can hide behind compute on this kind (1: all of it)."""
    comm_latency_contention: np.ndarray
    """Latencies a collective running during compute takes from it beyond that share (0 on GPUs)."""
    is_gpu: np.ndarray
    """[K] whether the kind's ranks reduce through NCCL (GPUs) rather than gloo (CPUs)."""
    nvlink_sharp: np.ndarray
    """[K] NVLS all-reduce bus bandwidth over the ring's inside one node (0: no NVLink SHARP)."""
    peaks: Peaks
    """Matmul, convolution and attention peaks per precision (`simulator.precision`)."""


@dataclass(frozen=True)
class ServerPrice:
    """Per device d as a parameter server: what a byte or a round trip costs there (see `simulator.ps`)."""

    inv_nic: np.ndarray
    """Seconds per byte through its node's NIC."""
    inv_intra: np.ndarray
    """Seconds per byte over its node's intra-node link (pushes from its own node's workers)."""
    inv_rate: np.ndarray
    """Seconds per byte the optimizer update streams through its memory."""
    inv_coalesce: np.ndarray
    """Seconds per byte of coalescing sparse rows there (the pushes it receives, summed into one)."""
    tensor_s: np.ndarray
    """Seconds its update pays per tensor (a shard of a PS variable) beyond the bytes."""
    push_scale: np.ndarray
    """[M] per node, not per device: time per pushed byte through the node relative to its links'
    all-reduce bandwidth (1 / `reduce_efficiency` of its slowest kind; nodes are of one kind)."""
    pull_scale: np.ndarray
    """[M] the same per pulled byte (1 / `broadcast_efficiency`)."""
    latency: np.ndarray
    """Seconds of latency per shard round trip (push, then pull): 2α."""


@dataclass(frozen=True)
class DeviceArrays:
    """Per device d, node j and kind k."""

    devices: list[str]
    device_index: dict[str, int]
    compute_device_indices: np.ndarray
    """Indices of `resources.compute_devices`: where a default candidate places its replicas."""
    device_node: np.ndarray
    device_kind: np.ndarray
    device_is_gpu: np.ndarray
    node_starts: np.ndarray
    """[M] first device index of each node (devices are listed node by node)."""
    node_addresses: list[str]
    nic_bandwidth: np.ndarray
    """[M] bytes/s each node's NIC reaches (line rate x link efficiency)."""
    nic_latency: np.ndarray
    intra_bandwidth: np.ndarray
    intra_latency: np.ndarray
    intra_nvlink: np.ndarray
    """[M] whether the node's devices are joined by NVLink (NCCL's link class: LL128 and NVLS need it)."""
    nic_gbps: np.ndarray
    server_price: ServerPrice
    kinds: DeviceKinds
    kind_slowness: np.ndarray
    """[K] rank of each kind by the time it needs for the graph's compute (higher = slower)."""

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_nodes(self) -> int:
        return len(self.node_addresses)

    def per_node(self, per_device: np.ndarray) -> np.ndarray:
        """[N, D] -> [N, M]: sum each node's devices (no BLAS: it would spawn threads for tiny products)."""
        return np.add.reduceat(per_device, self.node_starts, axis=1)


UPDATE_PARAM_PASSES, UPDATE_STATE_PASSES = 3.0, 2.0
"""The bytes an optimizer update is counted: the parameter in and out and the gradient in (3 x parameter
bytes), and the optimizer state in and out (2 x state bytes); what a fused update moves."""
LOOP_UPDATE_KERNELS: dict[str, int] = {
    "sgd": 1,
    "momentum": 3,
    "adagrad": 4,
    "rmsprop": 5,
    "adam": 7,
    "adamw": 8,
    "lamb": 12,
}
"""Element-wise kernels a for-loop update launches per tensor (torch.optim's `_single_tensor_*` paths,
without weight decay for the L2 optimizers): SGD's `add_`; momentum's `mul_`, `add_` and the step; Adam's
`lerp_` for the first moment, `mul_` and `addcmul_` for the second, `sqrt`, `div` and `add_` for the
denominator and `addcdiv_` for the step, AdamW's decoupled decay beside them (transformers 4.12's `AdamW`
launches the same); LAMB's trust ratio adds two norms and their quotient."""
CLIP_PASSES = 3.0
"""Clipping to a global norm reads each gradient the rank steps for the norm, then reads and writes it to
scale it: torch's `clip_grad_norm_` (`_foreach_norm`, then `_foreach_mul_`), apex's `multi_tensor_l2norm`
and `multi_tensor_scale` (Megatron-LM's `--clip-grad`), DeepSpeed's norm and its combined unscale-and-clip.
The norm's cross-rank all-reduce is one scalar, a latency the step does not notice."""
CLIP_LOOP_KERNELS = 2
"""Kernels a clip launches per tensor without multi-tensor kernels: a norm and a scale (torch 1.x's
`clip_grad_norm_`, which transformers 4.12's Trainer ran beside its loop `AdamW`)."""
UNFUSED_UPDATE_BYTES: dict[str, float] = {
    "sgd": 12.0,
    "momentum": 32.0,
    "adagrad": 44.0,
    "rmsprop": 52.0,
    "adam": 72.0,
    "adamw": 80.0,
    "lamb": 88.0,
}
"""Bytes per fp32 parameter that the kernels of `LOOP_UPDATE_KERNELS` move, each reading its operands and
writing its result (the multi-tensor path runs the same kernels over lists): Adam's `lerp_` 12, `mul_` 8,
`addcmul_` 12, `sqrt`, `div` and `add_` 8 each, `addcdiv_` 16; AdamW's decay 8 more; momentum's `mul_` 8
and two `add_` 12 each. A fused update moves the counted 3 x parameter + 2 x state bytes (28 for Adam), so
an unfused Adam moves 72 / 28 = 2.6 times what it is counted. An H200's calibration timed PyTorch's
default (foreach) Adam at 0.197 of its measured bandwidth on the counted bytes, where its element-wise
kernels reached 0.643: 0.643 x 28 / 72 = 0.25 prices it (benchmarks/results/gpu_one_rank_h200.json)."""


@dataclass(frozen=True)
class UpdateKernels:
    """How the graph's optimizer update runs (`OptimizerSpec.implementation`), as the kinds price it."""

    loop: bool
    """One tensor at a time (`for-loop`, or a parameter group holding a sparse gradient)."""
    fused: bool
    """One kernel over the counted bytes."""
    loop_kernels: int
    """Element-wise kernels the loop launches per tensor (`LOOP_UPDATE_KERNELS`)."""
    counted_share: float
    """The counted bytes over the bytes the unfused kernels move (28 / 72 for Adam)."""

    @classmethod
    def of(cls, optimizer: OptimizerSpec, *, sparse: bool) -> UpdateKernels:
        counted = UPDATE_PARAM_PASSES * 4.0 + UPDATE_STATE_PASSES * 4.0 * OPTIMIZER_STATE_SLOTS[optimizer.kind]
        return cls(
            loop=optimizer.implementation == "for-loop" or sparse,
            fused=optimizer.implementation == "fused" and not sparse,
            loop_kernels=LOOP_UPDATE_KERNELS[optimizer.kind],
            counted_share=counted / UNFUSED_UPDATE_BYTES[optimizer.kind],
        )


def kinds_of(resources: ResourceSpec, dtype: str, update: UpdateKernels) -> tuple[DeviceKinds, np.ndarray]:
    """The device kinds of the cluster's devices, and each device's kind index."""
    kind_names, device_kind = _device_kinds(resources, resources.all_devices)
    return _kinds_table(resources, kind_names, dtype, update), device_kind


def device_arrays(
    resources: ResourceSpec, kinds: DeviceKinds, device_kind: np.ndarray, *, total_flops: float
) -> DeviceArrays:
    """`total_flops` (the graph's forward and backward) ranks the kinds by how long they compute."""
    devices = resources.all_devices
    node_of = {node.address: j for j, node in enumerate(resources.nodes)}
    compute = set(resources.compute_devices)
    device_node = np.array([node_of[d.rsplit(":", 2)[0]] for d in devices], dtype=np.intp)
    links = _link_arrays(resources)
    rate = kinds.memory_bandwidth[device_kind] * kinds.optimizer_efficiency[device_kind]
    server_price = ServerPrice(
        inv_nic=1.0 / links["nic_bandwidth"][device_node],
        inv_intra=1.0 / links["intra_bandwidth"][device_node],
        inv_rate=1.0 / rate,
        inv_coalesce=1.0 / (kinds.memory_bandwidth[device_kind] * kinds.coalesce_efficiency[device_kind]),
        latency=np.asarray(collectives.ps_push_pull(links["nic_latency"][device_node])),
        tensor_s=kinds.optimizer_tensor_s[device_kind],
        push_scale=_node_max(device_node, 1.0 / kinds.reduce_efficiency[device_kind], len(resources.nodes)),
        pull_scale=_node_max(device_node, 1.0 / kinds.broadcast_efficiency[device_kind], len(resources.nodes)),
    )
    flops_time = total_flops / (kinds.peak_flops * kinds.matmul_efficiency)
    return DeviceArrays(
        devices=devices,
        device_index={d: i for i, d in enumerate(devices)},
        compute_device_indices=np.array([i for i, d in enumerate(devices) if d in compute], dtype=np.intp),
        device_node=device_node,
        device_kind=device_kind,
        device_is_gpu=np.array([":GPU:" in d for d in devices]),
        node_starts=np.searchsorted(device_node, np.arange(len(resources.nodes))),
        node_addresses=[node.address for node in resources.nodes],
        server_price=server_price,
        kinds=kinds,
        kind_slowness=np.argsort(np.argsort(flops_time, kind="stable"), kind="stable"),
        **links,
    )


def _device_kind_name(resources: ResourceSpec, node: Node, device: str) -> str:
    """A CPU-only node may name a kind of its own in `devices` (as calibration writes); else CPU."""
    if ":GPU:" in device:
        return node.device
    if not node.gpus and node.device in resources.devices:
        return node.device
    return "CPU"


def _tensor_seconds(spec: DeviceSpec, update: UpdateKernels) -> float:
    """Seconds an update pays per tensor beyond its bytes: the loop figure calibration measured; on a GPU
    without one, a for-loop update's kernels, each as long as the host takes to issue it (they are far
    shorter on the device); else the kind's multi-tensor figure (0 on a GPU)."""
    if update.loop and spec.optimizer_loop_tensor_s is not None:
        return spec.optimizer_loop_tensor_s
    if update.loop and spec.is_gpu:
        return update.loop_kernels * spec.launch_overhead_s
    return spec.optimizer_tensor_s or 0.0


def _clip_tensor_seconds(spec: DeviceSpec, update: UpdateKernels) -> float:
    """A clip beside a for-loop update on a GPU launches its norm and its scale per tensor, each as long as
    the host takes to issue it. Beside a multi-tensor or fused update it runs multi-tensor kernels, as
    torch's `clip_grad_norm_` and this runtime do on a GPU and a CPU alike, whose per-tensor cost a step
    does not notice. A CPU runs each op in the caller's thread, so it has no launches to price: on these
    CPUs the runtime clips a zoo model's 12-53 gradients in 0.10-0.16 ms, a loop of a norm and a scale per
    tensor in 0.8 of that, and the catalog CPU prices 0.16-0.51 ms on bytes alone (`benchmarks.clip_cost`)."""
    if update.loop and spec.is_gpu:
        return CLIP_LOOP_KERNELS * spec.launch_overhead_s
    return 0.0


def _update_efficiency(spec: DeviceSpec, update: UpdateKernels) -> float:
    """Fraction of bandwidth an update reaches on its counted bytes: a fused update is one element-wise
    pass over them; an unfused one runs at the kind's measured figure, else, on a GPU, at the element-wise
    rate over the bytes its kernels move (each kernel streams its operands from memory). A CPU's passes
    over a small tensor hit its caches, and `optimizer_knee_bytes` prices the tensors that do not."""
    if update.fused:
        return spec.elementwise_efficiency
    if spec.optimizer_efficiency is not None:
        return spec.optimizer_efficiency
    if spec.is_gpu:
        return spec.elementwise_efficiency * update.counted_share
    return spec.elementwise_efficiency


def _device_kinds(resources: ResourceSpec, devices: list[str]) -> tuple[list[str], np.ndarray]:
    names: list[str] = []
    kind = np.zeros(len(devices), dtype=np.intp)
    for i, device in enumerate(devices):
        name = _device_kind_name(resources, resources.node_of(device), device)
        if name not in names:
            names.append(name)
        kind[i] = names.index(name)
    return names, kind


def _kinds_table(resources: ResourceSpec, names: list[str], dtype: str, update: UpdateKernels) -> DeviceKinds:
    """The kinds' figures as arrays. A graph whose optimizer runs one tensor at a time (`for-loop`), or
    with a sparse gradient (PyTorch's multi-tensor optimizers fall back to the loop for a parameter group
    holding one), pays the kind's loop figure per tensor (`_tensor_seconds`); a fused update streams its
    bytes at the element-wise rate (`_update_efficiency`)."""
    specs = []
    for i, name in enumerate(names):
        try:
            specs.append(resources.device_spec(name))
        except KeyError:
            raise InvalidResourceSpecError(
                [Problem(f"devices.{name}", f"unknown device kind {name!r} (kind {i})")]
            ) from None
    return DeviceKinds(
        specs=specs,
        peak_flops=np.array([s.flops_for(dtype) for s in specs]),
        memory_bandwidth=np.array([s.memory_bandwidth for s in specs]),
        matmul_efficiency=np.array([s.matmul_efficiency for s in specs]),
        elementwise_efficiency=np.array([s.elementwise_efficiency for s in specs]),
        launch_overhead_s=np.array([s.launch_overhead_s for s in specs]),
        memory_bytes=np.array([s.memory_bytes for s in specs]),
        conv_efficiency=np.array([s.conv_efficiency or s.matmul_efficiency for s in specs]),
        norm_efficiency=np.array([s.norm_efficiency or s.elementwise_efficiency for s in specs]),
        optimizer_efficiency=np.array([_update_efficiency(s, update) for s in specs]),
        stream_efficiency=np.array([s.stream_efficiency or s.elementwise_efficiency for s in specs]),
        cast_efficiency=np.array([s.cast_efficiency or s.elementwise_efficiency for s in specs]),
        select_efficiency=np.array([s.select_efficiency or s.elementwise_efficiency for s in specs]),
        full_select_efficiency=np.array(
            [s.full_select_efficiency or s.select_efficiency or s.elementwise_efficiency for s in specs]
        ),
        lowrank_efficiency=np.array([s.lowrank_efficiency or s.elementwise_efficiency for s in specs]),
        coalesce_efficiency=np.array([s.coalesce_efficiency or s.elementwise_efficiency for s in specs]),
        scatter_efficiency=np.array([s.scatter_efficiency or 1.0 for s in specs]),
        gather_efficiency=np.array([s.gather_efficiency or 1.0 for s in specs]),
        half_reduce_efficiency=np.array([s.half_reduce_efficiency or 1.0 for s in specs]),
        optimizer_tensor_s=np.array([_tensor_seconds(s, update) for s in specs]),
        clip_tensor_s=np.array([_clip_tensor_seconds(s, update) for s in specs]),
        reduce_efficiency=np.array([s.reduce_efficiency or 1.0 for s in specs]),
        broadcast_efficiency=np.array([s.broadcast_efficiency or 1.0 for s in specs]),
        lowrank_round_s=np.array([s.lowrank_round_s or 0.0 for s in specs]),
        comm_overlap=np.array([s.comm_overlap for s in specs]),
        comm_latency_contention=np.array([s.comm_latency_contention for s in specs]),
        is_gpu=np.array([s.is_gpu for s in specs], dtype=bool),
        nvlink_sharp=np.array([s.nvlink_sharp or 0.0 for s in specs]),
        peaks=peaks(specs, dtype),
    )


def _node_max(device_node: np.ndarray, values: np.ndarray, nodes: int) -> np.ndarray:
    """[M] the largest of each node's per-device `values`."""
    out = np.zeros(nodes)
    np.maximum.at(out, device_node, values)
    return out


def _link_arrays(resources: ResourceSpec) -> dict[str, np.ndarray]:
    nics = [resources.nic(node) for node in resources.nodes]
    intra = [resources.intra_link(node) for node in resources.nodes]
    return {
        "nic_bandwidth": np.array([link.bytes_per_s for link in nics]),
        "nic_latency": np.array([link.latency_s for link in nics]),
        "nic_gbps": np.array([link.bandwidth_gbps for link in nics]),
        "intra_bandwidth": np.array([link.bytes_per_s for link in intra]),
        "intra_latency": np.array([link.latency_s for link in intra]),
        "intra_nvlink": np.array([link.kind == "nvlink" for link in intra], dtype=bool),
    }
