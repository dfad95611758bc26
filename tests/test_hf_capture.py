"""`stratagem.capture_hf_config` and `stratagem capture --hf-config`: a Hugging Face model from its config
alone, on the meta device, with its architecture recorded and its attention not free."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from layout_helpers import SMALL_LLAMA, llama_graph
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, AutoModelForCausalLM

from stratagem import CaptureError, ModelGraph, capture_hf_config
from stratagem.cli import main
from stratagem.ir import Architecture

GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 300, "n_positions": 128}


def _llama_config() -> object:
    fields = dict(SMALL_LLAMA)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def test_a_dict_a_config_json_and_a_config_object_capture_the_same_model(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_LLAMA))
    graphs = [
        capture_hf_config(config, batch=1, seq=64, name="llama") for config in (SMALL_LLAMA, path, _llama_config())
    ]
    assert len({graph.id for graph in graphs}) == 1
    assert graphs[0].architecture == Architecture(
        layers=4, hidden=64, heads=8, kv_heads=4, ffn=128, seq=64, vocab=512, causal=True
    )
    assert graphs[0].provenance["hf_config"]["num_key_value_heads"] == 4


def test_parameters_are_fp32_whatever_dtype_the_config_names() -> None:
    graph = capture_hf_config({**SMALL_LLAMA, "torch_dtype": "bfloat16"}, batch=1, seq=32)
    assert {str(variable.dtype) for variable in graph.variables} == {"float32"}


def test_gpt2_names_read_through_the_configs_attribute_map() -> None:
    graph = capture_hf_config(GPT2, batch=2, seq=32)
    assert graph.architecture == Architecture(layers=2, hidden=64, heads=4, ffn=256, seq=32, vocab=300, causal=True)
    assert graph.batch_size == 2 and graph.name == "gpt2"


def test_an_encoder_is_captured_with_its_masked_lm_head_and_is_not_causal() -> None:
    bert = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    graph = capture_hf_config({**bert, "intermediate_size": 128, "vocab_size": 300}, batch=1, seq=32)
    assert graph.architecture is not None and not graph.architecture.causal
    assert graph.provenance["model_class"].endswith("BertForMaskedLM")


def test_attention_costs_its_textbook_flops_where_torchs_counter_sees_none() -> None:
    model = AutoModelForCausalLM.from_config(_llama_config(), attn_implementation="sdpa")
    ids = torch.zeros(1, 64, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    counted = {str(op) for op in counter.get_flop_counts()["Global"]}
    assert not any("attention" in op for op in counted), counted  # the CPU SDPA kernel has no formula
    graph = llama_graph(batch=1, seq=64)
    attention = [layer for layer in graph.layers if layer.kind == "attention"]
    assert len(attention) == 4
    heads, seq, head_dim = 8, 64, 64 // 8
    assert attention[0].fwd_flops == 2 * heads * seq * seq * (head_dim + head_dim)
    assert attention[0].bwd_flops == 2 * attention[0].fwd_flops


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        ({"hidden_size": 64}, {}, "model_type is missing"),
        ({"model_type": "no-such-model"}, {}, "model_type 'no-such-model' is not a transformers architecture"),
        (SMALL_LLAMA, {"seq": 1024}, "seq: 1024 is longer than the model's max_position_embeddings(256)"),
        (SMALL_LLAMA, {"batch": 0}, "batch: must be a positive integer, got 0"),
        (42, {}, "config: expected a dict, a path to config.json or a transformers config, got int"),
        ("/no/such/config.json", {}, "no such config file"),
    ],
)
def test_a_config_that_cannot_be_captured_says_why(config: object, kwargs: dict, message: str) -> None:
    with pytest.raises(CaptureError) as error:
        capture_hf_config(config, **{"batch": 1, "seq": 32, **kwargs})
    assert message in str(error.value)


def test_the_cli_captures_a_config_json_into_a_graph_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMALL_LLAMA))
    out = tmp_path / "llama.json"
    argv = ["capture", "--hf-config", str(folder / "config.json"), "--batch", "1", "--seq", "64", "-o", str(out)]
    assert main(argv) == 0
    graph = ModelGraph.load(out)
    assert graph.name == "tiny-llama" and graph.architecture is not None and graph.architecture.seq == 64
    assert graph.optimizer.kind == "adamw"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["capture", "--batch", "1"], "give a builder (MODULE:FUNCTION or a zoo name) or --hf-config"),
        (["capture", "gpt", "--hf-config", "c.json", "--batch", "1"], "not both and not neither"),
        (["capture", "--hf-config", "c.json", "--batch", "1"], "--seq: a positive sequence length is needed"),
        (
            ["capture", "--hf-config", "missing.json", "--batch", "1", "--seq", "8"],
            "--hf-config: missing.json: no such",
        ),
        (["capture", "gpt", "--batch", "1", "--seq", "8"], "--seq: only with --hf-config"),
    ],
)
def test_the_cli_refuses_a_capture_it_cannot_make(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.json").write_text(json.dumps(SMALL_LLAMA))
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_zoo_transformer_records_its_architecture_on_capture() -> None:
    from layout_helpers import gpt_graph

    assert gpt_graph().architecture == Architecture(layers=4, hidden=64, heads=4, ffn=256, seq=32, vocab=1000)
