"""The service-side CLI: `optimize`, `jobs`, `trials export/import`, `db`, `serve`, against real services."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli
from sample_documents import make_cpu_cluster, make_embedding_graph, make_mlp_graph, make_t4_cluster
from service_helpers import QUICK_SEARCH, closed_port_url, served

import stratagem
from benchmarks.lib.serving import service_environment, start_serve, wait_healthy
from stratagem.cli import trials as trials_cli
from stratagem.ir import ModelGraph, Strategy
from stratagem.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[1]
SPEC_4X_T4 = ROOT / "examples" / "specs" / "4x_t4.yml"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path_factory.mktemp('cli') / 'service.db'}") as address:
        yield address


def table_rows(text: str) -> list[list[str]]:
    """The data rows of a table the CLI printed: the lines after the dashed rule, split on runs of spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("----")) + 1
    rows = []
    for line in lines[start:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 2:
            break
        rows.append(cells)
    return rows


# --- optimize ----------------------------------------------------------------------------------


def test_optimize_captures_a_zoo_model_on_an_autodist_spec_and_writes_the_best(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "best.json"
    code, out, err = run_cli(
        [
            "optimize",
            "stratagem.zoo:resnet50",
            "--size",
            "small",
            "--batch",
            "4",
            "--set",
            "width=8",
            "--resources",
            str(SPEC_4X_T4),
            "--device",
            "T4",
            "--trials",
            "0",
            "--time-budget",
            "0.5",
            "--seed",
            "3",
            "--url",
            url,
            "-o",
            str(output),
        ],
        capsys,
    )
    assert code == 0, err
    best = Strategy.load(output)
    assert len(best.replicas) == 4 and all(":GPU:" in d for d in best.replicas)
    rows = table_rows(out)
    with stratagem.Client(url) as client:
        job = client.jobs(limit=1)[0]
        candidates = client.job(job["id"]).strategies()
    assert len(rows) == len(candidates) and [row[0] for row in rows] == [str(c["rank"]) for c in candidates]
    assert job["best_strategy_id"] == best.id == candidates[0]["strategy_id"]
    assert job["options"]["max_trials"] == 0 and job["options"]["search"]["seed"] == 3
    assert f"best: {best.id}" in out and str(output) in out
    assert "succeeded" in err and f"job {job['id']} submitted" in err


def test_optimize_accepts_a_graph_file_and_a_resource_spec_json(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph, cluster = make_embedding_graph(), make_cpu_cluster(2)
    graph.save(tmp_path / "graph.json")
    cluster.save(tmp_path / "cluster.json")
    code, out, err = run_cli(
        [
            "optimize",
            str(tmp_path / "graph.json"),
            "--resources",
            str(tmp_path / "cluster.json"),
            "--trials",
            "0",
            "--time-budget",
            "0.5",
            "--top-k",
            "2",
            "--no-progress",
            "--url",
            url,
        ],
        capsys,
    )
    assert code == 0, err
    assert "[" not in err  # no progress bar
    rows = table_rows(out)
    assert rows[0][0] == "1" and rows[0][3] == "-"  # no measurement without trials
    # rank 1 is the answer the rule chose (a simpler strategy within 3% may beat a faster one); the rest by prediction
    rest = [float(row[1]) for row in rows[1:]]
    assert rest == sorted(rest) and float(rows[0][1]) <= min(rest) * 1.03
    assert "decided by " in out


def test_optimize_prices_the_current_layout_or_trainer_config_beside_the_answer(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph, cluster = make_embedding_graph(), make_cpu_cluster(2)
    graph.save(tmp_path / "graph.json")
    cluster.save(tmp_path / "cluster.json")
    ds_config = tmp_path / "ds_config.json"
    ds_config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 64, "gradient_accumulation_steps": 2}))
    common = [str(tmp_path / "graph.json"), "--resources", str(tmp_path / "cluster.json"), "--trials", "0"]
    common += ["--time-budget", "0.5", "--no-progress", "--url", url]
    for current, label in ((["--current", "dp=2"], "dp=2,mb=64,gbs=128"), (["--current-config", str(ds_config)], "")):
        code, out, err = run_cli(["optimize", *common, *current], capsys)
        assert code == 0, err
        assert re.search(r"\d+\.\d\dx predicted vs your current configuration", out), out
        assert f"your current configuration ({label}" in out
        assert "current" in [row[5] for row in table_rows(out)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--current", "tp=banana"], "tensor: Input should be a valid integer"),
        (["--current-config", "nowhere.toml"], "--current-config: nowhere.toml: no such file"),
        (["--current-config-format", "deepspeed"], "--current-config-format: says how to read --current-config"),
    ],
)
def test_optimize_refuses_a_bad_current_configuration_before_capturing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        ["optimize", "gpt", "--resources", str(SPEC_4X_T4), *argv, "--url", closed_port_url()], capsys
    )
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stratagem.zoo:gpt", "--resources", str(SPEC_4X_T4)], "--batch: needed to capture 'stratagem.zoo:gpt'"),
        (["gpt", "--batch", "2", "--resources", "nowhere.yml"], "--resources: nowhere.yml: no such file"),
        (["missing.json", "--resources", str(SPEC_4X_T4)], "missing.json: no such graph file"),
        (["gpt", "--batch", "2", "--resources", str(SPEC_4X_T4), "--trials", "-1"], "--trials: must be 0 or more"),
        (
            ["gpt", "--batch", "2", "--resources", str(SPEC_4X_T4), "--time-budget", "0"],
            "--time-budget: must be a positive",
        ),
        (
            ["gpt", "--batch", "2", "--resources", str(SPEC_4X_T4), "--set", "layerz=1"],
            "overrides.layerz: unknown field",
        ),
        (
            ["gpt", "--batch", "2", "--resources", str(SPEC_4X_T4), "--device", "Z80"],
            "nodes[0].device: unknown device kind 'Z80'",
        ),
    ],
)
def test_optimize_refuses_bad_input_in_one_line_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["optimize", *argv, "--url", closed_port_url()], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_optimize_refuses_a_resource_file_that_is_neither_json_nor_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "cluster.txt"
    spec.write_text("nodes:\n  - address: 10.0.0.1\n")
    code, _, err = run_cli(
        ["optimize", "gpt", "--batch", "2", "--resources", str(spec), "--url", closed_port_url()], capsys
    )
    assert code == 2 and "not JSON" in err and "must end in .yml or .yaml" in err


