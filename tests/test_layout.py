"""`stratagem.Layout`: validation with the arithmetic in the message, filling degrees from the device count,
`build()` to a Strategy, and `Strategy.layout()` back."""

from __future__ import annotations

import pytest
from layout_helpers import gpt_graph, gpu_cluster, llama_graph
from sample_documents import make_mlp_graph, make_t4_cluster

from stratagem import InvalidLayoutError, Layout, UnsupportedStrategyError, predict
from stratagem.builders import PS, AllReduce, DataParallel
from stratagem.ir import AllReduceSynchronizer, ShardedSynchronizer
from stratagem.layout_build import FUSION_CHUNK
from stratagem.parallel_rules import Refusal, block_cuts, block_of


def test_the_short_form_reads_and_writes_every_knob() -> None:
    text = (
        "dp=8,tp=4,pp=2,mb=1,gbs=512,schedule=interleaved-1f1b,vpp=2,zero=1,recompute=selective,precision=amp-bf16,sp"
    )
    layout = Layout.from_string(text)
    assert (layout.data, layout.tensor, layout.pipeline, layout.micro_batch, layout.global_batch) == (8, 4, 2, 1, 512)
    assert (layout.schedule, layout.virtual_stages, layout.zero) == ("interleaved-1f1b", 2, 1)
    assert (layout.recompute, layout.precision, layout.sequence_parallel) == ("selective", "amp-bf16", True)
    assert Layout.from_string(str(layout)) == layout
    assert str(Layout()) == "dp=auto"


def test_unset_degrees_are_filled_from_the_device_count_data_first() -> None:
    filled = Layout(tensor=4, pipeline=None).resolved(32)
    assert (filled.data, filled.tensor, filled.pipeline, filled.context) == (8, 4, 1, 1)
    assert Layout.from_string("dp=auto,tp=2").resolved(8).data == 4


@pytest.mark.parametrize(
    ("layout", "devices", "message"),
    [
        (Layout(data=2, tensor=4, pipeline=2), 32, "data: data(2)*tensor(4)*pipeline(2)*context(1)=16 != devices(32)"),
        (Layout(tensor=3), 32, "data: tensor(3)*pipeline(1)*context(1)=3 does not divide devices(32)"),
    ],
)
def test_degrees_that_do_not_fill_the_devices_say_the_arithmetic(layout: Layout, devices: int, message: str) -> None:
    with pytest.raises(InvalidLayoutError) as error:
        layout.resolved(devices)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "pp=2,schedule=interleaved-1f1b",
            "virtual_stages: interleaved-1f1b needs at least 2 chunks per pipeline rank",
        ),
        ("pp=2,vpp=2", "virtual_stages: 1f1b runs one chunk per rank, not 2"),
        ("schedule=zero-bubble", "schedule: zero-bubble needs pipeline > 1 (pipeline is 1)"),
        ("sp", "sequence_parallel: needs tensor > 1 (tensor is 1)"),
        ("dp=8,shard=4", "shard_group: hybrid sharding needs zero >= 1 (zero is 0)"),
        ("dp=6,zero=3,shard=4", "shard_group: shard_group(4) does not divide data(6)"),
        ("zero=1,bucket=50", "bucket_mb: sets DDP's all-reduce buckets, which zero 0 has (zero is 1)"),
        ("bucket=0", "bucket_mb: Input should be greater than or equal to 1"),
        ("zero=3,overlap=false", "overlap_grad_reduce: zero 3 gathers and reduce-scatters unit by unit"),
        ("bucket=50,overlap=false", "bucket_mb: DDP's buckets overlap backward; overlap_grad_reduce is false"),
        ("dp=8,mb=2,gbs=100", "global_batch: global_batch(100) is not a multiple of micro_batch(2)*data(8)=16"),
        ("tp=0", "tensor: Input should be greater than or equal to 1"),
        ("zero=4", "zero: Input should be 0, 1, 2 or 3"),
        ("precision=fp4", "precision: Input should be"),
        ("tp=4,fsdp_degree=2", "fsdp_degree: unknown layout key; known: dp (data), tp (tensor)"),
        ("tp=4,tp=2", "tp: given twice"),
    ],
)
def test_a_layout_that_breaks_a_rule_names_the_field_and_the_reason(text: str, message: str) -> None:
    with pytest.raises(InvalidLayoutError) as error:
        Layout.from_string(text)
    assert message in str(error.value)


