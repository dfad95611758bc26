"""Bad input a user types or hands over: the CLI and the SDK answer in one line naming the option or
argument and the reason, never a traceback, and leave what was already stored as it was."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli
from sample_documents import make_cpu_cluster, make_mlp_graph, make_t4_cluster
from service_helpers import QUICK_SEARCH, closed_port_url, served

import stratagem
from stratagem.errors import NotFoundError, RequestRejectedError, ServiceError, StratagemError
from stratagem.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[1]
SPEC_4X_T4 = ROOT / "examples" / "specs" / "4x_t4.yml"
HEADER = '{"kind": "header", "format": "stratagem-trials", "version": 1}\n'
NOT_UTF8 = b"\xff\xfe{}\n"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path_factory.mktemp('bad_input') / 'service.db'}") as address:
        yield address


# --- files handed to `optimize` -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("cluster.json", NOT_UTF8, "--resources: {path}: not UTF-8 text (byte 0"),
        ("cluster.yml", NOT_UTF8, "--resources: {path}: not UTF-8 text (byte 0"),
        ("cluster.json", DEEP.encode(), "--resources: {path}: not JSON (nested too deeply"),
        ("cluster.json", b'{"name": "trunc', "--resources: {path}: not JSON (Unterminated string starting at line 1);"),
        ("cluster.yml", None, "--resources: {path} is a directory, not a file"),
    ],
)
def test_optimize_refuses_a_resource_file_it_cannot_read_naming_the_option(
    name: str, content: bytes | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    code, _, err = run_cli(
        ["optimize", "gpt", "--batch", "2", "--resources", str(path), "--url", closed_port_url()], capsys
    )
    assert_one_line_error(code, err, message.format(path=path))


@pytest.mark.parametrize(
    ("content", "message"), [(NOT_UTF8, "model: {path}: not UTF-8 text"), (None, "model: {path} is a directory")]
)
def test_optimize_refuses_a_graph_file_it_cannot_read(
    content: bytes | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "graph.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    code, _, err = run_cli(["optimize", str(path), "--resources", str(SPEC_4X_T4), "--url", closed_port_url()], capsys)
    assert_one_line_error(code, err, message.format(path=path))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--size", "full"], "--size: configures a builder to capture, but"),
        (["--set", "layers=2"], "--set: configures a builder to capture, but"),
        (["--optimizer", "sgd"], "--optimizer: configures a builder to capture, but"),
        (["--optimizer-implementation", "fused"], "--optimizer-implementation: configures a builder to capture, but"),
        (["--max-grad-norm", "1.0"], "--max-grad-norm: configures a builder to capture, but"),
        (["--device", "V100"], "--device: names the GPU kind of an AutoDist spec's nodes, but"),
    ],
)
def test_optimize_refuses_options_that_a_graph_file_or_a_json_spec_would_silently_ignore(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_mlp_graph().save(tmp_path / "graph.json")
    make_t4_cluster(2).save(tmp_path / "cluster.json")
    code, _, err = run_cli(
        [
            "optimize",
            str(tmp_path / "graph.json"),
            "--resources",
            str(tmp_path / "cluster.json"),
            *extra,
            "--url",
            closed_port_url(),
        ],
        capsys,
    )
    assert_one_line_error(code, err, message)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--time-budget", "nan"], "--time-budget: must be a positive, finite number of seconds, got nan"),
        (["--time-budget", "inf"], "--time-budget: must be a positive, finite number of seconds, got inf"),
        (["--timeout", "nan"], "--timeout: must be a positive number of seconds, got nan"),
    ],
)
def test_optimize_refuses_numbers_json_cannot_carry_or_that_never_expire(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_mlp_graph().save(tmp_path / "graph.json")
    code, _, err = run_cli(
        ["optimize", str(tmp_path / "graph.json"), "--resources", str(SPEC_4X_T4), *extra, "--url", closed_port_url()],
        capsys,
    )
    assert_one_line_error(code, err, message)


# --- outputs are checked before the work -------------------------------------------------------


@pytest.mark.parametrize("target", ["missing-folder", "a-directory"])
@pytest.mark.parametrize("command", ["capture", "optimize", "calibrate"])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(
    command: str, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if target == "a-directory":
        output = tmp_path / "out.json"
        output.mkdir()
        message = f"--output: {output} is a directory"
    else:
        output = tmp_path / "nowhere" / "out.json"
        message = f"--output: {output}: folder {output.parent} does not exist"
    make_mlp_graph().save(tmp_path / "graph.json")
    argv = {
        "capture": ["capture", "gpt", "--batch", "2", "--size", "small"],
        # nothing listens at the URL: a job would fail with "cannot reach", so the output was checked first
        "optimize": [
            "optimize",
            str(tmp_path / "graph.json"),
            "--resources",
            str(SPEC_4X_T4),
            "--url",
            closed_port_url(),
        ],
        "calibrate": ["calibrate"],
    }[command]
    started = time.monotonic()
    code, _, err = run_cli([*argv, "-o", str(output)], capsys)
    assert_one_line_error(code, err, message)
    assert time.monotonic() - started < 30  # no calibration was measured
    assert not (output.parent.exists() and output.is_file())


# --- capture and calibrate ---------------------------------------------------------------------


def test_capture_reports_a_failing_make_batch_or_builder_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["capture", "gpt", "--size", "small", "--batch", "99999999999999999999"], capsys)
    assert_one_line_error(code, err, "--batch 99999999999999999999: the builder's make_batch failed: TypeError:")
    # torch appends its C++ stack to this one; the message keeps only its first line
    code, _, err = run_cli(
        ["capture", "gpt", "--size", "small", "--batch", "2", "--set", "seq=99999999999999999999"], capsys
    )
    assert_one_line_error(code, err, "builder gpt failed: TypeError:")


def test_capture_keeps_an_empty_optimizer_name_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["capture", "gpt", "--size", "small", "--batch", "2", "--optimizer", ""], capsys)
    assert_one_line_error(code, err, "optimizer.kind: unknown optimizer ''")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "100000"], "--ranks: this machine has"),
        (["--threads", "100000"], "--threads: this machine has"),
        (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
    ],
)
def test_calibrate_refuses_ranks_and_threads_the_machine_cannot_run(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, _, err = run_cli(["calibrate", *argv], capsys)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert time.monotonic() - started < 30  # refused before starting any rank


# --- trials export / import --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            (HEADER + '{"kind": ["graph"]}\n').encode(),
            ":2: kind: expected one of header, graph, resources, strategy, trial; got ['graph']",
        ),
        (HEADER.encode() + NOT_UTF8, ":2: not UTF-8 text (byte 0"),
        ((HEADER + DEEP + "\n").encode(), ":2: not JSON: nested too deeply"),
        ((HEADER + '{"kind": "gra').encode(), ":2: not JSON: Unterminated string starting at column 10"),
    ],
)
def test_trials_import_refuses_lines_it_cannot_read_naming_the_line(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    code, _, err = run_cli(["trials", "import", str(path), "--url", closed_port_url()], capsys)
    assert_one_line_error(code, err, f"{path}{message}")


def test_trials_import_of_a_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["trials", "import", str(tmp_path), "--url", closed_port_url()], capsys)
    assert_one_line_error(code, err, f"{tmp_path} is a directory, not a file written by `stratagem trials export`")


def test_a_failed_trials_export_leaves_the_existing_file_as_it_was(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "trials.jsonl"
    output.write_text("yesterday's export\n")
    code, _, err = run_cli(["trials", "export", "--url", closed_port_url(), "-o", str(output)], capsys)
    assert_one_line_error(code, err, "cannot reach")
    assert output.read_text() == "yesterday's export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trials.jsonl"]  # no partial file left behind
    code, _, err = run_cli(["trials", "export", "--url", url, "-o", str(output)], capsys)
    assert code == 0, err
    assert output.read_text().startswith('{"kind":"header"')


# --- files this user may not read or write -----------------------------------------------------


@pytest.mark.slow
def test_files_without_permission_are_one_line_errors_naming_the_option(tmp_path: Path) -> None:
    """chmod 000 and a read-only folder; as root the CLI runs without the capabilities that bypass them."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and setpriv (util-linux) is not there to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    graph, spec, trials = tmp_path / "graph.json", tmp_path / "cluster.yml", tmp_path / "trials.jsonl"
    make_mlp_graph().save(graph)
    shutil.copy(SPEC_4X_T4, spec)
    trials.write_text(HEADER)
    for path in (graph, spec, trials):
        path.chmod(0o000)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    cases = [
        (
            ["optimize", str(graph), "--resources", str(SPEC_4X_T4)],
            f"model: {graph}: cannot read it: Permission denied",
        ),
        (
            ["optimize", "gpt", "--batch", "2", "--resources", str(spec)],
            f"--resources: {spec}: cannot read it: Permission denied",
        ),
        (["trials", "import", str(trials)], f"{trials}: cannot read it: Permission denied"),
        (
            ["capture", "gpt", "--batch", "2", "-o", str(locked / "g.json")],
            f"--output: {locked / 'g.json'}: permission denied",
        ),
    ]
    for argv, message in cases:
        connection = ["--url", closed_port_url()] if argv[0] != "capture" else []
        completed = subprocess.run(
            [*prefix, sys.executable, "-m", "stratagem", *argv, *connection],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert completed.returncode == 2, completed.stderr
        assert message in completed.stderr and "Traceback" not in completed.stderr, completed.stderr


# --- jobs and the service URL ------------------------------------------------------------------


def test_jobs_show_sends_the_id_as_one_path_segment(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["jobs", "show", "../../healthz", "--url", url], capsys)
    assert_one_line_error(code, err, "-> 404")  # not GET /healthz read as a job
    assert out == ""
    code, _, err = run_cli(["jobs", "show", "", "--url", url], capsys)
    assert_one_line_error(code, err, "job_id: expected an id, got ''")


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("http://[::1", "url 'http://[::1': not a URL"),
        ("127.0.0.1:8000", "url '127.0.0.1:8000': expected http:// or https:// and a host"),
        ("http://127.0.0.1:99999", "url 'http://127.0.0.1:99999': port must be between 1 and 65535"),
        ("http://127.0.0.1:8000/v1/", "give the service's root (http://127.0.0.1:8000); the client adds /v1"),
    ],
)
def test_a_malformed_service_url_is_named(address: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["jobs", "--url", address], capsys)
    assert_one_line_error(code, err, message)