def test_optimize_against_an_unreachable_service_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_mlp_graph().save(tmp_path / "graph.json")
    make_t4_cluster(2).save(tmp_path / "cluster.json")
    address = closed_port_url()
    code, _, err = run_cli(
        ["optimize", str(tmp_path / "graph.json"), "--resources", str(tmp_path / "cluster.json"), "--url", address],
        capsys,
    )
    assert code == 2 and f"cannot reach {address}" in err


# --- jobs --------------------------------------------------------------------------------------


def test_jobs_lists_filters_and_shows_a_job_with_its_ranking(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with stratagem.Client(url) as client:
        job = client.optimize(
            make_mlp_graph(batch_size=64), make_t4_cluster(2), max_trials=0, search=QUICK_SEARCH
        ).wait(60)
        candidates = job.strategies()
    code, out, _ = run_cli(["jobs", "--url", url], capsys)
    assert code == 0
    listed = {row[0]: row for row in table_rows(out)}
    assert listed[job.id][1] == "succeeded" and listed[job.id][-1] == "predicted"
    code, out, _ = run_cli(["jobs", "--status", "queued", "--url", url], capsys)
    assert code == 0 and out.strip() == "no jobs with status queued"
    code, out, _ = run_cli(["jobs", "show", job.id, "--url", url], capsys)
    assert code == 0
    assert f"job        {job.id}" in out and "answer     predicted" in out and "vs data parallel" in out
    assert len(table_rows(out)) == len(candidates)


def test_jobs_show_of_an_unknown_job_is_a_one_line_404(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["jobs", "--url", url, "show", "00000000-0000-4000-8000-000000000000"], capsys)
    assert code == 2 and "-> 404" in err and len(err.strip().splitlines()) == 1


def test_jobs_cancel_cancels_a_queued_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with served(f"sqlite:///{tmp_path / 'queue.db'}", workers=0) as address:
        with stratagem.Client(address) as client:
            job = client.optimize(make_mlp_graph(), make_t4_cluster(2), max_trials=0)
        code, out, _ = run_cli(["jobs", "cancel", job.id, "--url", address], capsys)
        assert code == 0 and out.strip() == f"job {job.id}: cancelled"
        with stratagem.Client(address) as client:
            assert client.job(job.id).status == "cancelled"


def test_jobs_limit_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["jobs", "--limit", "0"], capsys)
    assert code == 2 and "--limit: must be at least 1, got 0" in err


# --- trials export / import --------------------------------------------------------------------


