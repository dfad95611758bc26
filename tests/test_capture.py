"""stratagem.capture: what one fake forward+backward records, per layer and per variable."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from stratagem import capture
from stratagem.errors import CaptureError, InvalidGraphError
from stratagem.ir import DType, LayerKind, ModelGraph
from stratagem.zoo import build


def reference_flops(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    """FlopCounterMode over a real forward+backward of the same step."""
    with FlopCounterMode(display=False) as counter:
        output = model(*inputs)
        (output if output.dim() == 0 else output.sum()).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x)))


class Residual(nn.Module):
    """Reuses one Linear twice and adds a residual outside any leaf module."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        y = self.proj(torch.tanh(y))
        return x + y


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class ItemInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) if x.sum().item() > 0 else x


class TolistInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * len(set(x.argmax(-1).tolist()))


@pytest.mark.parametrize("name", ["resnet50", "vgg16", "bert_large", "dlrm"])
def test_total_flops_agree_with_flop_counter_on_zoo_models(name: str) -> None:
    torch.manual_seed(0)
    model, make_batch = build(name)
    batch = make_batch(2)
    expected = reference_flops(model, batch)
    graph = capture(model, batch, batch_size=2)
    assert expected > 0
    assert graph.total_flops == pytest.approx(expected, rel=0.01)


def test_total_flops_agree_with_flop_counter_on_a_conv_net() -> None:
    model, batch = ConvNet(), (torch.randn(4, 3, 8, 8),)
    assert capture(model, batch, batch_size=4).total_flops == pytest.approx(reference_flops(model, batch), rel=0.01)


def test_sdpa_attention_is_counted_with_the_textbook_formula() -> None:
    model, make_batch = build("gpt", layers=1, hidden=32, heads=4, seq=16)
    graph = capture(model, make_batch(3), batch_size=3)
    attention = [layer for layer in graph.layers if layer.kind is LayerKind.attention]
    assert [layer.name for layer in attention] == ["blocks.0.attn/ops0"]
    b, h, s, d = 3, 4, 16, 8
    assert attention[0].fwd_flops == 4 * b * h * s * s * d
    assert attention[0].bwd_flops == 2 * attention[0].fwd_flops


def test_per_layer_flops_inputs_variables_and_bytes_of_a_small_mlp() -> None:
    graph = capture(TwoLinear(), (torch.randn(5, 8),), batch_size=5)
    assert [layer.name for layer in graph.layers] == ["a", "act", "b", "<loss>"]
    a, act, b, _ = graph.layers
    assert (a.kind, act.kind, b.kind) == (LayerKind.matmul, LayerKind.elementwise, LayerKind.matmul)
    # The batch needs no gradient, so `a`'s backward is the weight gradient alone; `b` also needs dx.
    assert a.fwd_flops == 2 * 5 * 8 * 16 and a.bwd_flops == a.fwd_flops
    assert b.fwd_flops == 2 * 5 * 16 * 4 and b.bwd_flops == 2 * b.fwd_flops
    assert (a.inputs, act.inputs, b.inputs) == ([], ["a"], ["act"])
    assert a.variables == ["a.weight", "a.bias"]
    assert a.output_bytes == 5 * 16 * 4 and b.output_bytes == 5 * 4 * 4
    # a saves its input batch; act saves its output, which b then reads without saving it again.
    assert a.activation_bytes == 5 * 8 * 4
    assert act.activation_bytes == 5 * 16 * 4 and b.activation_bytes == 0
    assert a.bytes_moved >= (5 * 8 + 16 * 8 + 16 + 5 * 16) * 4
    assert graph.variable("b.weight").consumer == "b"


def test_reused_module_gets_numbered_calls_and_residual_ops_get_a_pseudo_layer() -> None:
    graph = capture(Residual(), (torch.randn(2, 8),), batch_size=2)
    names = [layer.name for layer in graph.layers]
    assert names == ["proj", "<root>/ops0", "proj#1", "<root>/ops1", "<loss>"]
    assert graph.layer("proj#1").inputs == ["<root>/ops0"]
    assert graph.layer("<root>/ops1").inputs == ["proj#1"]
    assert graph.layer("proj#1").variables == ["proj.weight", "proj.bias"]
    assert graph.variable("proj.weight").consumer == "proj"


def test_tied_parameters_appear_once_under_the_named_parameters_name() -> None:
    tokens = torch.randint(0, 50, (2, 6))
    graph = capture(Tied(), (tokens,), batch_size=2)
    assert [v.name for v in graph.variables] == ["embed.weight"]
    assert graph.layer("head").variables == ["embed.weight"]
    variable = graph.variable("embed.weight")
    assert variable.consumer == "embed"
    assert variable.lookups_per_step == 12 and not variable.sparse
    assert graph.layer("embed").kind is LayerKind.embedding


