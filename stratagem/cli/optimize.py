"""`stratagem optimize MODULE:BUILDER|graph.json --batch N --resources spec.yml --trials 4 -o best.json`.

Capture (or read) the graph, read the cluster, submit both to a service, follow the job with a
progress bar, write the best strategy and print every ranked candidate. The builder is resolved and
built exactly as `stratagem capture` does it, so the two commands accept the same models.

`--current "dp=8,tp=4,mb=1,gbs=512"` (or `--current-config train.toml`, any trainer config
`stratagem predict --config` reads) names the configuration run today: the service prices it beside the
answer and states the answer's predicted speed-up over it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from stratagem.cli.capture import (
    DEFAULT_OPTIMIZER,
    add_builder_arguments,
    build_on_meta,
    make_example,
    optimizer_implementation,
    optimizer_kind,
    parse_overrides,
    refuse_capture_options,
    resolve_builder,
)
from stratagem.cli.configs import CONFIG_FILES, add_format_argument, config_layout
from stratagem.cli.files import check_output, json_reason, parse_json, read_text, write_text
from stratagem.cli.jobs import candidates_table, connect, connection_options, positive_int
from stratagem.errors import CaptureError, InvalidResourceSpecError, Problem, StratagemError
from stratagem.ir import ModelGraph, ResourceSpec

YAML_SUFFIXES = (".yml", ".yaml")
DEFAULT_DEVICE = "T4"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "optimize",
        parents=[connection_options()],
        help="find the fastest strategy for a model on a cluster, through a Stratagem service",
        description="Capture the model (or read a graph JSON), submit it with the cluster to the service, wait "
        "for the answer, write the best strategy and print the ranked candidates.",
    )
    parser.add_argument(
        "model", help="MODULE:FUNCTION returning (module, make_batch), a zoo name, or a graph .json file"
    )
    parser.add_argument("--batch", type=positive_int, default=None, help="per-replica batch size (needed to capture)")
    add_builder_arguments(parser)
    parser.add_argument(
        "--resources",
        type=Path,
        required=True,
        help="the cluster: AutoDist resource_spec.yml, or a ResourceSpec JSON (e.g. from `stratagem calibrate`)",
    )
    parser.add_argument(
        "--device", default=None, help=f"GPU kind of an AutoDist spec's nodes (default {DEFAULT_DEVICE})"
    )
    parser.add_argument(
        "--trials", type=int, default=None, help="real trials of the best candidates (0: simulator only)"
    )
    parser.add_argument("--time-budget", type=float, default=None, help="search seconds (default: the service's)")
    parser.add_argument("--top-k", type=positive_int, default=None, help="candidates kept in the ranking")
    parser.add_argument("--seed", type=int, default=None, help="search seed, for a reproducible answer")
    current = parser.add_mutually_exclusive_group()
    current.add_argument(
        "--current",
        default=None,
        metavar="LAYOUT",
        help='the layout you run today, priced beside the answer: "dp=8,tp=4,pp=2,mb=1,gbs=512"',
    )
    current.add_argument(
        "--current-config",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the trainer config you run today, priced beside the answer: {CONFIG_FILES}",
    )
    add_format_argument(parser, "--current-config", "--current-config")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the job (default 3600)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("-o", "--output", type=Path, default=None, help="where to write the best strategy JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_numbers(args)
    check_output(args.output, "--output")
    current = current_layout(args)
    graph = load_or_capture(args)
    resources = read_resources(args.resources, device=args.device)
    print(
        f"{graph.summary()}\non {resources.name}: {resources.num_devices} devices on {len(resources.nodes)} node(s)",
        file=sys.stderr,
    )
    with connect(args) as client:
        job = client.optimize(graph, resources, max_trials=args.trials, search=search_options(args), current=current)
        print(f"job {job.id} submitted to {args.url}", file=sys.stderr)
        job.wait(args.timeout, progress=not args.no_progress)
        best = job.best()
        candidates = job.strategies()
    if args.output is not None:
        write_text(args.output, best.to_json() + "\n", "--output")
    print(candidates_table(candidates))
    print(answer_line(job.data, best.id, args.output))
    for note in (job.data.get("result") or {}).get("notes") or []:
        print(f"note: {note}")
    return 0


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse what the service would refuse, before capturing a model for nothing."""
    if args.trials is not None and args.trials < 0:
        raise StratagemError(f"--trials: must be 0 or more, got {args.trials}")
    if args.time_budget is not None and not (math.isfinite(args.time_budget) and args.time_budget > 0):
        raise StratagemError(f"--time-budget: must be a positive, finite number of seconds, got {args.time_budget}")
    if args.seed is not None and args.seed < 0:
        raise StratagemError(f"--seed: must be 0 or more, got {args.seed}")
    if not args.timeout > 0:  # NaN too: it would never expire
        raise StratagemError(f"--timeout: must be a positive number of seconds, got {args.timeout}")


