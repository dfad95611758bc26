"""Tensor and pipeline splits the runtime cannot execute are refused before any collective, naming the
field and the reason (in-process: no process is spawned)."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import FakeMesh
from tiny_gpt import HEADS, HIDDEN, Attention, loss_fn, tiny_gpt
from torch import nn

from stratagem.errors import InvalidStrategyError, UnsupportedStrategyError
from stratagem.ir import PipelineConfig, Strategy, TensorParallelLayer
from stratagem.parallel_rules import fused_row_order, tie_refusal
from stratagem.runtime import PipelinedModel, distribute
from stratagem.runtime.pipeline_parallel import stage_children
from stratagem.runtime.tensor_parallel import apply_tensor_parallel


def split(*layers: dict) -> list[TensorParallelLayer]:
    return [TensorParallelLayer(**layer) for layer in layers]


def refusal(model: nn.Module, degree: int, *layers: dict) -> str:
    with pytest.raises((InvalidStrategyError, UnsupportedStrategyError)) as caught:
        apply_tensor_parallel(model, FakeMesh(degree), split(*layers))  # type: ignore[arg-type]
    return str(caught.value)


class Interleaved(nn.Module):
    """Megatron's fused projection, laid out [heads, 3, head_dim]: a layout the runtime does not recognise."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = HEADS
        self.query_key_value, self.dense = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)


def test_an_unknown_module_is_named_with_its_field_path() -> None:
    assert "tensor_parallel[0].name: '9.fc' is not a module of the model" in refusal(
        tiny_gpt(), 2, {"name": "9.fc", "style": "colwise"}
    )


def test_a_degree_that_does_not_divide_the_split_axis_is_refused() -> None:
    text = refusal(tiny_gpt(), 3, {"name": "1.fc", "style": "colwise"})
    assert "tensor_parallel[0].style: mesh.tensor(3) does not divide the 128 output features of 1.fc" in text
    text = refusal(tiny_gpt(), 3, {"name": "1.proj", "style": "rowwise"})
    assert "does not divide the 128 input features of 1.proj" in text


def test_a_style_is_refused_on_a_module_it_cannot_split() -> None:
    assert "the colwise style splits a Linear, not LayerNorm" in refusal(
        tiny_gpt(), 2, {"name": "1.ln1", "style": "colwise"}
    )


def test_heads_must_match_the_module_and_split_evenly() -> None:
    assert "tensor_parallel[0].heads: 8 given, but 1.attn.heads is 4" in refusal(
        tiny_gpt(), 2, {"name": "1.attn", "style": "heads", "heads": 8}
    )
    assert "does not divide the 4 heads of 1.attn" in refusal(
        tiny_gpt(), 3, {"name": "1.attn", "style": "heads", "heads": 4}
    )


def test_a_fused_projection_of_an_unrecognised_layout_is_refused_rather_than_split_across_q_k_and_v() -> None:
    text = refusal(nn.Sequential(Interleaved()), 2, {"name": "0", "style": "heads", "heads": HEADS})
    assert "query_key_value has 96 output features for 32 attention features" in text
    assert "nor a fused [q; k; v] projection named one of qkv" in text


