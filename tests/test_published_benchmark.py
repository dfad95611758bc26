"""`benchmarks/published.py` on eight published rows (tests/data/published_rows.csv, copied with their
source columns from shared/published/gpu_measurements.csv): each row's model, cluster and layout, the
scores on hand-worked numbers, the accounting of misses, and the rows as trials in a real service."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from layout_helpers import gpt_graph

import stratagem
from benchmarks import published
from benchmarks.lib import published_capture, published_layouts, published_models, published_rows, published_scoring

FIXTURE = Path(__file__).resolve().parent / "data" / "published_rows.csv"


@pytest.fixture(scope="module")
def rows() -> dict[str, Any]:
    return {row.id: row for row in published_rows.read_rows(FIXTURE)}


# --- rows to layouts, clusters and models -------------------------------------------------------


def test_rows_are_read_with_ids_per_source_and_the_derived_step_time(rows) -> None:
    assert list(rows) == [
        "megatron_sc21_table1:1",
        "bigscience_bloom176b:1",
        "dlperf_ngc_pytorch_resnet50:1",
        "dlperf_ngc_pytorch_resnet50:2",
        "deepspeed_autotuning_hf:1",
        "deepspeed_autotuning_hf:2",
        "torchtitan_benchmarks:1",
        "torchtitan_benchmarks:2",
    ]
    megatron = rows["megatron_sc21_table1:1"]
    assert megatron.model == "megatron-gpt-76.1B" and megatron.measured_step_s == 16.06 and megatron.seq == 2048
    assert rows["torchtitan_benchmarks:1"].measured_memory_bytes == pytest.approx(76.8 * 1024**3)
    assert rows["dlperf_ngc_pytorch_resnet50:1"].measured_memory_bytes is None


def test_megatron_interleaving_and_its_16_bit_model_become_the_layout(rows) -> None:
    layout = published_layouts.layout(rows["megatron_sc21_table1:1"])
    assert (layout.data, layout.tensor, layout.pipeline, layout.context) == (32, 8, 4, 1)
    assert (layout.micro_batch, layout.micro_batches, layout.global_batch) == (2, 28, 1792)
    assert (layout.schedule, layout.virtual_stages) == ("interleaved-1f1b", 3)
    # Megatron's --fp16 trains an fp16 model beside fp32 main weights, no autocast: the IR's `fp16`
    assert (layout.zero, layout.recompute, layout.precision, layout.sequence_parallel) == (0, "full", "fp16", False)


def test_bloom_is_zero_1_in_16_bit_bf16_on_twelve_uneven_stages(rows) -> None:
    row = rows["bigscience_bloom176b:1"]
    layout = published_layouts.layout(row)
    assert (layout.data, layout.tensor, layout.pipeline, layout.micro_batches) == (8, 4, 12, 128)
    assert (layout.zero, layout.precision, layout.recompute, layout.schedule) == (1, "bf16", "full", "1f1b")
    config = published_models.model_spec(row).config
    assert config["model_type"] == "bloom" and config["n_layer"] == 70 and config["vocab_size"] == 250880


def test_torchtitan_local_batch_splits_into_pipeline_micro_batches_and_tp_always_splits_the_sequence(rows) -> None:
    row = rows["torchtitan_benchmarks:2"]
    layout = published_layouts.layout(row)
    assert (layout.data, layout.tensor, layout.pipeline) == (8, 8, 8)
    assert (layout.micro_batch, layout.micro_batches, layout.global_batch) == (4, 8, 256)
    assert (layout.schedule, layout.virtual_stages) == ("interleaved-1f1b", 2)
    assert layout.sequence_parallel and layout.zero == 3 and layout.precision == "fp8"
    spec = published_models.model_spec(row)
    assert spec.batch == 4 and spec.seq == 8192
    assert spec.config["num_key_value_heads"] == 8 and spec.config["rope_scaling"]["rope_type"] == "llama3"


def test_clusters_take_the_rows_gpus_nodes_and_links(rows) -> None:
    sixteen = published_layouts.cluster(rows["dlperf_ngc_pytorch_resnet50:2"])
    assert [len(node.gpus) for node in sixteen.nodes] == [8, 8]
    assert {node.device for node in sixteen.nodes} == {"V100-16GB"}
    assert sixteen.network.bandwidth_gbps == 100 and sixteen.network.kind == "infiniband"
    assert sixteen.intra_link(sixteen.nodes[0]).kind == "nvlink"  # NVLink2, not the CPU link
    one = published_layouts.cluster(rows["dlperf_ngc_pytorch_resnet50:1"])
    assert one.num_devices == 1 and len(one.nodes) == 1
    dgx2 = published_layouts.cluster(rows["deepspeed_autotuning_hf:1"])
    assert len(dgx2.nodes) == 1 and dgx2.num_devices == 16
    assert dgx2.device_spec("V100").memory_bytes == 32e9


def test_the_96gb_hbm2e_h100_is_the_catalogs_500_watt_part_with_its_nvlink(rows) -> None:
    row = rows["torchtitan_benchmarks:1"]
    spec = published_layouts.cluster(row)
    device = spec.device_spec("H100-SXM-96GB-HBM2e")
    assert device.memory_bytes == 96e9 and device.memory_bandwidth == 2.4e12
    # 500 W sustains (500/700)^(1/3) of the 700 W part's clock, and every peak with it.
    clock = (500 / 700) ** (1 / 3)
    assert device.peak_flops["bfloat16"] == pytest.approx(989e12 * clock)
    assert device.peak_flops["float8"] == pytest.approx(1979e12 * clock)
    assert spec.intra_link(spec.nodes[0]).bandwidth_gbps == 3600
    assert published_layouts.proposed_catalog_entries(list(rows.values())) == []


def test_every_published_flag_is_stated_compile_and_fused_kernels_included(rows) -> None:
    misses = published_layouts.expressibility_misses
    assert all(misses(row) == [] for row in rows.values())
    assert published_layouts.layout(rows["torchtitan_benchmarks:1"]).compile
    # Megatron's fused softmax, bias-GeLU and bias-dropout-add kernels are what compile prices
    assert published_layouts.layout(rows["megatron_sc21_table1:1"]).compile
    assert not published_layouts.layout(rows["deepspeed_autotuning_hf:1"]).compile


def test_deepspeeds_fp16_runs_are_fp16_models_and_the_trainers_own_fp16_is_autocast(rows) -> None:
    """DeepSpeed's `fp16.enabled` halves the model and steps fp32 master copies; the Trainer's `--fp16`
    without DeepSpeed is native AMP over fp32 weights."""
    import dataclasses

    deepspeed = rows["deepspeed_autotuning_hf:2"]
    assert deepspeed.precision == "fp16" and published_layouts.layout(deepspeed).precision == "fp16"
    plain = dataclasses.replace(deepspeed, other={**deepspeed.other, "variant": "baseline_hf_ddp"})
    assert published_layouts.layout(plain).precision == "amp-fp16"


def test_each_source_steps_its_engines_optimizer(rows) -> None:
    """Megatron's and BLOOM's engines step a fused Adam; torchtitan foreach AdamW until its 2025 default of
    fused; NVIDIA's ResNet-50 PyTorch 1.5's SGD loop; Hugging Face's Trainer its loop AdamW, which
    DeepSpeed's fp16 ZeRO optimizer steps unfused over flat buffers."""
    import dataclasses

    implementation = published_models.optimizer_implementation
    assert implementation(rows["megatron_sc21_table1:1"]) == "fused"
    assert implementation(rows["bigscience_bloom176b:1"]) == "fused"
    assert implementation(rows["dlperf_ngc_pytorch_resnet50:1"]) == "for-loop"
    december = rows["torchtitan_benchmarks:1"]
    assert implementation(december) == "multi-tensor"
    june = dataclasses.replace(december, source_path="benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md")
    assert implementation(june) == "fused"
    assert implementation(rows["deepspeed_autotuning_hf:1"]) == "for-loop"
    assert implementation(rows["deepspeed_autotuning_hf:2"]) == "multi-tensor"
    assert published_models.training_graph(gpt_graph(), june).optimizer.implementation == "fused"


