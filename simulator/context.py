"""Compile a (graph, cluster) pair once into arrays, so each candidate costs numpy work, not Python.

Everything the engine needs about the model and the machines is here, indexed the way
`simulator.encoding` documents: variables `v` (trainable, graph order), layers `l` (forward order),
devices `d` (`resources.all_devices`), nodes `j`, and device kinds `k`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator import collectives
from simulator.compression import CompressionTables, VariableFigures, tables
from stratagem.errors import InvalidResourceSpecError, Problem
from stratagem.ir import DeviceSpec, Layer, LayerKind, ModelGraph, Node, ResourceSpec, TensorParallelLayer, Variable
from stratagem.tensor_plan import tensor_plan

MATMUL_KINDS = frozenset({LayerKind.matmul, LayerKind.conv, LayerKind.attention})
"""Layers whose arithmetic runs at the device's matmul efficiency."""
TENSOR_SPLIT_KINDS = MATMUL_KINDS | {LayerKind.embedding}
"""Layers Megatron-style tensor parallelism splits across the tensor group (work, weights, activations)."""
ROOT_LAYERS = ("<root>", "<loss>")
"""Capture's names for operations of the model's own forward and of the loss."""
UPDATE_PARAM_PASSES, UPDATE_STATE_PASSES = 3.0, 2.0
"""An optimizer update streams the parameter in and out and the gradient in (3 x parameter bytes), and
the optimizer state in and out (2 x state bytes)."""
SPARSE_INDEX_BYTES = 8.0
"""A sparse gradient's row index is an int64, on the wire and in a coalesce."""
SPARSE_STEP_COALESCES: dict[str, float] = {"sgd": 1.0}
"""What a sparse optimizer step costs beyond its update passes, in coalesces of its rows, by optimizer.
Plain SGD sorts the rows and adds them into the parameter: one (measured 0.8-1.1 on tables of 32 to 256
floats, session 11). Others cost `ADAPTIVE_SPARSE_STEP_COALESCES`."""
ADAPTIVE_SPARSE_STEP_COALESCES = 2.0
"""Adagrad sorts the gradient's rows, adds their square into the state, gathers the state back at those
rows (another sort) and adds the step into the parameter. On DLRM's four tables (session 11) these
steps took 5.2 ms alone on one rank, about two of the coalesces its block's calibration priced at 2.5 ms."""
COALESCE_PROBE_ROW_BYTES = 32 * 4 + SPARSE_INDEX_BYTES
"""A row of the calibration's coalesce probe (`stratagem.calibrate`, rows of 32 floats) and its index:
the bytes its rate is counted in."""


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
class SimContext:
    """A compiled (graph, resources) pair. Build it with `compile_context`; never mutate it."""

    graph: ModelGraph
    resources: ResourceSpec
    variable_names: list[str]
    variable_index: dict[str, int]
    layer_names: list[str]
    layer_index: dict[str, int]
    devices: list[str]
    device_index: dict[str, int]
    compute_device_indices: np.ndarray
    """Indices of `resources.compute_devices`: where a default candidate places its replicas."""
    # devices and nodes
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
    nic_gbps: np.ndarray
    server_price: ServerPrice
    kinds: DeviceKinds
    kind_slowness: np.ndarray
    """[K] rank of each kind by the time it needs for the graph's compute (higher = slower)."""
    # variables
    var_bytes: np.ndarray
    var_numel: np.ndarray
    var_rows: np.ndarray
    var_cols: np.ndarray
    var_itemsize: np.ndarray
    var_ps_bytes: np.ndarray
    """Bytes a PS push (or pull) of the variable moves: the rows looked up for sparse ones, capped by the table."""
    var_sparse: np.ndarray
    var_tensor_split: np.ndarray
    var_layer: np.ndarray
    """The layer whose backward makes the gradient ready (the earliest user in forward order)."""
    var_shape: np.ndarray
    """[V, R] the shape padded with 1s, for partition checks."""
    var_update_bytes: np.ndarray
    """[V] bytes an update of the variable streams (3 x parameter + 2 x state: param and state in and
    out, grad in), times the device's large-tensor factor (`DeviceSpec.optimizer_knee_bytes`). A sparse
    variable's gradient holds only the rows looked up, and optimizers that take sparse gradients
    update only those rows, on a replica or on its server alike: its share is the touched rows'."""
    var_coalesce_bytes: np.ndarray
    """[V] bytes of the variable's touched rows, values and int64 index: what one rank's share of a row
    exchange carries (0 for dense variables)."""
    var_coalesce_work: np.ndarray
    """[V] what coalescing those rows costs, in bytes at the device's coalesce rate (`_coalesce_work`)."""
    ps_held_bytes: np.ndarray
    """[V] bytes a PS server holds for the variable (parameters and optimizer state)."""
    var_state_bytes: np.ndarray
    order: np.ndarray
    """Variables in the order their gradients become ready (backward order)."""
    ready_position: np.ndarray
    """[V] position of each variable in `order` (its rank in gradient-ready order)."""
    figures: VariableFigures
    compression: CompressionTables
    # layers
    fwd_flops: np.ndarray
    bwd_flops: np.ndarray
    bytes_moved: np.ndarray
    activation_bytes: np.ndarray
    output_bytes: np.ndarray
    layer_matmul: np.ndarray
    layer_conv: np.ndarray
    """Convolution layers (they compute at the kind's `conv_efficiency`)."""
    layer_norm: np.ndarray
    """Normalization layers (they stream memory at the kind's `norm_efficiency`)."""
    layer_embedding: np.ndarray
    """Embedding lookups: a gather, which copies rows (at the kind's `stream_efficiency`)."""
    layer_tensor_split: np.ndarray
    layer_tp_allreduce: np.ndarray
    """Matmul layers that end a Megatron column/row pair: they all-reduce their output in each pass."""
    layer_sharded_input: np.ndarray
    """Layers that read activations a tensor split left sharded (between a column- and a row-parallel
    matmul: attention cores, activations, the row-parallel matmul itself): their saved activations, and
    an element-wise layer's work, are 1/T per rank. Inputs of column-parallel matmuls stay whole."""
    layer_recomputed: np.ndarray
    """Layers inside a numbered block (`blocks.3.*`, `2.*`): with recomputation their forward runs again
    in backward and only the block's input is kept."""
    unit_starts: np.ndarray
    """First layer of each unit (a numbered block or another top-level module); pipelines cut between them."""
    recompute_kept: np.ndarray
    """[L] bytes kept under recomputation: a block's input at its first layer, 0 for its other layers,
    the saved activations of any layer outside the blocks."""
    layer_frozen_bytes: np.ndarray
    """Bytes of non-trainable variables per layer (memory only)."""
    layer_grad_fill_bytes: np.ndarray
    """[L] bytes of the dense gradients an embedding layer's backward materialises: autograd writes a
    table-sized gradient of zeros, then adds the looked-up rows into it (trainable tables without sparse
    gradients; 0 elsewhere)."""
    batch_size: int
    state_bytes_per_param: float
    update_per_variable: bool
    """A device kind's `optimizer_knee_bytes` (update cost depends on each tensor's size) or a sparse
    variable (only its touched rows update) makes updates differ from parameter and state bytes, so
    they are summed from `var_update_bytes`."""
    _layer_time_cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _tiles: dict[tuple[str, int], np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _tensor_plans: dict[int, list[TensorParallelLayer]] = field(default_factory=dict, repr=False, compare=False)

    def tensor_plan(self, degree: int) -> list[TensorParallelLayer]:
        """The splits this simulator assumes for a tensor degree, as a Strategy names them (cached)."""
        plan = self._tensor_plans.get(degree)
        if plan is None:
            plan = self._tensor_plans[degree] = tensor_plan(self.graph, self.layer_tp_allreduce.tolist(), degree)
        return list(plan)

    def ready_position_tile(self, n: int) -> np.ndarray:
        """`ready_position` repeated for n candidates, flat [n·V] (cached; do not modify)."""
        return self._tile("ready_position", n)

    def var_bytes_tile(self, n: int) -> np.ndarray:
        """`var_bytes` repeated for n candidates, flat [n·V] (cached; copy before modifying)."""
        return self._tile("var_bytes", n)

    def _tile(self, name: str, n: int) -> np.ndarray:
        tile = self._tiles.get((name, n))
        if tile is None:
            tile = np.tile(getattr(self, name), n)
            tile.flags.writeable = False
            if len(self._tiles) > 16:
                self._tiles.clear()
            self._tiles[(name, n)] = tile
        return tile

    @property
    def num_variables(self) -> int:
        return len(self.variable_names)

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_nodes(self) -> int:
        return len(self.node_addresses)

    def per_node(self, per_device: np.ndarray) -> np.ndarray:
        """[N, D] -> [N, M]: sum each node's devices (no BLAS: it would spawn threads for tiny products)."""
        return np.add.reduceat(per_device, self.node_starts, axis=1)

    def var_axis_length(self, axis: np.ndarray) -> np.ndarray:
        """Length of `axis` for each variable ([N, V] axes in, [N, V] lengths out; 1 beyond the rank)."""
        clipped = np.clip(axis.astype(np.intp), 0, self.var_shape.shape[1] - 1)
        return np.take_along_axis(
            np.broadcast_to(self.var_shape, (*axis.shape, self.var_shape.shape[1])), clipped[..., None], axis=-1
        )[..., 0]


def compile_context(graph: ModelGraph, resources: ResourceSpec) -> SimContext:
    """Everything per-graph and per-cluster, computed once; candidates then cost only array work."""
    devices = resources.all_devices
    node_of = {node.address: j for j, node in enumerate(resources.nodes)}
    kind_names, device_kind = _device_kinds(resources, devices)
    kinds = _kinds_table(resources, kind_names, graph.dtype.value, sparse=any(v.sparse for v in graph.variables))
    layers = _layer_arrays(graph)
    variables = _variable_arrays(graph, layers["index"])
    variables["var_coalesce_work"] = _coalesce_work(
        variables["var_coalesce_bytes"], variables["var_bytes"] / variables["var_rows"], kinds
    )
    variables["var_update_bytes"] = variables["var_update_bytes"] * _update_scale(
        kinds, variables["var_ps_bytes"]
    ) + variables["var_coalesce_work"] * _coalesce_in_update_bytes(kinds, graph.optimizer.kind)
    lowrank_knees = [spec.lowrank_knee_bytes for spec in kinds.specs if spec.lowrank_knee_bytes]
    variables["compression"] = (
        variables["compression"]
        .with_streaming_scale(_update_scale(kinds, variables["var_bytes"]))
        .with_lowrank_scale(_size_scale(lowrank_knees, variables["var_bytes"]))
    )
    compute = set(resources.compute_devices)
    device_node = np.array([node_of[d.rsplit(":", 2)[0]] for d in devices], dtype=np.intp)
    node_starts = np.searchsorted(device_node, np.arange(len(resources.nodes)))
    links = _link_arrays(resources)
    rate = kinds.memory_bandwidth[device_kind] * kinds.optimizer_efficiency[device_kind]
    server_price = ServerPrice(
        inv_nic=1.0 / links["nic_bandwidth"][device_node],
        inv_intra=1.0 / links["intra_bandwidth"][device_node],
        inv_rate=1.0 / rate,
        inv_coalesce=1.0 / (kinds.memory_bandwidth[device_kind] * kinds.coalesce_efficiency[device_kind]),
        latency=collectives.ps_push_pull(links["nic_latency"][device_node]),
        tensor_s=kinds.optimizer_tensor_s[device_kind],
        push_scale=_node_max(device_node, 1.0 / kinds.reduce_efficiency[device_kind], len(resources.nodes)),
        pull_scale=_node_max(device_node, 1.0 / kinds.broadcast_efficiency[device_kind], len(resources.nodes)),
    )
    flops_time = (layers["fwd_flops"].sum() + layers["bwd_flops"].sum()) / (kinds.peak_flops * kinds.matmul_efficiency)
    return SimContext(
        graph=graph,
        resources=resources,
        variable_names=variables["names"],
        variable_index={n: i for i, n in enumerate(variables["names"])},
        layer_names=[layer.name for layer in graph.layers],
        layer_index=layers["index"],
        devices=devices,
        device_index={d: i for i, d in enumerate(devices)},
        compute_device_indices=np.array([i for i, d in enumerate(devices) if d in compute], dtype=np.intp),
        device_node=device_node,
        device_kind=device_kind,
        device_is_gpu=np.array([":GPU:" in d for d in devices]),
        node_starts=node_starts,
        node_addresses=[node.address for node in resources.nodes],
        server_price=server_price,
        kinds=kinds,
        kind_slowness=np.argsort(np.argsort(flops_time, kind="stable"), kind="stable"),
        **links,
        **{k: v for k, v in variables.items() if k != "names"},
        **{k: v for k, v in layers.items() if k != "index"},
        batch_size=graph.batch_size,
        state_bytes_per_param=graph.optimizer.state_bytes_per_param,
        update_per_variable=any(spec.optimizer_knee_bytes for spec in kinds.specs)
        or bool(variables["var_sparse"].any()),
    )


def _device_kind_name(resources: ResourceSpec, node: Node, device: str) -> str:
    """A CPU-only node may name a kind of its own in `devices` (as calibration writes); else CPU."""
    if ":GPU:" in device:
        return node.device
    if not node.gpus and node.device in resources.devices:
        return node.device
    return "CPU"


def _tensor_seconds(spec: DeviceSpec, sparse: bool) -> float:
    if sparse and spec.optimizer_loop_tensor_s is not None:
        return spec.optimizer_loop_tensor_s
    return spec.optimizer_tensor_s or 0.0


def _device_kinds(resources: ResourceSpec, devices: list[str]) -> tuple[list[str], np.ndarray]:
    names: list[str] = []
    kind = np.zeros(len(devices), dtype=np.intp)
    for i, device in enumerate(devices):
        name = _device_kind_name(resources, resources.node_of(device), device)
        if name not in names:
            names.append(name)
        kind[i] = names.index(name)
    return names, kind


def _kinds_table(resources: ResourceSpec, names: list[str], dtype: str, *, sparse: bool = False) -> DeviceKinds:
    """The kinds' figures as arrays. A graph with a sparse gradient updates every tensor through the
    optimizer's per-tensor loop (PyTorch's multi-tensor optimizers fall back to it for a parameter group
    holding a sparse gradient), so its per-tensor cost is the kind's loop figure where one was measured."""
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
        optimizer_efficiency=np.array([s.optimizer_efficiency or s.elementwise_efficiency for s in specs]),
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
        optimizer_tensor_s=np.array([_tensor_seconds(s, sparse) for s in specs]),
        reduce_efficiency=np.array([s.reduce_efficiency or 1.0 for s in specs]),
        broadcast_efficiency=np.array([s.broadcast_efficiency or 1.0 for s in specs]),
        lowrank_round_s=np.array([s.lowrank_round_s or 0.0 for s in specs]),
        comm_overlap=np.array([s.comm_overlap for s in specs]),
        comm_latency_contention=np.array([s.comm_latency_contention for s in specs]),
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
    }