def test_build_writes_the_mesh_the_tensor_plan_and_stage_cuts_at_block_starts() -> None:
    graph, cluster = gpt_graph(layers=4), gpu_cluster(2, 8)
    strategy = Layout(tensor=2, pipeline=2, global_batch=32).build(graph, cluster)
    mesh = strategy.effective_mesh
    assert (mesh.data, mesh.tensor, mesh.pipeline) == (4, 2, 2)
    assert strategy.replicas == cluster.compute_devices
    assert {split.style for split in strategy.tensor_parallel} >= {"heads", "colwise", "rowwise"}
    assert strategy.pipeline is not None and len(strategy.pipeline.stages) == 2
    assert strategy.pipeline.micro_batches == 32 // (graph.batch_size * 4)
    assert not isinstance(block_cuts(strategy.pipeline.stages), Refusal)
    assert block_of(strategy.pipeline.stages[1][0]) is not None
    assert strategy.provenance.builder == "Layout"


def test_interleaved_chunks_are_pipeline_times_virtual_stages_and_balanced_by_compute() -> None:
    graph = gpt_graph(layers=8)
    strategy = Layout(pipeline=2, virtual_stages=2, schedule="interleaved-1f1b", global_batch=64).build(
        graph, gpu_cluster(2, 8)
    )
    assert strategy.pipeline is not None
    chunks = strategy.pipeline.stages
    assert len(chunks) == 4 and strategy.pipeline.virtual_stages == 2
    work = {layer.name: layer.fwd_flops + layer.bwd_flops for layer in graph.layers}
    shares = [sum(work[name] for name in chunk) for chunk in chunks]
    block = max(shares) / 3  # a chunk of two blocks holds about one block too many at worst
    assert max(shares) - min(shares) <= block * 1.5


def test_accumulated_micro_batches_without_a_pipeline_are_one_stage() -> None:
    graph = gpt_graph()
    strategy = Layout(global_batch=64).build(graph, gpu_cluster(1, 8))
    assert strategy.pipeline is not None
    assert strategy.pipeline.stages == [[layer.name for layer in graph.layers]]
    assert strategy.pipeline.micro_batches == 64 // (graph.batch_size * 8)
    assert Layout().build(graph, gpu_cluster(1, 8)).pipeline is None