def test_a_fused_qkv_is_reordered_so_each_rank_holds_q_k_and_v_of_its_own_heads() -> None:
    heads, head_dim, degree = 4, 2, 2
    order = fused_row_order(heads, head_dim, degree)
    rows = [(block, row // head_dim) for block in "qkv" for row in range(heads * head_dim)]  # (q/k/v, head) of each row
    shards = [[rows[i] for i in order[r * 12 : (r + 1) * 12]] for r in range(degree)]
    assert shards[0] == [(b, h) for b in "qkv" for h in (0, 0, 1, 1)]
    assert shards[1] == [(b, h) for b in "qkv" for h in (2, 2, 3, 3)]
    assert sorted(order) == list(range(3 * heads * head_dim))


def test_a_tied_weight_splits_only_when_every_holder_splits_by_vocabulary() -> None:
    assert tie_refusal({"embed": "vocab", "head": "vocab"}) is None
    assert tie_refusal({"embed": None, "head": None}) is None
    assert "split all of them by vocab" in str(tie_refusal({"embed": "vocab", "head": None}))


def test_an_attention_without_a_head_count_is_refused() -> None:
    attention = Attention()
    del attention.heads
    assert "needs the module's head count" in refusal(
        nn.Sequential(attention), 2, {"name": "0", "style": "heads", "heads": HEADS}
    )


def test_tied_weights_are_not_silently_untied() -> None:
    model = tiny_gpt()
    model[3].out.weight = model[0].tok.weight
    assert "3.out.weight is tied to 0.tok" in refusal(model, 2, {"name": "3.out", "style": "vocab"})


def test_stages_must_cut_between_the_children_of_a_sequential() -> None:
    model = tiny_gpt()
    assert stage_children(model, [["0.tok", "1.attn.q"], ["2.fc", "3.out", "<loss>"]]) == [["0", "1"], ["2", "3"]]
    with pytest.raises(UnsupportedStrategyError, match=r"module '1' is split between stages 0 and 1"):
        stage_children(model, [["0.tok", "1.attn.q"], ["1.fc", "3.out"]])
    with pytest.raises(
        UnsupportedStrategyError, match=r"the model is a Block, not an nn.Sequential; wrap the model's parts"
    ):
        stage_children(model[1], [["ln1"], ["fc"]])
    with pytest.raises(InvalidStrategyError, match=r"pipeline.stages\[1\]\[0\]: '7.fc' is not inside any child"):
        stage_children(model, [["0.tok"], ["7.fc"]])


def test_1f1b_with_fewer_micro_batches_than_stages_is_refused() -> None:
    config = PipelineConfig(stages=[["0"], ["1"], ["2"]], micro_batches=2, schedule="1f1b")
    with pytest.raises(
        InvalidStrategyError,
        match=r"pipeline.micro_batches: 1F1B needs at least as many micro-batches as stages: 2 < 3",
    ):
        PipelinedModel(
            nn.Sequential(),
            stage_index=0,
            num_stages=3,
            config=config,
            group=None,
            device=torch.device("cpu"),
            loss_fn=loss_fn,
        )


def test_micro_batches_inside_forward_need_a_model_that_returns_its_loss_and_batch_first_inputs() -> None:
    from stratagem.runtime.pipeline_parallel import AccumulatedModel

    class ReturnsLogits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    with pytest.raises(UnsupportedStrategyError, match=r"ReturnsLogits returned \[2, 2\], not its loss"):
        AccumulatedModel(ReturnsLogits(), micro_batches=2)(torch.randn(4, 4), torch.zeros(4))
    with pytest.raises(UnsupportedStrategyError, match=r"the inputs' first dimensions are \[3, 4\]"):
        AccumulatedModel(ReturnsLogits(), micro_batches=2)(torch.randn(4, 4), torch.zeros(3))


def test_micro_batches_inside_forward_average_the_loss_and_accumulate_every_gradient() -> None:
    from stratagem.runtime.pipeline_parallel import AccumulatedModel

    class Regression(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (self.fc(x).squeeze(1) - y).square().mean()

    torch.manual_seed(0)
    model, x, y = Regression(), torch.randn(8, 4), torch.randn(8)
    whole = model(x, y)
    whole.backward()
    expected = model.fc.weight.grad.clone()
    model.zero_grad()
    loss = AccumulatedModel(model, micro_batches=4)(x, y)
    assert float(loss.detach()) == pytest.approx(float(whole.detach()), rel=1e-6)
    loss.backward()
    assert torch.allclose(model.fc.weight.grad, expected, rtol=1e-5, atol=1e-7)


def test_micro_batches_without_a_loss_function_are_refused(one_rank) -> None:
    model = tiny_gpt()
    names = [n for n, _ in model.named_parameters()]
    strategy = Strategy.parse(
        {
            "replicas": ["127.0.0.1:CPU:0"],
            "pipeline": {"stages": [["0", "1", "2", "3"]], "micro_batches": 2},
            "variables": [{"var_name": n, "synchronizer": {"kind": "allreduce"}} for n in names],
        }
    )
    with pytest.raises(UnsupportedStrategyError, match=r"needs distribute\(\.\.\., loss_fn=\.\.\.\)"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy)


def test_context_parallelism_is_planned_only_for_attention_the_runtime_reaches_and_without_stages() -> None:
    from stratagem.parallel_rules import context_parallel_refusal

    assert context_parallel_refusal("transformers.models.llama.modeling_llama.LlamaForCausalLM") is None
    assert context_parallel_refusal("stratagem.zoo.transformer.Transformer") is None
    unknown = context_parallel_refusal("my_project.models.MyGPT")
    assert unknown is not None and "MyGPT" in str(unknown)
    assert context_parallel_refusal(None) is not None
    staged = context_parallel_refusal("stratagem.zoo.transformer.Transformer", pipeline=2)
    assert staged is not None and "pipeline" in str(staged)