def test_each_source_clips_as_its_runs_do(rows) -> None:
    """Megatron's SC21 script passes --clip-grad 1.0, BLOOM keeps Megatron's 1.0, torchtitan's configs set
    max_norm 1.0; Hugging Face's Trainer clips at 1.0 unless DeepSpeed steps (whose configs set no
    gradient_clipping); NVIDIA's ResNet-50 recipe does not clip."""
    clip = published_models.max_grad_norm
    for row in ("megatron_sc21_table1:1", "bigscience_bloom176b:1", "torchtitan_benchmarks:1"):
        assert clip(rows[row]) == 1.0
    assert rows["deepspeed_autotuning_hf:1"].other["variant"] == "baseline_hf_ddp"
    assert clip(rows["deepspeed_autotuning_hf:1"]) == 1.0
    assert clip(rows["deepspeed_autotuning_hf:2"]) is None
    assert clip(rows["dlperf_ngc_pytorch_resnet50:1"]) is None
    graph = published_models.training_graph(gpt_graph(), rows["megatron_sc21_table1:1"])
    assert graph.optimizer.max_grad_norm == 1.0 and graph.optimizer.implementation == "fused"


def test_each_source_captures_the_attention_and_compute_dtype_its_runs_used(rows) -> None:
    spec = published_models.model_spec
    assert spec(rows["megatron_sc21_table1:1"]).attn_implementation == "eager"
    assert spec(rows["deepspeed_autotuning_hf:1"]).attn_implementation == "eager"
    titan = spec(rows["torchtitan_benchmarks:1"])
    assert (titan.attn_implementation, titan.dtype) == ("sdpa", "bfloat16")
    assert published_layouts.layout(rows["torchtitan_benchmarks:1"]).recompute == "selective-op"


