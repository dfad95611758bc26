"""`stratagem predict MODEL_OR_GRAPH --resources spec.yml --layout "dp=8,tp=4,pp=2,mb=1,gbs=512" [--layout ...]`.

Prices layouts (and the layouts of trainer configs given with `--config`) on a cluster without a
service: one simulator call, the layouts side by side as a table, or `--json`. The model is a graph
JSON, a Hugging Face `config.json` (captured on the meta device at `--batch` × `--seq`), a zoo name or
`MODULE:FUNCTION` (captured at `--batch`, the micro-batch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stratagem.cli.capture import (
    add_builder_arguments,
    optimizer_implementation,
    optimizer_kind,
    refuse_capture_options,
)
from stratagem.cli.configs import CONFIG_FILES, add_format_argument, config_layout
from stratagem.cli.files import json_reason, parse_json, read_text
from stratagem.cli.jobs import positive_int
from stratagem.cli.optimize import capture_model, read_resources
from stratagem.errors import CaptureError, InvalidDocumentError, StratagemError, UnsupportedStrategyError

LABEL_WIDTH = 22


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="price layouts (or trainer configs) of a model on a cluster, side by side",
        description="Predict step time, throughput, MFU and memory of each layout with the simulator; no service.",
    )
    parser.add_argument("model", help="a graph .json, a Hugging Face config.json, a zoo name, or MODULE:FUNCTION")
    parser.add_argument(
        "--resources", type=Path, required=True, help="the cluster: resource_spec.yml or ResourceSpec JSON"
    )
    parser.add_argument("--device", default=None, help="GPU kind of an AutoDist spec's nodes (default T4)")
    parser.add_argument(
        "--layout",
        dest="layouts",
        action="append",
        default=[],
        metavar="LAYOUT",
        help='a layout, repeatable: "dp=8,tp=4,pp=2,mb=1,gbs=512,recompute=selective,precision=amp-bf16"',
    )
    parser.add_argument(
        "--config",
        dest="configs",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help=f"a trainer config priced as its layout, repeatable: {CONFIG_FILES}",
    )
    add_format_argument(parser, "--config", "every --config")
    parser.add_argument("--batch", type=positive_int, default=None, help="micro-batch to capture a model at")
    parser.add_argument("--seq", type=positive_int, default=None, help="sequence length of a Hugging Face config")
    add_builder_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stratagem.layout import Layout
    from stratagem.prediction import predict

    layouts = [Layout.from_string(text) for text in args.layouts]
    layouts += [config_layout(path, args.config_format) for path in args.configs]
    origins = [f"--layout {text!r}" for text in args.layouts] + [f"--config {path}" for path in args.configs]
    if not layouts:
        raise StratagemError("give at least one --layout or --config to price")
    graph = load_model(args, layouts)
    resources = read_resources(args.resources, device=args.device)
    try:
        predictions = predict(graph, resources, layouts)
    except (InvalidDocumentError, UnsupportedStrategyError) as error:
        raise StratagemError(_by_origin(error, origins)) from None
    if args.json:
        print(json.dumps([p.model_dump(mode="json") for p in predictions], indent=2))
        return 0
    print(f"{graph.summary()}\non {resources.name}: {resources.num_devices} devices on {len(resources.nodes)} node(s)")
    print(predictions_table(predictions))
    return 0


def _by_origin(error: InvalidDocumentError | UnsupportedStrategyError, origins: list[str]) -> str:
    """`predict` names a layout by its index (`[1].tensor`); the command line names it as the user gave it."""
    problems = (
        [(p.path, p.reason) for p in error.problems] if isinstance(error, InvalidDocumentError) else [(str(error), "")]
    )
    lines = []
    for path, reason in problems:
        head, sep, rest = path.partition("]")
        if sep and head.startswith("[") and head[1:].isdigit():
            where, path = origins[int(head[1:])], rest.lstrip(".:").strip()
            lines.append(f"{where}: {path}: {reason}" if reason else f"{where}: {path}")
        else:
            lines.append(f"{path}: {reason}" if reason else path)
    return "; ".join(lines)


def load_model(args: argparse.Namespace, layouts: list[Any]) -> Any:
    """The graph: read, built from a Hugging Face config, or captured at the micro-batch."""
    from stratagem.ir import ModelGraph

    batch = args.batch or _layout_micro_batch(layouts)
    path = Path(args.model)
    if path.suffix.lower() == ".json":
        try:
            data = parse_json(read_text(path, "model"))
        except json.JSONDecodeError as error:
            raise CaptureError(f"{path}: not JSON ({json_reason(error)} at line {error.lineno})") from None
        if isinstance(data, dict) and "model_type" in data:
            if args.seq is None:
                raise CaptureError(f"--seq: needed to build {path} (a Hugging Face config) for capture")
            from stratagem.hf import DEFAULT_OPTIMIZER as HF_OPTIMIZER
            from stratagem.hf import capture_hf_config

            return capture_hf_config(
                data,
                batch=batch or 1,
                seq=args.seq,
                optimizer=args.optimizer or HF_OPTIMIZER,
                optimizer_implementation=optimizer_implementation(args),
                max_grad_norm=args.max_grad_norm,
                name=path.parent.name or None,
            )
        refuse_capture_options(args, str(path))
        graph = ModelGraph.parse(data)
        if batch is not None and batch != graph.batch_size:
            raise CaptureError(
                f"{path} was captured at batch {graph.batch_size}, not the micro-batch {batch}; recapture it"
            )
        return graph
    if batch is None:
        raise CaptureError(f"--batch: needed to capture {args.model!r} at the micro-batch")
    return capture_model(
        args.model,
        batch=batch,
        size=args.size,
        overrides=args.overrides,
        optimizer=optimizer_kind(args),
        implementation=optimizer_implementation(args),
        max_grad_norm=args.max_grad_norm,
    )


def _layout_micro_batch(layouts: list[Any]) -> int | None:
    given = {layout.micro_batch for layout in layouts if layout.micro_batch is not None}
    if len(given) > 1:
        raise StratagemError(
            f"the layouts state micro-batches {sorted(given)}; one graph is captured at one micro-batch, "
            "so price them in separate runs"
        )
    return next(iter(given), None)


def predictions_table(predictions: list[Any]) -> str:
    """Layouts as columns, figures as rows; bottlenecks listed under the table."""
    rows = [
        ("layout", [f"[{i + 1}]" for i in range(len(predictions))]),
        ("step time", [_seconds(p.step_time_s) for p in predictions]),
        ("samples/s", [f"{p.samples_per_s:,.1f}" for p in predictions]),
        ("tokens/s", ["-" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}" for p in predictions]),
        ("tokens/s/device", [_per_device(p) for p in predictions]),
        ("MFU", ["-" if p.mfu is None else f"{100 * p.mfu:.1f}%" for p in predictions]),
        ("memory/device", [f"{p.memory_per_device_bytes / 1e9:.1f} GB" for p in predictions]),
        ("fits", [_fits(p) for p in predictions]),
    ]
    width = max([len(cell) for _, cells in rows for cell in cells] + [10])
    lines = [f"{name:<{LABEL_WIDTH}}" + "".join(f"  {cell:>{width}}" for cell in cells) for name, cells in rows]
    lines.append("")
    for i, p in enumerate(predictions):
        lines.append(f"[{i + 1}] {p.label}")
        lines.append(f"    {p.bottleneck}")
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value >= 1 else f"{value * 1e3:.1f} ms"


def _per_device(prediction: Any) -> str:
    if prediction.tokens_per_s is None:
        return "-"
    return f"{prediction.tokens_per_s / prediction.devices:,.0f}"


def _fits(prediction: Any) -> str:
    if prediction.feasible:
        return "yes"
    if prediction.memory_over_bytes > 0:
        return f"no (+{prediction.memory_over_bytes / 1e9:.1f} GB)"
    return "no"
