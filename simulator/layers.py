"""What the simulator knows about each layer `l` of the graph (forward order), as arrays.

Work (FLOPs and bytes), activations, the kind of kernel a layer runs, how tensor parallelism splits
it (Megatron's column/row pairs), and the units a pipeline cuts between and recomputation repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.kernels import KernelArrays, kernel_arrays
from stratagem.ir import Layer, LayerKind, ModelGraph, Variable

MATMUL_KINDS = frozenset({LayerKind.matmul, LayerKind.conv, LayerKind.attention})
"""Layers whose arithmetic runs at the device's matmul efficiency."""
TENSOR_SPLIT_KINDS = MATMUL_KINDS | {LayerKind.embedding}
"""Layers Megatron-style tensor parallelism splits across the tensor group (work, weights, activations)."""
ROOT_LAYERS = ("<root>", "<loss>")
"""Capture's names for operations of the model's own forward and of the loss."""


@dataclass(frozen=True)
class LayerArrays:
    """Per layer l, in forward order."""

    layer_names: list[str]
    layer_index: dict[str, int]
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
    layer_attention: np.ndarray
    """[L] attention cores (scores, softmax, weighted values): what selective recomputation repeats and
    ring attention spreads over the context-parallel group."""
    selective_dropped: np.ndarray
    """[L] bytes selective recomputation frees: an attention core's saved activations beyond its inputs
    (q, k, v, kept to recompute it) and its output (kept for the next layer), in numbered blocks. An
    eager core saves its s×s scores and probabilities (5·a·s²·b bytes per layer in half precision,
    Korthikanti et al. 2022, eq. 2), a flash or memory-efficient kernel only O(s) statistics."""
    attention_kv_bytes: np.ndarray
    """[L] bytes of the keys and values an attention core reads (its inputs' share that is k and v:
    2·kv_heads / (heads + 2·kv_heads) under grouped-query attention, else 2/3): what ring attention
    passes around the context-parallel group."""
    layer_weight_grad: np.ndarray
    """[L] layers with trainable weights whose backward computes a weight gradient (matmul, conv): about
    half their backward, the part a zero-bubble schedule defers into the bubble."""
    layer_unit: np.ndarray
    """[L] index of each layer's unit in `unit_starts` (FSDP's wrapping unit: a block or a top-level module)."""
    kernels: KernelArrays
    """[L] how each layer's work splits into kernels on a GPU (`simulator.kernels`)."""
    op_recomputed: np.ndarray
    """[L] layers per-op selective checkpointing runs again in backward: inside a numbered block, all but
    its fused attention cores and every other weighted matmul (the first, third, ... in the block are
    kept: torchtitan's policy saves the output of each `mm` except every second one)."""
    compile_fused: np.ndarray
    """[L] layers `torch.compile` launches nothing for: an element-wise or normalization layer inside a
    numbered block right after another such layer, whose ops join that layer's fused kernel (the compiled
    block's host code launches each kernel once, not each module's ops)."""
    gpu_activation_bytes: np.ndarray
    """[L] what a layer saves for backward on a GPU (`Layer.gpu_activation_bytes`, else `activation_bytes`)."""
    gradient_bytes: np.ndarray
    """[L] bytes of gradients a layer's backward holds at once: the gradient of its output (or of its
    internal tensors, the size of what it saved, when larger) and the gradient it produces for its inputs."""
    op_kept: np.ndarray
    """[L] bytes per-op selective checkpointing keeps for a layer inside a numbered block: a kept
    matmul's or attention core's output, and the block's input at its first layer; 0 for the rest."""

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)