def _layer_arrays(graph: ModelGraph) -> dict:
    layers = graph.layers
    index = {layer.name: i for i, layer in enumerate(layers)}
    matmul = np.array([layer.kind in MATMUL_KINDS for layer in layers], dtype=bool)
    frozen = np.zeros(len(layers))
    by_name = {v.name: v for v in graph.variables}
    for i, layer in enumerate(layers):
        frozen[i] = sum(by_name[n].nbytes for n in layer.variables if not by_name[n].trainable)
    row_parallel = _row_parallel(graph, index, matmul)
    split = np.array([_splits(layer, graph) for layer in layers], dtype=bool)
    units = [layer_unit(layer.name) for layer in layers]
    recomputed = np.array([_numbered(unit) for unit in _carried(units)], dtype=bool)
    starts = _unit_starts(units)
    output = np.array([layer.output_bytes for layer in layers], dtype=float)
    activations = np.array([layer.activation_bytes for layer in layers], dtype=float)
    first = np.zeros(len(layers), dtype=bool)
    first[starts] = True
    block_input = np.r_[0.0, output[:-1]] if len(layers) else output
    kept = np.where(recomputed, np.where(first, block_input, 0.0), activations)
    return {
        "index": index,
        "fwd_flops": np.array([layer.fwd_flops for layer in layers], dtype=float),
        "bwd_flops": np.array([layer.bwd_flops for layer in layers], dtype=float),
        "bytes_moved": np.array([layer.bytes_moved for layer in layers], dtype=float),
        "activation_bytes": np.array([layer.activation_bytes for layer in layers], dtype=float),
        "output_bytes": np.array([layer.output_bytes for layer in layers], dtype=float),
        "layer_matmul": matmul,
        "layer_conv": np.array([layer.kind == LayerKind.conv for layer in layers], dtype=bool),
        "layer_norm": np.array([layer.kind == LayerKind.norm for layer in layers], dtype=bool),
        "layer_embedding": np.array([layer.kind == LayerKind.embedding for layer in layers], dtype=bool),
        "layer_tensor_split": split,
        "layer_tp_allreduce": row_parallel,
        "layer_sharded_input": _sharded_inputs(graph, index, split & matmul & ~row_parallel, row_parallel),
        "layer_recomputed": recomputed,
        "unit_starts": starts,
        "recompute_kept": kept,
        "layer_frozen_bytes": frozen,
        "layer_grad_fill_bytes": np.array([_grad_fill_bytes(layer, graph) for layer in layers], dtype=float),
    }