def test_sparse_embedding_bags_record_lookups_per_step() -> None:
    model, make_batch = build("dlrm")
    graph = capture(model, make_batch(8), batch_size=8)
    pooling = model.zoo_spec["config"]["pooling"]
    sparse = [v for v in graph.variables if v.sparse]
    assert [v.name for v in sparse] == [f"tables.{i}.weight" for i in range(4)]
    assert all(v.lookups_per_step == 8 * pooling for v in sparse)
    assert [v.shape[0] for v in sparse] == list(model.zoo_spec["config"]["tables"])
    assert all(not v.sparse and v.lookups_per_step is None for v in graph.variables if v.name.startswith("top"))


@pytest.mark.parametrize("bag", [False, True])
def test_an_embedding_lookup_moves_the_rows_it_reads_not_its_table(bag: bool) -> None:
    def traffic(rows: int) -> float:
        table = nn.EmbeddingBag(rows, 16, mode="sum", sparse=True) if bag else nn.Embedding(rows, 16)
        graph = capture(nn.Sequential(table), (torch.randint(0, 64, (8, 3)),), batch_size=8)
        return graph.layer("0").bytes_moved

    looked_up = 8 * 3 * 16 * 4
    assert traffic(100_000) == traffic(64)  # a 6 MiB table costs its lookups, as a 4 KiB one does
    assert looked_up < traffic(64) < 4 * looked_up  # rows read, indices, output written


def test_capture_leaves_a_real_model_untouched() -> None:
    model = ConvNet().eval()
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    first = capture(model, (torch.randn(2, 3, 8, 8),), batch_size=2)
    assert not model.training and not any(m.training for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 10)
    assert capture(model, (torch.randn(2, 3, 8, 8),), batch_size=2).id == first.id


def test_meta_model_captures_like_the_real_one() -> None:
    torch.manual_seed(0)
    real, make_real = build("gpt")
    meta, make_meta = build("gpt", device="meta")
    assert all(p.is_meta for p in meta.parameters())
    real_graph = capture(real, make_real(2), batch_size=2)
    meta_graph = capture(meta, make_meta(2), batch_size=2)
    assert meta_graph.id == real_graph.id


def test_graph_round_trips_through_json_and_carries_provenance() -> None:
    model, make_batch = build("bert_large")
    graph = capture(model, make_batch(2), batch_size=2, optimizer="sgd", name="bert-tiny")
    assert ModelGraph.parse(graph.to_json()).id == graph.id
    assert graph.name == "bert-tiny" and graph.optimizer.kind == "sgd" and graph.optimizer.state_bytes_per_param == 0
    assert graph.provenance["source"] == "capture"
    assert graph.provenance["torch"] == torch.__version__
    assert graph.provenance["model_class"] == "stratagem.zoo.transformer.Transformer"
    assert graph.provenance["zoo"]["name"] == "bert_large" and graph.provenance["zoo"]["size"] == "small"
    assert graph.num_parameters == sum(p.numel() for p in model.parameters())


def test_every_layer_reads_only_earlier_layers_in_a_resnet() -> None:
    model, make_batch = build("resnet50")
    graph = capture(model, make_batch(2), batch_size=2)
    relus = [layer.name for layer in graph.layers if layer.name.startswith("stages.0.0.relu")]
    assert relus == ["stages.0.0.relu", "stages.0.0.relu#1", "stages.0.0.relu#2"]
    assert {layer.kind for layer in graph.layers} >= {LayerKind.conv, LayerKind.norm, LayerKind.matmul}
    assert graph.layer("stages.0.0/ops0").inputs == ["stages.0.0.bn3", "stages.0.0.downsample.1"]


def test_default_loss_uses_the_first_tensor_of_tuple_and_dict_outputs() -> None:
    class TupleOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> dict[str, object]:
            return {"aux": None, "logits": (self.lin(x), x.long())}

    graph = capture(TupleOut(), (torch.randn(2, 4),), batch_size=2)
    assert graph.layer("lin").bwd_flops > 0


def test_custom_loss_fn_and_keyword_inputs() -> None:
    model = TwoLinear()
    graph = capture(
        model, {"x": torch.randn(3, 8)}, batch_size=3, loss_fn=lambda out: F.mse_loss(out, out.detach() + 1)
    )
    assert graph.layer("<loss>").bytes_moved > 0 and graph.layer("a").bwd_flops > 0


