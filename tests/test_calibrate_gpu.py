"""`stratagem calibrate --gpu`: a CUDA device measured into a spec the simulator prices with. The probes
run here on the CPU at small sizes (the device plumbing is the same); the measurement on a real GPU is
in tests/test_trial_cuda.py."""

from __future__ import annotations

import math

import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli
from sample_documents import make_embedding_graph, make_mlp_graph

from simulator import simulate
from simulator.encoding import Precision
from simulator.precision import peaks
from stratagem.builders import DataParallel
from stratagem.calibrate.compute import ProbeShapes, compute_figures
from stratagem.calibrate.gpu import GPU_PROBES, catalog_kind, gpu_spec
from stratagem.calibrate.timing import Stepper
from stratagem.ir import Node, ResourceSpec
from stratagem.ir.catalog import CATALOG
from stratagem.ir.resources import DEFAULT_INTRA_NODE

TINY = ProbeShapes(
    linear=(64, 64),
    bf16_side=64,
    images=(2, 4, 8, 8),
    tokens=(64, 64),
    copy_elements=1 << 12,
    gradient_elements=1 << 14,
    optimizer_bytes=4 << 20,
    lowrank=((2, 64), (1, 128)),
    lookups=(256, 512),
)

FIGURES = {
    "matmul_flops": 50e12,
    "conv_flops": 120e12,
    "bf16_flops": 700e12,
    "copy_bandwidth": 4e12,
    "elementwise_rate": 2e12,
    "norm_rate": 1e12,
    "layer_overhead_s": 60e-6,
    "optimizer_rate": 1e12,
    "optimizer_large_rate": 1e12,
    "optimizer_tensor_s": 2e-6,
    "stream_rate": 3e12,
    "cast_rate": 2.5e12,
    "select_rate": 1e11,
    "lowrank_rate": 4e11,
    "lowrank_large_rate": 5e11,
    "coalesce_rate": 5e10,
    "optimizer_loop_tensor_s": 40e-6,
    "full_select_rate": 5e10,
}


@pytest.mark.parametrize(
    ("name", "memory_gb", "kind"),
    [
        ("NVIDIA H100 80GB HBM3", 80, "H100"),
        ("NVIDIA H200", 141, "H200"),
        ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40, "A100-40GB"),
        ("Tesla V100-SXM2-16GB", 16, "V100-16GB"),
        ("Tesla T4", 16, "T4"),
        ("NVIDIA GeForce RTX 4090", 24, None),
        ("NVIDIA T400", 4, None),
    ],
)
def test_a_cuda_device_name_maps_to_its_catalog_kind(name: str, memory_gb: float, kind: str | None):
    assert catalog_kind(name, memory_gb * 1e9) == kind


def test_the_spec_prices_convolutions_at_their_own_rate_and_keeps_the_catalog_link():
    spec = gpu_spec(FIGURES, name="NVIDIA H200", memory_bytes=141e9, gpus=[0, 1])
    node = spec.nodes[0]
    device = spec.devices[node.device]
    assert node.device == "H200-calibrated" and node.gpus == [0, 1] and device.is_gpu
    # cuDNN's TF32 convolutions outrun the fp32 matmul: the peak is theirs, the matmul a share of it
    assert device.peak_flops["float32"] == 120e12 and device.fp32_matmul_efficiency == pytest.approx(50 / 120)
    assert device.conv_efficiency == 1.0 and device.peak_flops["bfloat16"] == 700e12
    assert device.elementwise_efficiency == pytest.approx(0.5) and device.launch_overhead_s == 60e-6
    # what one device cannot measure stays the catalog kind's: NCCL's kernels slowing overlapped compute
    assert device.comm_overlap == CATALOG["H200"].comm_overlap and device.comm_latency_contention == 0.0
    assert device.nvlink_sharp == CATALOG["H200"].nvlink_sharp
    assert device.optimizer_knee_bytes is None and device.scatter_efficiency is None
    assert spec.intra_node == DEFAULT_INTRA_NODE["H200"]
    assert ResourceSpec.model_validate_json(spec.to_json()) == spec


