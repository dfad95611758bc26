"""`stratagem trials export > trials.jsonl` and `stratagem trials import trials.jsonl`: move measured
runs between deployments through the REST API, so a new service starts with what an old one learned.

The file is JSON Lines, one object per line, each with a `kind`:

    {"kind": "header", "format": "stratagem-trials", "version": 1, "source": URL, "exported_at": ...}
    {"kind": "graph", "id": ..., "document": {ModelGraph}}        before the first trial that uses it
    {"kind": "resources", "id": ..., "document": {ResourceSpec}}  likewise
    {"kind": "strategy", "id": ..., "document": {Strategy}}       likewise
    {"kind": "trial", "id": ..., "graph_id": ..., "strategy_id": ..., "step_times_s": [...], ...}

A trial line is the trial as `GET /v1/trials` shows it. Import uploads the documents (content ids
make that idempotent), then records each trial with its strategy inline; trials the target already
holds (same graph, cluster, strategy, outcome, backend, step times and error) are skipped, so importing a
file twice records nothing new. The source job is not carried over: it does not exist on the target.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from stratagem.cli.files import decode, json_reason, parse_json, replace_atomically
from stratagem.cli.jobs import connect, connection_options
from stratagem.client import Client
from stratagem.errors import InvalidDocumentError, StratagemError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

FORMAT = "stratagem-trials"
VERSION = 1
PAGE = 200
DOCUMENT_KINDS: dict[str, Any] = {"graph": ModelGraph, "resources": ResourceSpec, "strategy": Strategy}
TRIAL_FIELDS = (
    "outcome",
    "step_times_s",
    "median_s",
    "p90_s",
    "samples_per_s",
    "peak_memory_bytes",
    "error",
    "backend",
    "predicted_step_time_s",
    "simulator_version",
)
"""What a trial line carries into `POST /v1/trials` besides its documents."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("trials", help="export or import measured trials as JSON Lines")
    actions = parser.add_subparsers(dest="trials_command", metavar="ACTION", required=True)
    export = actions.add_parser("export", parents=[connection_options()], help="write a service's trials as JSON Lines")
    export.add_argument("--job-id", default=None, help="only this job's trials")
    export.add_argument("--graph-id", default=None, help="only trials of this graph (content id)")
    export.add_argument("-o", "--output", type=Path, default=None, help="file to write (default: stdout)")
    export.set_defaults(func=run_export)
    load = actions.add_parser(
        "import", parents=[connection_options()], help="record a JSON Lines file's trials on a service"
    )
    load.add_argument("file", type=Path, help="a file written by `stratagem trials export` ('-' for stdin)")
    load.set_defaults(func=run_import)


# --- export ------------------------------------------------------------------------------------


