"""`benchmarks/clip_cost.py` times the runtime's gradient clip beside a per-tensor loop and the simulator's price."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import clip_cost


def test_reports_each_model_measured_beside_its_price() -> None:
    """Run as a script (it owns a one-process gloo group), so the JSON it prints is what is checked."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.clip_cost", "--repeats", "3", "--flat-elements", "4096"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(done.stdout)
    assert set(report["cases"]) == {*clip_cost.MODELS, clip_cost.FLAT}
    assert report["cases"][clip_cost.FLAT]["parameters"] == clip_cost.FLAT_TENSORS * 4096
    for row in report["cases"].values():
        assert row["tensors"] > 0 and row["parameters"] > 0
        assert row["runtime_s"] > 0 and row["per_tensor_loop_s"] > 0 and row["priced_s"] > 0
        assert row["loop_over_runtime"] == row["per_tensor_loop_s"] / row["runtime_s"]
        assert row["priced_over_runtime"] == row["priced_s"] / row["runtime_s"]


def test_the_loop_clips_to_the_same_norm_as_torch() -> None:
    import torch

    grads = [torch.randn(5, 3), torch.randn(7)]
    expected = [g.clone() for g in grads]
    clip_cost._loop_clip(grads, 0.5)()
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in expected]
    for param, grad in zip(params, expected, strict=True):
        param.grad = grad
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    for got, param in zip(grads, params, strict=True):
        torch.testing.assert_close(got, param.grad)