def _dense_tables(layer: Layer, graph: ModelGraph) -> list[Variable]:
    """An embedding layer's trainable tables whose gradients are dense (no `sparse` lookups)."""
    if layer.kind != LayerKind.embedding:
        return []
    tables = [graph.variable(n) for n in layer.variables]
    return [v for v in tables if v.trainable and not v.sparse]


def _splits(layer: Layer, graph: ModelGraph) -> bool:
    """Whether tensor parallelism divides the layer. Embeddings split by vocabulary only where every
    table is trainable with dense gradients, as the runtime's plan splits them (`stratagem.tensor_plan`):
    a frozen table (fixed positions) or a sparse one stays whole on every rank."""
    if layer.kind != LayerKind.embedding:
        return layer.kind in TENSOR_SPLIT_KINDS
    return bool(layer.variables) and len(_dense_tables(layer, graph)) == len(layer.variables)


def _grad_fill_bytes(layer: Layer, graph: ModelGraph) -> float:
    return float(sum(v.nbytes for v in _dense_tables(layer, graph)))


def _row_parallel(graph: ModelGraph, index: dict[str, int], matmul: np.ndarray) -> np.ndarray:
    """Megatron splits a column-parallel matmul (widens) and a row-parallel one (narrows back) and
    all-reduces only the latter's output. A matmul whose output is no wider than its input is taken
    as row-parallel. Separate q/k/v projections are over-counted by this rule (see docs)."""
    out = np.zeros(len(graph.layers), dtype=bool)
    for i, layer in enumerate(graph.layers):
        if not matmul[i] or layer.kind == LayerKind.attention:
            continue
        inputs = sum(graph.layers[index[name]].output_bytes for name in layer.inputs)
        out[i] = bool(layer.inputs) and 0 < layer.output_bytes <= inputs
    return out