def run_export(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if args.output is None:
            counts = export_trials(client, sys.stdout, job_id=args.job_id, graph_id=args.graph_id, source=args.url)
        else:
            with replace_atomically(args.output, "--output") as stream:  # a failed export keeps the old file
                counts = export_trials(client, stream, job_id=args.job_id, graph_id=args.graph_id, source=args.url)
    print(f"exported {_counted(counts)}", file=sys.stderr)
    return 0


def export_trials(
    client: Client, stream: TextIO, *, job_id: str | None = None, graph_id: str | None = None, source: str = ""
) -> Counter[str]:
    """Write the header, then every matching trial after the documents it needs; returns lines per kind.
    The first page is fetched before the header, so a refused filter (an unknown job) writes nothing."""
    exported_at = datetime.datetime.now(datetime.UTC).isoformat()
    trials = _all_trials(client, job_id=job_id, graph_id=graph_id)
    first = next(trials, None)
    _write(
        stream, {"kind": "header", "format": FORMAT, "version": VERSION, "source": source, "exported_at": exported_at}
    )
    written: set[tuple[str, str]] = set()
    counts: Counter[str] = Counter()
    for trial in itertools.chain([first] if first is not None else [], trials):
        for kind, key in (("graph", "graph_id"), ("resources", "resource_id"), ("strategy", "strategy_id")):
            if (kind, trial[key]) not in written:
                _write(stream, {"kind": kind, "id": trial[key], "document": _fetch(client, kind, trial[key])})
                written.add((kind, trial[key]))
                counts[kind] += 1
        _write(stream, {"kind": "trial", **trial})
        counts["trial"] += 1
    return counts


def _all_trials(client: Client, *, job_id: str | None, graph_id: str | None) -> Iterator[dict[str, Any]]:
    """Page through the listing; a trial recorded meanwhile shifts the pages, so ids already seen are skipped."""
    seen: set[str] = set()
    offset = 0
    while True:
        page = client.trials(job_id=job_id, graph_id=graph_id, limit=PAGE, offset=offset)
        for trial in page:
            if trial["id"] not in seen:
                seen.add(trial["id"])
                yield trial
        if len(page) < PAGE:
            return
        offset += len(page)


def _fetch(client: Client, kind: str, ident: str) -> dict[str, Any]:
    fetchers = {"graph": client.graph, "resources": client.resources, "strategy": client.strategy}
    return fetchers[kind](ident).model_dump(mode="json")


def _write(stream: TextIO, line: dict[str, Any]) -> None:
    stream.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")


# --- import ------------------------------------------------------------------------------------


def run_import(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if str(args.file) == "-":
            counts = import_trials(client, sys.stdin.buffer, name="<stdin>")
        else:
            if args.file.is_dir():
                raise StratagemError(f"{args.file} is a directory, not a file written by `stratagem trials export`")
            if not args.file.is_file():
                raise StratagemError(f"{args.file}: no such file")
            try:
                stream = args.file.open("rb")
            except OSError as error:
                raise StratagemError(f"{args.file}: cannot read it: {error.strerror or error}") from None
            with stream:
                counts = import_trials(client, stream, name=str(args.file))
    print(
        f"imported {counts['trial']} trial(s), skipped {counts['skipped']} already present; "
        f"uploaded {counts['graph']} graph(s), {counts['resources']} resource spec(s)",
        file=sys.stderr,
    )
    return 0


class _Importer:
    """State of one import: the documents read so far and the target's trials, to skip duplicates."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.documents: dict[tuple[str, str], Any] = {}
        self.present: dict[str, Counter[tuple[Any, ...]]] = {}
        self.counts: Counter[str] = Counter()

    def document(self, kind: str, line: dict[str, Any], where: str) -> None:
        try:
            document = DOCUMENT_KINDS[kind].parse(line.get("document"))
        except InvalidDocumentError as error:
            raise StratagemError(f"{where}: document: {error}") from None
        if kind == "graph":
            self.client.upload_graph(document)
        elif kind == "resources":
            self.client.upload_resources(document)
        self.documents[(kind, str(line.get("id")))] = document
        self.counts[kind] += kind != "strategy"

    def trial(self, line: dict[str, Any], where: str) -> None:
        graph = self._needed("graph", line, "graph_id", where)
        resources = self._needed("resources", line, "resource_id", where)
        strategy = self._needed("strategy", line, "strategy_id", where)
        key = _fingerprint(graph.id, resources.id, strategy.id, line)
        present = self._present(graph.id)
        if present[key] > 0:
            present[key] -= 1
            self.counts["skipped"] += 1
            return
        fields: dict[str, Any] = {name: line.get(name) for name in TRIAL_FIELDS}
        self.client.record_trial(strategy, graph_id=graph.id, resource_id=resources.id, **fields)
        self.counts["trial"] += 1

    def _needed(self, kind: str, line: dict[str, Any], key: str, where: str) -> Any:
        document = self.documents.get((kind, str(line.get(key))))
        if document is None:
            raise StratagemError(
                f"{where}: {key}: {line.get(key)!r} is not carried by an earlier {kind!r} line of the file"
            )
        return document

    def _present(self, graph_id: str) -> Counter[tuple[Any, ...]]:
        if graph_id not in self.present:
            offset, found = 0, Counter[tuple[Any, ...]]()
            while page := self.client.trials(graph_id=graph_id, limit=PAGE, offset=offset):
                found.update(_fingerprint(t["graph_id"], t["resource_id"], t["strategy_id"], t) for t in page)
                offset += len(page)
            self.present[graph_id] = found
        return self.present[graph_id]


def import_trials(client: Client, stream: IO[str] | IO[bytes], *, name: str = "<file>") -> Counter[str]:
    """Record every trial of an exported file (text or bytes, read as UTF-8) on the service behind
    `client`; returns counts per kind."""
    importer = _Importer(client)
    for number, line in _lines(stream, name):
        where = f"{name}:{number}"
        kind = line.get("kind")
        if not isinstance(kind, str):
            raise StratagemError(
                f"{where}: kind: expected one of header, graph, resources, strategy, trial; got {kind!r}"
            )
        if kind in DOCUMENT_KINDS:
            importer.document(str(kind), line, where)
        elif kind == "trial":
            importer.trial(line, where)
        elif kind != "header":
            raise StratagemError(
                f"{where}: kind: expected one of header, graph, resources, strategy, trial; got {kind!r}"
            )
    return importer.counts


def _lines(stream: IO[str] | IO[bytes], name: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Numbered JSON objects; the first must be this format's header, blank lines are allowed."""
    header_seen = False
    raws: Iterable[str | bytes] = stream
    for number, raw in enumerate(raws, start=1):
        text = decode(raw, f"{name}:{number}") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        try:
            line = parse_json(text)
        except json.JSONDecodeError as error:
            raise StratagemError(f"{name}:{number}: not JSON: {json_reason(error)} at column {error.colno}") from None
        if not isinstance(line, dict):
            raise StratagemError(f"{name}:{number}: expected a JSON object, got {type(line).__name__}")
        if not header_seen:
            _check_header(line, f"{name}:{number}")
            header_seen = True
        yield number, line
    if not header_seen:
        raise StratagemError(f"{name}: empty; expected a file written by `stratagem trials export`")


def _check_header(line: dict[str, Any], where: str) -> None:
    if line.get("kind") != "header" or line.get("format") != FORMAT:
        raise StratagemError(
            f"{where}: expected the header line {{'kind': 'header', 'format': '{FORMAT}', ...}}; "
            "was this file written by `stratagem trials export`?"
        )
    if line.get("version") != VERSION:
        raise StratagemError(
            f"{where}: version: this stratagem reads version {VERSION}, the file is {line.get('version')!r}"
        )


def _fingerprint(graph_id: Any, resource_id: Any, strategy_id: Any, trial: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two recorded trials the same measurement, whichever service holds them."""
    times = tuple(round(float(t), 9) for t in trial.get("step_times_s") or [])
    median = trial.get("median_s")
    median = round(float(median), 9) if isinstance(median, (int, float)) else None
    return (
        graph_id,
        resource_id,
        strategy_id,
        trial.get("outcome"),
        trial.get("backend"),
        times,
        median,
        trial.get("error"),
    )


def _counted(counts: Counter[str]) -> str:
    return (
        f"{counts['trial']} trial(s) with {counts['graph']} graph(s), {counts['resources']} resource spec(s), "
        f"{counts['strategy']} strategy(ies)"
    )