def _record_history(address: str) -> tuple[str, int]:
    """Five trials over two graphs on the service at `address`, three of them tied to one job."""
    with stratagem.Client(address) as client:
        mlp, embedding, cluster = make_mlp_graph(), make_embedding_graph(), make_cpu_cluster(2)
        job = client.optimize(mlp, cluster, max_trials=0, search=QUICK_SEARCH).wait(60)
        strategies = [c["strategy"] for c in job.strategies()[:2]]
        for i, strategy in enumerate(strategies):
            client.record_trial(
                Strategy.parse(strategy),
                graph_id=mlp.id,
                resource_id=cluster.id,
                step_times_s=[0.01 + i / 100, 0.02, 0.015],
                job_id=job.id,
                backend="ray",
            )
        client.record_trial(
            Strategy.parse(strategies[0]),
            graph_id=mlp.id,
            resource_id=cluster.id,
            step_times_s=[],
            outcome="crash",
            error="rank 1 died",
            job_id=job.id,
        )
        other = client.optimize(embedding, cluster, max_trials=0, search=QUICK_SEARCH).wait(60).best()
        for times in ([0.5, 0.4], [0.45]):
            client.record_trial(
                other,
                graph_id=embedding.id,
                resource_id=cluster.id,
                step_times_s=times,
                peak_memory_bytes=1e9,
                predicted_step_time_s=0.3,
                simulator_version="v1",
            )
        return job.id, 5


def _comparable(trials: list[dict[str, Any]]) -> list[str]:
    """Trials without what a deployment assigns itself (ids, times, the job), in a stable order."""
    kept = [{k: v for k, v in t.items() if k not in ("id", "created_at", "job_id")} for t in trials]
    return sorted(json.dumps(t, sort_keys=True) for t in kept)


def test_trials_round_trip_between_two_services_and_reimport_adds_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trials_cli, "PAGE", 2)  # several pages each way
    exported, again = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with served(f"sqlite:///{tmp_path / 'a.db'}") as source, served(f"sqlite:///{tmp_path / 'b.db'}") as target:
        job_id, count = _record_history(source)
        code, _, err = run_cli(["trials", "export", "--url", source, "-o", str(exported)], capsys)
        assert code == 0 and f"exported {count} trial(s) with 2 graph(s), 1 resource spec(s)" in err
        code, _, err = run_cli(["trials", "import", str(exported), "--url", target], capsys)
        assert code == 0 and f"imported {count} trial(s), skipped 0 already present; uploaded 2 graph(s)" in err
        code, _, err = run_cli(["trials", "import", str(exported), "--url", target], capsys)
        assert code == 0 and f"imported 0 trial(s), skipped {count} already present" in err
        code, _, _ = run_cli(["trials", "export", "--url", target, "-o", str(again)], capsys)
        assert code == 0
        with stratagem.Client(source) as a, stratagem.Client(target) as b:
            assert _comparable(b.trials(limit=100)) == _comparable(a.trials(limit=100))
            assert len(a.trials(job_id=job_id)) == 3
            assert {t["job_id"] for t in b.trials(limit=100)} == {None}
            for graph in (make_mlp_graph(), make_embedding_graph()):
                assert b.graph(graph.id) == a.graph(graph.id)
    kinds = [json.loads(line)["kind"] for line in exported.read_text().splitlines()]
    assert kinds[0] == "header" and kinds.count("trial") == count and kinds.count("graph") == 2