def layer_unit(name: str) -> str | None:
    """The unit a layer belongs to: its outermost numbered module (`blocks.3`, `2`) or its top-level
    module; None for operations of the model itself or of the loss, which join the unit before them."""
    head = name.split("/")[0]
    if head in ROOT_LAYERS:
        return None
    parts = head.split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: k + 1])
    return parts[0]


def _carried(units: list[str | None]) -> list[str | None]:
    """Units with root operations joined to the unit before them."""
    out, current = [], None
    for unit in units:
        current = unit if unit is not None else current
        out.append(current)
    return out


def _numbered(unit: str | None) -> bool:
    return unit is not None and unit.rsplit(".", 1)[-1].isdigit()


def _unit_starts(units: list[str | None]) -> np.ndarray:
    starts, current = [], None
    for i, unit in enumerate(units):
        if unit is not None and unit != current:
            starts.append(i)
            current = unit
    return np.array(starts or [0], dtype=np.intp)


def _sharded_inputs(graph: ModelGraph, index: dict[str, int], column: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Follow sharded activations forward: a column-parallel matmul's output is sharded, a row-parallel
    one's is whole again (all-reduced), and any other layer's output is sharded when all its inputs are."""
    sharded_output = np.zeros(len(graph.layers), dtype=bool)
    sharded_input = np.zeros(len(graph.layers), dtype=bool)
    for i, layer in enumerate(graph.layers):
        sources = [index[name] for name in layer.inputs]
        sharded_input[i] = bool(sources) and all(sharded_output[j] for j in sources)
        sharded_output[i] = bool(column[i]) or (sharded_input[i] and not row[i])
    return sharded_input


def _coalesce_in_update_bytes(kinds: DeviceKinds, optimizer: str) -> float:
    """Update bytes that cost as much as a sparse optimizer step's work per coalesced byte of its rows
    (`SPARSE_STEP_COALESCES`), priced at the update's rate as `var_update_bytes` is; with several
    kinds, the largest ratio."""
    coalesces = SPARSE_STEP_COALESCES.get(optimizer, ADAPTIVE_SPARSE_STEP_COALESCES)
    return coalesces * float((kinds.optimizer_efficiency / kinds.coalesce_efficiency).max())


def _coalesce_work(nbytes: np.ndarray, row_bytes: np.ndarray, kinds: DeviceKinds) -> np.ndarray:
    """[V] bytes at the coalesce rate that coalescing each variable's touched rows (`nbytes` of values and
    indices) costs. A coalesce sorts one index per row and moves the row's values; on the probe's narrow
    rows the sort is most of the time, so wider rows pay their extra bytes at the element-wise rate, not
    the probe's (an embedding of 256 floats coalesced 4096 rows in 0.92 ms, rows of 32 in 0.34 ms,
    session 11). With several kinds, the largest share of a byte's cost (`coalesce / elementwise`)."""
    share = float(np.clip((kinds.coalesce_efficiency / kinds.elementwise_efficiency).max(), 0.0, 1.0))
    rows = nbytes / (row_bytes + SPARSE_INDEX_BYTES)
    return rows * (COALESCE_PROBE_ROW_BYTES * (1.0 - share) + (row_bytes + SPARSE_INDEX_BYTES) * share)