def test_each_precision_s_gemms_run_at_the_rate_measured_for_it():
    """fp32 matmuls at the fp32 GEMM's rate, half precision at the bf16 GEMM's (not scaled by the fp32
    matmul's share of the TF32 convolutions), fp8 at `_scaled_mm`'s where it was measured."""
    plain = gpu_spec(FIGURES, name="NVIDIA H200", memory_bytes=141e9, gpus=[0])
    with_fp8 = gpu_spec(FIGURES | {"gemm_fp8_flops": 1.1e15}, name="NVIDIA H200", memory_bytes=141e9, gpus=[0])
    graph = make_mlp_graph(batch_size=8, widths=(64, 64, 10))
    for spec, fp8 in ((plain, None), (with_fp8, 1.1e15)):
        rates = peaks(list(spec.devices.values()), graph.dtype)
        achieved = rates.matmul[0] * rates.matmul_efficiency[0]
        assert achieved[Precision.FP32] == pytest.approx(50e12)
        assert achieved[Precision.AMP_BF16] == achieved[Precision.BF16] == pytest.approx(700e12)
        assert bool(rates.fp8[0]) == (fp8 is not None)
        if fp8 is not None:
            assert achieved[Precision.FP8] == pytest.approx(fp8)


def test_tf32_gemms_run_at_their_measured_rate_and_convolutions_keep_theirs():
    """Without a TF32 figure the `tf32` precision ran at the IEEE fp32 GEMM's rate, an eighth of what an
    Ampere or Hopper part's tensor cores give it. Convolutions, which every catalog GPU prices against
    its TF32 peak, keep the rate measured for them under both fp32 and tf32."""
    graph = make_mlp_graph(batch_size=8, widths=(64, 64, 10))
    before = gpu_spec(FIGURES, name="NVIDIA H200", memory_bytes=141e9, gpus=[0])
    after = gpu_spec(FIGURES | {"gemm_tf32_flops": 400e12}, name="NVIDIA H200", memory_bytes=141e9, gpus=[0])
    assert "tf32" not in next(iter(before.devices.values())).peak_flops
    for spec, tf32 in ((before, 50e12), (after, 400e12)):
        rates = peaks(list(spec.devices.values()), graph.dtype)
        matmul = rates.matmul[0] * rates.matmul_efficiency[0]
        conv = rates.conv[0] * rates.conv_efficiency[0]
        assert matmul[Precision.TF32] == pytest.approx(tf32) and matmul[Precision.FP32] == pytest.approx(50e12)
        assert conv[Precision.FP32] == conv[Precision.TF32] == pytest.approx(120e12)


def test_a_measured_launch_overhead_prices_a_small_model_slower_than_the_catalog():
    """The catalog's 5 µs per layer pass is what made one-rank H100 steps priced 2.7-61x too fast."""
    graph = make_mlp_graph(batch_size=8, widths=(256, 256, 10))
    catalog = ResourceSpec(name="one", nodes=[Node(address="127.0.0.1", chief=True, gpus=[0], device="H200")])
    calibrated = gpu_spec(FIGURES, name="NVIDIA H200", memory_bytes=141e9, gpus=[0])
    priced = [simulate(graph, spec, [DataParallel().build(graph, spec)])[0] for spec in (catalog, calibrated)]
    assert all(p.feasible for p in priced)
    layer_passes = 2 * len(graph.layers)
    assert priced[1].breakdown["compute"] >= layer_passes * 60e-6 > priced[0].breakdown["compute"]
    assert CATALOG["H200"].launch_overhead_s < 60e-6


def test_the_probes_take_a_device_and_their_sizes():
    figures = compute_figures(Stepper(), TINY, "cpu")
    assert set(figures) == set(FIGURES) - {"optimizer_loop_tensor_s"}  # measured on CUDA only
    assert all(math.isfinite(v) and v > 0 for k, v in figures.items() if k != "layer_overhead_s"), figures
    assert GPU_PROBES.linear[0] * GPU_PROBES.linear[1] > 100 * ProbeShapes().linear[0] * ProbeShapes().linear[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a CUDA device here")
def test_calibrating_a_gpu_where_there_is_none_is_one_clear_error(capsys: pytest.CaptureFixture[str]):
    code, _, err = run_cli(["calibrate", "--gpu"], capsys)
    assert_one_line_error(code, err, "device: no CUDA device 0: torch sees 0")
    code, _, err = run_cli(["calibrate", "--gpu", "-1"], capsys)
    assert code == 2 and "argument --gpu: must be at least 0, got -1" in err and "Traceback" not in err


def test_a_sparse_model_updates_every_tensor_at_the_loop_figure():
    """PyTorch's multi-tensor optimizers step a parameter group holding a sparse gradient tensor by tensor."""
    spec = gpu_spec(FIGURES, name="NVIDIA H200", memory_bytes=141e9, gpus=[0])
    dense = make_mlp_graph(batch_size=8, widths=(64, 64, 10))
    sparse = make_embedding_graph()
    for graph, per_tensor in ((dense, 2e-6), (sparse, 40e-6)):
        tensors = sum(v.trainable for v in graph.variables)
        update = simulate(graph, spec, [DataParallel().build(graph, spec)])[0].breakdown["optimizer_update"]
        assert tensors * per_tensor <= update < tensors * per_tensor + 2e-5