def layer_arrays(graph: ModelGraph) -> LayerArrays:
    layers = graph.layers
    index = {layer.name: i for i, layer in enumerate(layers)}
    matmul = np.array([layer.kind in MATMUL_KINDS for layer in layers], dtype=bool)
    frozen = np.zeros(len(layers))
    by_name = {v.name: v for v in graph.variables}
    for i, layer in enumerate(layers):
        frozen[i] = sum(by_name[n].nbytes for n in layer.variables if not by_name[n].trainable)
    row_parallel = _row_parallel(graph, index, matmul)
    split = np.array([splits(layer, graph) for layer in layers], dtype=bool)
    units = [layer_unit(layer.name) for layer in layers]
    recomputed = np.array([_numbered(unit) for unit in _carried(units)], dtype=bool)
    starts = _unit_starts(units)
    output = np.array([layer.output_bytes for layer in layers], dtype=float)
    activations = np.array([layer.activation_bytes for layer in layers], dtype=float)
    first = np.zeros(len(layers), dtype=bool)
    first[starts] = True
    block_input = np.r_[0.0, output[:-1]] if len(layers) else output
    kept = np.where(recomputed, np.where(first, block_input, 0.0), activations)
    attention = np.array([layer.kind == LayerKind.attention for layer in layers], dtype=bool)
    inputs = np.array([sum(output[index[n]] for n in layer.inputs) for layer in layers], dtype=float)
    trainable = {v.name for v in graph.variables if v.trainable}
    weighted = np.array(
        [
            layer.kind in (LayerKind.matmul, LayerKind.conv) and any(n in trainable for n in layer.variables)
            for layer in layers
        ],
        dtype=bool,
    )
    return LayerArrays(
        layer_names=[layer.name for layer in layers],
        layer_index=index,
        fwd_flops=np.array([layer.fwd_flops for layer in layers], dtype=float),
        bwd_flops=np.array([layer.bwd_flops for layer in layers], dtype=float),
        bytes_moved=np.array([layer.bytes_moved for layer in layers], dtype=float),
        activation_bytes=activations,
        output_bytes=output,
        layer_matmul=matmul,
        layer_conv=np.array([layer.kind == LayerKind.conv for layer in layers], dtype=bool),
        layer_norm=np.array([layer.kind == LayerKind.norm for layer in layers], dtype=bool),
        layer_embedding=np.array([layer.kind == LayerKind.embedding for layer in layers], dtype=bool),
        layer_tensor_split=split,
        layer_tp_allreduce=row_parallel,
        layer_sharded_input=_sharded_inputs(graph, index, split & matmul & ~row_parallel, row_parallel),
        layer_recomputed=recomputed,
        unit_starts=starts,
        recompute_kept=kept,
        layer_frozen_bytes=frozen,
        layer_grad_fill_bytes=np.array([_grad_fill_bytes(layer, graph) for layer in layers], dtype=float),
        layer_attention=attention,
        selective_dropped=np.where(attention & recomputed, np.maximum(activations - inputs - output, 0.0), 0.0),
        attention_kv_bytes=np.where(attention, inputs * _kv_share(graph), 0.0),
        layer_weight_grad=weighted,
        layer_unit=np.maximum(np.searchsorted(starts, np.arange(len(layers)), side="right") - 1, 0),
        kernels=kernel_arrays(graph),
        gradient_bytes=np.maximum(output, activations) + inputs,
        gpu_activation_bytes=np.array(
            [
                layer.activation_bytes if layer.gpu_activation_bytes is None else layer.gpu_activation_bytes
                for layer in layers
            ],
            dtype=float,
        ),
        compile_fused=_compile_fused(layers, _carried(units), recomputed),
        **_op_checkpointing(graph, units, recomputed, first, block_input, output, weighted, attention),
    )


def _compile_fused(layers: list[Layer], units: list[str | None], recomputed: np.ndarray) -> np.ndarray:
    streaming = [layer.kind not in MATMUL_KINDS and layer.kind != LayerKind.embedding for layer in layers]
    out = np.zeros(len(layers), dtype=bool)
    for i in range(1, len(layers)):
        out[i] = bool(recomputed[i]) and streaming[i] and streaming[i - 1] and units[i] == units[i - 1]
    return out


def _op_checkpointing(
    graph: ModelGraph,
    units: list[str | None],
    recomputed: np.ndarray,
    first: np.ndarray,
    block_input: np.ndarray,
    output: np.ndarray,
    weighted: np.ndarray,
    attention: np.ndarray,
) -> dict[str, np.ndarray]:
    fused = np.array([layer.attention is not None for layer in graph.layers], dtype=bool)
    kept = np.zeros(len(graph.layers), dtype=bool)
    counts: dict[str | None, int] = {}
    for i, unit in enumerate(_carried(units)):
        if recomputed[i] and weighted[i]:
            counts[unit] = counts.get(unit, 0) + 1
            kept[i] = counts[unit] % 2 == 1
    kept |= attention & fused
    held = np.where(kept, output, 0.0) + np.where(first, block_input, 0.0)
    return {"op_recomputed": recomputed & ~kept, "op_kept": np.where(recomputed, held, 0.0)}


def _kv_share(graph: ModelGraph) -> float:
    """Keys' and values' share of an attention core's q, k, v inputs."""
    arch = graph.architecture
    if arch is None:
        return 2.0 / 3.0
    kv = arch.kv_heads or arch.heads
    return 2.0 * kv / (arch.heads + 2.0 * kv)


def _dense_tables(layer: Layer, graph: ModelGraph) -> list[Variable]:
    """An embedding layer's trainable tables whose gradients are dense (no `sparse` lookups)."""
    if layer.kind != LayerKind.embedding:
        return []
    tables = [graph.variable(n) for n in layer.variables]
    return [v for v in tables if v.trainable and not v.sparse]


def splits(layer: Layer, graph: ModelGraph) -> bool:
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
    as row-parallel, unless another matmul reads the same input: projections side by side (separate
    q, k and v; a gated MLP's gate and up) are one column-parallel group whose input is gathered once."""
    readers: dict[str, int] = {}
    for i, layer in enumerate(graph.layers):
        if matmul[i] and layer.kind != LayerKind.attention:
            for name in layer.inputs:
                readers[name] = readers.get(name, 0) + 1
    out = np.zeros(len(graph.layers), dtype=bool)
    for i, layer in enumerate(graph.layers):
        if not matmul[i] or layer.kind == LayerKind.attention:
            continue
        inputs = sum(graph.layers[index[name]].output_bytes for name in layer.inputs)
        siblings = any(readers.get(name, 0) > 1 for name in layer.inputs)
        out[i] = bool(layer.inputs) and 0 < layer.output_bytes <= inputs and not siblings
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