def _update_scale(kinds: DeviceKinds, nbytes: np.ndarray) -> np.ndarray:
    """[V] how much more an update costs per byte for each variable than for a small tensor,
    `1 + bytes / optimizer_knee_bytes` (a sparse variable's server updates only the rows pushed, so
    PS updates pass their pushed bytes); with several device kinds, the largest (kinds mix rarely, and
    the slowest paces the step)."""
    return _size_scale([spec.optimizer_knee_bytes for spec in kinds.specs if spec.optimizer_knee_bytes], nbytes)


def _size_scale(knees: list[float], nbytes: np.ndarray) -> np.ndarray:
    """[V] `1 + bytes / knee` with the smallest knee of the kinds that have one (1 when none has)."""
    if not knees:
        return np.ones_like(nbytes)
    return 1.0 + nbytes / min(knees)


def _variable_arrays(graph: ModelGraph, layer_index: dict[str, int]) -> dict:
    users: dict[str, int] = {}
    for i, layer in enumerate(graph.layers):
        for name in layer.variables:
            users.setdefault(name, i)
    trainable = graph.trainable_variables
    rank = max([len(v.shape) for v in trainable] + [1])
    shape = np.ones((len(trainable), rank), dtype=np.int64)
    for i, var in enumerate(trainable):
        shape[i, : len(var.shape)] = var.shape
    layer_of = np.array(
        [layer_index[v.consumer] if v.consumer else users.get(v.name, 0) for v in trainable], dtype=np.intp
    )
    nbytes = np.array([v.nbytes for v in trainable], dtype=float)
    numel = np.array([v.numel for v in trainable], dtype=float)
    itemsize = np.array([v.dtype.itemsize for v in trainable], dtype=float)
    rows = np.array([v.shape[0] if v.shape else 1 for v in trainable], dtype=float)
    ps_bytes = np.array(
        [min(v.nbytes, (v.lookups_per_step or 0) * v.row_bytes) if v.sparse else v.nbytes for v in trainable],
        dtype=float,
    )
    split = np.array([bool(graph.layers) and _splits(graph.layers[int(li)], graph) for li in layer_of], dtype=bool)
    state = numel * graph.optimizer.state_bytes_per_param
    sparse = np.array([v.sparse for v in trainable], dtype=bool)
    # Backward runs layers in reverse; a stable sort on -layer keeps graph order among a layer's variables.
    order = np.argsort(-layer_of, kind="stable")
    return {
        "names": [v.name for v in trainable],
        "var_bytes": nbytes,
        "var_numel": numel,
        "var_rows": rows,
        "var_cols": numel / rows,
        "var_itemsize": itemsize,
        "var_ps_bytes": ps_bytes,
        "var_sparse": sparse,
        "var_tensor_split": split,
        "var_layer": layer_of,
        "var_shape": shape,
        "var_update_bytes": (UPDATE_PARAM_PASSES * nbytes + UPDATE_STATE_PASSES * state) * ps_bytes / nbytes,
        "var_coalesce_bytes": np.where(sparse, ps_bytes * (1.0 + SPARSE_INDEX_BYTES * rows / nbytes), 0.0),
        "ps_held_bytes": nbytes + state,
        "var_state_bytes": state,
        "order": order,
        "ready_position": np.argsort(order).astype(np.int32),
        "figures": VariableFigures(nbytes, numel, rows, numel / rows, itemsize),
        "compression": tables(VariableFigures(nbytes, numel, rows, numel / rows, itemsize)),
    }
