"""What the runtime can split across a tensor group or cut into pipeline stages, stated once.

The search writes a tensor plan and stage cuts from a ModelGraph (`stratagem.tensor_plan`,
`optimizer_service.search.meshes`); the runtime applies them to a live module
(`stratagem.runtime.tensor_parallel`, `pipeline_parallel`). Both ask the functions here, on plain
descriptions (class names, Linear shapes, a head count), so the plan never emits what the runtime
refuses and the two cannot drift. No torch here: the simulator imports it without a GPU stack.

Tensor parallelism (Megatron's styles):
- `colwise` / `rowwise` split a `Linear`; `vocab` splits the rows of an `Embedding` with dense
  gradients, or of an output-head `Linear` (its logits gathered). Exact class names: a subclass may
  override `forward` in ways a split does not survive.
- `heads` splits an attention module that keeps its head count in an int attribute
  (`HEAD_COUNT_ATTRIBUTES`) and whose Linear children are one output projection
  (`OUTPUT_PROJECTIONS`) and either separate q, k and v projections, each as wide as the output
  projection's input, or one fused projection (`FUSED_QKV_PROJECTIONS`) laid out as [q; k; v]
  blocks of heads × head_dim rows (GPT-2, nanoGPT, MPT). The fused one is split per head group: its
  rows are reordered so that each rank's contiguous shard is [q, k, v] of its own heads
  (`fused_row_order`). The module's forward must size its views from the head count and the local
  tensors (`view(b, s, self.heads, -1)`), as Megatron-style attention does: nothing can check that
  before it runs. Megatron's own interleaved [heads, 3, head_dim] layout is not recognised.
- A weight shared by several modules (tied embeddings) may be split only when every module holding
  it is split by vocabulary: each split takes the same rows, so one sharded parameter stays tied.

Pipeline stages, two ways (`pipeline_route`):
- `children`: an `nn.Sequential` whose output goes to the caller's `loss_fn` is cut between its
  top-level children, and the last stage scores each micro-batch with `loss_fn`;
- `blocks`: a model of any other class that returns its own loss (a 0-d mean over samples) and keeps
  its transformer blocks in a ModuleList named one of `BLOCK_LISTS` (`blocks.3`, `layers.0`) is cut at
  the beginning of blocks: torch.distributed.pipelining's tracer (`pipeline(..., split_spec=...)`)
  exports the whole forward and splits it there, so everything before the first cut (embeddings) is
  stage 0 and everything after the last (final norm, head, loss) the last stage, whatever the forward
  does around its blocks. Every input is split along its first dimension into micro-batches, so it must
  be the batch. The traced graph holds no DTensor and no checkpoint, so such a pipeline has no tensor
  degree and no recomputation. A weight tied across stages (embedding and output head) is held by
  both stages and its gradient summed over them before the optimizer step.
Anything else (a forward that returns logits and is no nn.Sequential, blocks in an unrecognised
container) cannot be cut into stages. Micro-batches on one stage (gradient accumulation) work for a
model that returns its loss, a mean over samples, when every input has the batch as its first
dimension: the runtime splits the inputs and runs each micro-batch's forward and backward in turn
(`accumulation_refusal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from stratagem.ir import ModelGraph

HEAD_COUNT_ATTRIBUTES = ("heads", "num_heads", "n_heads", "n_head", "num_attention_heads")
"""Where an attention module keeps its number of heads (the `heads` style divides it)."""
OUTPUT_PROJECTIONS = ("out", "o", "o_proj", "out_proj", "wo", "c_proj", "dense", "proj")
"""Names of an attention module's output projection."""
FUSED_QKV_PROJECTIONS = ("qkv", "c_attn", "qkv_proj", "Wqkv", "in_proj")
"""Names of a fused projection laid out as [q; k; v] blocks, each heads × head_dim rows."""
STYLE_MODULES = {"colwise": ("Linear",), "rowwise": ("Linear",), "vocab": ("Embedding", "Linear")}
"""Module classes each style splits (exact class names)."""
SEQUENTIAL_CLASS = "torch.nn.modules.container.Sequential"
"""The one model class the runtime cuts into pipeline stages (between its top-level children)."""
LOSS_LAYER = "<loss>"
"""Capture's layer for the loss function's operations, outside the model."""
BLOCK_LISTS = ("blocks", "layers", "h")
"""Names of the ModuleList holding a model's numbered blocks, where the `blocks` route cuts stages."""
MAX_ITEMSIZE = 8
"""Bytes of the widest scalar: a layer whose output is no larger holds a single number."""