def current_layout(args: argparse.Namespace) -> Any:
    """The `--current` layout, or the layout of the `--current-config` trainer config; None without either.
    Read before capturing, so a bad one costs no capture."""
    from stratagem.layout import Layout

    if args.current is not None:
        return Layout.from_string(args.current)
    if args.current_config is not None:
        return config_layout(args.current_config, args.current_config_format, "--current-config")
    if args.current_config_format is not None:
        raise StratagemError("--current-config-format: says how to read --current-config, which was not given")
    return None


def load_or_capture(args: argparse.Namespace) -> ModelGraph:
    """A `.json` path is a captured graph; anything else names a builder to capture."""
    if args.model.lower().endswith(".json"):
        refuse_capture_options(args, args.model)
        return load_graph(Path(args.model), batch=args.batch)
    if args.batch is None:
        raise CaptureError(f"--batch: needed to capture {args.model!r} (the per-replica batch size)")
    return capture_model(
        args.model,
        batch=args.batch,
        size=args.size,
        overrides=args.overrides,
        optimizer=optimizer_kind(args),
        implementation=optimizer_implementation(args),
        max_grad_norm=args.max_grad_norm,
    )


def load_graph(path: Path, *, batch: int | None) -> ModelGraph:
    if not path.exists():
        raise CaptureError(f"{path}: no such graph file")
    graph = ModelGraph.parse(read_text(path, "model"))
    if batch is not None and batch != graph.batch_size:
        raise CaptureError(
            f"--batch: {path} was captured at batch {graph.batch_size}, not {batch}; recapture it to change"
        )
    return graph


def capture_model(
    spec: str,
    *,
    batch: int,
    size: str | None,
    overrides: list[str],
    optimizer: str = DEFAULT_OPTIMIZER,
    implementation: str = "multi-tensor",
    max_grad_norm: float | None = None,
) -> ModelGraph:
    from stratagem.tracing import capture

    kwargs = parse_overrides(overrides)
    if size is not None:
        kwargs["size"] = size
    module, make_batch = build_on_meta(resolve_builder(spec), kwargs)
    return capture(
        module,
        make_example(make_batch, batch),
        batch_size=batch,
        optimizer=optimizer,
        optimizer_implementation=implementation,
        max_grad_norm=max_grad_norm,
    )


def read_resources(path: Path, *, device: str | None) -> ResourceSpec:
    """AutoDist's YAML by suffix, else our JSON; a file that is neither says what was expected."""
    if not path.exists():
        raise InvalidResourceSpecError([Problem("--resources", f"{path}: no such file")])
    text = read_text(path, "--resources")
    if path.suffix.lower() in YAML_SUFFIXES:
        return ResourceSpec.from_autodist_yaml(text, device=device or DEFAULT_DEVICE, name=path.stem)
    if device is not None:
        raise StratagemError(
            f"--device: names the GPU kind of an AutoDist spec's nodes, but {path} is a ResourceSpec JSON, "
            "whose nodes name their device; drop --device"
        )
    try:
        data = parse_json(text)
    except json.JSONDecodeError as error:
        raise InvalidResourceSpecError(
            [
                Problem(
                    "--resources",
                    (
                        f"{path}: not JSON ({json_reason(error)} at line {error.lineno}); "
                        f"an AutoDist resource spec must end in {' or '.join(YAML_SUFFIXES)}"
                    ),
                )
            ]
        ) from None
    return ResourceSpec.parse(data)


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    chosen = {"time_budget_s": args.time_budget, "top_k": args.top_k, "seed": args.seed}
    return {key: value for key, value in chosen.items() if value is not None}


def answer_line(job: dict[str, Any], best_id: str | None, output: Path | None) -> str:
    result = job.get("result") or {}
    speedup = result.get("speedup_vs_data_parallel")
    parts = [f"best: {best_id}", f"answer {result.get('answer_basis', '?')}"]
    rule = (result.get("decision") or {}).get("rule")
    if rule:
        parts.append(f"decided by {rule}")
    if isinstance(speedup, (int, float)):
        parts.append(f"{speedup:.2f}x predicted vs plain data parallel")
    current = result.get("speedup_vs_current")
    if isinstance(current, (int, float)):
        parts.append(f"{current:.2f}x predicted vs your current configuration")
    if output is not None:
        parts.append(f"written to {output}")
    return "; ".join(parts)
