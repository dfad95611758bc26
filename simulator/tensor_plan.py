"""The tensor-parallel splits the simulator assumes, written as a Strategy states them.

For a tensor degree T the simulator divides the work, weights and activations of every matmul,
attention and embedding layer by T and puts one all-reduce per row-parallel matmul on the critical
path (`context._row_parallel`). `tensor_plan` names those splits for the runtime, Megatron's way:

- an attention module (the owner of a layer of kind `attention`) is split by heads when the graph
  records its head count (a zoo model's config), which covers its projections;
- other matmul layers are `rowwise` when they narrow their input back (the second of a pair) and
  `colwise` otherwise, except a widening last matmul (an output head), which is split by vocabulary
  so that the loss sees whole logits;
- dense embeddings are split by vocabulary. Sparse tables stay whole: a parameter server moves just
  the rows a step touches, which a vocabulary split would not.
A layer whose split axis T does not divide is left out, so the plan is always valid for the graph;
`degree_splits_everything` says whether T splits every layer the simulator assumes split.
"""

from __future__ import annotations

from stratagem.ir import LayerKind, ModelGraph, TensorParallelLayer

SPLIT_AXIS = {"colwise": 0, "rowwise": 1, "vocab": 0}


def head_count(graph: ModelGraph) -> int | None:
    """Attention heads from the graph's provenance (a zoo model records its config), if known."""
    config = graph.provenance.get("zoo", {}).get("config", {}) if isinstance(graph.provenance.get("zoo"), dict) else {}
    heads = config.get("heads") if isinstance(config, dict) else None
    return heads if isinstance(heads, int) and heads > 0 else None


def candidate_splits(graph: ModelGraph, row_parallel: list[bool]) -> list[tuple[TensorParallelLayer, int]]:
    """Every split the simulator assumes, with the length its tensor degree must divide."""
    variables = {v.name: v for v in graph.variables}
    heads = head_count(graph)
    attention = _attention_modules(graph) if heads is not None else []
    out: list[tuple[TensorParallelLayer, int]] = [(TensorParallelLayer(name=name, style="heads", heads=heads), heads) for name in attention]
    covered = set(attention)
    matmuls = [i for i, layer in enumerate(graph.layers) if layer.kind == LayerKind.matmul]
    last = matmuls[-1] if matmuls else -1
    for i, layer in enumerate(graph.layers):
        if layer.kind not in (LayerKind.matmul, LayerKind.embedding) or _parent(layer.name) in covered:
            continue
        weights = [variables[n] for n in layer.variables if len(variables[n].shape) == 2 and variables[n].trainable]
        if not weights or weights[0].sparse:
            continue
        output_head = i == last and not row_parallel[i]
        style = "vocab" if layer.kind == LayerKind.embedding or output_head else "rowwise" if row_parallel[i] else "colwise"
        out.append((TensorParallelLayer(name=layer.name, style=style), weights[0].shape[SPLIT_AXIS[style]]))
    return out


def tensor_plan(graph: ModelGraph, row_parallel: list[bool], degree: int) -> list[TensorParallelLayer]:
    """The splits for tensor degree `degree` (empty for 1), leaving out those it does not divide."""
    if degree <= 1:
        return []
    return [split for split, length in candidate_splits(graph, row_parallel) if length % degree == 0]


def degree_splits_everything(graph: ModelGraph, row_parallel: list[bool], degree: int) -> bool:
    return all(length % degree == 0 for _, length in candidate_splits(graph, row_parallel))


def _attention_modules(graph: ModelGraph) -> list[str]:
    """Owners of attention layers (`blocks.0.attn/ops0` -> `blocks.0.attn`) whose children hold projections."""
    projecting = {_parent(layer.name) for layer in graph.layers if layer.kind == LayerKind.matmul}
    owners: list[str] = []
    for layer in graph.layers:
        owner = layer.name.split("/")[0]
        if layer.kind == LayerKind.attention and "/" in layer.name and owner in projecting and owner not in owners:
            owners.append(owner)
    return owners


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""
