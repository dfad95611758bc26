"""Capture records the operator trace of the step: every op, its tensors, its layer, as a content-addressed document."""

from __future__ import annotations

import gzip
import io
import json

import pytest
import torch
from torch import nn

from stratagem import zoo
from stratagem.errors import InvalidDocumentError
from stratagem.tracing import capture
from stratagem.tracing.optrace import OperatorTrace, tensor_refs, trace_graph_problems


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.fc = nn.Linear(8, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.norm(self.fc(self.emb(ids).mean(1)))
        return nn.functional.cross_entropy(logits, labels)


def _tiny_graph():
    return capture(Tiny(), (torch.randint(0, 50, (6, 3)), torch.randint(0, 4, (6,))), batch_size=6)


def test_capture_names_its_trace_by_content_id_and_keeps_it_beside_the_graph() -> None:
    graph = _tiny_graph()
    assert graph.trace is not None and graph.trace_id == graph.trace.id
    assert graph.trace.batch_size == 6 and graph.trace.graph_name == graph.name
    assert capture(Tiny(), (torch.randint(0, 50, (6, 3)), torch.randint(0, 4, (6,))), batch_size=6).id == graph.id
    untraced = capture(Tiny(), (torch.randint(0, 50, (6, 3)), torch.randint(0, 4, (6,))), batch_size=6, trace=False)
    assert untraced.trace is None and untraced.trace_id is None
    assert untraced.id != graph.id
    assert "trace_id" not in untraced.id_content()


def test_the_trace_records_forward_backward_and_a_steady_state_optimizer_step() -> None:
    trace = _tiny_graph().trace
    forward = [op.op for op in trace.forward]
    assert "aten::embedding.default" in forward and "aten::addmm.default" in forward
    assert "aten::nll_loss_forward.default" in forward
    backward = [op.op for op in trace.backward]
    assert "aten::embedding_dense_backward.default" in backward and "aten::mm.default" in backward
    optimizer = [op.op for op in trace.optimizer_step]
    assert "aten::addcdiv_.default" in optimizer  # Adam's update
    assert "aten::zeros_like.default" not in optimizer  # its state already exists: a steady-state step
    assert {trace.layers[op.layer] for op in trace.optimizer_step} == {"<optimizer>"}


def test_ops_name_their_layer_and_parameters_their_variable() -> None:
    graph = _tiny_graph()
    trace = graph.trace
    layers = {layer.name for layer in graph.layers}
    assert {trace.layers[op.layer] for op in (*trace.forward, *trace.backward)} <= layers
    addmm = next(op for op in trace.forward if op.op == "aten::addmm.default")
    assert trace.layers[addmm.layer] == "fc"
    fc_ops = [op for op in trace.forward if trace.layers[op.layer] == "fc"]
    read = [trace.tensors[i] for op in fc_ops for i in tensor_refs(op.args)]
    assert {t.name for t in read if t.source == "parameter"} == {"fc.weight", "fc.bias"}
    names = {t.name for t in trace.tensors if t.source == "parameter"}
    assert names == {v.name for v in graph.variables}
    assert {t.name for t in trace.tensors if t.source == "buffer"} == {
        "norm.running_mean",
        "norm.running_var",
        "norm.num_batches_tracked",
    }
    assert set(trace.gradients) == {v.name for v in graph.variables}
    assert trace_graph_problems(trace, graph) == []


def test_shapes_dtypes_strides_and_saved_activations_are_recorded() -> None:
    trace = _tiny_graph().trace
    inputs = [trace.tensors[i] for i in trace.inputs]
    assert [(t.shape, t.dtype) for t in inputs] == [([6, 3], "int64"), ([6], "int64")]
    embedding = next(op for op in trace.forward if op.op == "aten::embedding.default")
    out = trace.tensors[embedding.out["t"]]
    assert (out.shape, out.dtype, out.stride) == ([6, 3, 8], "float32", [24, 8, 1])
    saved = [t for t in trace.tensors if t.saved]
    assert saved and all(t.source in ("op", "input") for t in saved)
    assert trace.tensors[trace.loss].shape == []
    assert any(op.flops > 0 for op in trace.forward) and any(op.flops > 0 for op in trace.backward)


def test_a_backward_op_reads_the_forward_tensors_autograd_saved() -> None:
    trace = _tiny_graph().trace
    made_forward = {i for op in trace.forward for i in tensor_refs(op.out)}
    read_backward = {i for op in trace.backward for i in tensor_refs([op.args, list(op.kwargs.values())])}
    shared = (made_forward & read_backward) - {trace.loss}  # the loss is read once, by backward's ones_like
    assert shared and all(trace.tensors[i].saved for i in shared)


def test_the_trace_round_trips_compressed_with_its_id() -> None:
    trace = zoo_trace("gpt")
    data = trace.to_bytes()
    assert data[:2] == b"\x1f\x8b" and data == trace.to_bytes()  # deterministic bytes
    again = OperatorTrace.from_bytes(data)
    assert again.id == trace.id and again == trace
    assert OperatorTrace.parse(trace.model_dump_json()).id == trace.id
    assert len(data) < len(trace.model_dump_json()) / 5


def zoo_trace(name: str) -> OperatorTrace:
    model, make_batch = zoo.build(name, "small")
    trace = capture(model, make_batch(4), batch_size=4).trace
    assert trace is not None
    return trace


def test_a_decompression_bomb_or_other_bytes_are_refused_without_inflating() -> None:
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb") as stream:
        stream.write(b" " * (8 << 20))
    with pytest.raises(InvalidDocumentError, match="decompresses past 1048576 bytes"):
        OperatorTrace.from_bytes(bomb.getvalue(), max_json_bytes=1 << 20)
    with pytest.raises(InvalidDocumentError, match="not valid gzip"):
        OperatorTrace.from_bytes(b"\x1f\x8b\x08garbage")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["forward"][0].update(op="os.system"), r"forward\[0\]\.op: 'os.system' is not an op name"),
        (lambda d: d["forward"][0].update(args=[{"t": 10**6}]), r"forward\[0\]\.args: reads tensor 1000000"),
        (lambda d: d["forward"][0].update(args=[{"code": "x"}]), r"forward\[0\]\.args: an object argument"),
        (lambda d: d["tensors"][0].update(dtype="object"), r"tensors\.0\.dtype|unknown dtype 'object'"),
        (lambda d: d.update(loss=10**6), r"loss: 1000000 is not a tensor"),
    ],
)
def test_a_malformed_trace_is_refused_naming_the_field(edit, message) -> None:
    data = json.loads(zoo_trace("dlrm").model_dump_json(exclude={"id"}))
    edit(data)
    with pytest.raises(InvalidDocumentError, match=message):
        OperatorTrace.parse(data)


def test_a_trace_that_does_not_match_its_graph_is_named() -> None:
    graph = _tiny_graph()
    other = capture(nn.Sequential(nn.Linear(3, 2)), (torch.randn(2, 3),), batch_size=2)
    problems = {p.path for p in trace_graph_problems(other.trace, graph)}
    assert "graph.trace_id" in problems
    assert any(path.startswith("trace.tensors[") for path in problems)


def test_a_constant_built_in_forward_keeps_its_values() -> None:
    class WithTable(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            table = torch.tensor([0, 2, 1, 3])  # a constant built in forward: its values are recorded
            return self.fc(x)[:, table].sum()

    trace = capture(WithTable(), (torch.randn(2, 4),), batch_size=2).trace
    constants = [t for t in trace.tensors if t.source == "constant"]
    assert any(t.data == [0, 2, 1, 3] for t in constants)
