"""`python -m stratagem.launch` starts the ranks of a real script that trains a zoo model under a strategy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stratagem.runtime.launch import main

ROOT = Path(__file__).resolve().parents[1]


def _parallax_strategy(path: Path) -> None:
    from stratagem import ResourceSpec, capture
    from stratagem.builders import Parallax
    from stratagem.zoo import build

    module, make_batch = build("dlrm", "small")
    graph = capture(module, make_batch(4), batch_size=4, optimizer="momentum")
    resources = ResourceSpec.parse(
        {
            "nodes": [
                {"address": "10.0.0.1", "cpus": [0], "device": "CPU", "chief": True},
                {"address": "10.0.0.2", "cpus": [0], "device": "CPU"},
            ]
        }
    )
    Parallax().build(graph, resources).save(path)


@pytest.mark.slow
def test_launch_runs_the_example_script_and_every_rank_ends_with_the_same_model(tmp_path: Path) -> None:
    strategy = tmp_path / "best.json"
    _parallax_strategy(strategy)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "stratagem.launch",
        "--strategy",
        str(strategy),
        "--nproc-per-node",
        "2",
        str(ROOT / "examples" / "train_with_strategy.py"),
        "--model",
        "dlrm",
        "--steps",
        "4",
        "--batch",
        "4",
        "--out-dir",
        str(tmp_path),
    ]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-12)
    assert ranks[0]["losses"] != ranks[1]["losses"], "each rank should train on its own data"
    for rank in ranks:
        assert len(rank["stats"]) == 4
        assert set(rank["stats"][-1]["wait_s"]) == {"allreduce", "ps"}
    assert "step 3: loss" in done.stdout


def test_launch_refuses_a_strategy_for_another_number_of_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    strategy = tmp_path / "s.json"
    strategy.write_text(json.dumps({"replicas": ["10.0.0.1:CPU:0", "10.0.0.2:CPU:0"], "variables": []}))
    (tmp_path / "train.py").write_text("")
    assert main(["--strategy", str(strategy), "--nproc-per-node", "3", str(tmp_path / "train.py")]) == 2
    assert "2 replicas but nnodes(1) * nproc_per_node(3) = 3" in capsys.readouterr().err


def test_launch_reports_an_invalid_strategy_file_with_the_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    strategy = tmp_path / "s.json"
    strategy.write_text(json.dumps({"replicas": ["nowhere"], "variables": []}))
    (tmp_path / "train.py").write_text("")
    assert main(["--strategy", str(strategy), "--nproc-per-node", "1", str(tmp_path / "train.py")]) == 2
    assert "replicas[0]" in capsys.readouterr().err


@pytest.mark.slow
def test_launched_ranks_reuse_freed_memory_unless_the_user_tuned_malloc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stratagem.rank_env import MALLOC_SETTINGS
    from stratagem.runtime.launch import launch

    strategy = tmp_path / "best.json"
    strategy.write_text(json.dumps({"replicas": ["10.0.0.1:CPU:0", "10.0.0.1:CPU:1"], "variables": []}))
    script = tmp_path / "env.py"
    script.write_text(
        "import json, os, sys\n"
        "names = ['MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_', 'RANK']\n"
        "open(sys.argv[1] + os.environ['RANK'], 'w').write(json.dumps({n: os.environ.get(n) for n in names}))\n"
    )
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    assert launch(str(script), [str(tmp_path / "rank")], strategy=strategy, nproc_per_node=2) == 0
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}").read_text())
        assert seen == {
            "MALLOC_MMAP_THRESHOLD_": MALLOC_SETTINGS["MALLOC_MMAP_THRESHOLD_"],
            "MALLOC_TRIM_THRESHOLD_": "12345",
            "RANK": str(rank),
        }