def test_async_tensor_parallelism_is_stated_by_the_layout_not_missed(rows) -> None:
    layout = published_layouts.layout(rows["torchtitan_benchmarks:2"])
    assert layout.async_tensor_parallel and layout.sequence_parallel and layout.tensor == 8
    assert "async_tp=true" in str(layout)
    assert not published_layouts.layout(rows["torchtitan_benchmarks:1"]).async_tensor_parallel


def test_glue_rows_capture_the_classification_head_with_the_rows_shape(rows) -> None:
    row = rows["deepspeed_autotuning_hf:1"]
    spec = published_models.model_spec(row)
    assert spec.config["architectures"] == ["DistilBertForSequenceClassification"]
    graph = published_capture.capture(spec)
    arch = graph.architecture
    assert (arch.layers, arch.hidden, arch.heads, arch.ffn, arch.seq, arch.vocab) == (6, 768, 12, 3072, 128, 30522)
    assert graph.batch_size == 256 and not arch.causal
    masked = stratagem.capture_hf_config(
        {k: v for k, v in spec.config.items() if k not in ("architectures", "num_labels", "problem_type")},
        batch=256,
        seq=128,
    )
    # The vocabulary projection of a masked-LM head is not what a GLUE fine-tune computes.
    assert graph.total_flops < 0.75 * masked.total_flops


def test_resnet50_from_the_zoo_is_v1_5_with_torchvisions_parameter_count(rows) -> None:
    spec = published_models.model_spec(rows["dlperf_ngc_pytorch_resnet50:1"])
    module, _ = stratagem.zoo.build(spec.config["zoo"], spec.config["size"], device="meta")
    first = module.stages[1][0]
    assert first.conv1.stride == (1, 1) and first.conv2.stride == (2, 2)  # v1.5: the stride on the 3x3
    assert sum(p.numel() for p in module.parameters()) == 25_557_032
    assert spec.optimizer == "momentum" and spec.batch == 128


def test_graphs_are_cached_on_disk_and_read_back(rows, tmp_path: Path) -> None:
    spec = published_models.model_spec(rows["dlperf_ngc_pytorch_resnet50:1"])
    first = published_capture.GraphCache(tmp_path).get(spec)
    again = published_capture.GraphCache(tmp_path).get(spec)
    assert not first.cached and again.cached
    assert again.graph.id == first.graph.id and again.capture_s == pytest.approx(first.capture_s, abs=1e-3)
    assert len(list(tmp_path.glob("*.json"))) == 2  # the graph and its capture time