@pytest.mark.parametrize("module", [ItemInForward(), TolistInForward()], ids=["item", "tolist"])
def test_data_dependent_forward_fails_naming_the_layer(module: nn.Module) -> None:
    model = nn.Sequential(nn.Linear(4, 4), module)
    with pytest.raises(CaptureError) as caught:
        capture(model, (torch.randn(2, 4),), batch_size=2)
    message = str(caught.value)
    assert f"'1' ({type(module).__name__})" in message
    assert "data-dependent" in message and "DataDependentOutputException" in message


def test_the_optimizer_implementation_is_recorded_with_the_optimizer() -> None:
    graph = capture(
        TwoLinear(), (torch.randn(2, 8),), batch_size=2, optimizer="adamw", optimizer_implementation="fused"
    )
    assert graph.optimizer.kind == "adamw" and graph.optimizer.implementation == "fused"
    assert capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2).optimizer.implementation == "multi-tensor"


def test_the_clip_norm_is_recorded_with_the_optimizer_and_a_graph_without_one_keeps_its_id() -> None:
    plain = capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2, trace=False)
    clipped = capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2, max_grad_norm=1.0, trace=False)
    assert plain.optimizer.max_grad_norm is None and clipped.optimizer.max_grad_norm == 1.0
    assert clipped.id != plain.id
    assert "max_grad_norm" not in str(plain.id_content())


def test_bad_arguments_raise_errors_naming_the_field() -> None:
    with pytest.raises(InvalidGraphError, match=r"batch_size: must be a positive integer, got 0"):
        capture(TwoLinear(), (torch.randn(2, 8),), batch_size=0)
    with pytest.raises(InvalidGraphError, match=r"optimizer.kind: unknown optimizer 'adamz'"):
        capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2, optimizer="adamz")
    with pytest.raises(InvalidGraphError, match=r"optimizer.implementation: unknown implementation 'apex'"):
        capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2, optimizer_implementation="apex")
    with pytest.raises(InvalidGraphError, match=r"optimizer.max_grad_norm: must be a positive finite norm, got 0.0"):
        capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2, max_grad_norm=0.0)
    with pytest.raises(CaptureError, match=r"loss_fn must return a scalar tensor, got shape \[2, 4\]"):
        capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2, loss_fn=lambda out: out)
    frozen = TwoLinear().requires_grad_(False)
    with pytest.raises(CaptureError, match="does not require grad"):
        capture(frozen, (torch.randn(2, 8),), batch_size=2)


def test_bfloat16_model_sets_graph_dtype_and_optimizer_state() -> None:
    graph = capture(TwoLinear().to(torch.bfloat16), (torch.randn(2, 8, dtype=torch.bfloat16),), batch_size=2)
    assert graph.dtype is DType.bfloat16
    assert graph.variable("a.weight").dtype is DType.bfloat16
    assert graph.optimizer.state_bytes_per_param == 4


def test_frozen_parameters_are_recorded_as_not_trainable() -> None:
    model = TwoLinear()
    model.a.requires_grad_(False)
    graph = capture(model, (torch.randn(2, 8),), batch_size=2)
    assert not graph.variable("a.weight").trainable and graph.variable("b.weight").trainable


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_huggingface_models_built_from_configs_capture(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=32)
        model = transformers.GPT2LMHeadModel(config)
        tied = "transformer.wte.weight"
    else:
        config = transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=64,
            vocab_size=128,
            max_position_embeddings=32,
        )
        model = transformers.BertForMaskedLM(config)
        tied = "bert.embeddings.word_embeddings.weight"
    tokens = torch.randint(0, 128, (2, 16))
    graph = capture(model, {"input_ids": tokens}, batch_size=2)
    assert graph.num_parameters == sum(p.numel() for p in model.parameters())
    attention = [layer for layer in graph.layers if layer.kind is LayerKind.attention]
    assert len(attention) == 2 and all(layer.fwd_flops > 0 and layer.bwd_flops > 0 for layer in attention)
    assert graph.variable(tied).lookups_per_step == 32
    assert graph.total_flops > 6 * 0.9 * graph.num_parameters * 32 * 0.5


def test_stratagem_capture_is_the_function_even_after_the_package_is_imported() -> None:
    import inspect

    import stratagem
    import stratagem.tracing.trace  # importing the implementation must not rebind `stratagem.capture`

    assert inspect.isfunction(stratagem.capture)
    graph = stratagem.capture(TwoLinear(), (torch.randn(2, 8),), batch_size=2)
    assert graph.layer("a").fwd_flops == 2 * 2 * 8 * 16