def test_trials_export_of_one_job_writes_only_its_trials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with served(f"sqlite:///{tmp_path / 'a.db'}") as source:
        job_id, _ = _record_history(source)
        code, out, _ = run_cli(["trials", "export", "--url", source, "--job-id", job_id], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    trials = [line for line in lines if line["kind"] == "trial"]
    assert len(trials) == 3 and {t["job_id"] for t in trials} == {job_id}
    assert [line["kind"] for line in lines].count("graph") == 1
    graph_line = next(line for line in lines if line["kind"] == "graph")
    assert ModelGraph.parse(graph_line["document"]).id == graph_line["id"] == trials[0]["graph_id"]


def test_trials_export_of_an_unknown_job_writes_nothing_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "00000000-0000-4000-8000-000000000000"
    with served(f"sqlite:///{tmp_path / 'a.db'}") as source:
        code, out, err = run_cli(["trials", "export", "--url", source, "--job-id", unknown], capsys)
    assert code != 0 and out == "" and unknown in err and "job_id" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty; expected a file written by `stratagem trials export`"),
        ('{"kind": "trial"}\n', ":1: expected the header line"),
        (
            '{"kind": "header", "format": "stratagem-trials", "version": 9}\n',
            ":1: version: this stratagem reads version 1",
        ),
        ('{"kind": "header", "format": "stratagem-trials", "version": 1}\nnot json\n', ":2: not JSON"),
        (
            '{"kind": "header", "format": "stratagem-trials", "version": 1}\n{"kind": "trial", "graph_id": "abc"}\n',
            ":2: graph_id: 'abc' is not carried by an earlier 'graph' line",
        ),
        (
            '{"kind": "header", "format": "stratagem-trials", "version": 1}\n{"kind": "graph", "id": "x", "document": {"layers": 3}}\n',
            ":2: document: invalid graph",
        ),
        (
            '{"kind": "header", "format": "stratagem-trials", "version": 1}\n{"kind": "job"}\n',
            ":2: kind: expected one of",
        ),
    ],
)
def test_trials_import_refuses_a_malformed_file_naming_the_line(
    content: str, message: str, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    code, _, err = run_cli(["trials", "import", str(path), "--url", url], capsys)
    assert code == 2 and message in err and "Traceback" not in err


# --- db ----------------------------------------------------------------------------------------


def test_db_upgrade_and_current_on_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import migrations

    database = f"sqlite:///{tmp_path / 'ops.db'}"
    head = migrations.head_revision()
    code, out, _ = run_cli(["db", "current", "--database-url", database], capsys)
    assert code == 1 and "(empty: no schema yet)" in out and f"behind head {head}" in out  # a script can gate on it
    code, out, _ = run_cli(["db", "upgrade", "--database-url", database], capsys)
    assert code == 0 and out.strip().endswith(f"upgraded (empty) -> {head}")
    code, out, _ = run_cli(["db", "upgrade", "--database-url", database], capsys)
    assert code == 0 and out.strip().endswith(f"already at {head}")
    code, out, _ = run_cli(["db", "current", "--database-url", database], capsys)
    assert code == 0 and out.strip().endswith(f"{head} (up to date)")


@pytest.mark.postgres
def test_db_upgrade_migrates_a_postgresql_database(postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    import migrations

    code, out, err = run_cli(["db", "upgrade", "--database-url", postgres_url], capsys)
    assert code == 0, err
    assert out.strip().endswith(f"-> {migrations.head_revision()}") and "postgresql+psycopg://" in out
    code, out, _ = run_cli(["db", "current", "--database-url", postgres_url], capsys)
    assert code == 0 and "(up to date)" in out


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://postgres@127.0.0.1:1/test", "OperationalError"),
        ("nosuchdb://x", "--database-url 'nosuchdb://x': NoSuchModuleError"),
    ],
)
def test_db_errors_are_one_line(url: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["db", "current", "--database-url", url], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


# --- serve -------------------------------------------------------------------------------------


def test_serve_refuses_bad_settings_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["serve", "--workers", "-1", "--database-url", "sqlite://"], capsys)
    assert code == 2 and "invalid service settings: workers: Input should be greater than or equal to 0" in err


@pytest.mark.slow
def test_serve_runs_the_service_with_the_options_given_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    server = start_serve(
        port,
        f"sqlite:///{tmp_path / 'served.db'}",
        "--workers",
        "2",
        "--trials-backend",
        "none",
        "--log-level",
        "info",
        env=service_environment(STRATAGEM_WORKERS="1"),  # the option wins over the environment
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        health = wait_healthy(f"http://127.0.0.1:{port}", server)
        assert health["workers"] == 2 and health["database"] == "ok"
        with stratagem.Client(f"http://127.0.0.1:{port}") as client:
            job = client.optimize(make_mlp_graph(), make_t4_cluster(2), max_trials=0, search=QUICK_SEARCH).wait(60)
            assert job.status == "succeeded"
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
    assert server.returncode in (0, -signal.SIGTERM), output
    assert (tmp_path / "served.db").exists()
    assert "Application shutdown complete" in output and "Traceback" not in output


def test_serve_without_the_service_extras_says_how_to_install_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what `import uvicorn` meets when it is not installed
    code, _, err = run_cli(["serve"], capsys)
    assert code == 2 and "pip install 'stratagem[service]'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["serve", "--port", "9000"], ["db", "upgrade"]])
def test_without_the_service_installed_its_commands_say_how_to_install_it(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import stratagem.cli

    monkeypatch.setattr(stratagem.cli, "entry_points", lambda group: [])  # no package plugs commands in
    code, _, err = run_cli(argv, capsys)
    assert (
        code == 2
        and f"`stratagem {argv[0]}` comes with the service" in err
        and "pip install 'stratagem[service]'" in err
    )


@pytest.mark.slow
def test_the_cli_loads_only_the_services_command_registrations_until_a_server_command_runs() -> None:
    script = (
        "import sys\n"
        "from stratagem.cli import build_parser\n"
        "build_parser().parse_args(['jobs'])\n"
        "assert {'optimizer_service.cli.serve', 'optimizer_service.cli.db'} <= set(sys.modules)\n"
        "server = ('simulator', 'trial_runner', 'models', 'migrations', 'uvicorn', 'fastapi', 'sqlalchemy')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(server)))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
