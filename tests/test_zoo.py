"""stratagem.zoo: every model trains for real at small size, and full configs have the published shapes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stratagem import capture
from stratagem.errors import InvalidDocumentError
from stratagem.zoo import PRESETS, SIZES, ZOO, build, count_parameters, resolve_config, transformer_parameters

MODELS = sorted(ZOO)


@pytest.mark.parametrize("name", MODELS)
def test_small_model_takes_a_real_optimizer_step_with_a_finite_loss(name: str) -> None:
    torch.manual_seed(0)
    model, make_batch = build(name)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(*make_batch(2))
    loss.backward()
    optimizer.step()
    assert loss.dim() == 0 and math.isfinite(loss.item())
    changed = sum(not torch.equal(old, new) for old, new in zip(before, model.parameters(), strict=True))
    assert changed >= len(before) // 2


@pytest.mark.parametrize("name", MODELS)
def test_small_model_captures_with_all_its_parameters(name: str) -> None:
    model, make_batch = build(name)
    graph = capture(model, make_batch(2), batch_size=2)
    assert graph.num_parameters == sum(p.numel() for p in model.parameters())
    assert graph.total_flops > 0
    assert graph.provenance["zoo"]["name"] == name
    assert all(v.consumer is not None for v in graph.variables)


@pytest.mark.parametrize(
    ("name", "size", "expected", "tolerance"),
    [
        ("resnet50", "full", 25.56e6, 0.01),  # torchvision resnet50
        ("vgg16", "full", 138.36e6, 0.01),  # torchvision vgg16
        ("bert_large", "full", 335e6, 0.02),  # BERT-large with its tied MLM decoder
        ("gpt", "full", 124.4e6, 0.01),  # GPT-2 small
        ("dlrm", "full", 12.6e6 * 64, 0.01),  # tables dominate
        ("densenet121", "full", 7_978_856, 0.001),  # torchvision densenet121
        ("inception_v3", "full", 23_834_568, 0.001),  # torchvision inception_v3 without its auxiliary head
    ],
)
def test_full_configs_have_the_published_parameter_counts(
    name: str, size: str, expected: float, tolerance: float
) -> None:
    assert count_parameters(name, size) == pytest.approx(expected, rel=tolerance)


def test_gpt_7b_is_llama_7b_sized_and_builds_on_meta_only() -> None:
    model, make_batch = build("gpt", "7b", device="meta", layers=2)
    assert all(p.is_meta for p in model.parameters())
    tokens, _ = make_batch(1)
    assert tokens.is_meta and tokens.shape == (1, 2048)
    assert transformer_parameters(resolve_config(PRESETS["gpt"], "7b", {})) == pytest.approx(6.74e9, rel=0.01)
    with pytest.raises(InvalidDocumentError, match=r"device: gpt size '7b' has 6.7B parameters"):
        build("gpt", "7b")


@pytest.mark.parametrize(
    ("size", "billions"),
    [
        ("1.7b", 1.7),
        ("3.6b", 3.6),
        ("7.5b", 7.5),
        ("18b", 18.4),
        ("39b", 39.1),
        ("76b", 76.1),
        ("145b", 145.6),
        ("310b", 310.1),
        ("530b", 529.6),
        ("1t", 1008.0),
    ],
)
def test_megatron_presets_match_the_paper(size: str, billions: float) -> None:
    config = resolve_config(PRESETS["gpt"], size, {})
    assert config.vocab == 51200 and config.seq == 2048 and config.ffn == 4 * config.hidden
    assert transformer_parameters(config) == pytest.approx(billions * 1e9, rel=0.03)


@pytest.mark.parametrize(("name", "size"), [("gpt", "small"), ("gpt", "7b"), ("gpt", "1.7b"), ("bert_large", "full")])
def test_parameter_formula_matches_the_built_model(name: str, size: str) -> None:
    presets = PRESETS[name]
    config = resolve_config(presets, size, {"layers": 2})
    assert count_parameters(name, size, layers=2) == transformer_parameters(config)


def test_dlrm_has_sparse_tables_of_different_sizes() -> None:
    model, make_batch = build("dlrm")
    tables = [m for m in model.modules() if isinstance(m, nn.EmbeddingBag)]
    assert [t.num_embeddings for t in tables] == [20_000, 5_000, 1_000, 200]
    assert all(t.sparse for t in tables)
    dense, indices, offsets, labels = make_batch(3)
    assert dense.shape == (3, 13) and indices.shape == (4, 6) and offsets.tolist() == [0, 2, 4]
    assert labels.dtype == torch.float32


def test_overrides_are_coerced_from_strings_and_recorded() -> None:
    model, _ = build("gpt", layers="3", tie_embeddings="false")
    assert len(model.blocks) == 3 and model.head.weight is not model.embed.weight
    assert model.zoo_spec["overrides"] == {"layers": "3", "tie_embeddings": "false"}
    assert model.zoo_spec["config"]["layers"] == 3
    model, _ = build("dlrm", tables="100,50")
    assert [t.num_embeddings for t in model.tables] == [100, 50]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: build("gpt", size="huge"), r"size: unknown size 'huge'; known: small, full, 7b"),
        (lambda: build("gpt", layerz=2), r"overrides.layerz: unknown field"),
        (lambda: build("gpt", layers="many"), r"overrides.layers: cannot use 'many'"),
        (lambda: build("gpt", layers=0), r"overrides.layers: must be positive, got 0"),
        (lambda: build("gpt", hidden=30, heads=4), r"hidden\(30\) % heads\(4\) != 0"),
        (lambda: build("gpt", mlp="relu"), r"overrides.mlp: cannot use 'relu': must be one of"),
        (lambda: build("alexnet"), r"name: unknown zoo model 'alexnet'"),
        (lambda: build("gpt")[1](0), r"batch_size: must be a positive integer, got 0"),
    ],
)
def test_bad_configs_name_the_field(call: object, message: str) -> None:
    with pytest.raises(InvalidDocumentError, match=message):
        call()  # type: ignore[operator]


def test_registry_lists_every_builder_with_its_sizes() -> None:
    assert set(ZOO) == {"resnet50", "vgg16", "bert_large", "gpt", "dlrm", "densenet121", "inception_v3"} == set(SIZES)
    assert {"small", "full", "7b", "1t"} <= set(SIZES["gpt"])
    assert all({"small", "full"} <= set(sizes) for sizes in SIZES.values())