# --- serve, db, launch -------------------------------------------------------------------------


def test_serve_refuses_a_port_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["serve", "--port", "70000"], capsys)
    assert code == 2 and "argument --port: must be at most 65535, got 70000" in err and "Traceback" not in err


def test_serve_refuses_a_database_it_cannot_open_and_leaves_the_file_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "service.db"
    code, _, err = run_cli(
        ["serve", "--port", str(free_port()), "--trials-backend", "none", "--database-url", f"sqlite:///{missing}"],
        capsys,
    )
    assert_one_line_error(code, err, "OperationalError: unable to open database file")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    code, _, err = run_cli(
        ["serve", "--port", str(free_port()), "--trials-backend", "none", "--database-url", f"sqlite:///{notes}"],
        capsys,
    )
    assert_one_line_error(code, err, "DatabaseError: file is not a database")
    assert notes.read_text() == "not a database\n"


def test_db_upgrade_to_an_unknown_revision_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        ["db", "upgrade", "--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}", "--revision", "bogus"], capsys
    )
    assert_one_line_error(code, err, "--revision 'bogus': Can't locate revision identified by 'bogus'")


@pytest.mark.slow
def test_launch_refuses_what_every_rank_would_die_of(tmp_path: Path) -> None:
    strategy = tmp_path / "strategy.json"
    strategy.write_text("{}")
    script = tmp_path / "train.py"
    script.write_text("print('started')\n")
    garbled = tmp_path / "garbled.json"
    garbled.write_bytes(NOT_UTF8)
    cases = [
        (
            ["--strategy", str(strategy), "--nproc-per-node", "2", "--master-port", "99999", str(script)],
            "--master-port: must be between 0 (any free port) and 65535, got 99999",
        ),
        (["--strategy", str(strategy), "--nproc-per-node", "2", str(tmp_path / "missing.py")], "script: "),
        (["--strategy", str(strategy), "--nproc-per-node", "2", str(tmp_path)], "is a directory without a __main__.py"),
        (["--strategy", str(garbled), "--nproc-per-node", "2", str(script)], f"--strategy: {garbled}: not UTF-8 text"),
    ]
    for argv, message in cases:
        completed = subprocess.run(
            [sys.executable, "-m", "stratagem.launch", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert completed.returncode == 2, completed.stderr
        assert message in completed.stderr and "Traceback" not in completed.stderr and "started" not in completed.stdout


# --- the SDK -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "http://[::1"}, "url 'http://[::1': not a URL"),
        ({"url": "localhost:8000"}, "expected http:// or https:// and a host"),
        ({"url": "ftp://example.com"}, "expected http:// or https:// and a host"),
        ({"api_key": "clé"}, "api_key: must be printable ASCII"),
        ({"api_key": "a\nb"}, "api_key: must be printable ASCII"),
        ({"timeout": -1}, "timeout: must be a positive number of seconds"),
    ],
)
def test_client_arguments_are_checked_with_the_librarys_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(StratagemError) as raised:
        stratagem.Client(**kwargs)  # type: ignore[arg-type]
    assert message in str(raised.value)


