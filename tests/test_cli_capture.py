"""The `stratagem` command line and its `capture` subcommand."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stratagem.cli import COMMANDS, main
from stratagem.ir import ModelGraph

ROOT = Path(__file__).resolve().parent.parent


def test_capture_writes_a_valid_graph_and_prints_its_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "bert.json"
    code = main(["capture", "stratagem.zoo:bert_large", "--batch", "4", "--size", "small", "-o", str(output)])
    assert code == 0
    graph = ModelGraph.load(output)
    assert graph.batch_size == 4 and graph.name == "bert_large"
    assert graph.provenance["zoo"]["size"] == "small"
    printed = capsys.readouterr().out
    assert printed.startswith(graph.summary()) and str(output) in printed


def test_capture_builds_full_size_models_on_meta(tmp_path: Path) -> None:
    output = tmp_path / "gpt.json"
    assert main(["capture", "gpt", "--batch", "1", "--size", "7b", "--set", "layers=2", "-o", str(output)]) == 0
    graph = ModelGraph.load(output)
    assert graph.provenance["zoo"]["overrides"] == {"layers": 2}
    assert graph.variable("embed.weight").shape == [32000, 4096]


def test_capture_records_how_the_optimizer_steps(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capture", "dlrm", "--batch", "2", "--optimizer", "adamw", "--optimizer-implementation", "fused"]
    assert main(argv) == 0
    graph = ModelGraph.parse(capsys.readouterr().out)
    assert graph.optimizer.kind == "adamw" and graph.optimizer.implementation == "fused"
    assert main(["capture", "dlrm", "--batch", "2", "--optimizer-implementation", "apex"]) == 2
    assert "--optimizer-implementation: invalid choice: 'apex'" in capsys.readouterr().err
    assert main(["capture", "dlrm", "--batch", "2", "--max-grad-norm", "0.5"]) == 0
    assert ModelGraph.parse(capsys.readouterr().out).optimizer.max_grad_norm == 0.5
    assert main(["capture", "dlrm", "--batch", "2", "--max-grad-norm", "-1"]) != 0
    assert "optimizer.max_grad_norm: must be a positive finite norm, got -1.0" in capsys.readouterr().err


def test_capture_without_output_writes_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "dlrm", "--batch", "2", "--optimizer", "sgd", "--name", "rec"]) == 0
    streams = capsys.readouterr()
    graph = ModelGraph.parse(streams.out)
    assert graph.name == "rec" and graph.optimizer.kind == "sgd"
    assert sum(v.sparse for v in graph.variables) == 4
    assert streams.err.strip() == graph.summary()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["capture", "gpt", "--batch", "2", "--set", "layerz=1"], "overrides.layerz: unknown field"),
        (["capture", "gpt", "--batch", "2", "--optimizer", "adamz"], "optimizer.kind: unknown optimizer 'adamz'"),
        (["capture", "no_such_module:gpt", "--batch", "2"], "cannot import module 'no_such_module'"),
        (["capture", "stratagem.zoo:nothing", "--batch", "2"], "has no function 'nothing'"),
        (["capture", "gpt", "--batch", "0"], "--batch: must be a positive integer"),
        (["capture", "gpt", "--batch", "2", "--set", "novalue"], "expected KEY=VALUE"),
    ],
)
def test_errors_print_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


BUILDERS = """
import torch

def bare_module(size="small"):
    return torch.nn.Linear(2, 2)

def broken(size="small"):
    raise RuntimeError("no such config")

def no_device():
    model = torch.nn.Linear(3, 1)
    return model, lambda batch: (torch.randn(batch, 3),)
"""


def test_user_builders_are_checked_and_called_on_meta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my_builders.py").write_text(BUILDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["capture", "my_builders:bare_module", "--batch", "2"]) == 2
    assert "must return (module, make_batch), got Linear" in capsys.readouterr().err
    assert main(["capture", "my_builders:broken", "--batch", "2"]) == 2
    assert "builder broken failed: RuntimeError: no such config" in capsys.readouterr().err
    assert main(["capture", "my_builders:no_device", "--batch", "2", "-o", str(tmp_path / "g.json")]) == 0
    graph = ModelGraph.load(tmp_path / "g.json")
    assert graph.name == "Linear" and graph.layers[0].fwd_flops == 2 * 2 * 3


def test_usage_errors_and_help_return_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["capture"]) == 2
    assert main(["--help"]) == 0
    assert "capture" in capsys.readouterr().out


def test_every_listed_command_registers_a_handler() -> None:
    assert "capture" in COMMANDS
    for name in COMMANDS:
        assert callable(importlib.import_module(f"stratagem.cli.{name}").register)


@pytest.mark.slow
def test_python_dash_m_stratagem_captures_in_a_subprocess(tmp_path: Path) -> None:
    output = tmp_path / "resnet.json"
    completed = subprocess.run(
        [sys.executable, "-m", "stratagem", "capture", "stratagem.zoo:resnet50", "--batch", "8", "-o", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    graph = ModelGraph.load(output)
    assert graph.provenance["zoo"]["name"] == "resnet50" and graph.layers[0].kind.value == "conv"
    assert completed.stdout.startswith(graph.summary())
    failed = subprocess.run(
        [sys.executable, "-m", "stratagem", "capture", "gpt", "--batch", "-1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert failed.returncode == 2 and failed.stderr.startswith("error: ") and "Traceback" not in failed.stderr
    assert json.loads(output.read_text())["batch_size"] == 8
