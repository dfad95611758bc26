"""The LLM dimensions priced from first principles: precision, recomputation, sequence and context
parallelism, pipeline schedules, ZeRO stages and hybrid sharding (docs/simulator.md, "LLM dimensions").

The four laws of issue 43 first, then one or more per knob. Graphs are hand-built where a law needs
exact arithmetic (uniform blocks, a single matmul, no activations), or the zoo's GPT captured on meta.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from simulator import (
    BREAKDOWN_KEYS,
    CandidateBatch,
    activations,
    compile_context,
    encode,
    fsdp,
    schedules,
    simulate,
    simulate_batch,
    to_strategy,
)
from simulator.compute import Knobs, layer_times
from simulator.encoding import Precision, Schedule, SyncKind
from simulator.pipeline import Config, _configs
from simulator.topology import topology
from stratagem import zoo
from stratagem.errors import InvalidStrategyError
from stratagem.ir import Architecture, Layer, Link, ModelGraph, Node, ResourceSpec, Variable
from stratagem.ir.catalog import CATALOG, HOPPER_FP8_OVER_BF16
from stratagem.tracing import capture

HALF = 2


@functools.cache
def gpt() -> ModelGraph:
    module, make_batch = zoo.build("gpt", "small", device="meta")
    return capture(module, make_batch(8), batch_size=8, name="gpt-small")


def block_graph(
    blocks: int = 8, hidden: int = 256, tokens: int = 512, seq: int = 128, heads: int = 4, eager: bool = True
) -> ModelGraph:
    """Identical transformer blocks (norm, qkv, attention core, out, dropout, norm, fc, GELU, proj) and
    nothing else, so every pipeline chunk of whole blocks costs the same. An eager core saves its
    scores, probabilities and dropout mask (5·a·s²·b elements at 4 bytes)."""
    act, layers, variables = 4.0 * tokens * hidden, [], []
    batch = tokens // seq

    def layer(name: str, kind: str, flops: float, saved: float, out: float, inputs: list[str], weight=None) -> str:
        names = []
        if weight is not None:
            variables.append(Variable(name=f"{name}.weight", shape=list(weight)))
            names = [f"{name}.weight"]
        layers.append(
            Layer(
                name=name,
                type=kind,
                kind=kind,
                fwd_flops=flops,
                bwd_flops=2 * flops,
                bytes_moved=saved + out,
                activation_bytes=saved,
                output_bytes=out,
                inputs=inputs,
                variables=names,
            )
        )
        return name

    source: list[str] = []
    for i in range(blocks):
        p = f"blocks.{i}"
        ln = layer(f"{p}.ln1", "norm", 8 * tokens * hidden, act, act, source)
        qkv = layer(f"{p}.qkv", "matmul", 6 * tokens * hidden**2, act, 3 * act, [ln], (3 * hidden, hidden))
        scores = 5.0 * heads * seq * seq * batch * 4 if eager else 4.0 * tokens * heads
        core = layer(f"{p}.core", "attention", 4 * tokens * seq * hidden, 4 * act + scores, act, [qkv])
        out = layer(f"{p}.out", "matmul", 2 * tokens * hidden**2, 0.0, act, [core], (hidden, hidden))
        drop = layer(f"{p}.drop", "other", 0.0, act / 4, act, [out])
        ln2 = layer(f"{p}.ln2", "norm", 8 * tokens * hidden, act, act, [drop])
        fc = layer(f"{p}.fc", "matmul", 8 * tokens * hidden**2, act, 4 * act, [ln2], (4 * hidden, hidden))
        gelu = layer(f"{p}.act", "elementwise", 8 * tokens * hidden, 4 * act, 4 * act, [fc])
        source = [layer(f"{p}.proj", "matmul", 8 * tokens * hidden**2, 0.0, act, [gelu], (hidden, 4 * hidden))]
    return ModelGraph(
        name="blocks",
        batch_size=batch,
        layers=layers,
        variables=variables,
        architecture=Architecture(layers=blocks, hidden=hidden, heads=heads, ffn=4 * hidden, seq=seq, vocab=1),
    )


def matmul_graph(flops: float = 1e15, numel: int = 1 << 20, activations: float = 0.0) -> ModelGraph:
    """One Linear layer: compute-bound, and without activations unless asked."""
    return ModelGraph(
        name="matmul",
        batch_size=1,
        layers=[
            Layer(
                name="fc",
                type="Linear",
                kind="matmul",
                fwd_flops=flops,
                bwd_flops=2 * flops,
                bytes_moved=4.0 * numel,
                activation_bytes=activations,
                output_bytes=activations,
                variables=["fc.weight"],
            )
        ],
        variables=[Variable(name="fc.weight", shape=[numel])],
    )


def gpus(device: str = "H100", nodes: int = 1, per_node: int = 8, gbps: float = 400.0) -> ResourceSpec:
    return ResourceSpec(
        name=f"{device}-{nodes}x{per_node}",
        nodes=[
            Node(address=f"10.0.0.{j + 1}", chief=j == 0, gpus=list(range(per_node)), device=device)
            for j in range(nodes)
        ],
        network=Link(kind="infiniband", bandwidth_gbps=gbps, latency_us=5),
    )


def cpus(count: int = 8) -> ResourceSpec:
    return ResourceSpec(
        name=f"cpu-1x{count}", nodes=[Node(address="127.0.0.1", chief=True, cpus=list(range(count)), device="CPU")]
    )


def candidates(context, rows: list[dict]) -> CandidateBatch:
    """One candidate per dict: mesh degrees, pipeline (chunks of whole units, in order), and any batch field."""
    batch = CandidateBatch.allocate(context, len(rows))
    for i, row in enumerate(rows):
        row = dict(row)
        data, tensor, pipeline, cp = (row.pop(k, 1) for k in ("data", "tensor", "pipeline", "context_parallel"))
        virtual = row.pop("virtual_stages", 1)
        batch.replicas[i] = False
        batch.replicas[i, context.compute_device_indices[: data * tensor * pipeline * cp]] = True
        batch.data[i], batch.tensor[i], batch.pipeline[i], batch.context_parallel[i] = data, tensor, pipeline, cp
        batch.virtual_stages[i] = virtual
        chunks = pipeline * virtual
        units = context.unit_starts.size
        batch.layer_stage[i] = np.minimum(context.layer_unit * chunks // units, chunks - 1)
        for name, value in row.items():
            getattr(batch, name)[i] = value
    batch.validate(context)
    return batch


def component(result, key: str) -> np.ndarray:
    return result.breakdown[:, BREAKDOWN_KEYS.index(key)]


# --- the four laws -----------------------------------------------------------------------------------


def test_recomputation_raises_compute_by_the_forward_it_repeats_and_lowers_activation_memory():
    graph = block_graph()
    context = compile_context(graph, cpus(1))
    result = simulate_batch(
        context,
        candidates(context, [{}, {"recompute": True}, {"selective": True}, {"micro_batches": 4, "recompute": True}]),
    )
    fwd, _ = layer_times(context, 0, 1, 1)
    repeated = fwd[context.layer_recomputed].sum()
    attention = fwd[context.layer_attention].sum()
    compute = component(result, "compute")
    assert compute[1] - compute[0] == pytest.approx(repeated, rel=1e-9)
    assert compute[2] - compute[0] == pytest.approx(attention, rel=1e-9)
    fwd4, _ = layer_times(context, 0, 1, 4)
    assert compute[3] - simulate_batch(context, candidates(context, [{"micro_batches": 4}])).component("compute")[
        0
    ] == pytest.approx(4 * fwd4[context.layer_recomputed].sum(), rel=1e-9)
    assert result.memory[1] < result.memory[0] and result.memory[2] < result.memory[0]


def test_interleaving_divides_the_bubble_by_the_virtual_stages():
    context = compile_context(block_graph(blocks=8), cpus(4))
    plain = {"pipeline": 4, "micro_batches": 8}
    result = simulate_batch(
        context,
        candidates(context, [plain, {**plain, "schedule": Schedule.INTERLEAVED, "virtual_stages": 2}]),
    )
    bubble = component(result, "pipeline_bubble")
    assert bubble[0] / bubble[1] == pytest.approx(2.0, rel=1e-9)
    p2p = component(result, "pipeline_p2p")
    assert p2p[1] > p2p[0]  # every micro-batch crosses p·v − 1 chunk boundaries instead of p − 1


def test_sequence_parallel_divides_norm_and_dropout_activations_by_the_tensor_degree():
    graph = gpt()
    context = compile_context(graph, gpus())
    whole = activations.per_layer(context, activations.Shape(tensor=4))
    split = activations.per_layer(context, activations.Shape(tensor=4, sequence_parallel=True))
    norm_or_dropout = np.array([layer.kind == "norm" or layer.type == "Dropout" for layer in graph.layers])
    saved = norm_or_dropout & (whole > 0)
    assert saved.any()
    np.testing.assert_allclose(split[saved], whole[saved] / 4, rtol=1e-12)
    result = simulate_batch(
        context, candidates(context, [{"tensor": 4, "data": 2}, {"tensor": 4, "data": 2, "sequence_parallel": True}])
    )
    assert result.memory[1] < result.memory[0]
    # the all-reduces become reduce-scatter + all-gather: the same bytes on a ring, the same time
    assert component(result, "tensor_parallel")[1] == pytest.approx(component(result, "tensor_parallel")[0], rel=1e-12)


def test_bf16_matmuls_on_an_a100_are_priced_sixteen_times_faster_than_fp32():
    context = compile_context(matmul_graph(), gpus("A100-80GB", per_node=1))
    times = {p: layer_times(context, 0, 1, 1, Knobs(precision=p))[0][0] for p in Precision}
    # launches ride on each time: equal to 1e-4
    assert times[Precision.FP32] / times[Precision.BF16] == pytest.approx(312 / 19.5, rel=1e-4)
    assert times[Precision.FP32] / times[Precision.AMP_BF16] == pytest.approx(16.0, rel=1e-4)
    assert times[Precision.FP32] / times[Precision.TF32] == pytest.approx(156 / 19.5, rel=1e-4)


# --- precision ---------------------------------------------------------------------------------------


def test_fp8_matmuls_run_at_their_measured_share_of_twice_bf16_on_an_h100_and_are_infeasible_on_an_a100():
    h100 = compile_context(matmul_graph(), gpus("H100", per_node=1))
    bf16 = layer_times(h100, 0, 1, 1, Knobs(precision=Precision.BF16))[0][0]
    fp8 = layer_times(h100, 0, 1, 1, Knobs(precision=Precision.FP8))[0][0]
    # dense tensor TFLOP/s of the H100 SXM data sheet, at the share of it an H200 measured fp8 GEMMs reach
    assert bf16 / fp8 == pytest.approx(1979 / 989 * HOPPER_FP8_OVER_BF16, rel=1e-4)
    graph, resources = gpt(), gpus("A100-80GB", per_node=2)
    a100 = compile_context(graph, resources)
    strategy = to_strategy(a100, candidates(a100, [{"data": 2, "precision": Precision.FP8}]), 0)
    prediction = simulate(graph, resources, [strategy])[0]
    assert not prediction.feasible and "fp8 tensor cores" in (prediction.infeasible_reason or "")


def test_fp32_convolutions_run_at_tf32_as_cudnn_allows_by_default_and_cpus_have_no_tf32():
    graph = zoo.build("resnet50", "small", device="meta")
    module, make_batch = graph
    resnet = capture(module, make_batch(8), batch_size=8, name="resnet")
    context = compile_context(resnet, gpus("A100-80GB", per_node=1))
    conv = context.layer_conv
    fp32, tf32 = (layer_times(context, 0, 1, 1, Knobs(precision=p))[0] for p in (Precision.FP32, Precision.TF32))
    np.testing.assert_allclose(fp32[conv], tf32[conv])
    cpu = compile_context(resnet, cpus(1))
    np.testing.assert_allclose(
        layer_times(cpu, 0, 1, 1, Knobs(precision=Precision.FP32))[0],
        layer_times(cpu, 0, 1, 1, Knobs(precision=Precision.TF32))[0],
    )


@pytest.mark.parametrize(
    ("precision", "per_param"),
    [
        (Precision.FP32, 4 + 4 + 8),
        (Precision.TF32, 4 + 4 + 8),
        (Precision.AMP_BF16, 4 + 4 + 8 + HALF),  # fp32 param, grad, Adam; the half copy autocast saves
        (Precision.BF16, 2 + 2 + 4 + 8),  # ZeRO's 2 + 2 + 12
        (Precision.FP8, 2 + 2 + 4 + 8),
        (Precision.FP16, 2 + 2 + 4 + 8),
    ],
)
def test_each_precision_keeps_its_bytes_per_parameter(precision, per_param):
    numel = 1 << 20
    context = compile_context(matmul_graph(numel=numel), gpus(per_node=8))
    result = simulate_batch(context, candidates(context, [{"data": 8, "precision": precision}]))
    assert result.memory[0] == pytest.approx(numel * per_param, rel=1e-12)
    sharded = candidates(context, [{"data": 8, "precision": precision, "kind": SyncKind.SHARDED, "zero_stage": 1}])
    master = 4 if precision in (Precision.BF16, Precision.FP8, Precision.FP16) else 0
    optimizer = (8 + master) * numel
    assert simulate_batch(context, sharded).memory[0] == pytest.approx(numel * per_param - optimizer * 7 / 8, rel=1e-12)


def test_amp_reduces_fp32_gradients_and_bf16_reduces_half_of_them():
    context = compile_context(gpt(), gpus())
    batch = candidates(
        context,
        [{"data": 8}, {"data": 8, "precision": Precision.AMP_BF16}, {"data": 8, "precision": Precision.BF16}],
    )
    wire = simulate_batch(context, batch, detail=True).detail["allreduce_bytes"]
    assert wire[1] == pytest.approx(wire[0]) and wire[2] == pytest.approx(wire[0] / 2)


def test_an_fp16_model_computes_at_the_fp16_tensor_rate_and_reduces_half_the_gradient_bytes_of_amp():
    """A V100 has fp16 tensor cores and no bf16: an fp16 model (DeepSpeed's `fp16.enabled`) computes at
    the rate autocast's fp16 matmuls do, without autocast's weight casts, and reduces fp16 gradients; on
    an A100 it prices as bf16 does but for unscaling its gradients."""
    v100 = compile_context(matmul_graph(), gpus("V100", per_node=1))
    times = {p: layer_times(v100, 0, 1, 1, Knobs(precision=p))[0][0] for p in Precision}
    assert times[Precision.FP16] <= times[Precision.AMP_FP16]
    assert times[Precision.FP32] / times[Precision.FP16] > 5 and times[Precision.BF16] > 5 * times[Precision.FP16]
    context = compile_context(gpt(), gpus("V100"))
    batch = candidates(
        context, [{"data": 8, "precision": Precision.AMP_FP16}, {"data": 8, "precision": Precision.FP16}]
    )
    wire = simulate_batch(context, batch, detail=True).detail["allreduce_bytes"]
    assert wire[1] == pytest.approx(wire[0] / 2)
    a100 = compile_context(gpt(), gpus("A100-80GB"))
    same = simulate_batch(
        a100, candidates(a100, [{"data": 8, "precision": p} for p in (Precision.BF16, Precision.FP16)])
    )
    # The same step, but fp16 scales its loss: each gradient is read and written once more to unscale it.
    spec = CATALOG["A100-80GB"]
    unscale = 2 * a100.var_bytes.sum() / (spec.memory_bandwidth * spec.elementwise_efficiency)
    assert same.step_time[1] - same.step_time[0] == pytest.approx(unscale, rel=1e-6)
    assert same.memory[1] == same.memory[0]


def test_half_precision_activations_halve_the_tensor_parallel_bytes():
    context = compile_context(gpt(), gpus(gbps=100))
    result = simulate_batch(context, candidates(context, [{"tensor": 8}, {"tensor": 8, "precision": Precision.BF16}]))
    tp = component(result, "tensor_parallel")
    assert tp[1] < tp[0]
    assert result.memory[1] < result.memory[0]


# --- context parallelism ----------------------------------------------------------------------------


def test_context_parallel_ranks_compute_and_hold_one_cth_of_every_layer():
    graph = block_graph()
    context = compile_context(graph, cpus(4))
    launch = context.kinds.launch_overhead_s[0]
    one = layer_times(context, 0, 1, 1)
    two = layer_times(context, 0, 1, 1, Knobs(context_parallel=2))
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose((a - launch) / 2, b - launch, rtol=1e-12)
    held = activations.per_layer(context, activations.Shape(tensor=1, context_parallel=2))
    np.testing.assert_allclose(held, context.activation_bytes / 2)


def test_context_parallel_exchange_hides_behind_the_first_block_until_the_link_is_too_slow():
    graph = block_graph(blocks=2)
    row = [{"context_parallel": 4, "data": 1}]
    fast = compile_context(graph, gpus(nodes=4, per_node=1, gbps=3200))
    slow = compile_context(graph, gpus(nodes=4, per_node=1, gbps=0.1))
    hidden = simulate_batch(fast, candidates(fast, row))
    exposed = simulate_batch(slow, candidates(slow, row))
    assert component(exposed, "context_parallel")[0] > component(hidden, "context_parallel")[0]
    fwd, bwd = layer_times(slow, 0, 1, 1, Knobs(context_parallel=4))
    topo = topology(slow, candidates(slow, row))
    alpha, per_byte = topo.cp[0][0], topo.cp[1][0]
    kv = slow.attention_kv_bytes / 4
    expected = 0.0
    for i in np.flatnonzero(slow.layer_attention):
        send = alpha + kv[i] * per_byte
        gather = 3 * send  # the other three blocks, in one all-gather behind the first block
        expected += max(gather - fwd[i] / 4, 0) + max(gather - bwd[i] / 4, 0) + 3 * max(send - bwd[i] / 4, 0)
    assert component(exposed, "context_parallel")[0] == pytest.approx(expected, rel=1e-9)


def test_gradients_are_reduced_over_data_times_context_ranks():
    context = compile_context(gpt(), gpus())
    topo = topology(context, candidates(context, [{"data": 2, "context_parallel": 4}, {"data": 8}]))
    assert topo.dp_degree.tolist() == [8.0, 8.0]
    assert topo.ring[0][0] == topo.ring[0][1] and topo.ring[1][0] == topo.ring[1][1]


# --- pipeline schedules ----------------------------------------------------------------------------


def test_zero_bubble_fills_the_bubble_with_weight_gradients_once_there_are_enough_micro_batches():
    context = compile_context(block_graph(blocks=8), cpus(4))
    base = {"pipeline": 4, "micro_batches": 8}
    result = simulate_batch(
        context,
        candidates(
            context,
            [
                base,
                {**base, "schedule": Schedule.ZERO_BUBBLE},
                {**base, "schedule": Schedule.ZERO_BUBBLE, "virtual_stages": 2},
                {"pipeline": 4, "micro_batches": 2, "schedule": Schedule.ZERO_BUBBLE},
                {"pipeline": 4, "micro_batches": 2},
            ],
        ),
    )
    bubble = component(result, "pipeline_bubble")
    fwd, bwd = layer_times(context, 0, 1, 8)
    per_rank = 2 * len(context.layer_names) // 8  # two identical blocks per rank
    forward, backward = fwd[:per_rank].sum(), bwd[:per_rank].sum()
    weight = 0.5 * (bwd * context.layer_weight_grad)[:per_rank].sum()
    assert bubble[0] == pytest.approx(3 * (forward + backward), rel=1e-9)
    assert bubble[1] == pytest.approx(3 * (forward + backward - 2 * weight), rel=1e-9)  # ZB-H1
    assert bubble[2] < 0.2 * bubble[0]  # ZBV: its two chunks' W fill all but the attention and element-wise share
    assert bubble[3] == pytest.approx(bubble[4])  # too few micro-batches to fill: priced as 1F1B


def test_each_schedule_holds_the_micro_batches_it_keeps_in_flight():
    p, m = np.array([4.0]), np.array([8.0])
    flight = {
        name: schedules.in_flight(np.array([schedule]), np.array([v]), p, m, 4)[0].tolist()
        for name, schedule, v in (
            ("gpipe", Schedule.GPIPE, 1),
            ("1f1b", Schedule.ONE_F_ONE_B, 1),
            ("interleaved", Schedule.INTERLEAVED, 2),
            ("zbv", Schedule.ZERO_BUBBLE, 2),
        )
    }
    assert flight["gpipe"] == [8, 8, 8, 8]
    assert flight["1f1b"] == [4, 3, 2, 1]
    assert flight["interleaved"] == [5.5, 4.5, 3.5, 2.5]  # Megatron's 2(p − r − 1) + (v − 1)p + 1 chunks, over v
    assert flight["zbv"] == [4, 4, 4, 4]
    context = compile_context(block_graph(blocks=8), cpus(4))
    base = {"pipeline": 4, "micro_batches": 8}
    memory = simulate_batch(
        context,
        candidates(
            context,
            [
                {**base, "schedule": Schedule.GPIPE},
                {**base, "schedule": Schedule.INTERLEAVED, "virtual_stages": 2},
                base,
            ],
        ),
    ).memory
    assert memory[0] > memory[1] > memory[2]


def test_a_zbv_pipeline_folds_its_second_chunks_back_onto_the_ranks():
    ranks = schedules.chunk_rank(np.arange(8)[None, :], np.array([4]), np.array([Schedule.ZERO_BUBBLE]), np.array([2]))
    assert ranks[0].tolist() == [0, 1, 2, 3, 3, 2, 1, 0]
    interleaved = schedules.chunk_rank(
        np.arange(8)[None, :], np.array([4]), np.array([Schedule.INTERLEAVED]), np.array([2])
    )
    assert interleaved[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]


# --- ZeRO stages and hybrid sharding -----------------------------------------------------------------


def test_each_zero_stage_shards_what_it_names():
    numel = 1 << 20
    context = compile_context(matmul_graph(numel=numel), gpus(per_node=8))
    rows = [{"data": 8}] + [{"data": 8, "kind": SyncKind.SHARDED, "zero_stage": s} for s in (1, 2, 3)]
    memory = simulate_batch(context, candidates(context, rows)).memory / numel
    assert memory.tolist() == pytest.approx(
        [16, 4 + 4 + 8 / 8, 4 + (4 + 8) / 8, 16 / 8 + 4]
    )  # stage 3: + the gathered unit


def test_a_pipelined_stage_holds_whole_gradients_at_every_zero_stage():
    """The schedule accumulates every micro-batch's gradient unsharded and reduces once after the last,
    so under a pipeline only the optimizer state is sharded: stages 1, 2 and 3 peak alike."""
    context = compile_context(block_graph(blocks=8), gpus(per_node=8))
    base = {"data": 4, "pipeline": 2, "micro_batches": 4}
    rows = [base] + [{**base, "kind": SyncKind.SHARDED, "zero_stage": s} for s in (1, 2, 3)]
    memory = simulate_batch(context, candidates(context, rows)).memory
    stage_params = 4 * 12 * 256**2  # four blocks of qkv, out, fc and proj
    assert memory[0] - memory[1] == pytest.approx(stage_params * (8 - 8 / 4))  # Adam's fp32 state, ÷ 4
    assert memory[1] == memory[2] == memory[3]


def test_zero_stage_one_all_reduces_gradients_and_stage_three_gathers_in_forward_and_backward():
    context = compile_context(gpt(), gpus(gbps=100))
    rows = [{"data": 8}] + [{"data": 8, "kind": SyncKind.SHARDED, "zero_stage": s} for s in (1, 2, 3)]
    result = simulate_batch(context, candidates(context, rows), detail=True)
    busy = result.detail["allreduce_busy"]
    assert busy[0] > 0 and busy[1:].tolist() == [0, 0, 0]
    sharded = component(result, "sharded")
    assert sharded[3] > 0 and all(result.feasible)


def test_fsdp_prefetch_hides_each_gather_behind_the_unit_before():
    one = np.ones((1, 4))
    assert fsdp.exposed(one, one, 0.5 * one, 0.5 * one)[0] == pytest.approx(1.5)  # first gathers and last scatter
    assert fsdp.exposed(one, one, 0 * one, 0 * one)[0] == 0
    slow = fsdp.exposed(one, one, 3 * one, 0 * one)[0]
    assert slow == pytest.approx(3 + 3 * 2 + 3 + 3 * 2)  # gather-bound: each unit waits 2 s more than it computes


def test_hybrid_sharding_shards_inside_the_group_and_all_reduces_across_groups():
    numel = 1 << 20
    context = compile_context(matmul_graph(numel=numel), gpus(nodes=2, per_node=8, gbps=100))
    rows = [
        {"data": 16, "kind": SyncKind.SHARDED, "zero_stage": 2},
        {"data": 16, "kind": SyncKind.SHARDED, "zero_stage": 2, "shard_group": 8},
    ]
    batch = candidates(context, rows)
    topo = topology(context, batch)
    assert topo.shard_degree.tolist() == [16, 8]
    memory = simulate_batch(context, batch).memory / numel
    assert memory.tolist() == pytest.approx([4 + 12 / 16, 4 + 12 / 8])
    assert topo.replicate[1][0] == 0 and topo.replicate[1][1] > 0
    assert topo.shard_reduce_scatter[1][1] < topo.shard_reduce_scatter[1][0]  # inside a node: NVLink, not the NIC


# --- the encoding --------------------------------------------------------------------------------------


def test_every_new_knob_survives_a_strategy_round_trip_and_is_priced():
    graph, resources = gpt(), gpus(nodes=2)
    context = compile_context(graph, resources)
    rows = [
        {"data": 2, "tensor": 2, "pipeline": 2, "context_parallel": 2, "micro_batches": 4, "virtual_stages": 2,
         "schedule": Schedule.INTERLEAVED, "precision": Precision.AMP_BF16, "sequence_parallel": True, "selective": True},
        {"data": 4, "pipeline": 2, "micro_batches": 4, "virtual_stages": 2, "schedule": Schedule.ZERO_BUBBLE,
         "precision": Precision.FP8, "recompute": True},
        {"data": 16, "kind": SyncKind.SHARDED, "zero_stage": 3, "shard_group": 8, "precision": Precision.BF16},
        {"data": 16, "kind": SyncKind.SHARDED, "zero_stage": 1, "precision": Precision.TF32},
    ]  # fmt: skip
    batch = candidates(context, rows)
    strategies = [to_strategy(context, batch, i) for i in range(len(batch))]
    assert strategies[0].recompute == "selective" and strategies[0].sequence_parallel
    assert strategies[0].effective_mesh.context == 2 and strategies[0].pipeline.schedule == "interleaved-1f1b"
    assert (
        strategies[2].variables[0].synchronizer.stage == 3 and strategies[2].variables[0].synchronizer.shard_group == 8
    )
    again = encode(context, strategies)
    for name, array in batch.arrays().items():
        np.testing.assert_array_equal(getattr(again, name), array, err_msg=name)
    predictions = simulate(graph, resources, strategies)
    for prediction in predictions:
        assert prediction.step_time_s > 0
        assert sum(prediction.breakdown.values()) == pytest.approx(prediction.step_time_s, rel=1e-9)


def test_each_knob_that_decides_layer_times_has_its_own_bits_in_the_configuration_key():
    context = compile_context(gpt(), gpus(nodes=2))
    modes = ({}, {"selective": True}, {"selective_op": True}, {"recompute": True})
    combos = list(itertools.product((False, True), (False, True), modes, (Precision.AMP_BF16, Precision.FP8)))
    rows = [
        {"data": 8, "tensor": 2, "sequence_parallel": True, "compile": c, "async_tp": a, "precision": p, **mode}
        for c, a, mode, p in combos
    ]
    batch = candidates(context, rows)
    kind = np.full(len(rows), 9)
    keys, inverse = _configs(batch, kind, np.arange(len(rows)))
    assert len(keys) == len(rows)
    for i, (compiled, async_tp, mode, precision) in enumerate(combos):
        config = Config.decode(keys[inverse[i]])
        assert (config.kind, config.tensor, config.micro) == (9, 2, 1)
        assert (config.knobs.compile, config.async_tp, config.knobs.precision) == (compiled, async_tp, precision)
        assert (config.selective, config.selective_op, config.recompute) == (
            "selective" in mode,
            "selective_op" in mode,
            "recompute" in mode,
        )
        assert config.knobs.sequence_parallel and config.knobs.context_parallel == 1


@pytest.mark.parametrize(
    ("field", "row", "reason"),
    [
        ("selective", {"data": 8, "selective": True, "recompute": True}, "exclude each other"),
        ("sequence_parallel", {"data": 8, "sequence_parallel": True}, "needs tensor > 1"),
        ("virtual_stages", {"data": 4, "pipeline": 2, "schedule": Schedule.INTERLEAVED}, ">= 2 chunks"),
        ("shard_group", {"data": 8, "shard_group": 3}, "must divide data"),
        ("zero_stage", {"data": 8, "kind": SyncKind.SHARDED, "zero_stage": 4}, "stage 1, 2 or 3"),
        ("replicas", {"data": 8, "context_parallel": 2}, "data\\*tensor\\*pipeline\\*context_parallel"),
    ],
)
def test_an_impossible_combination_is_refused_naming_the_field(field, row, reason):
    context = compile_context(gpt(), gpus(nodes=2))
    batch = CandidateBatch.allocate(context, 1)
    batch.replicas[0] = False
    batch.replicas[0, context.compute_device_indices[:8]] = True
    for name, value in row.items():
        getattr(batch, name)[0] = value
    with pytest.raises(InvalidStrategyError, match=rf"batch\.{field}\[0.*{reason}"):
        batch.validate(context)