class _NotAService(http.server.BaseHTTPRequestHandler):
    """Another web server on the port the user named: 200 with a login page, or JSON of another shape."""

    def _answer(self) -> None:
        body, kind = (
            (b'{"items": []}', "application/json")
            if self.path.startswith("/json")
            else (b"<html>sign in</html>", "text/html")
        )
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_a_service() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotAService)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_answers_that_are_not_the_services_raise_service_error(not_a_service: str) -> None:
    with stratagem.Client(not_a_service) as client:
        with pytest.raises(ServiceError, match=r"GET /healthz -> 200: the answer is not JSON \(text/html\)"):
            client.health()
        with pytest.raises(ServiceError, match="the answer is not JSON"):
            client.optimize(make_mlp_graph(), make_t4_cluster(2))
    with (
        stratagem.Client(not_a_service + "/json") as client,
        pytest.raises(ServiceError, match="the answer has no 'data' field"),
    ):
        client.jobs()


def test_ids_are_one_path_segment_and_empty_ones_are_refused(url: str) -> None:
    with stratagem.Client(url) as client:
        with pytest.raises(NotFoundError):
            client.job("../../healthz")  # not the health answer read as a job
        with pytest.raises(NotFoundError):
            client.strategy("../../healthz")
        for bad in ("", "..", None):
            with pytest.raises(RequestRejectedError, match="job_id: expected"):
                client.job(bad)  # type: ignore[arg-type]
        with pytest.raises(RequestRejectedError, match="graph_id: expected an id"):
            client.graph(" ")


