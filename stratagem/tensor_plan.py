"""The tensor-parallel splits a tensor degree makes, written as a Strategy states them.

Only splits the runtime executes exactly are planned; what each module takes is
`stratagem.parallel_rules` (shared with the runtime), and whether the activations around it are laid
out as the split assumes is read here from the graph's dataflow (the runtime cannot see it):

- an attention module (the owner of a layer of kind `attention`) is split by heads when the graph
  records its head count (a zoo model's config) and its Linear children follow a recognised
  convention (`attention_split`), and nothing outside it reads its inner activations;
- a `rowwise` Linear needs its input sharded on the last dimension: it is planned only where every
  path into it comes from `colwise` Linears (of as many output features as it has input features)
  through element-wise, shape-preserving layers (activations, dropout, a SwiGLU product), and where
  nothing else reads those sharded activations. Megatron's MLP is such a pair; a lone narrowing
  Linear (a classifier after pooling) is not, and stays whole;
- dense embeddings and the last Linear (an output head, its logits gathered) are split by
  vocabulary; their outputs are whole again, so they need no partner. Sparse tables stay whole.
- a module called more than once, and a weight tied to a module not split by vocabulary, stay whole.
A split whose axis the degree does not divide is left out, so the plan is always valid for the graph.
`covered_layers` says which layers the plan splits: the search offers a tensor degree only where that
covers every layer the simulator prices as split, so predictions and trials describe the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stratagem.ir import Layer, LayerKind, ModelGraph, TensorParallelLayer, Variable
from stratagem.parallel_rules import Projection, Refusal, attention_split, style_refusal, tie_refusal

PASSTHROUGH_TYPES = ("Dropout", "Identity")
"""Module classes that leave a sharded activation as it is even when they record no arithmetic."""


@dataclass(frozen=True)
class Split:
    """One split the plan may make: the strategy entry, the length its degree must divide, and the
    graph layers it covers (by index)."""

    layer: TensorParallelLayer
    length: int
    covers: tuple[int, ...]


def head_count(graph: ModelGraph) -> int | None:
    """Attention heads from the graph's provenance (a zoo model records its config), if known."""
    zoo = graph.provenance.get("zoo")
    config = zoo.get("config", {}) if isinstance(zoo, dict) else {}
    heads = config.get("heads") if isinstance(config, dict) else None
    return heads if isinstance(heads, int) and heads > 0 else None


def candidate_splits(graph: ModelGraph) -> list[Split]:
    """Every split the runtime can execute on this graph, whatever the degree."""
    return _Planner(graph).splits()


def tensor_plan(graph: ModelGraph, row_parallel: Sequence[bool] | None, degree: int) -> list[TensorParallelLayer]:
    """The splits for tensor degree `degree` (empty for 1), leaving out those it does not divide.
    `row_parallel` (the simulator's own pairing) is not consulted: the plan follows the dataflow."""
    if degree <= 1:
        return []
    return [split.layer for split in candidate_splits(graph) if split.length % degree == 0]


def covered_layers(splits: Sequence[Split], degree: int) -> set[int]:
    """Indices of the graph layers that `splits` (from `candidate_splits`) split at `degree`."""
    return {i for split in splits if split.length % degree == 0 for i in split.covers}


