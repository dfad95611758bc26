"""What a new user with a model of their own ran into: each test pins one fix.

The user's models are written here (not zoo models): a transformer LM with nn.MultiheadAttention, an
embedding tied to the output head and a frozen position table; and a CNN that returns logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from sample_documents import make_mlp_graph, make_t4_cluster
from torch import nn

from optimizer_service.core.inputs import JobOptions, SearchBudget
from optimizer_service.jobs.pipeline import run_pipeline
from optimizer_service.jobs.trials import TrialRunnerExecutor
from stratagem import Client, ModelGraph, ResourceSpec, Strategy, capture, zoo
from stratagem.cli import main
from stratagem.client import _capture
from stratagem.errors import InvalidGraphError, InvalidResourceSpecError, InvalidStrategyError, StratagemError
from stratagem.ir import OptimizerSpec
from stratagem.runtime.pipeline_parallel import stage_parameters
from trial_runner import FakeBackend


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return x + a + self.ff(x)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 16, heads: int = 2, layers: int = 2, seq: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.pos.weight.requires_grad_(False)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _lm_graph() -> tuple[TinyLM, ModelGraph]:
    model = TinyLM()
    ids = torch.randint(0, 50, (2, 4))
    return model, capture(model, (ids, ids), batch_size=2)


def test_a_pipeline_stage_holds_the_multihead_attention_out_proj_its_attention_reads() -> None:
    model, graph = _lm_graph()
    names = [layer.name for layer in graph.layers]
    cut = names.index("blocks.1.ln")
    stages = stage_parameters(model, [names[:cut], names[cut:]])
    assert "blocks.0.attn.out_proj.weight" in stages[0] and "blocks.0.attn.out_proj.weight" not in stages[1]
    assert "blocks.1.attn.out_proj.bias" in stages[1] and "blocks.1.attn.out_proj.bias" not in stages[0]
    everything = {name for name, _ in model.named_parameters()}
    assert set(stages[0]) | set(stages[1]) == everything
    assert "tok.weight" in stages[0] and "tok.weight" in stages[1]  # tied to the head in the last stage


def test_a_document_of_another_kind_is_named_in_one_sentence(tmp_path: Path) -> None:
    _, graph = _lm_graph()
    cluster = make_t4_cluster(1)
    with pytest.raises(
        InvalidResourceSpecError, match=r"^invalid resource spec: this is a ModelGraph document, not a ResourceSpec$"
    ):
        ResourceSpec.parse(graph.to_json())
    with pytest.raises(InvalidGraphError, match=r"this is a ResourceSpec document, not a ModelGraph$"):
        ModelGraph.parse(cluster.model_dump(mode="json"))
    path = tmp_path / "graph.json"
    graph.save(path)
    with pytest.raises(InvalidStrategyError, match=r"this is a ModelGraph document, not a Strategy$"):
        Strategy.load(path)
    with pytest.raises(InvalidGraphError, match=r"batch_size: Field required"):  # not a whole other document
        ModelGraph.parse({"layers": [], "variables": []})
    with pytest.raises(InvalidGraphError, match=r"recursion limit"):  # too deep to look for another kind either
        ModelGraph.parse("[" * 100_000 + "]" * 100_000)


def test_a_bare_builder_name_outside_the_zoo_says_how_to_name_your_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "mymodels", "--batch", "2"]) == 2
    err = capsys.readouterr().err
    assert "not a zoo model" in err and "gpt" in err and "MODULE:FUNCTION" in err


def test_an_unknown_optimizer_lists_the_known_ones() -> None:
    with pytest.raises(InvalidGraphError, match=r"unknown optimizer 'sparseadam' \(known: sgd, momentum, .*adamw"):
        OptimizerSpec.of("sparseadam")


def test_the_client_refuses_a_resource_file_name_as_yaml_text() -> None:
    _, graph = _lm_graph()
    with Client("http://127.0.0.1:9") as client:  # refused before any request is made
        with pytest.raises(
            StratagemError, match=r"'spec\.json' looks like a file name.*ResourceSpec\.load\('spec\.json'\)"
        ):
            client.optimize(graph, "spec.json")
        with pytest.raises(StratagemError, match=r"ResourceSpec\.from_autodist_yaml\('cluster\.yml'\)"):
            client.optimize(graph, "cluster.yml")


def test_the_one_liner_captures_with_the_users_loss_fn() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    scored: list[torch.Size] = []

    def loss_fn(output: torch.Tensor) -> torch.Tensor:
        scored.append(output.shape)
        return output.logsumexp(-1).mean()

    graph = _capture(model, (torch.randn(2, 4),), 2, "sgd", loss_fn)
    assert scored == [torch.Size([2, 3])] and graph.optimizer.kind == "sgd"


def test_trials_of_a_users_own_model_say_they_trained_a_replay() -> None:
    executor = TrialRunnerExecutor(FakeBackend(lambda spec: 0.01), name="fake", warmup=1, steps=2, timeout_s=30)
    options = JobOptions(max_trials=1, search=SearchBudget(time_budget_s=0.3, max_candidates=200, top_k=2, seed=0))
    result = run_pipeline(make_mlp_graph(), make_t4_cluster(1), options, lambda p: None, lambda: False, trials=executor)
    assert any("replay of the graph" in note for note in result.summary["notes"])
    claims_zoo = make_mlp_graph().model_copy(update={"provenance": {"zoo": {"name": "dlrm", "size": "small"}}})
    assert "replay of the graph" in str(executor.workload_note(claims_zoo))  # its shapes are not DLRM's
    module, make_batch = zoo.build("dlrm", "small")
    assert executor.workload_note(capture(module, make_batch(2), batch_size=2)) is None
    assert json.dumps(result.summary["notes"])  # stored as JSON with the job