# --- scores -------------------------------------------------------------------------------------


def test_mape_tau_and_scaling_on_hand_worked_numbers() -> None:
    s = published_scoring
    assert s.mape(measured=[1.0, 2.0], predicted=[1.1, 1.6]) == pytest.approx(0.15)
    assert math.isnan(s.mape(measured=[], predicted=[]))
    # 5 concordant pairs, 1 discordant: (5 - 1) / 6.
    assert s.kendall_tau(measured=[1, 2, 3, 4], predicted=[1, 3, 2, 4]) == pytest.approx(4 / 6)
    # A tie in measured: 2 concordant, 1 tied pair; tau-b = 2 / sqrt(3 * 2).
    assert s.kendall_tau(measured=[1, 1, 2], predicted=[1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(s.kendall_tau(measured=[1.0], predicted=[2.0]))
    taus = s.kendall_tau_by_group(measured=[1, 2, 3, 5], predicted=[2, 1, 1, 9], groups=["a", "a", "b", "c"])
    assert taus == {"a": -1.0}
    errors = s.scaling_errors(
        devices=[1, 4, 8, 2], measured=[1.0, 1.1, 1.2, 3.0], predicted=[2.0, 2.0, 2.6, 3.0], series=["x", "x", "x", "y"]
    )
    assert list(errors) == ["x"]
    assert [p["error"] for p in errors["x"]] == pytest.approx([(2.0 / 2.0) / 1.1 - 1, (2.6 / 2.0) / 1.2 - 1])
    assert s.max_abs_scaling_error(errors) == pytest.approx(max(abs(1 / 1.1 - 1), abs(1.3 / 1.2 - 1)))
    with pytest.raises(TypeError):
        s.mape([1.0], [1.0])  # keyword-only


def test_misses_are_counted_by_reason_and_never_scored(rows) -> None:
    priced = published.RowResult(rows["dlperf_ngc_pytorch_resnet50:1"])
    priced.prediction = _prediction(step=0.5)
    refused = published.RowResult(rows["dlperf_ngc_pytorch_resnet50:2"], misses=["simulator: refused"])
    unexpressed = published.RowResult(
        rows["torchtitan_benchmarks:1"], misses=["torch.compile: x"], unexpressed=["torch.compile: x"]
    )
    unexpressed.prediction = _prediction(step=1.0)
    out = published.summary([priced, refused, unexpressed], capture_wall_s=0.0)
    assert out["overall"]["scored"] == 1 and out["overall"]["missed"] == 2
    assert out["overall"]["mape"] == pytest.approx(abs(0.5 - 0.3485) / 0.3485, abs=1e-4)
    assert out["misses_by_reason"] == {"simulator: refused": 1, "torch.compile: x": 1}
    assert [m["id"] for m in out["misses"]] == ["dlperf_ngc_pytorch_resnet50:2", "torchtitan_benchmarks:1"]
    assert out["priced_but_unexpressed"]["ids"] == ["torchtitan_benchmarks:1"]
    assert out["per_source"]["torchtitan_benchmarks"]["scored"] == 0


def test_memory_is_the_live_tensors_priced_with_the_allocators_share_against_the_reported_peak(rows) -> None:
    row = rows["torchtitan_benchmarks:1"]
    resources = published_layouts.cluster(row)
    share = resources.node_device_spec(resources.nodes[0]).allocator_overhead or 0.0
    reporting = published.RowResult(row, resources=resources)
    reporting.prediction = _prediction(step=1.0, memory=70 * 1024**3)
    silent = published.RowResult(rows["dlperf_ngc_pytorch_resnet50:1"])
    silent.prediction = _prediction(step=0.5)
    memory = published.summary([reporting, silent], capture_wall_s=0.0)["memory"]
    entry = memory["per_row"]["torchtitan_benchmarks:1"]
    assert list(memory["per_row"]) == ["torchtitan_benchmarks:1"] and memory["rows"] == 1
    assert entry["reported_gib"] == 76.8 and entry["predicted_gib"] == pytest.approx(70 * (1 + share), abs=0.01)
    assert memory["mape"] == pytest.approx(abs(70 * (1 + share) / 76.8 - 1), abs=1e-4)


def _prediction(*, step: float, memory: float = 1.0) -> Any:
    return stratagem.Prediction(
        label="test",
        strategy_id="s",
        devices=1,
        global_batch=1,
        step_time_s=step,
        samples_per_s=1 / step,
        model_flops_per_step=1.0,
        memory_per_device_bytes=memory,
        memory_capacity_bytes=2.0 * memory,
        feasible=True,
        breakdown={"compute": step},
    )


# --- the whole benchmark, and its rows as trials -------------------------------------------------


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    argv = ["--csv", str(FIXTURE), "--cache", str(tmp_path / "cache"), *extra]
    assert published.main(argv) == 0
    return json.loads(capsys.readouterr().out)


SMALL_SOURCES = ("--source", "dlperf_ngc_pytorch_resnet50", "--source", "deepspeed_autotuning_hf")


def test_every_row_is_scored_or_listed_as_a_miss_with_its_reasons(tmp_path, capsys) -> None:
    out = _run(tmp_path, capsys, *SMALL_SOURCES, "--no-learned")
    assert [r["id"] for r in out["rows"]] == [
        "dlperf_ngc_pytorch_resnet50:1",
        "dlperf_ngc_pytorch_resnet50:2",
        "deepspeed_autotuning_hf:1",
        "deepspeed_autotuning_hf:2",
    ]
    misses = {m["id"]: m["reasons"] for m in out["summary"]["misses"]}
    for row in out["rows"]:
        assert row["scored"] != (row["id"] in misses)
        assert row["scored"] == (row["predicted_step_s"] is not None and not row["miss_reasons"])
        assert all(reason for reason in row["miss_reasons"])
        assert row["capture"]["layers"] > 0 and row["capture"]["seconds"] > 0
    counted = sum(out["summary"]["misses_by_reason"].values())
    assert counted == sum(len(reasons) for reasons in misses.values())
    overall = out["summary"]["overall"]
    assert overall["rows"] == 4 and overall["scored"] + overall["missed"] == 4
    engine = out["deepspeed_engine_timed"]
    assert [(r["model"], r["zero_stage"]) for r in engine["rows"]] == [
        *(("distilbert-base-uncased", stage) for stage in range(4)),
        ("gpt2", 0),
        ("gpt2", 1),
    ]
    assert engine["scores"]["scored"] == 6 and all(0.5 < r["ratio"] < 2 for r in engine["rows"])


def test_deepspeeds_engine_timed_runs_copy_their_models_row_at_the_timed_stage_and_micro_batch(rows) -> None:
    from benchmarks.lib.published_engine_timed import SOURCE, engine_timed_rows, outside_engine

    timed = engine_timed_rows(list(rows.values()))
    assert [(r.model, r.zero_stage, r.micro_batch) for r in timed] == [
        *(("distilbert-base-uncased", stage, 256) for stage in range(4)),
        ("gpt2", 0, 11),
        ("gpt2", 1, 15),
    ]
    for row in timed:
        base = next(r for r in rows.values() if r.source == row.source and r.model == row.model)
        assert row.id.startswith(f"{SOURCE}:") and (row.precision, row.config) == (base.precision, base.config)
        assert row.global_batch == 16 * row.micro_batch and row.measured_metric == "engine_timed_samples_per_s"
        assert row.measured_step_s == pytest.approx(row.global_batch / row.measured_value)
    assert timed[0].measured_step_s == pytest.approx(4096 / 5759.96)
    # the fixture holds no autotuned end-to-end row, so no time outside the engine is read
    assert outside_engine(list(rows.values()), timed) == []


def test_the_csv_must_exist(tmp_path) -> None:
    with pytest.raises(SystemExit):
        published.main(["--csv", str(tmp_path / "missing.csv")])


@pytest.mark.slow
def test_all_fixture_rows_including_a_1024_gpu_megatron_run_and_the_405b_run_get_through(tmp_path, capsys) -> None:
    out = _run(tmp_path, capsys)
    assert out["summary"]["overall"]["rows"] == 8
    mapping = [r for r in out["rows"] if any(m.startswith("mapping:") for m in r["miss_reasons"])]
    assert mapping == []
    by_id = {r["id"]: r for r in out["rows"]}
    assert by_id["torchtitan_benchmarks:2"]["capture"]["parameters"] > 400e9
    assert by_id["bigscience_bloom176b:1"]["capture"]["attn_implementation"] == "eager"
    memory = out["summary"]["memory"]["per_row"]
    assert set(memory) == {"torchtitan_benchmarks:1", "torchtitan_benchmarks:2"}
    # each pipeline stage holds its whole gradient until the last micro-batch, as torchtitan's 405B does
    assert 0.8 < memory["torchtitan_benchmarks:2"]["ratio"] < 1.0
    learned = out["leave_one_source_out"]
    assert set(learned["source_levels"]) == set(learned["sources_priced"])
    assert all(level > 0 for level in learned["source_levels"].values())


@pytest.mark.slow
def test_exported_rows_import_into_a_service_once_and_a_second_import_adds_nothing(tmp_path, capsys) -> None:
    from service_helpers import served

    from stratagem.cli import main as cli

    path = tmp_path / "rows.jsonl"
    out = _run(tmp_path, capsys, *SMALL_SOURCES, "--no-learned", "--export-trials", str(path))
    written = out["export"]["lines"]["trial"]
    assert written == 4 and out["export"]["left_out"] == []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["format"] == "stratagem-trials"
    with served(f"sqlite:///{tmp_path / 'service.db'}") as url:
        assert cli(["trials", "import", str(path), "--url", url]) == 0
        assert f"imported {written} trial(s), skipped 0" in capsys.readouterr().err
        assert cli(["trials", "import", str(path), "--url", url]) == 0
        assert f"imported 0 trial(s), skipped {written} already present" in capsys.readouterr().err
        with stratagem.Client(url) as client:
            stored = client.trials(limit=100)
    assert len(stored) == written
    assert sorted(t["backend"] for t in stored) == sorted(
        [line["backend"] for line in lines if line["kind"] == "trial"]
    )
    assert {t["backend"] for t in stored} == {"dlperf_ngc_pytorch_resnet50", "deepspeed_autotuning_hf"}
    measured = sorted(t["median_s"] for t in stored)
    assert measured == sorted([0.3485, 0.3582, 0.7935, 0.3217])


def test_rows_the_ir_cannot_state_are_left_out_of_the_export_with_their_reason(rows, tmp_path) -> None:
    reasons = ["torch.compile: the IR has no compile knob"]
    compiled = published.RowResult(rows["torchtitan_benchmarks:1"], misses=reasons, unexpressed=reasons)
    report = published.write_trials([compiled], tmp_path / "rows.jsonl", csv_name="rows.csv", version="v")
    assert report["lines"]["trial"] == 0
    assert report["left_out"] == [{"id": "torchtitan_benchmarks:1", "reasons": reasons}]
    header = json.loads((tmp_path / "rows.jsonl").read_text().splitlines()[0])
    assert header["kind"] == "header" and header["source"] == "published:rows.csv"


def test_a_pipeline_cuts_blocks_unevenly_as_torchtitan_does_and_megatron_refuses_it() -> None:
    graph = stratagem.capture_hf_config(
        {
            "model_type": "llama",
            "num_hidden_layers": 10,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 128,
        },
        batch=1,
        seq=32,
    )
    cluster = stratagem.ResourceSpec.parse({"nodes": [{"address": "n0", "gpus": [0, 1, 2, 3], "device": "H100"}]})
    layout = stratagem.Layout(pipeline=4, global_batch=4)
    strategy = layout.build(graph, cluster)
    blocks = [
        sum(".layers." in name and name.endswith("input_layernorm") for name in stage)
        for stage in strategy.pipeline.stages
    ]
    assert sum(blocks) == 10 and len(blocks) == 4 and min(blocks) >= 1
    with pytest.raises(stratagem.UnsupportedStrategyError, match=r"layers\(10\) is not a multiple of pipeline\(4\)"):
        layout.to_megatron(layers=10)
    with pytest.raises(stratagem.InvalidLayoutError, match="every chunk needs a block"):
        stratagem.Layout(pipeline=4, virtual_stages=3, schedule="interleaved-1f1b").build(graph, cluster)