def test_documents_of_the_wrong_type_are_named_and_nan_is_refused_before_sending(url: str) -> None:
    graph, cluster = make_mlp_graph(), make_cpu_cluster(2)
    with stratagem.Client(url) as client:
        before = len(client.jobs(limit=500))
        with pytest.raises(StratagemError, match=re.escape("resources: expected a stratagem.ResourceSpec")):
            client.optimize(graph, cluster.model_dump(mode="json"))  # type: ignore[arg-type]
        with pytest.raises(StratagemError, match=re.escape("graph: expected a stratagem.ModelGraph, got dict")):
            client.optimize(graph.model_dump(mode="json"), cluster)  # type: ignore[arg-type]
        with pytest.raises(RequestRejectedError, match=re.escape("body.search.time_budget_s: must be a finite number")):
            client.optimize(graph, cluster, search={"time_budget_s": float("nan")})
        with pytest.raises(RequestRejectedError, match=re.escape("body.max_trials: must be a finite number")):
            client.optimize(graph, cluster, max_trials=float("inf"))  # type: ignore[arg-type]
        assert len(client.jobs(limit=500)) == before  # nothing was submitted
        best = client.optimize(graph, cluster, max_trials=0, search=QUICK_SEARCH).wait(60).best()
        client.upload_graph(graph)
        client.upload_resources(cluster)
        with pytest.raises(RequestRejectedError, match=re.escape("body.step_times_s.1: must be a finite number")):
            client.record_trial(best, graph_id=graph.id, resource_id=cluster.id, step_times_s=[0.1, float("nan")])
        with pytest.raises(StratagemError, match=re.escape("strategy: expected a stratagem.Strategy")):
            client.record_trial(
                best.model_dump(mode="json"), graph_id=graph.id, resource_id=cluster.id, step_times_s=[0.1]
            )  # type: ignore[arg-type]
        assert client.trials(graph_id=graph.id) == []


def test_wait_arguments_and_a_closed_client_raise_the_librarys_errors(url: str) -> None:
    client = stratagem.Client(url)
    job = client.optimize(make_mlp_graph(), make_cpu_cluster(2), max_trials=0, search=QUICK_SEARCH)
    with pytest.raises(StratagemError, match=r"wait\(poll_s=...\): must be a positive number of seconds, got 0"):
        job.wait(poll_s=0)
    with pytest.raises(StratagemError, match=r"wait\(timeout=...\): must be None or 0 or more seconds, got nan"):
        job.wait(timeout=float("nan"))
    assert job.wait(60).status == "succeeded"
    client.close()
    with pytest.raises(StratagemError, match="this Client is closed"):
        job.refresh()
    with pytest.raises(StratagemError, match="this Client is closed"):
        client.health()


@pytest.mark.parametrize(
    ("workers", "reason"), [("99999999999", "less than or equal to 16"), ("-1", "greater than or equal to 0")]
)
def test_serve_refuses_a_worker_count_the_database_pool_cannot_serve(
    workers: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        ["serve", "--workers", workers, "--port", "1", "--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}"], capsys
    )
    assert_one_line_error(code, err, f"workers: Input should be {reason}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "70000"], {}, "argument --port: must be at most 65535, got 70000"),
        ([], {"STRATAGEM_WORKERS": "99"}, "workers: Input should be less than or equal to 16"),
    ],
)
def test_the_service_entry_point_refuses_bad_settings_in_one_line(
    argv: list[str], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    environment = dict(os.environ, STRATAGEM_DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite'}", **env)
    done = subprocess.run(
        [sys.executable, "-m", "optimizer_service", "--port", "1", *argv],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
