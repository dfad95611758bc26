"""A GPU step priced as the kernels it runs: what capture records per layer (element-wise bytes eager and
fused, dropout as one kernel, fused attention calls), how the simulator prices them (GEMM waves,
flash attention, compile, fp8 scaling, per-op checkpointing, backward's gradients), the catalog's 500 W
H100, and the kernel probes of `stratagem calibrate --gpu` (run here on the CPU at toy sizes)."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from layout_helpers import gpt_graph, gpu_cluster, llama_graph
from torch import nn

from simulator import compile_context
from simulator.compute import Knobs, layer_times
from simulator.encoding import Precision
from simulator.kernels import fp8_scaling_bytes, wave_utilisation
from simulator.memory import tensor_room
from simulator.step_graph import step_graph
from stratagem import Layout, capture, predict
from stratagem.calibrate.kernels import KernelShapes, kernel_figures, kernel_probes
from stratagem.calibrate.timing import Stepper
from stratagem.hf import capture_hf_config
from stratagem.ir import LayerKind, ModelGraph
from stratagem.ir.catalog import CATALOG, GPU_ALLOCATOR_OVERHEAD, H100_500W_CLOCK, HOPPER_FP8_OVER_BF16

TINY_GPT2 = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 128,
    "vocab_size": 256,
}


def _without_kernel_fields(graph: ModelGraph) -> ModelGraph:
    layers = [
        layer.model_copy(
            update={
                "arithmetic_bytes": None,
                "elementwise_bytes": 0.0,
                "fused_elementwise_bytes": None,
                "attention": None,
            }
        )
        for layer in graph.layers
    ]
    return graph.replace(layers=layers)


# --- capture ----------------------------------------------------------------------------------------


def test_sdpa_calls_are_recorded_with_their_flops_and_what_a_flash_kernel_streams() -> None:
    graph = capture_hf_config(TINY_GPT2, batch=2, seq=128)
    cores = [layer for layer in graph.layers if layer.attention is not None]
    assert len(cores) == 2 and all(layer.kind == LayerKind.attention for layer in cores)
    core = cores[0].attention
    assert core.causal and core.flops > 0
    # the CPU math path (dropout on) writes the s x s scores several times; a flash kernel only q, k, v, o
    assert core.io_bytes < core.traced_bytes
    eager = capture_hf_config(TINY_GPT2, batch=2, seq=128, attn_implementation="eager")
    assert not any(layer.attention is not None for layer in eager.layers)


def test_dropout_is_one_kernel_and_a_fused_chain_moves_less_than_its_ops() -> None:
    graph = capture_hf_config(TINY_GPT2, batch=2, seq=128)
    dropout = graph.layer("transformer.h.0.mlp.dropout")
    elements = dropout.output_bytes / 4
    # input and output in fp32, the mask one byte per element, where a CPU runs three kernels
    assert dropout.elementwise_bytes == pytest.approx(elements * (4 + 4 + 1))
    assert dropout.bytes_moved > dropout.elementwise_bytes
    for layer in graph.layers:
        assert layer.fused_elementwise_bytes is not None
        assert layer.fused_elementwise_bytes <= layer.elementwise_bytes + 1e-6
    linear = graph.layer("transformer.h.0.mlp.c_fc")
    assert linear.arithmetic_bytes == pytest.approx(linear.bytes_moved) and linear.elementwise_bytes == 0
    # a GPU's fused dropout keeps a 1-byte mask for backward where the CPU decomposition keeps fp32 noise
    assert dropout.gpu_activation_bytes == pytest.approx(dropout.activation_bytes - elements * (4 - 1))
    assert linear.gpu_activation_bytes == linear.activation_bytes


def test_under_autocast_what_runs_in_fp32_stays_fp32_until_a_matmul_casts_it() -> None:
    """Autocast's fp32 ops (layer norm, softmax, `pow`) return fp32, element-wise ops on an fp32 input stay
    fp32 (the residual stream, from fp32 embeddings), batch norm keeps its half input, and a matmul
    casts an fp32 activation down: 4 bytes read and 2 written per element."""
    graph = capture_hf_config(TINY_GPT2, batch=2, seq=128, attn_implementation="eager")
    elements = graph.layer("transformer.h.0.mlp.dropout").output_bytes / 4
    # a dropout after a matmul: half in, half out, a one-byte mask
    assert graph.layer("transformer.h.0.mlp.dropout").autocast_elementwise_bytes == pytest.approx(
        elements * (2 + 2 + 1)
    )
    # the residual add: a half branch onto the fp32 stream, written fp32
    assert graph.layer("transformer.h.0/ops0").autocast_elementwise_bytes == pytest.approx(elements * (2 + 4 + 4))
    # layer norm of the fp32 stream moves what the fp32 capture counted
    norm = graph.layer("transformer.h.0.ln_1")
    assert norm.autocast_elementwise_bytes == pytest.approx(norm.elementwise_bytes)
    # the GELU's fp32 output is cast down by the next matmul
    gelu = graph.layer("transformer.h.0.mlp.act")
    assert graph.layer("transformer.h.0.mlp.c_proj").autocast_elementwise_bytes == pytest.approx(
        gelu.output_bytes / 4 * (4 + 2)
    )
    assert gelu.autocast_elementwise_bytes > 0.9 * gelu.elementwise_bytes
    convolutional = capture(
        nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()), (torch.randn(4, 3, 16, 16),), batch_size=4
    )
    relu = convolutional.layers[2]
    assert relu.autocast_elementwise_bytes == pytest.approx(relu.elementwise_bytes / 2)
    assert convolutional.layers[1].autocast_elementwise_bytes < 0.51 * convolutional.layers[1].elementwise_bytes


def test_autocast_casts_an_fp32_query_key_and_value_for_fused_attention() -> None:
    class ScaledAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = x * self.scale  # an fp32 parameter: the product stays fp32 under autocast
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    x = torch.randn(2, 4, 32, 16)
    graph = capture(ScaledAttention(), (x,), batch_size=2)
    core = next(layer for layer in graph.layers if layer.attention is not None)
    # each of query, key and value is cast to half precision: 4 bytes read and 2 written per element
    assert core.autocast_elementwise_bytes >= 3 * (4 + 2) * x.numel()


def test_a_step_of_several_micro_batches_scales_what_autocast_moves_with_the_samples() -> None:
    graph = capture_hf_config(TINY_GPT2, batch=2, seq=128, attn_implementation="eager")
    scaled = step_graph(graph, 6)
    for before, after in zip(graph.layers, scaled.layers, strict=True):
        assert after.autocast_elementwise_bytes == pytest.approx(3 * before.autocast_elementwise_bytes)
        assert after.elementwise_bytes == pytest.approx(3 * before.elementwise_bytes)


def test_autocast_prices_the_fp32_it_keeps_and_the_engines_half_precision_does_not() -> None:
    graph = capture_hf_config(TINY_GPT2 | {"n_embd": 256, "n_head": 8}, batch=8, seq=128, attn_implementation="eager")
    unrecorded = graph.replace(
        layers=[layer.model_copy(update={"autocast_elementwise_bytes": None}) for layer in graph.layers]
    )
    context = compile_context(graph, gpu_cluster(1, 1, device="V100"))
    before = compile_context(unrecorded, gpu_cluster(1, 1, device="V100"))

    def step(ctx, precision: Precision) -> float:
        fwd, bwd = layer_times(ctx, 0, 1, 1, Knobs(precision=int(precision)))
        return float(np.sum(fwd) + np.sum(bwd))

    assert step(context, Precision.AMP_FP16) > 1.2 * step(before, Precision.AMP_FP16)
    assert step(context, Precision.FP16) == step(before, Precision.FP16)


# --- the simulator ------------------------------------------------------------------------------------


def test_a_cpu_prices_a_graph_the_same_with_or_without_the_kernel_split() -> None:
    graph = gpt_graph()
    cpu = compile_context(graph, _cpu())
    plain = compile_context(_without_kernel_fields(graph), _cpu())
    for split, whole in zip(layer_times(cpu, 0, 1, 1), layer_times(plain, 0, 1, 1), strict=True):
        np.testing.assert_array_equal(split, whole)


def test_on_a_gpu_flash_attention_and_compile_make_the_step_cheaper() -> None:
    graph = gpt_graph(batch=16, hidden=512, seq=256)
    context = compile_context(graph, gpu_cluster(1, 8, device="H100"))
    plain = compile_context(_without_kernel_fields(graph), gpu_cluster(1, 8, device="H100"))
    attention = context.layer_attention
    knobs = Knobs(precision=int(Precision.AMP_BF16))
    fused, traced = layer_times(context, 0, 1, 1, knobs)[0], layer_times(plain, 0, 1, 1, knobs)[0]
    assert fused[attention].sum() < traced[attention].sum()
    compiled = layer_times(context, 0, 1, 1, Knobs(precision=int(Precision.AMP_BF16), compile=True))
    eager = layer_times(context, 0, 1, 1, knobs)
    assert compiled[0].sum() + compiled[1].sum() < eager[0].sum() + eager[1].sum()


def test_tensor_core_convolutions_of_nchw_tensors_pay_their_transposes() -> None:
    from simulator.compute import NCHW_TRANSPOSE_PASSES
    from stratagem import zoo
    from stratagem.tracing import capture

    module, make_batch = zoo.build("resnet50", "small", device="meta")
    graph = capture(module, make_batch(8), batch_size=8)
    context = compile_context(graph, gpu_cluster(1, 8, device="V100"))
    conv = context.layer_conv
    kinds = context.kinds
    streamed = kinds.memory_bandwidth[0] * kinds.elementwise_efficiency[0]
    amp = layer_times(context, 0, 1, 1, Knobs(precision=int(Precision.AMP_FP16)))[0]
    transposes = NCHW_TRANSPOSE_PASSES * context.kernels.arithmetic_bytes * 0.5 / streamed
    assert (amp[conv] >= transposes[conv] * (1 - 1e-9)).all()


def test_fp32_three_by_three_stride_one_convolutions_run_winograd_where_there_are_no_tensor_cores() -> None:
    from simulator.kernels import WINOGRAD_MULTIPLY_SHARE
    from stratagem import zoo
    from stratagem.tracing import capture

    module, make_batch = zoo.build("resnet50", "small", device="meta")
    graph = capture(module, make_batch(64), batch_size=64)  # device-bound: no layer waits on the host
    variables = graph.variables_by_name()
    context = compile_context(graph, gpu_cluster(1, 8, device="V100"))
    eligible = context.kernels.winograd
    names = [layer.name for layer in graph.layers]
    filters = {
        layer.name: [variables[v].shape[2:] for v in layer.variables if len(variables[v].shape) == 4]
        for layer in graph.layers
    }
    assert eligible.any() and all(filters[names[i]] == [[3, 3]] for i in np.flatnonzero(eligible))
    assert not eligible[names.index("stem.0")]  # 7 x 7
    strided = [i for i, name in enumerate(names) if filters[name] == [[3, 3]] and name.endswith(".0.conv2") and i > 0]
    assert any(not eligible[i] for i in strided)  # the first block of a later stage halves its input
    assert all(not eligible[i] for i, name in enumerate(names) if filters[name] == [[1, 1]])

    direct = copy.copy(context.kernels)
    object.__setattr__(direct, "winograd", np.zeros_like(eligible))
    plain = compile_context(graph, gpu_cluster(1, 8, device="V100"))
    object.__setattr__(plain, "kernels", direct)
    fwd, bwd = layer_times(context, 0, 1, 1)
    fwd_direct, bwd_direct = layer_times(plain, 0, 1, 1)
    assert (fwd[eligible] < fwd_direct[eligible]).all() and (bwd[eligible] < bwd_direct[eligible]).all()
    assert np.allclose(fwd[~eligible], fwd_direct[~eligible]) and np.allclose(bwd[~eligible], bwd_direct[~eligible])
    largest = int(np.argmax(np.where(eligible, context.fwd_flops, 0.0)))
    assert fwd[largest] == pytest.approx(WINOGRAD_MULTIPLY_SHARE * fwd_direct[largest])  # compute-bound

    # On tensor cores (half precision, or TF32 on an A100) cuDNN runs no Winograd.
    amp = int(Precision.AMP_FP16)
    assert np.allclose(
        layer_times(context, 0, 1, 1, Knobs(precision=amp))[0], layer_times(plain, 0, 1, 1, Knobs(precision=amp))[0]
    )
    a100, a100_plain = (compile_context(graph, gpu_cluster(1, 8, device="A100-80GB")) for _ in range(2))
    object.__setattr__(a100_plain, "kernels", direct)
    assert np.allclose(layer_times(a100, 0, 1, 1)[0], layer_times(a100_plain, 0, 1, 1)[0])


def test_a_gemm_output_of_one_tile_more_than_a_wave_takes_two_waves() -> None:
    sms = 132
    full = wave_utilisation(np.array([128.0 * 132]), np.array([128.0]), np.array([4096.0]), sms)
    over = wave_utilisation(np.array([128.0 * 133]), np.array([128.0]), np.array([4096.0]), sms)
    assert full[0] == pytest.approx(1.0)
    assert over[0] == pytest.approx(133 / 264)
    # fewer tiles than SMs: split along K until the SMs are full
    split = wave_utilisation(np.array([128.0]), np.array([128.0]), np.array([8192.0]), sms)
    assert split[0] == pytest.approx(1.0)
    assert wave_utilisation(np.array([128.0]), np.array([128.0]), np.array([64.0]), sms)[0] == pytest.approx(2 / sms)


def test_fp8_scaling_reads_each_operand_for_its_maximum_then_casts_it() -> None:
    m, n, k = np.array([4.0]), np.array([3.0]), np.array([2.0])
    forward, backward = fp8_scaling_bytes(m, n, k, compiled=False)
    assert forward[0] == 5 * (4 * 2 + 3 * 2) and backward[0] == 5 * 4 * 3 + 2 * (4 * 2 + 4 * 3)
    fused, _ = fp8_scaling_bytes(m, n, k, compiled=True)
    assert fused[0] == 3 * (4 * 2 + 3 * 2)


def test_per_op_checkpointing_costs_between_none_and_full_and_keeps_every_other_matmul() -> None:
    graph = llama_graph(batch=2, seq=64)
    cluster = gpu_cluster(1, 8, device="H100")
    context = compile_context(graph, cluster)
    blocks = context.layer_recomputed & context.layer_weight_grad
    kept = blocks & ~context.op_recomputed
    assert 0 < kept.sum() < blocks.sum()
    none, op, full = predict(
        graph, cluster, [Layout(recompute=r, precision="amp-bf16") for r in ("none", "selective-op", "full")]
    )
    assert none.step_time_s < op.step_time_s < full.step_time_s
    assert none.memory_per_device_bytes > op.memory_per_device_bytes > full.memory_per_device_bytes


def test_a_language_models_loss_gradients_raise_the_gpu_peak_beyond_its_activations() -> None:
    from simulator import activations

    context = compile_context(llama_graph(batch=2, seq=64), gpu_cluster(1, 8, device="H100"))
    shape = activations.Shape(tensor=1)
    assert activations.backward_extra(context, shape, activations.held(context, shape)) > 0


def test_a_gpu_fits_a_step_only_beside_what_the_cuda_context_and_libraries_hold() -> None:
    graph = gpt_graph(batch=16, hidden=512, seq=256)
    roomy = gpu_cluster(1, 8, device="H100")
    peak = predict(graph, roomy, Layout(precision="amp-bf16")).memory_per_device_bytes
    reserved = CATALOG["H100"].reserved_memory_bytes
    assert reserved and reserved > 0
    tight = roomy.replace(devices={"H100": CATALOG["H100"].model_copy(update={"memory_bytes": peak + reserved / 2})})
    squeezed = predict(graph, tight, Layout(precision="amp-bf16"))
    assert not squeezed.feasible and "CUDA context" in (squeezed.infeasible_reason or "")


def test_the_caching_allocator_holds_a_share_of_the_peak_beyond_the_live_tensors() -> None:
    graph = gpt_graph(batch=16, hidden=512, seq=256)
    h100 = CATALOG["H100"]
    assert h100.allocator_overhead == GPU_ALLOCATOR_OVERHEAD and all(
        spec.allocator_overhead == GPU_ALLOCATOR_OVERHEAD for spec in CATALOG.values() if spec.is_gpu
    )
    layout = Layout(precision="amp-bf16")
    peak = predict(graph, gpu_cluster(1, 8, device="H100"), layout).memory_per_device_bytes
    reserved, slack = h100.reserved_memory_bytes or 0.0, peak * GPU_ALLOCATOR_OVERHEAD

    def on(capacity: float):
        device = h100.model_copy(update={"memory_bytes": capacity})
        return predict(graph, gpu_cluster(1, 8, device="H100").replace(devices={"H100": device}), layout)

    assert on(peak + reserved + slack * 1.01).feasible
    short = on(peak + reserved + slack / 2)
    assert not short.feasible and short.memory_per_device_bytes == peak
    assert "the caching allocator holds beyond it" in (short.infeasible_reason or "")


def test_the_search_prunes_meshes_against_the_room_the_simulator_fits_by() -> None:
    """`tensor_room` is what the search's mesh cutting compares layers with; it must draw the line
    where `predict` does, or the search keeps meshes the simulator refuses."""
    graph = gpt_graph(batch=16, hidden=512, seq=256)
    h100 = CATALOG["H100"]
    layout = Layout(precision="amp-bf16")
    peak = predict(graph, gpu_cluster(1, 8, device="H100"), layout).memory_per_device_bytes
    for capacity in np.linspace(peak, peak * 1.2 + 2e9, 9):
        cluster = gpu_cluster(1, 8, device="H100").replace(
            devices={"H100": h100.model_copy(update={"memory_bytes": float(capacity)})}
        )
        room = float(tensor_room(compile_context(graph, cluster), np.array([0]))[0])
        assert predict(graph, cluster, layout).feasible == (peak <= room)


# --- the catalog -------------------------------------------------------------------------------------


def test_torchtitans_500_watt_h100_runs_at_the_clock_its_power_sustains() -> None:
    part, h100 = CATALOG["H100-SXM-96GB-HBM2e"], CATALOG["H100"]
    assert pytest.approx(0.894, abs=1e-3) == H100_500W_CLOCK
    for dtype in ("float32", "bfloat16", "tf32", "float8"):
        assert part.peak_flops[dtype] == pytest.approx(h100.peak_flops[dtype] * H100_500W_CLOCK)
    assert (part.memory_bytes, part.memory_bandwidth, part.sm_count) == (96e9, 2.4e12, 132)


def test_a_power_limited_clock_slows_gemms_but_not_attention_or_memory_bound_kernels() -> None:
    graph = gpt_graph(batch=16, hidden=512, seq=256)
    cluster = gpu_cluster(1, 8, device="H100")
    h100 = CATALOG["H100"]
    assert h100.sustained_matmul == pytest.approx(708.5 / 841.9)
    burst = cluster.replace(devices={"H100": h100.model_copy(update={"sustained_matmul": None})})
    layout = Layout(precision="amp-bf16")
    sustained_kinds = compile_context(graph, cluster).kinds.peaks
    burst_kinds = compile_context(graph, burst).kinds.peaks
    bf16, fp8 = int(Precision.AMP_BF16), int(Precision.FP8)
    for field, precision in (("matmul_efficiency", bf16), ("matmul_efficiency", fp8), ("conv_efficiency", bf16)):
        ratio = getattr(sustained_kinds, field)[0, precision] / getattr(burst_kinds, field)[0, precision]
        assert ratio == pytest.approx(h100.sustained_matmul)
    for field in ("attention_efficiency", "attention_backward_efficiency"):
        assert getattr(sustained_kinds, field)[0, bf16] == getattr(burst_kinds, field)[0, bf16] == getattr(h100, field)
    slow, fast = predict(graph, cluster, layout), predict(graph, burst, layout)
    assert fast.breakdown["compute"] < slow.breakdown["compute"] < fast.breakdown["compute"] / h100.sustained_matmul
    assert CATALOG["V100"].sustained_matmul is None and CATALOG["CPU"].sustained_matmul is None


def test_fp8_gemms_reach_a_smaller_share_of_their_doubled_peak_than_bf16_gemms() -> None:
    graph = gpt_graph(batch=16, hidden=2048, seq=1024)
    h100 = CATALOG["H100"]
    assert h100.fp8_matmul_efficiency == pytest.approx(h100.matmul_efficiency * HOPPER_FP8_OVER_BF16)
    peaks = compile_context(graph, gpu_cluster(1, 8, device="H100")).kinds.peaks
    bf16_rate = peaks.matmul[0, Precision.BF16] * peaks.matmul_efficiency[0, Precision.BF16]
    fp8_rate = peaks.matmul[0, Precision.FP8] * peaks.matmul_efficiency[0, Precision.FP8]
    assert fp8_rate / bf16_rate == pytest.approx(2 * HOPPER_FP8_OVER_BF16, rel=1e-3)
    cluster = gpu_cluster(1, 8, device="H100")
    even = cluster.replace(devices={"H100": h100.model_copy(update={"fp8_matmul_efficiency": None})})
    layout = Layout(precision="fp8")
    assert predict(graph, even, layout).breakdown["compute"] < predict(graph, cluster, layout).breakdown["compute"]


# --- calibration probes ------------------------------------------------------------------------------


def test_the_kernel_probes_measure_gemms_and_attention_into_efficiencies() -> None:
    stepper = Stepper(lambda go: go)
    rates = {name: probe() for name, probe in kernel_probes(stepper, KernelShapes(), "cpu").items()}
    assert all(math.isfinite(rate) and rate > 0 for rate in rates.values())
    assert "gemm_fp8_flops" in rates  # PyTorch's reference kernel on the CPU; on CUDA, fp8 tensor cores only
    figures = kernel_figures(rates, bf16_peak=1e15, fp32_peak=1e15, sms=4, fp8_peak=2e15)
    keys = ("matmul_efficiency", "fp32_matmul_efficiency", "fp8_matmul_efficiency", "attention_efficiency")
    for key in (*keys, "attention_backward_efficiency"):
        assert 0 < figures[key] <= 1
    assert figures["sm_count"] == 4
    assert "fp8_matmul_efficiency" not in kernel_figures(rates, bf16_peak=1e15, fp32_peak=1e15, sms=4)


# --- the runtime -------------------------------------------------------------------------------------


def test_per_op_checkpointing_keeps_attention_and_recomputes_the_rest_with_the_same_gradients() -> None:
    from stratagem.runtime.recompute import apply_recomputation
    from stratagem.zoo import build

    torch.manual_seed(0)
    model, make_batch = build("gpt", "small")
    reference = copy.deepcopy(model)
    apply_recomputation(model, "selective-op")
    batch = make_batch(4)
    reference(*batch).backward()
    loss = model(*batch)
    calls: dict[str, int] = {}

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls[func.overloadpacket.__name__] = calls.get(func.overloadpacket.__name__, 0) + 1
            return func(*args, **(kwargs or {}))

    with Count():
        loss.backward()
    assert "_scaled_dot_product_flash_attention_for_cpu" not in calls, "the attention core ran again"
    assert calls.get("gelu", 0) > 0, "the element-wise ops were not recomputed"
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.slow
def test_a_compiled_strategy_trains_like_eager_on_one_rank(one_rank) -> None:
    from runtime_helpers import make_batches, make_model, make_strategy, max_relative_error, train

    from stratagem.runtime import distribute

    batches = make_batches("cnn", steps=2, batch=6)
    reference = make_model("cnn")
    train(reference, torch.optim.SGD(reference.parameters(), lr=0.1), batches)
    model = make_model("cnn")
    strategy = make_strategy("allreduce_groups", model, 1, compile=True)
    model, optimizer = distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy)
    train(model, optimizer, batches)
    assert max_relative_error(model, reference) < 1e-4
    compiled = [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert compiled, "nothing was compiled"


def _cpu():
    from stratagem.ir import Node, ResourceSpec

    return ResourceSpec(name="cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")])


def test_a_for_loop_optimizer_pays_its_kernels_per_tensor_on_a_gpu() -> None:
    from simulator.devices import LOOP_UPDATE_KERNELS

    graph = gpt_graph()
    loop = graph.replace(optimizer=graph.optimizer.model_copy(update={"implementation": "for-loop"}))
    cluster = gpu_cluster(1, 8, device="V100")
    layout = Layout(data=8)
    tensors = len([v for v in graph.variables if v.trainable])
    multi, looped = predict(graph, cluster, layout), predict(loop, cluster, layout)
    per_tensor = LOOP_UPDATE_KERNELS[graph.optimizer.kind] * CATALOG["V100"].launch_overhead_s
    extra = looped.breakdown["optimizer_update"] - multi.breakdown["optimizer_update"]
    assert extra == pytest.approx(tensors * per_tensor, rel=1e-6)
    # Under ZeRO each rank steps flat shards of its buckets, far fewer tensors than the model holds.
    sharded = Layout(data=8, zero=1)
    shards = predict(loop, cluster, sharded).breakdown["optimizer_update"]
    assert 0 < shards - predict(graph, cluster, sharded).breakdown["optimizer_update"] < extra / 4


def test_an_unfused_update_moves_each_kernels_bytes_and_a_fused_one_the_counted_bytes() -> None:
    from simulator.devices import UNFUSED_UPDATE_BYTES

    graph = gpt_graph()
    fused = graph.replace(optimizer=graph.optimizer.model_copy(update={"implementation": "fused"}))
    cluster, layout = gpu_cluster(1, 1, device="V100"), Layout()
    spec = CATALOG["V100"]
    params = sum(v.nbytes for v in graph.variables if v.trainable)
    counted = params * (3 + 2 * 2)  # fp32 Adam: parameter and gradient in, parameter out; two moments in and out
    one_pass = counted / (spec.memory_bandwidth * spec.elementwise_efficiency)
    assert predict(fused, cluster, layout).breakdown["optimizer_update"] == pytest.approx(one_pass, rel=1e-6)
    unfused = predict(graph, cluster, layout).breakdown["optimizer_update"]
    assert unfused == pytest.approx(one_pass * UNFUSED_UPDATE_BYTES["adam"] / 28, rel=1e-6)
    # A measured figure is the unfused update's own (calibration times PyTorch's default Adam).
    measured = cluster.model_copy(update={"devices": {"V100": spec.model_copy(update={"optimizer_efficiency": 0.2})}})
    measured = type(cluster).model_validate(measured.model_dump(exclude={"id"}))
    timed = predict(graph, measured, layout).breakdown["optimizer_update"]
    assert timed == pytest.approx(counted / (spec.memory_bandwidth * 0.2), rel=1e-6)
    assert predict(fused, measured, layout).breakdown["optimizer_update"] == pytest.approx(one_pass, rel=1e-6)


def test_dynamic_loss_scaling_reads_and_writes_each_stepped_gradient_once_more() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(1, 8, device="A100-80GB")
    spec = CATALOG["A100-80GB"]
    params = sum(v.nbytes for v in graph.variables if v.trainable)
    unscale = 2 * params / (spec.memory_bandwidth * spec.elementwise_efficiency)

    def update(**layout: Any) -> float:
        return predict(graph, cluster, Layout(data=8, **layout)).breakdown["optimizer_update"]

    for scaled in ("amp-fp16", "fp16"):
        assert update(precision=scaled) - update(precision="amp-bf16") == pytest.approx(unscale, rel=1e-6)
    # Under ZeRO each rank unscales the shard it steps.
    sharded = update(precision="amp-fp16", zero=2) - update(precision="amp-bf16", zero=2)
    assert sharded == pytest.approx(unscale / 8, rel=1e-6)


def test_clipping_reads_each_stepped_gradient_for_its_norm_then_scales_it() -> None:
    graph, cluster = gpt_graph(), gpu_cluster(1, 8, device="A100-80GB")
    spec = CATALOG["A100-80GB"]
    params = sum(v.nbytes for v in graph.variables if v.trainable)
    three_passes = 3 * params / (spec.memory_bandwidth * spec.elementwise_efficiency)

    def update(optimizer: dict[str, Any], **layout: Any) -> float:
        clipped = graph.replace(optimizer=graph.optimizer.model_copy(update=optimizer))
        return predict(clipped, cluster, Layout(data=8, **layout)).breakdown["optimizer_update"]

    assert update({"max_grad_norm": 1.0}) - update({}) == pytest.approx(three_passes, rel=1e-6)
    # Under ZeRO each rank clips the shard it steps; the norm's all-reduce is one scalar.
    sharded = update({"max_grad_norm": 1.0}, zero=2) - update({}, zero=2)
    assert sharded == pytest.approx(three_passes / 8, rel=1e-6)
    # Beside a for-loop update the clip launches a norm and a scale per tensor.
    tensors = len([v for v in graph.variables if v.trainable])
    loop = {"implementation": "for-loop"}
    looped = update({**loop, "max_grad_norm": 1.0}) - update(loop)
    assert looped == pytest.approx(three_passes + tensors * 2 * spec.launch_overhead_s, rel=1e-6)


def test_a_graph_that_clips_cannot_run_asynchronous_parameter_servers_and_is_told_why() -> None:
    from sample_documents import make_mlp_graph, make_t4_cluster

    from stratagem.builders import PS

    graph, cluster = make_mlp_graph(), make_t4_cluster(2)
    clipped = graph.replace(optimizer=graph.optimizer.model_copy(update={"max_grad_norm": 1.0}))
    for sync, staleness in ((True, 0), (True, 2)):
        assert predict(clipped, cluster, PS(sync=sync, staleness=staleness).build(clipped, cluster)).feasible
    asp = predict(clipped, cluster, PS(sync=False).build(clipped, cluster))
    assert not asp.feasible and "optimizer.max_grad_norm" in (asp.infeasible_reason or "")
    assert predict(graph, cluster, PS(sync=False).build(graph, cluster)).feasible
