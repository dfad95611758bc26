"""Turn the Recorder's bookkeeping into a validated ModelGraph."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn

from stratagem.errors import CaptureError
from stratagem.ir import DType, FusedAttention, Layer, LayerKind, ModelGraph, OptimizerSpec, Variable
from stratagem.ir.document import problems_from_validation_error
from stratagem.tracing.fake import ir_dtype
from stratagem.tracing.recorder import LayerRecord, Recorder

_KIND_PRIORITY = ("attention", "conv", "matmul", "embedding", "norm")


def layer_kind(record: LayerRecord) -> LayerKind:
    """The strongest class among the layer's ops; a `*Norm` module whose norm is spelled out
    in elementwise ops (RMSNorm) is still a norm."""
    for kind in _KIND_PRIORITY:
        if kind in record.categories:
            return LayerKind(kind)
    if "Norm" in record.type and record.categories:
        return LayerKind.norm
    return LayerKind.elementwise if record.categories else LayerKind.other


def to_layer(record: LayerRecord) -> Layer:
    return Layer(
        name=record.name,
        type=record.type,
        kind=layer_kind(record),
        fwd_flops=record.fwd_flops,
        bwd_flops=record.bwd_flops,
        bytes_moved=record.bytes_moved,
        activation_bytes=record.activation_bytes,
        output_bytes=record.output_bytes,
        inputs=list(record.inputs),
        variables=list(record.variables),
        arithmetic_bytes=record.arithmetic_bytes,
        gpu_activation_bytes=record.activation_bytes - record.gpu_saved_excess,
        elementwise_bytes=record.elementwise_bytes,
        fused_elementwise_bytes=record.fused_elementwise_bytes,
        autocast_elementwise_bytes=record.autocast_elementwise_bytes,
        attention=_attention(record),
    )


def _attention(record: LayerRecord) -> FusedAttention | None:
    call = record.attention
    if call is None:
        return None
    return FusedAttention(flops=call.flops, traced_bytes=call.traced_bytes, io_bytes=call.io_bytes, causal=call.causal)


def sparse_parameter_names(model: nn.Module) -> set[str]:
    """Weights of embeddings built with `sparse=True`, under the names `named_parameters()` uses."""
    sparse_ids = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}
    return {name for name, p in model.named_parameters() if id(p) in sparse_ids}


def to_variables(model: nn.Module, recorder: Recorder) -> list[Variable]:
    sparse = sparse_parameter_names(model)
    variables = []
    for name, param in model.named_parameters():
        lookups = recorder.lookups.get(name)
        is_sparse = name in sparse
        variables.append(
            Variable(
                name=name,
                shape=list(param.shape),
                dtype=ir_dtype(param.dtype, where=f"parameter {name!r}"),
                trainable=param.requires_grad,
                sparse=is_sparse,
                lookups_per_step=lookups if lookups is not None else (0 if is_sparse else None),
                consumer=recorder.consumers.get(name),
            )
        )
    return variables


def dominant_dtype(model: nn.Module) -> DType:
    """The floating dtype holding most parameters: the dtype the step computes in."""
    counts: Counter[torch.dtype] = Counter()
    for param in model.parameters():
        if param.is_floating_point():
            counts[param.dtype] += param.numel()
    if not counts:
        return DType.float32
    dtype = counts.most_common(1)[0][0]
    return ir_dtype(dtype, where="parameters")


def build_graph(
    model: nn.Module,
    recorder: Recorder,
    *,
    name: str,
    batch_size: int,
    optimizer: OptimizerSpec,
    provenance: dict[str, Any],
    trace_id: str | None = None,
) -> ModelGraph:
    dtype = dominant_dtype(model)
    try:
        return ModelGraph(
            name=name,
            batch_size=batch_size,
            dtype=dtype,
            optimizer=OptimizerSpec.of(
                optimizer.kind, dtype.itemsize, optimizer.implementation, optimizer.max_grad_norm
            ),
            layers=[to_layer(r) for r in recorder.layers],
            variables=to_variables(model, recorder),
            trace_id=trace_id,
            provenance=provenance,
        )
    except ValidationError as error:
        shown = "; ".join(str(p) for p in problems_from_validation_error(error)[:5])
        raise CaptureError(f"the graph captured from {name!r} is inconsistent (a capture bug): {shown}") from None
