"""`stratagem jobs [--status S]`, `stratagem jobs show ID`, `stratagem jobs cancel ID`: the service's jobs.

Also home of what every command that talks to a service shares: the `--url`/`--api-key` options
(defaulting to `STRATAGEM_URL` and `STRATAGEM_API_KEY`, so a shell session sets them once) and the
plain-text tables the commands print.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from stratagem.client import DEFAULT_URL, Client

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
DESCRIPTION_WIDTH = 90


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "jobs",
        parents=[connection_options()],
        help="list the service's optimization jobs, show one, cancel one",
        description="Without a subcommand: a table of jobs, newest first.",
    )
    parser.add_argument("--status", choices=JOB_STATUSES, default=None, help="only jobs in this state")
    parser.add_argument("--limit", type=positive_int, default=50, help="jobs to list (default 50)")
    parser.set_defaults(func=run_list)
    # The actions take the options too, without overriding ones given before the action's name.
    connection = connection_options(suppress_defaults=True)
    actions = parser.add_subparsers(dest="jobs_command", metavar="ACTION")
    show = actions.add_parser("show", parents=[connection], help="one job: status, summary and ranked strategies")
    show.add_argument("job_id", help="the job's id")
    show.set_defaults(func=run_show)
    cancel = actions.add_parser("cancel", parents=[connection], help="cancel a queued or running job")
    cancel.add_argument("job_id", help="the job's id")
    cancel.set_defaults(func=run_cancel)


def connection_options(*, suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """A parent parser with `--url` and `--api-key`, for every command that talks to a service."""
    url_default = os.environ.get("STRATAGEM_URL", DEFAULT_URL)
    key_default = os.environ.get("STRATAGEM_API_KEY")
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--url",
        default=argparse.SUPPRESS if suppress_defaults else url_default,
        help=f"the service (default: $STRATAGEM_URL or {DEFAULT_URL})",
    )
    parent.add_argument(
        "--api-key",
        default=argparse.SUPPRESS if suppress_defaults else key_default,
        help="bearer key, when the service requires one (default: $STRATAGEM_API_KEY)",
    )
    return parent


def positive_int(text: str) -> int:
    """An argparse type, so a bad value is a usage error naming the option."""
    return int_at_least(text, 1)


def int_at_least(text: str, least: int, expected: str = "an integer") -> int:
    """`text` as an int of at least `least`, or the argparse error that names what was expected."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def connect(args: argparse.Namespace) -> Client:
    return Client(args.url, api_key=args.api_key)


def run_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        jobs = client.jobs(status=args.status, limit=args.limit)
    print(jobs_table(jobs) if jobs else "no jobs" + (f" with status {args.status}" if args.status else ""))
    return 0


def run_show(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.job(args.job_id)
        print(job_summary(job.data))
        if job.status == "succeeded":
            print()
            print(candidates_table(job.strategies()))
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.job(args.job_id).cancel()
    pending = job.data.get("cancel_requested") and not job.done
    print(f"job {job.id}: {job.status}" + (" (cancel requested; it stops at its next check)" if pending else ""))
    return 0


# --- rendering ---------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[bool] | None = None) -> str:
    """Columns padded to their widest cell; `right[i]` right-aligns column i (numbers)."""
    right = list(right) if right is not None else [False] * len(headers)
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def milliseconds(seconds: Any) -> str:
    return f"{seconds * 1e3:.2f}" if isinstance(seconds, (int, float)) else "-"


def per_second(value: Any) -> str:
    return f"{value:,.1f}" if isinstance(value, (int, float)) else "-"


def candidates_table(candidates: list[dict[str, Any]]) -> str:
    """Ranked candidates as `GET /v1/jobs/{id}/strategies` returns them: predicted and measured side by side."""
    rows = []
    for candidate in candidates:
        predicted = candidate.get("predicted") or {}
        measured = candidate.get("measured") or {}
        description = str(candidate.get("description", ""))
        if len(description) > DESCRIPTION_WIDTH:
            description = description[: DESCRIPTION_WIDTH - 3] + "..."
        rows.append(
            [
                str(candidate.get("rank", "?")),
                milliseconds(predicted.get("step_time_s")),
                per_second(predicted.get("samples_per_s")),
                milliseconds(measured.get("step_time_s")),
                per_second(measured.get("samples_per_s")),
                str(candidate.get("source", "")),
                description,
            ]
        )
    headers = ["rank", "predicted ms", "pred. samples/s", "measured ms", "meas. samples/s", "source", "description"]
    return format_table(headers, rows, right=[True, True, True, True, True, False, False])


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    rows = []
    for job in jobs:
        progress = job.get("progress") or {}
        result = job.get("result") or {}
        speedup = result.get("speedup_vs_data_parallel")
        rows.append(
            [
                str(job["id"]),
                str(job.get("status", "")),
                str(job.get("phase", "")),
                str(job.get("created_at", ""))[:19].replace("T", " "),
                f"{progress.get('candidates_evaluated', 0):,}",
                f"{progress.get('trials_done', 0)}/{progress.get('trials_budget', 0)}",
                milliseconds(progress.get("best_step_time_s")),
                f"{speedup:.2f}x" if isinstance(speedup, (int, float)) else "-",
                str(result.get("answer_basis", "-")),
            ]
        )
    headers = ["id", "status", "phase", "created (UTC)", "candidates", "trials", "best ms", "vs DP", "basis"]
    return format_table(headers, rows, right=[False, False, False, False, True, True, True, True, False])


def job_summary(job: dict[str, Any]) -> str:
    """The few facts a person asks about a job, one per line."""
    progress = job.get("progress") or {}
    result = job.get("result") or {}
    lines = [
        f"job        {job['id']}",
        f"status     {job.get('status')} (phase {job.get('phase')}, {job.get('attempts', 0)} attempt(s))",
        f"graph      {job.get('graph_id')}",
        f"resources  {job.get('resource_id')}",
        f"created    {job.get('created_at')}",
        f"finished   {job.get('finished_at') or '-'}",
        f"searched   {progress.get('candidates_evaluated', 0):,} candidates; "
        f"trials {progress.get('trials_done', 0)}/{progress.get('trials_budget', 0)}",
    ]
    if result:
        lines.append(
            f"answer     {result.get('answer_basis', '?')}; best {job.get('best_strategy_id')}; "
            f"{_speedup(result.get('speedup_vs_data_parallel'))} vs data parallel, "
            f"{_speedup(result.get('speedup_vs_best_builder'))} vs the best builder"
        )
        if result.get("answer_reason"):
            lines.append(f"why        {result['answer_reason']}")
        lines.extend(f"note       {note}" for note in result.get("notes") or [])
    if job.get("error"):
        lines.append(f"error      {job['error']}")
    return "\n".join(lines)


def _speedup(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "?"