def test_zero_0_all_reduces_in_fusion_groups_and_zero_3_shards_in_the_shard_group() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    plain = Layout().build(graph, cluster)
    assert all(isinstance(c.synchronizer, AllReduceSynchronizer) for c in plain.variables)
    assert [c.synchronizer.group for c in plain.variables] == [i // 128 for i in range(len(plain.variables))]
    hybrid = Layout(zero=3, shard_group=8).build(graph, cluster)
    syncs = [c.synchronizer for c in hybrid.variables]
    assert all(isinstance(s, ShardedSynchronizer) and s.stage == 3 and s.shard_group == 8 for s in syncs)
    assert len(hybrid.variables) == len(graph.trainable_variables)


@pytest.mark.parametrize("bucket_mb", [1, 4, 50])
def test_a_bucket_cap_groups_gradients_as_ddp_buckets_them(bucket_mb: int) -> None:
    graph, cluster = gpt_graph(hidden=256), gpu_cluster(2, 8)
    layout = Layout.from_string(f"bucket={bucket_mb}")
    assert layout.bucket_mb == bucket_mb and Layout.from_string(str(layout)) == layout
    groups = [c.synchronizer.group for c in layout.build(graph, cluster).variables]
    ddp = DataParallel(bucket_cap_mb=bucket_mb).build(graph, cluster)
    assert groups == [c.synchronizer.group for c in ddp.variables]
    ready = list(zip(groups, graph.trainable_variables, strict=True))[::-1]
    sizes = [sum(v.nbytes for g, v in ready if g == group) for group in range(max(groups) + 1)]
    last_member = {g: v.nbytes for g, v in ready}
    caps = [2**20] + [bucket_mb * 2**20] * (len(sizes) - 1)
    assert all(cap <= size < cap + last_member[g] for g, (size, cap) in enumerate(zip(sizes[:-1], caps, strict=False)))
    assert sizes[-1] < caps[-1] + last_member[len(sizes) - 1] and sum(sizes) == sum(
        v.nbytes for v in graph.trainable_variables
    )


@pytest.mark.parametrize(
    ("layout", "cluster", "message"),
    [
        (Layout(tensor=8), gpu_cluster(1, 8), "tensor: tensor(8) does not divide heads(4)"),
        (
            Layout(pipeline=8),
            gpu_cluster(1, 8),
            "pipeline: layers(4) < pipeline(8)*virtual_stages(1)=8: every chunk needs a block",
        ),
        (
            Layout(tensor=4),
            gpu_cluster(2, 2),
            "tensor(4) does not divide the 2 devices of node 10.0.0.1: a tensor group",
        ),
        (
            Layout(micro_batch=4),
            gpu_cluster(1, 8),
            "micro_batch: the graph was captured at batch 2, not micro_batch(4)",
        ),
        (Layout(global_batch=20), gpu_cluster(1, 8), "global_batch(20) is not a multiple of micro_batch(2)*data(8)=16"),
        (Layout(context=3, data=1), gpu_cluster(1, 3), "context: seq(32) is not a multiple of 2*context(3)=6"),
        (Layout(global_batch=1 << 36), gpu_cluster(1, 8), "= 4294967296 micro-batches per replica per step, more than"),
        (
            Layout(micro_batches=2, global_batch=64),
            gpu_cluster(1, 8),
            "global_batch(64) != micro_batch(2)*micro_batches(2)*data(8)=32",
        ),
    ],
)
def test_build_checks_the_layout_against_the_model_and_the_cluster(layout, cluster, message: str) -> None:
    with pytest.raises(InvalidLayoutError) as error:
        layout.build(gpt_graph(), cluster)
    assert message in str(error.value)


def test_grouped_query_attention_needs_the_tensor_degree_to_divide_the_kv_heads() -> None:
    with pytest.raises(InvalidLayoutError, match=r"tensor\(8\) does not divide kv_heads\(4\)"):
        Layout(tensor=8).build(llama_graph(), gpu_cluster(1, 8))
    assert Layout(tensor=4).build(llama_graph(), gpu_cluster(1, 8)).effective_mesh.tensor == 4


def test_context_parallelism_needs_a_transformer() -> None:
    with pytest.raises(InvalidLayoutError, match="the graph records no architecture"):
        Layout(context=2).build(make_mlp_graph(), make_t4_cluster(1))


def test_a_strategy_gives_its_layout_back_with_the_graph_and_keeps_its_micro_batches_without() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    layout = Layout.from_string("tp=2,pp=2,mb=2,gbs=64,zero=1,recompute=full,precision=amp-bf16,sp")
    strategy = layout.build(graph, cluster)
    assert strategy.layout(graph) == layout.resolved(16)
    without = strategy.layout()
    assert (without.micro_batch, without.global_batch, without.micro_batches) == (None, None, 8)
    assert without.build(graph, cluster).id == strategy.id


def test_a_strategy_no_layout_states_is_refused_with_the_reason() -> None:
    graph, cluster = make_mlp_graph(), make_t4_cluster(2)
    with pytest.raises(
        UnsupportedStrategyError, match=r"no layout states this strategy: variable .* is on a parameter server"
    ):
        PS().build(graph, cluster).layout()
    with pytest.raises(UnsupportedStrategyError, match="all-reduced with powersgd compression"):
        AllReduce(compressor="PowerSGDCompressor").build(graph, cluster).layout()
    base = AllReduce().build(graph, cluster)
    mixed = base.replace(
        variables=[
            c.model_copy(update={"synchronizer": ShardedSynchronizer()}) if i == 0 else c
            for i, c in enumerate(base.variables)
        ]
    )
    with pytest.raises(UnsupportedStrategyError, match=r"synchronized differently .*zero 0.*zero 2"):
        mixed.layout()
    with pytest.raises(UnsupportedStrategyError, match="made for graph"):
        base.layout(gpt_graph())
    assert base.layout(graph).data == 8


def test_a_built_strategy_states_its_micro_batch_and_a_trial_feeds_every_micro_batch_of_the_step() -> None:
    from trial_runner import ReplayWorkload, TrialSpec

    graph, cluster = gpt_graph(), gpu_cluster(1, 8)
    strategy = Layout(data=8, micro_batch=graph.batch_size, global_batch=graph.batch_size * 8 * 4).build(graph, cluster)
    assert strategy.micro_batch_size == graph.batch_size and strategy.micro_batches == 4
    assert strategy.step_samples(graph.batch_size) == 4 * graph.batch_size
    spec = TrialSpec(workload=ReplayWorkload(graph), resources=cluster, strategy=strategy)
    assert spec.global_batch_size == graph.batch_size * 4 * 8


def test_a_strategy_gives_back_the_bucket_cap_that_makes_its_groups() -> None:
    graph, cluster = gpt_graph(hidden=256), gpu_cluster(2, 8)
    for bucket_mb in (None, 1, 4):
        strategy = Layout(bucket_mb=bucket_mb).build(graph, cluster)
        assert strategy.layout(graph).bucket_mb == bucket_mb
    assert Layout(bucket_mb=4).build(graph, cluster).layout().bucket_mb is None
    args = Layout(bucket_mb=4).build(graph, cluster).to_megatron(graph)
    assert args[args.index("--ddp-bucket-size") + 1] == str(4 * 2**20 // 4)


def test_reducing_after_backward_is_one_group_per_pipeline_chunk_and_reads_back() -> None:
    graph, cluster = gpt_graph(layers=12, hidden=256), gpu_cluster(2, 8)
    assert len(graph.trainable_variables) > FUSION_CHUNK
    for text in ("overlap=false", "zero=1,overlap=false", "dp=4,pp=4,zero=2,m=4,overlap=false"):
        layout = Layout.from_string(text)
        assert Layout.from_string(str(layout)) == layout and "overlap=false" in str(layout)
        strategy = layout.build(graph, cluster)
        groups = [c.synchronizer.group for c in strategy.variables]
        chunks = (layout.pipeline or 1) * layout.virtual_stages
        assert sorted(set(groups)) == list(range(chunks)) and groups == sorted(groups, reverse=True)
        assert strategy.layout(graph).overlap_grad_reduce is False
        assert (
            Layout.from_string(text.replace(",overlap=false", "").replace("overlap=false", ""))
            .build(graph, cluster)
            .layout(graph)
            .overlap_grad_reduce
        )


def test_reducing_after_backward_exposes_the_whole_reduction() -> None:
    graph, cluster = gpt_graph(layers=12, hidden=256, batch=16, seq=256), gpu_cluster(2, 8)
    for zero in (0, 1, 2):
        during = predict(graph, cluster, Layout(zero=zero))
        after = predict(graph, cluster, Layout(zero=zero, overlap_grad_reduce=False))
        kind = "allreduce" if zero == 0 else "sharded"
        assert after.breakdown[kind] > during.breakdown[kind] and after.step_time_s > during.step_time_s