@dataclass(frozen=True)
class Refusal:
    """Why the runtime cannot split or cut something, in words for a report or an error."""

    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Projection:
    """A Linear child of an attention module: its name and features."""

    name: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class AttentionSplit:
    """How the heads style splits one attention module's projections."""

    output: str
    """The output projection (row-wise)."""
    separate: tuple[str, ...] = ()
    """Separate q, k and v projections (column-wise)."""
    fused: str | None = None
    """A fused [q; k; v] projection (column-wise after `fused_row_order`)."""


def style_refusal(style: str, module_class: str, *, sparse: bool = False) -> Refusal | None:
    """Whether a colwise, rowwise or vocab split fits a module of this class (None when it does)."""
    kinds = STYLE_MODULES.get(style)
    if kinds is None:
        return Refusal(f"unknown style {style!r}")
    if module_class not in kinds:
        return Refusal(f"the {style} style splits {' or '.join(f'a {k}' for k in kinds)}, not {module_class}")
    if sparse:
        return Refusal(
            "a sparse-gradient Embedding cannot be split by vocabulary (a parameter server moves just its touched rows)"
        )
    return None


def head_attribute(attributes: dict[str, object]) -> tuple[str, int] | None:
    """The (attribute, head count) an attention module keeps, from its attributes, or None."""
    for name in HEAD_COUNT_ATTRIBUTES:
        value = attributes.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def attention_split(projections: Sequence[Projection], heads: int) -> AttentionSplit | Refusal:
    """How the heads style splits an attention module with these Linear children and head count."""
    names = sorted(p.name for p in projections)
    outputs = [p for p in projections if p.name in OUTPUT_PROJECTIONS]
    if len(outputs) != 1 or len(projections) < 2:
        return Refusal(
            f"the heads style needs Linear children projecting into heads and exactly one output projection "
            f"named one of {', '.join(OUTPUT_PROJECTIONS)}; found Linear children {names}"
        )
    out = outputs[0]
    width = out.in_features
    if width % heads:
        return Refusal(f"{width} attention features do not divide into {heads} heads")
    separate: list[str] = []
    fused: list[str] = []
    for p in projections:
        if p is out:
            continue
        if p.in_features != out.out_features:
            return Refusal(
                f"{p.name} reads {p.in_features} features but {out.name} writes {out.out_features}: not a projection into heads"
            )
        if p.out_features == width:
            separate.append(p.name)
        elif p.out_features == 3 * width and p.name in FUSED_QKV_PROJECTIONS:
            fused.append(p.name)
        else:
            return Refusal(
                f"{p.name} has {p.out_features} output features for {width} attention features: neither one of separate q/k/v "
                f"projections nor a fused [q; k; v] projection named one of {', '.join(FUSED_QKV_PROJECTIONS)}"
            )
    if fused and (separate or len(fused) > 1):
        return Refusal(f"a fused q/k/v projection ({fused[0]}) beside other projections {sorted(separate + fused[1:])}")
    return AttentionSplit(output=out.name, separate=tuple(separate), fused=fused[0] if fused else None)


def fused_row_order(heads: int, head_dim: int, degree: int) -> list[int]:
    """Rows of a fused [q; k; v] weight reordered so that shard r of `degree` contiguous shards is
    [q; k; v] of heads r·H/T .. (r+1)·H/T - 1: new row i is old row order[i]."""
    width = heads * head_dim
    local = heads // degree
    order: list[int] = []
    for group in range(degree):
        for block in range(3):
            start = block * width + group * local * head_dim
            order.extend(range(start, start + local * head_dim))
    return order


def tie_refusal(holders: dict[str, str | None]) -> Refusal | None:
    """Whether a weight held by several modules (module -> its split style, None if unsplit) may be
    split: only when every holder is split by vocabulary, or none is split."""
    styles = set(holders.values())
    if styles <= {"vocab"} or styles == {None}:
        return None
    return Refusal(
        f"splitting would untie the weight shared by {', '.join(sorted(holders))}: split all of them by vocab "
        "(the same rows each) or none"
    )


def pipeline_refusal(model_class: str | None, *, returns_loss: bool) -> Refusal | None:
    """Whether the `children` route can cut the model: an nn.Sequential whose output goes to loss_fn.
    `model_class` is the model's class path (None when unknown, as for a hand-built graph);
    `returns_loss` whether its forward returns a single number (the loss computed inside forward)."""
    reasons = []
    if model_class is not None and model_class != SEQUENTIAL_CLASS:
        reasons.append(f"the model is a {model_class.rsplit('.', 1)[-1]}, not an nn.Sequential")
    if returns_loss:
        reasons.append(
            "it computes its loss inside forward (it returns a single number, leaving loss_fn nothing to score)"
        )
    if not reasons:
        return None
    return Refusal(
        "the runtime cuts pipeline stages only between the children of an nn.Sequential whose output goes to "
        f"loss_fn: {'; '.join(reasons)}"
    )


