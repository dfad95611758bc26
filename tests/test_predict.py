"""`stratagem.predict`: one layout or strategy, or many in one simulator call; throughput, MFU and memory
as a user reads them; errors naming the item at fault; the simulator loaded only when called."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from layout_helpers import gpt_graph, gpu_cluster, llama_graph, mixed_shard_synchronizers
from sample_documents import make_cpu_cluster, make_mlp_graph, make_t4_cluster

import stratagem
from stratagem import InvalidLayoutError, Layout, Prediction, UnsupportedStrategyError, predict
from stratagem.builders import AllReduce, PartitionedPS
from stratagem.ir import CATALOG, Node, ResourceSpec

ROOT = Path(__file__).resolve().parents[1]


def test_one_layout_gives_one_prediction_and_a_list_gives_a_list_in_order() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    one = predict(graph, cluster, Layout(tensor=2))
    assert isinstance(one, Prediction) and one.label == "dp=8,tp=2,mb=2,gbs=16"
    many = predict(graph, cluster, [Layout(), Layout(tensor=2), Layout(pipeline=2, global_batch=64)])
    assert [p.label for p in many] == ["dp=16,mb=2,gbs=32", "dp=8,tp=2,mb=2,gbs=16", "dp=8,pp=2,mb=2,gbs=64"]
    assert many[1].step_time_s == pytest.approx(one.step_time_s)
    assert predict(graph, cluster, []) == []


def test_throughput_counts_every_micro_batch_of_a_step_and_tokens_by_the_sequence() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    prediction = predict(graph, cluster, Layout(pipeline=2, global_batch=64))
    assert prediction.global_batch == 64 and prediction.devices == 16
    assert prediction.samples_per_s == pytest.approx(64 / prediction.step_time_s)
    assert graph.architecture is not None
    assert prediction.tokens_per_s == pytest.approx(prediction.samples_per_s * graph.architecture.seq)
    assert predict(make_mlp_graph(), make_t4_cluster(1), Layout()).tokens_per_s is None


def test_mfu_is_model_flops_over_the_dense_peak_of_every_device_at_the_precision() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(1, 8)
    prediction = predict(graph, cluster, Layout(global_batch=32, recompute="full"))
    steps = 32 // (graph.batch_size * 8)
    assert prediction.model_flops_per_step == pytest.approx(graph.total_flops * steps * 8)
    peak = 8 * CATALOG["H100"].peak_flops["float32"]
    assert prediction.mfu == pytest.approx(prediction.model_flops_per_step / prediction.step_time_s / peak)


def test_a_layout_that_does_not_fit_says_by_how_much() -> None:
    tiny = CATALOG["H100"].model_copy(update={"name": "H100-1MB", "memory_bytes": 1e6})
    cluster = ResourceSpec(
        name="tiny",
        nodes=[Node(address="10.0.0.1", chief=True, gpus=[0, 1], device="H100-1MB")],
        devices={"H100-1MB": tiny},
    )
    prediction = predict(gpt_graph(), cluster, Layout())
    assert not prediction.feasible and prediction.memory_capacity_bytes == 1e6
    assert prediction.memory_over_bytes == pytest.approx(prediction.memory_per_device_bytes - 1e6)
    assert "does not fit" in prediction.bottleneck and "over" in (prediction.infeasible_reason or "")


def test_a_layout_and_the_strategy_it_builds_are_priced_the_same() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    layout = Layout(tensor=2, pipeline=2, global_batch=64, zero=2)
    by_layout, by_strategy = predict(graph, cluster, [layout, layout.build(graph, cluster)])
    assert by_strategy.step_time_s == pytest.approx(by_layout.step_time_s)
    assert by_strategy.label == by_layout.label and by_strategy.strategy_id == by_layout.strategy_id
    assert by_layout.strategy is not None and by_layout.strategy.id == by_layout.strategy_id
    assert "strategy" not in by_layout.model_dump()


def test_a_builders_strategy_is_priced_under_its_own_description() -> None:
    graph, cluster = make_mlp_graph(), make_t4_cluster(2)
    prediction = predict(graph, cluster, PartitionedPS().build(graph, cluster))
    assert prediction.layout is None and prediction.label.startswith("PartitionedPS: 8 replicas")
    assert sum(prediction.breakdown.values()) == pytest.approx(prediction.step_time_s, rel=1e-6)


def test_a_bad_item_in_a_list_is_named_by_its_index() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(1, 8)
    with pytest.raises(InvalidLayoutError) as error:
        predict(graph, cluster, [Layout(), Layout(), Layout(tensor=8)])
    assert error.value.problems[0].path == "[2].tensor"
    mixed = mixed_shard_synchronizers(graph, cluster)
    with pytest.raises(UnsupportedStrategyError, match=r"^\[1\]: variable .* different synchronizer kinds"):
        predict(graph, cluster, [Layout(), mixed])


@pytest.mark.slow
def test_importing_the_library_and_its_predict_module_does_not_load_the_simulator() -> None:
    code = (
        "import sys, stratagem\n"
        "from stratagem import predict, Layout\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'simulator', 'torch', 'optimizer_service'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
    assert stratagem.predict is predict


# --- laws of the new knobs: pinned now, priced when the simulator carries them ---------------------


def test_bf16_compute_is_faster_than_fp32_and_its_mfu_is_over_the_bf16_peak() -> None:
    graph, cluster = llama_graph(batch=8, seq=256), gpu_cluster(1, 8)
    fp32, bf16 = predict(graph, cluster, [Layout(), Layout(precision="amp-bf16")])
    assert bf16.step_time_s < fp32.step_time_s
    peak = 8 * CATALOG["H100"].peak_flops["bfloat16"]
    assert bf16.mfu == pytest.approx(bf16.model_flops_per_step / bf16.step_time_s / peak)


def test_selective_recomputation_costs_less_than_full_and_more_than_none() -> None:
    graph, cluster = llama_graph(batch=8, seq=256), gpu_cluster(1, 8)
    none, selective, full = predict(
        graph, cluster, [Layout(recompute=r, tensor=2, sequence_parallel=True) for r in ("none", "selective", "full")]
    )
    assert none.step_time_s < selective.step_time_s < full.step_time_s
    assert none.memory_per_device_bytes > selective.memory_per_device_bytes > full.memory_per_device_bytes


def test_each_zero_level_holds_less_memory_than_the_one_below() -> None:
    graph, cluster = llama_graph(), gpu_cluster(1, 8)
    memory = [p.memory_per_device_bytes for p in predict(graph, cluster, [Layout(zero=z) for z in (0, 1, 2, 3)])]
    assert memory == sorted(memory, reverse=True) and len(set(memory)) == 4


def test_a_step_of_m_micro_batches_computes_m_times_one_micro_batch() -> None:
    graph, cluster = gpt_graph(hidden=512, seq=256), make_cpu_cluster(2)
    one, four = predict(graph, cluster, [Layout(), Layout(global_batch=graph.batch_size * 2 * 4)])
    assert four.breakdown["compute"] == pytest.approx(4 * one.breakdown["compute"], rel=0.05)
    assert four.global_batch == 4 * one.global_batch


def test_a_strategy_without_a_micro_batch_size_splits_its_graphs_batch_and_one_with_it_repeats_it() -> None:
    from simulator import simulate

    graph, cluster = gpt_graph(hidden=512, seq=256), make_cpu_cluster(2)
    whole = AllReduce().build(graph, cluster)
    split = whole.replace(pipeline={"stages": [[layer.name for layer in graph.layers]], "micro_batches": 2})
    repeated = split.replace(micro_batch_size=graph.batch_size)
    one, two, twice = simulate(graph, cluster, [whole, split, repeated])
    assert two.breakdown["compute"] == pytest.approx(one.breakdown["compute"], rel=0.1)
    assert twice.breakdown["compute"] == pytest.approx(2 * one.breakdown["compute"], rel=0.1)
    assert twice.samples_per_s * twice.step_time_s == pytest.approx(2 * one.samples_per_s * one.step_time_s)
    assert (split.step_samples(graph.batch_size), repeated.step_samples(graph.batch_size)) == (
        graph.batch_size,
        2 * graph.batch_size,
    )


def test_a_search_strategys_micro_batches_split_its_graphs_batch() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(1, 8)
    whole = AllReduce().build(graph, cluster)
    split = whole.replace(pipeline={"stages": [[layer.name for layer in graph.layers]], "micro_batches": 2})
    layout = split.layout(graph)
    assert (layout.micro_batch, layout.global_batch) == (graph.batch_size // 2, graph.batch_size * 8)
    prediction = predict(graph, cluster, split)
    assert prediction.global_batch == graph.batch_size * 8 and prediction.label == str(layout)


def test_larger_ddp_buckets_leave_more_of_the_all_reduce_after_backward() -> None:
    graph, cluster = gpt_graph(hidden=256, batch=64, seq=256), gpu_cluster(2, 8)
    steps = [predict(graph, cluster, Layout(bucket_mb=mb)) for mb in (1, 4, 25, 200)]
    exposed = [p.breakdown["allreduce"] for p in steps]
    assert exposed[0] < exposed[1] < exposed[2] == pytest.approx(exposed[3])
    assert steps[2].step_time_s == pytest.approx(predict(graph, cluster, Layout()).step_time_s)