class _Planner:
    """The graph's dataflow, indexed once for the rules above."""

    def __init__(self, graph: ModelGraph) -> None:
        self.graph = graph
        self.layers = graph.layers
        self.index = {layer.name: i for i, layer in enumerate(self.layers)}
        self.consumers: list[list[int]] = [[] for _ in self.layers]
        for i, layer in enumerate(self.layers):
            for name in layer.inputs:
                self.consumers[self.index[name]].append(i)
        self.variables = {v.name: v for v in graph.variables}
        self.calls: dict[str, int] = {}
        self.holders: dict[str, set[str]] = {}
        for layer in self.layers:
            if _is_module_layer(layer):
                module = _module_of(layer)
                self.calls[module] = self.calls.get(module, 0) + 1
                for name in layer.variables:
                    self.holders.setdefault(name, set()).add(module)

    def splits(self) -> list[Split]:
        out = self._heads()
        taken = {i for split in out for i in split.covers}
        pairs = self._pairs(taken)
        out += pairs
        taken |= {i for split in pairs for i in split.covers}
        out += self._vocab(taken)
        return out

    # --- what a layer is -----------------------------------------------------------------------

    def weight(self, i: int) -> Variable | None:
        """The 2-D trainable weight of a single-call module layer that holds it alone, else None."""
        layer = self.layers[i]
        if not _is_module_layer(layer) or self.calls.get(_module_of(layer), 0) != 1:
            return None
        for name in layer.variables:
            variable = self.variables[name]
            if len(variable.shape) == 2 and variable.trainable:
                return variable
        return None

    def linear(self, i: int, *, tied_ok: bool = False) -> Variable | None:
        layer = self.layers[i]
        weight = self.weight(i)
        if weight is None or style_refusal("colwise", layer.type) is not None:
            return None
        return weight if tied_ok or len(self.holders.get(weight.name, ())) == 1 else None

    def passthrough(self, i: int) -> bool:
        """Element-wise and shape-preserving: a sharded input stays sharded the same way."""
        layer = self.layers[i]
        if layer.variables or not layer.inputs:
            return False
        if not (
            layer.kind == LayerKind.elementwise or (layer.kind == LayerKind.other and layer.type in PASSTHROUGH_TYPES)
        ):
            return False
        return all(self.layers[self.index[name]].output_bytes == layer.output_bytes for name in layer.inputs)

    # --- the rules -----------------------------------------------------------------------------

    def _heads(self) -> list[Split]:
        heads = head_count(self.graph)
        if heads is None:
            return []
        owners = list(
            dict.fromkeys(
                _module_of(layer) for layer in self.layers if layer.kind == LayerKind.attention and "/" in layer.name
            )
        )
        return [split for owner in owners if (split := self._attention(owner, heads)) is not None]

    def _attention(self, owner: str, heads: int) -> Split | None:
        inside = [i for i, layer in enumerate(self.layers) if layer.name.startswith((owner + ".", owner + "/"))]
        children = {_module_of(self.layers[i])[len(owner) + 1 :]: i for i in inside if _is_module_layer(self.layers[i])}
        projections = []
        for child, i in children.items():
            direct_linear = "." not in child and self.layers[i].type == "Linear"
            if not direct_linear and self.layers[i].variables:
                return None  # weights the heads style would not split, reading split activations
            if not direct_linear:
                continue
            weight = self.linear(i)
            if weight is None:
                return None
            projections.append(Projection(child, weight.shape[1], weight.shape[0]))
        split = attention_split(projections, heads)
        if isinstance(split, Refusal):
            return None
        output = children[split.output]
        inner = set(inside) - {output}
        if any(c not in inner and c != output for i in inner for c in self.consumers[i]):
            return None
        if not all(self.index[name] in inner for name in self.layers[output].inputs):
            return None
        return Split(TensorParallelLayer(name=owner, style="heads", heads=heads), heads, tuple(sorted(inside)))

    def _pairs(self, taken: set[int]) -> list[Split]:
        """Column-wise Linears feeding a row-wise one through element-wise layers, closed to outside readers."""
        out: list[Split] = []
        used = set(taken)
        for r in range(len(self.layers)):
            weight = self.linear(r)
            if r in used or weight is None:
                continue
            width = weight.shape[1]
            found = self._sources(r, width)
            if found is None:
                continue
            sources, between = found
            if used & (sources | between):
                continue
            if any(c not in between and c != r for i in sources | between for c in self.consumers[i]):
                continue
            for s in sorted(sources):
                # `_sources` admits only Linears whose output width is this one's input width.
                out.append(Split(TensorParallelLayer(name=_module_of(self.layers[s]), style="colwise"), width, (s,)))
            out.append(
                Split(
                    TensorParallelLayer(name=_module_of(self.layers[r]), style="rowwise"),
                    width,
                    (r, *sorted(between)),
                )
            )
            used |= sources | between | {r}
        return out

    def _sources(self, r: int, width: int) -> tuple[set[int], set[int]] | None:
        """The column-wise Linears and element-wise layers every path into layer r passes, or None."""
        sources: set[int] = set()
        between: set[int] = set()
        frontier = list(self.layers[r].inputs)
        if not frontier:
            return None
        while frontier:
            j = self.index[frontier.pop()]
            if j in sources or j in between:
                continue
            weight = self.linear(j)
            if weight is not None:
                if weight.shape[0] != width:
                    return None
                sources.add(j)
            elif self.passthrough(j):
                between.add(j)
                frontier.extend(self.layers[j].inputs)
            else:
                return None
        return sources, between

    def _vocab(self, taken: set[int]) -> list[Split]:
        """Dense embeddings and the output head, by rows; a tied weight only when all its holders split."""
        last = max((i for i in range(len(self.layers)) if self.linear(i, tied_ok=True) is not None), default=-1)
        chosen: dict[int, Variable] = {}
        for i, layer in enumerate(self.layers):
            if i in taken:
                continue
            weight = self.weight(i)
            if weight is None:
                continue
            embedding = layer.type == "Embedding" and style_refusal("vocab", layer.type, sparse=weight.sparse) is None
            if embedding or i == last:
                chosen[i] = weight
        out = []
        styled = {_module_of(self.layers[i]) for i in chosen}
        for i, weight in chosen.items():
            holders = self.holders.get(weight.name, set())
            if tie_refusal({module: "vocab" if module in styled else None for module in holders}) is None:
                out.append(
                    Split(TensorParallelLayer(name=_module_of(self.layers[i]), style="vocab"), weight.shape[0], (i,))
                )
        return out


def _is_module_layer(layer: Layer) -> bool:
    """A layer for a module's call (`blocks.0.mlp.fc`, `blocks.0.drop#1`), not for ops of a module's own forward."""
    return "/" not in layer.name and not layer.name.startswith("<")


def _module_of(layer: Layer) -> str:
    """The module a layer belongs to: `blocks.0.drop#1` -> `blocks.0.drop`, `blocks.0.attn/ops0` -> `blocks.0.attn`."""
    return layer.name.split("/")[0].split("#")[0]
