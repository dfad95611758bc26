"""`stratagem predict`: layouts and trainer configs priced side by side, as a table or JSON, without a service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from layout_helpers import SMALL_LLAMA, gpt_graph, gpu_cluster

from stratagem import Layout
from stratagem.cli import main
from stratagem.interop.engines import render


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    graph, cluster = tmp_path / "gpt.json", tmp_path / "h100.json"
    gpt_graph().save(graph)
    cluster.write_text(gpu_cluster(1, 8).to_json())
    return {"graph": graph, "resources": cluster}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_layouts_are_printed_side_by_side_with_their_bottlenecks(files, capsys) -> None:
    argv = ["predict", str(files["graph"]), "--resources", str(files["resources"])]
    code, out, _ = _run([*argv, "--layout", "dp=8", "--layout", "tp=2,pp=2,gbs=32"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[2].split() == ["layout", "[1]", "[2]"]
    for row in ("step time", "samples/s", "tokens/s", "tokens/s/device", "MFU", "memory/device", "fits"):
        assert any(line.startswith(row) for line in lines), row
    assert "[1] dp=8,mb=2,gbs=16" in out and "[2] dp=2,tp=2,pp=2,mb=2,gbs=32" in out


def test_json_gives_every_prediction_in_full(files, capsys) -> None:
    argv = ["predict", str(files["graph"]), "--resources", str(files["resources"]), "--layout", "tp=2", "--json"]
    code, out, _ = _run(argv, capsys)
    predictions = json.loads(out)
    assert code == 0 and len(predictions) == 1
    assert predictions[0]["layout"]["tensor"] == 2 and predictions[0]["step_time_s"] > 0
    assert predictions[0]["tokens_per_s"] == pytest.approx(predictions[0]["samples_per_s"] * 32)


def test_trainer_configs_are_priced_as_their_layouts(files, tmp_path: Path, capsys) -> None:
    layouts = {
        "torchtitan": ("train.toml", Layout.from_string("dp=8,zero=2,mb=2,gbs=32,precision=fp32")),
        "deepspeed": ("ds_config.json", Layout.from_string("dp=8,mb=2,gbs=32,overlap=false")),
        "megatron": ("pretrain.sh", Layout.from_string("dp=4,tp=2,mb=2,gbs=16")),
        "accelerate": ("accelerate.yaml", Layout.from_string("dp=4,tp=2")),
    }
    argv = ["predict", str(files["graph"]), "--resources", str(files["resources"]), "--json"]
    for engine, (name, layout) in layouts.items():
        (tmp_path / name).write_text(render(engine, getattr(layout, f"to_{engine}")()))
        argv += ["--config", str(tmp_path / name)]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    labels = [p["label"] for p in json.loads(out)]
    assert labels == [
        "dp=8,mb=2,gbs=32,zero=2",
        "dp=8,mb=2,gbs=32,overlap=false",
        "dp=4,tp=2,mb=2,gbs=16",
        "dp=4,tp=2,mb=2,gbs=8",
    ]


def test_a_hugging_face_config_is_captured_at_the_micro_batch_and_sequence(tmp_path: Path, files, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    argv = ["predict", str(config), "--seq", "64", "--resources", str(files["resources"]), "--layout", "tp=4,mb=2"]
    code, out, err = _run([*argv, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)[0]["label"] == "dp=2,tp=4,mb=2,gbs=4"


def test_a_hugging_face_config_is_captured_with_the_optimizer_and_clip_given(tmp_path: Path, files, capsys) -> None:
    from stratagem import predict
    from stratagem.hf import capture_hf_config

    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    argv = ["predict", str(config), "--seq", "64", "--resources", str(files["resources"]), "--layout", "tp=4,mb=2"]
    code, out, err = _run([*argv, "--json", "--optimizer", "sgd", "--max-grad-norm", "1.0"], capsys)
    assert code == 0, err
    (row,) = json.loads(out)
    graph = capture_hf_config(SMALL_LLAMA, batch=2, seq=64, optimizer="sgd", max_grad_norm=1.0, name="x")
    expected = predict(graph, gpu_cluster(1, 8), Layout.from_string(row["label"]))
    assert row["step_time_s"] == pytest.approx(expected.step_time_s, rel=1e-9)


def test_a_zoo_model_is_captured_at_the_layouts_micro_batch(files, capsys) -> None:
    argv = ["predict", "gpt", "--size", "small", "--resources", str(files["resources"]), "--layout", "mb=4", "--json"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert json.loads(out)[0]["global_batch"] == 32


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "give at least one --layout or --config to price"),
        (["--layout", "mb=1", "--layout", "mb=2"], "the layouts state micro-batches [1, 2]"),
        (["--layout", "mb=4"], "was captured at batch 2, not the micro-batch 4; recapture it"),
        (["--layout", "tp=3"], "--layout 'tp=3': data: tensor(3)*pipeline(1)*context(1)=3 does not divide devices(8)"),
        (["--layout", "dp=8,turbo=1"], "turbo: unknown layout key"),
        (["--config", "missing.toml"], "--config: missing.toml: no such file"),
        (["--layout", "mb=2", "--optimizer", "sgd"], "--optimizer: configures a builder to capture, but"),
        (["--layout", "mb=2", "--max-grad-norm", "1"], "--max-grad-norm: configures a builder to capture, but"),
    ],
)
def test_bad_input_is_one_line_naming_what_is_wrong(extra, message: str, files, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(["predict", str(files["graph"]), "--resources", str(files["resources"]), *extra], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_hugging_face_config_needs_a_sequence_length(tmp_path: Path, files, capsys) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    code, _, err = _run(["predict", str(config), "--resources", str(files["resources"]), "--layout", "tp=2"], capsys)
    assert code == 2 and "--seq: needed to build" in err


def test_an_unpriced_layout_is_named_as_the_user_gave_it() -> None:
    from stratagem.cli.predict import _by_origin
    from stratagem.errors import UnsupportedStrategyError

    error = UnsupportedStrategyError("[1]: the simulator does not price precision 'fp8' yet")
    origins = ["--layout 'dp=8'", "--config train.toml"]
    assert _by_origin(error, origins) == "--config train.toml: the simulator does not price precision 'fp8' yet"