CONTEXT_PARALLEL_CLASSES = ("transformers.", "stratagem.zoo.transformer.")
"""Class paths whose attention the runtime's context parallelism reaches: Hugging Face models (through
transformers' AttentionInterface) and the zoo's transformers (`stratagem.runtime.context_parallel`, which
decides on the live module)."""


def context_parallel_refusal(model_class: str | None, *, pipeline: int = 1) -> Refusal | None:
    """Whether the runtime runs context parallelism on a model of `model_class` (its class path; None when
    unknown) beside `pipeline` stages (`context_pipeline_refusal`)."""
    if model_class is None or not model_class.startswith(CONTEXT_PARALLEL_CLASSES):
        shown = "an unknown class" if model_class is None else model_class.rsplit(".", 1)[-1]
        return Refusal(
            f"the runtime's context parallelism replaces the attention of Hugging Face models and of the zoo's "
            f"transformers; the model is {shown}"
        )
    return context_pipeline_refusal(2, pipeline)


def context_pipeline_refusal(context: int, pipeline: int) -> Refusal | None:
    """Why the runtime does not run `context` ranks per sequence beside `pipeline` stages, or None."""
    if context <= 1 or pipeline <= 1:
        return None
    return Refusal(
        f"mesh.context ({context}) with mesh.pipeline ({pipeline}) is not run by this runtime: a pipeline stage "
        "runs children of an nn.Sequential or a graph traced from the model, which carry neither the "
        "context-parallel attention nor the global positions it sets before the model's forward; use "
        "mesh.pipeline 1 with context parallelism here (torchtitan and Megatron run both)"
    )


def master_weights_refusal(precision: str) -> Refusal | None:
    """Why the runtime does not train in `precision` (the reason names the value, its field left to the
    caller), or None: an fp16 model beside fp32 master weights is DeepSpeed's and Megatron-LM's mode, and
    the runtime keeps no master copy (the search offers it to the `engine` runner alone, and a job asks
    for it with that runner)."""
    if precision != "fp16":
        return None
    return Refusal(
        "'fp16' trains an fp16 model beside fp32 master weights, which this runtime does not keep: it runs in "
        "DeepSpeed or Megatron-LM; ask for runner 'engine', or amp-fp16"
    )


PipelineRoute = Literal["children", "blocks"]


def pipeline_route(
    model_class: str | None,
    *,
    returns_loss: bool,
    blocks: Sequence[str],
    input_rows: Sequence[int | None] | None = None,
    batch: int | None = None,
) -> PipelineRoute | Refusal:
    """How the runtime cuts the model into stages, or why it cannot. `blocks` are the model's numbered
    blocks in a `BLOCK_LISTS` container (`block_of`), `input_rows` its inputs' first dimensions when known."""
    children = pipeline_refusal(model_class, returns_loss=returns_loss)
    if children is None:
        return "children"
    reasons = []
    if not returns_loss:
        reasons.append("it does not return its own loss")
    if not blocks:
        reasons.append(f"no layer sits in a numbered block of a ModuleList named {', '.join(BLOCK_LISTS)}")
    wrong = [rows for rows in input_rows or () if rows != batch]
    if batch is not None and wrong:
        reasons.append(
            f"an input's first dimension ({wrong[0]}) is not the batch ({batch}), so micro-batches cannot split it"
        )
    if not reasons:
        return "blocks"
    return Refusal(
        f"{children}; nor can it be cut between the blocks of a model that returns its loss: {'; '.join(reasons)}"
    )


def block_of(layer: str) -> str | None:
    """The numbered block a layer or module path sits in (`blocks.3.attn.qkv` -> `blocks.3`), or None."""
    parts = layer.split("/")[0].split("#")[0].split(".")
    for i in range(len(parts) - 1):
        if parts[i] in BLOCK_LISTS and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return None


