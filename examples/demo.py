"""`make demo` (`python -m examples.demo`): the whole service on this machine, in a few minutes.

It starts a local Ray (2 CPUs) and the service (SQLite in a temporary directory, trials on that Ray),
then, through the client SDK like any user, optimizes three zoo models at their small sizes with two
real trials each on this machine (one node, two CPU ranks talking gloo), plus one simulator-only job
for BERT-large on AutoDist's benchmark cluster (16 nodes x 4 T4), which is where the search pays off.
It prints each job's ranked strategies, the dashboard URL and the wall time. With a terminal on stdin
it keeps serving until Ctrl-C so the dashboard can be opened; otherwise it shuts everything down.

Unlike the other examples, which use only `stratagem`, the demo composes the service itself (the
way a deployment script would), so it imports `optimizer_service`, uvicorn and Ray inside functions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stratagem
from stratagem.cli.jobs import candidates_table
from stratagem.errors import ServiceError
from stratagem.ir import ModelGraph, Node, ResourceSpec

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "examples" / "specs" / "16x4_t4.yml"
BATCH = 8
JOB_TIMEOUT_S = 600.0
CLUSTER_SEARCH_S = 3.0
"""Search seconds for the 64-GPU job (the local jobs take the service's 1 s): its space is far larger."""
RANKED_HEADER = "Ranked strategies"


@dataclass(frozen=True)
class DemoModel:
    name: str
    size: str
    batch: int
    optimizer: str
    """DLRM's sparse embedding gradients need an optimizer torch can apply them with (SGD, Adagrad)."""


LOCAL_MODELS = (
    DemoModel("dlrm", "small", BATCH, "sgd"),
    DemoModel("bert_large", "small", BATCH, "adam"),
    DemoModel("resnet50", "small", BATCH, "adam"),
)
CLUSTER_MODEL = DemoModel("bert_large", "full", 32, "adam")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    plan = demo_plan(quick=args.quick, calibrated=args.calibrate)
    with demo_directory(args.dir) as directory, ThreadPoolExecutor(max_workers=1) as pool:
        graphs = pool.submit(capture_all, plan)  # torch's tracing overlaps Ray's start-up
        with local_ray(), ServiceThread(demo_app(directory), port=args.port) as service:
            print(
                f"service at {service.url}: SQLite {directory / 'stratagem.db'}, trials on a local Ray with 2 CPUs",
                flush=True,
            )
            with stratagem.Client(service.url) as client:
                jobs = [
                    (job.title, submit(client, job, graph)) for job, graph in zip(plan, graphs.result(), strict=True)
                ]
                failures = sum(not report(title, job) for title, job in jobs)
            print(f"\nDashboard: {service.url}/   (API docs: {service.url}/docs)")
            print(f"Demo wall time: {time.monotonic() - started:.1f} s", flush=True)
            if sys.stdin is not None and sys.stdin.isatty():
                serve_until_interrupted(service)
    return 1 if failures else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one model, one trial, no cluster job")
    parser.add_argument("--calibrate", action="store_true", help="measure this machine first (about 20 s more)")
    parser.add_argument("--port", type=int, default=0, help="port to serve on (default: any free one)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="keep the SQLite database here (default: a temporary dir)"
    )
    return parser.parse_args(argv)


# --- the parts the demo starts -----------------------------------------------------------------


@contextlib.contextmanager
def demo_directory(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    directory = Path(tempfile.mkdtemp(prefix="stratagem-demo-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    """A Ray for this process; its workers import this checkout through PYTHONPATH (inherited)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    clock = time.monotonic()
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"Ray started in {time.monotonic() - clock:.1f} s", flush=True)
    try:
        yield
    finally:
        ray.shutdown()


def demo_app(directory: Path) -> Any:
    """The service, tuned for a demo: quick workers, short trials, one worker thread per job."""
    from optimizer_service.app import create_app
    from optimizer_service.settings import Settings

    settings = Settings(
        database_url=f"sqlite:///{directory / 'stratagem.db'}",
        trials_backend="ray",
        workers=4,
        poll_interval_s=0.2,
        progress_interval_s=0.2,
        trial_warmup=1,
        trial_steps=3,
        trial_timeout_s=240.0,
        search_time_budget_s=1.0,
    )
    return create_app(settings)


class ServiceThread:
    """uvicorn serving an app from a thread of this process: the real HTTP stack, started and stopped here.

    Port 0 takes any free port, read back from the bound socket, so parallel runs never collide.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 60.0) -> None:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, name="stratagem-service", daemon=True)
        self._host = host
        self._start_timeout_s = start_timeout_s
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def __enter__(self) -> ServiceThread:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start on {self._host}:{self.port} (see the log above)")
            time.sleep(0.02)
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)

    def wait(self) -> None:
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)


def serve_until_interrupted(service: ServiceThread) -> None:
    print("Serving until Ctrl-C ...", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        service.wait()
    print("\nshutting down", flush=True)


# --- what a user does: capture, submit, read the answer ---------------------------------------


@dataclass(frozen=True)
class PlannedJob:
    model: DemoModel
    cluster: ResourceSpec
    trials: int
    search_s: float | None = None
    """Search seconds; None takes the service's."""

    @property
    def title(self) -> str:
        m, c = self.model, self.cluster
        return f"{m.name} ({m.size}, batch {m.batch}, {m.optimizer}) on {c.name}: {c.num_devices} devices"


def demo_plan(*, quick: bool, calibrated: bool) -> list[PlannedJob]:
    """Each local model with its trials on this machine, then the simulator-only job on a real-size cluster."""
    here = this_machine(calibrated=calibrated)
    if quick:
        return [PlannedJob(LOCAL_MODELS[0], here, trials=1)]
    realistic = ResourceSpec.from_autodist_yaml(CLUSTER_YAML, device="T4", name="autodist-16x4-t4")
    return [
        *(PlannedJob(model, here, trials=2) for model in LOCAL_MODELS),
        PlannedJob(CLUSTER_MODEL, realistic, trials=0, search_s=CLUSTER_SEARCH_S),
    ]


def this_machine(*, calibrated: bool) -> ResourceSpec:
    """One node, two CPU ranks: where the demo's trials really run."""
    if calibrated:
        from stratagem.calibrate import calibrate

        return calibrate(ranks=2)
    return ResourceSpec(
        name="this-machine-2cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")]
    )


def capture_all(plan: list[PlannedJob]) -> list[ModelGraph]:
    graphs = []
    for job in plan:
        clock = time.monotonic()
        graphs.append(capture(job.model))
        print(f"captured {graphs[-1].summary()} in {time.monotonic() - clock:.1f} s", flush=True)
    return graphs


def capture(model: DemoModel) -> ModelGraph:
    import torch

    from stratagem.zoo import build

    module, make_batch = build(model.name, size=model.size, device="meta")
    with torch.device("meta"):
        example = make_batch(model.batch)
    return stratagem.capture(module, example, batch_size=model.batch, optimizer=model.optimizer)


def submit(client: stratagem.Client, job: PlannedJob, graph: ModelGraph) -> stratagem.Job:
    search = {"time_budget_s": job.search_s} if job.search_s else None
    submitted = client.optimize(graph, job.cluster, max_trials=job.trials, search=search)
    print(f"submitted {job.model.name} to the service: job {submitted.id}", flush=True)
    return submitted


def report(title: str, job: stratagem.Job) -> bool:
    """Wait for the job and print its ranked strategies; False when it did not succeed."""
    print(f"\n{RANKED_HEADER} for {title}, job {job.id}", flush=True)
    try:
        job.wait(JOB_TIMEOUT_S, progress=sys.stderr)
    except ServiceError as error:
        print(f"  the job did not succeed: {error}")
        return False
    result = job.data.get("result") or {}
    timings = ", ".join(
        f"{phase} {seconds:.1f} s" for phase, seconds in (job.data["progress"].get("timings_s") or {}).items()
    )
    print(
        f"  answer {result.get('answer_basis')}: {result.get('trials_ok', 0)}/{result.get('trials_ran', 0)} trials ok; "
        f"predicted {_times(result.get('speedup_vs_data_parallel'))} vs plain data parallel, "
        f"{_times(result.get('speedup_vs_best_builder'))} vs the best AutoDist builder ({timings})"
    )
    if result.get("answer_reason"):
        print(f"  why this answer: {result['answer_reason']}")
    for note in result.get("notes") or []:
        print(f"  note: {note}")
    for trial in job.client.trials(job_id=job.id):
        if trial["outcome"] != "ok":
            reason = (trial.get("error") or "no error text").strip().splitlines()[0]
            print(f"  a trial ended {trial['outcome']}: {reason}")
    print(candidates_table(job.strategies()), flush=True)
    return True


def _times(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "?"


if __name__ == "__main__":
    raise SystemExit(main())