def block_cuts(stages: Sequence[Sequence[str]]) -> list[str] | Refusal:
    """The block each stage after the first begins with (the `blocks` route's split points): the first
    layer of every later stage (operations of the model itself or the loss aside) must open a block
    that no earlier stage touches."""
    cuts = []
    for s in range(1, len(stages)):
        first = next((name for name in stages[s] if not name.startswith("<")), None)
        block = block_of(first) if first is not None else None
        if block is None:
            return Refusal(
                f"pipeline.stages[{s}] begins with {first!r}, not inside a numbered block of a ModuleList named "
                f"{', '.join(BLOCK_LISTS)}: stages of a model that returns its loss are cut at the beginning of blocks"
            )
        if any(block_of(name) == block for earlier in stages[:s] for name in earlier):
            return Refusal(
                f"pipeline.stages[{s}]: block {block!r} is split between stages {s - 1} and {s}; stages are cut between blocks"
            )
        cuts.append(block)
    return cuts


def accumulation_refusal(
    model_class: str | None, *, returns_loss: bool, input_rows: Sequence[int | None] | None, batch: int | None
) -> Refusal | None:
    """Whether the runtime can accumulate micro-batches on one stage: as a one-stage pipeline where it
    can cut the model (`pipeline_refusal`), else, for a model that returns its own loss, by splitting
    every input along its first dimension (which must be the batch: `input_rows`, when known) and
    running forward and backward per micro-batch inside the model's forward."""
    refusal = pipeline_refusal(model_class, returns_loss=returns_loss)
    if refusal is None:
        return None
    if not returns_loss:
        return refusal
    wrong = [rows for rows in input_rows or () if rows != batch]
    if batch is not None and wrong:
        return Refusal(
            f"micro-batches split every input of a model that returns its loss along its first dimension, and an "
            f"input's first dimension ({wrong[0]}) is not the batch ({batch})"
        )
    return None


def graph_pipeline_refusal(graph: ModelGraph) -> Refusal | None:
    """Why the runtime cannot cut a captured graph into stages (`graph_pipeline_route`), or None."""
    route = graph_pipeline_route(graph)
    return route if isinstance(route, Refusal) else None


def graph_pipeline_route(graph: ModelGraph) -> PipelineRoute | Refusal:
    """`pipeline_route` for a captured graph: capture records the model's class (`provenance.model_class`), its
    inputs' shapes (`provenance.inputs`) and its ModuleLists of blocks (`provenance.block_lists`), and a model that
    returns its loss feeds a single number to `<loss>`."""
    lists = _block_lists(graph)
    blocks = list(
        dict.fromkeys(
            b
            for b in (block_of(layer.name) for layer in graph.layers)
            if b is not None and (lists is None or b.rpartition(".")[0] in lists)
        )
    )
    return pipeline_route(
        _model_class(graph),
        returns_loss=_returns_loss(graph),
        blocks=blocks,
        input_rows=_input_rows(graph),
        batch=graph.batch_size,
    )


def graph_accumulation_refusal(graph: ModelGraph) -> Refusal | None:
    """`accumulation_refusal` for a captured graph (capture records its inputs' shapes in `provenance.inputs`)."""
    return accumulation_refusal(
        _model_class(graph), returns_loss=_returns_loss(graph), input_rows=_input_rows(graph), batch=graph.batch_size
    )


def _block_lists(graph: ModelGraph) -> set[str] | None:
    """The ModuleLists capture found under a `BLOCK_LISTS` name (None for a graph captured before it
    recorded them, or built by hand: then every numbered block counts)."""
    lists = graph.provenance.get("block_lists")
    return {name for name in lists if isinstance(name, str)} if isinstance(lists, list) else None


def _input_rows(graph: ModelGraph) -> list[int | None] | None:
    inputs = graph.provenance.get("inputs")
    if not isinstance(inputs, list):
        return None
    shapes = [item.get("shape") if isinstance(item, dict) else None for item in inputs]
    return [shape[0] if isinstance(shape, list) and shape else None for shape in shapes]


def graph_context_parallel_refusal(graph: ModelGraph) -> Refusal | None:
    """`context_parallel_refusal` for a captured graph (capture records the model's class)."""
    return context_parallel_refusal(_model_class(graph))


def _model_class(graph: ModelGraph) -> str | None:
    model_class = graph.provenance.get("model_class")
    return model_class if isinstance(model_class, str) else None


def _returns_loss(graph: ModelGraph) -> bool:
    loss = next((layer for layer in graph.layers if layer.name == LOSS_LAYER), None)
    fed = [graph.layer(name) for name in loss.inputs] if loss is not None else []
    return bool(fed) and all(0 < layer.output_bytes <= MAX_ITEMSIZE for layer in fed)


def class_path(cls: type) -> str:
    """A class as capture records it (`provenance.model_class`)."""
    return f"{cls.__module__}.{cls.__qualname__}"
