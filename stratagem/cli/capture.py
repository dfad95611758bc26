"""`stratagem capture MODULE:BUILDER --batch N [--size S] [--set k=v ...] [-o graph.json]
[--trace graph.trace.json.gz] [--chakra graph.et]`, or
`stratagem capture --hf-config config.json --batch 1 --seq 4096 -o llama.json`.

The builder is called on the meta device (nothing allocated, so full-size models are cheap) and
must return `(module, make_batch)`, like the builders in `stratagem.zoo`; a Hugging Face config is
built on the meta device by `stratagem.capture_hf_config` (no weights, no network). `--trace` saves
the step's operator trace beside the graph (which then names it by `trace_id`); `--chakra` exports the
same trace as an MLCommons Chakra execution trace.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from stratagem.cli.files import check_output, write_text
from stratagem.errors import CaptureError, StratagemError
from stratagem.ir.graph import OptimizerImplementation

ZOO_MODULE = "stratagem.zoo"
DEFAULT_OPTIMIZER = "adam"
OPTIMIZER_IMPLEMENTATIONS = get_args(OptimizerImplementation)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "capture",
        help="capture a model into a ModelGraph JSON",
        description="Build a model on the meta device, record one training step, write the graph as JSON.",
    )
    parser.add_argument(
        "builder", nargs="?", help="MODULE:FUNCTION returning (module, make_batch), or a zoo name (gpt)"
    )
    parser.add_argument("--batch", type=int, required=True, help="per-replica batch size (the micro-batch)")
    parser.add_argument(
        "--hf-config", type=Path, default=None, help="a Hugging Face config.json to build and capture instead"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="also write the operator trace (gzip-compressed JSON when the name ends in .gz); the graph names it",
    )
    parser.add_argument(
        "--chakra", type=Path, default=None, help="also write the operator trace as a Chakra execution trace (.et)"
    )
    parser.add_argument("--seq", type=int, default=None, help="sequence length (with --hf-config)")
    add_builder_arguments(parser)
    parser.add_argument("--name", default=None, help="graph name (default: the zoo name or model class)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="where to write the JSON (default: stdout)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stratagem.tracing import capture

    if args.batch <= 0:
        raise CaptureError(f"--batch: must be a positive integer, got {args.batch}")
    check_output(args.output, "--output")
    trace_path: Path | None = getattr(args, "trace", None)
    chakra_path: Path | None = getattr(args, "chakra", None)
    check_output(trace_path, "--trace")
    check_output(chakra_path, "--chakra")
    if (args.builder is None) == (args.hf_config is None):
        raise CaptureError("give a builder (MODULE:FUNCTION or a zoo name) or --hf-config, not both and not neither")
    if args.hf_config is not None:
        graph = capture_hf(args)
    elif args.seq is not None:
        raise CaptureError("--seq: only with --hf-config; a zoo model takes --set seq=N")
    else:
        builder = resolve_builder(args.builder)
        kwargs = parse_overrides(args.overrides)
        if args.size is not None:
            kwargs["size"] = args.size
        module, make_batch = build_on_meta(builder, kwargs)
        batch = make_example(make_batch, args.batch)
        graph = capture(
            module,
            batch,
            batch_size=args.batch,
            optimizer=optimizer_kind(args),
            optimizer_implementation=optimizer_implementation(args),
            max_grad_norm=args.max_grad_norm,
            name=args.name,
            trace=trace_path is not None or chakra_path is not None,
        )
    graph = write_trace(graph, trace_path=trace_path, chakra_path=chakra_path)
    if args.output is None:
        sys.stdout.write(graph.to_json() + "\n")
        print(graph.summary(), file=sys.stderr)
    else:
        write_text(args.output, graph.to_json() + "\n", "--output")
        print(f"{graph.summary()} -> {args.output}")
    return 0


def write_trace(graph: Any, *, trace_path: Path | None, chakra_path: Path | None) -> Any:
    """Write the trace where asked; the graph names its trace only when `--trace` keeps it."""
    from stratagem.tracing.chakra import write_chakra

    trace = graph.trace
    if trace is None:
        return graph
    if chakra_path is not None:
        try:
            nodes = write_chakra(trace, chakra_path)
        except OSError as error:
            raise CaptureError(f"--chakra: {chakra_path}: cannot write it: {error.strerror or error}") from None
        print(f"{nodes} Chakra nodes -> {chakra_path}", file=sys.stderr)
    if trace_path is None:
        return graph.replace(trace_id=None)
    try:
        trace.save(trace_path)
    except OSError as error:
        raise CaptureError(f"--trace: {trace_path}: cannot write it: {error.strerror or error}") from None
    print(f"{trace.summary()} -> {trace_path}", file=sys.stderr)
    return graph


def capture_hf(args: argparse.Namespace) -> Any:
    from stratagem.hf import DEFAULT_OPTIMIZER as HF_OPTIMIZER
    from stratagem.hf import capture_hf_config

    if args.seq is None or args.seq <= 0:
        raise CaptureError(f"--seq: a positive sequence length is needed with --hf-config, got {args.seq}")
    given = [option for option, value in (("--size", args.size), ("--set", args.overrides)) if value]
    if given:
        raise CaptureError(f"{given[0]}: configures a builder; a Hugging Face config states the model itself")
    if not args.hf_config.exists():
        raise CaptureError(f"--hf-config: {args.hf_config}: no such file")
    return capture_hf_config(
        args.hf_config,
        batch=args.batch,
        seq=args.seq,
        optimizer=args.optimizer or HF_OPTIMIZER,
        optimizer_implementation=optimizer_implementation(args),
        max_grad_norm=args.max_grad_norm,
        name=args.name or args.hf_config.resolve().parent.name,
    )


def resolve_builder(spec: str) -> Callable[..., Any]:
    """`package.module:function`; a bare name means a zoo model (`gpt` is `stratagem.zoo:gpt`)."""
    module_name, _, attribute = spec.rpartition(":") if ":" in spec else (ZOO_MODULE, ":", spec)
    if not module_name or not attribute:
        raise CaptureError(f"builder {spec!r}: expected MODULE:FUNCTION, e.g. stratagem.zoo:gpt")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CaptureError(f"builder {spec!r}: cannot import module {module_name!r}: {error}") from None
    builder = getattr(module, attribute, None)
    if not callable(builder):
        if ":" not in spec:
            raise CaptureError(_not_a_zoo_model(spec, module))
        raise CaptureError(f"builder {spec!r}: module {module_name!r} has no function {attribute!r}")
    return builder


def _not_a_zoo_model(spec: str, zoo: Any) -> str:
    """A bare name is read as a zoo model; a user who meant their own builder (`train.py` or `mymodels`
    without `:function`) needs to hear the MODULE:FUNCTION form, not that the zoo lacks a function."""
    names = ", ".join(sorted(getattr(zoo, "ZOO", {}))) or "none"
    return (
        f"builder {spec!r}: not a zoo model (zoo models: {names}); "
        "a builder of your own is MODULE:FUNCTION, e.g. my_pkg.models:build"
    )


def add_builder_arguments(parser: argparse.ArgumentParser) -> None:
    """How a model builder is configured, the same for every command that captures one."""
    parser.add_argument("--size", default=None, help="size preset passed to the builder (zoo: small, full, 7b, ...)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="builder keyword override, repeatable (--set layers=4)",
    )
    parser.add_argument(
        "--optimizer",
        default=None,
        help=f"optimizer kind the model trains with (sgd, momentum, adam, adamw, ...; default {DEFAULT_OPTIMIZER})",
    )
    parser.add_argument(
        "--optimizer-implementation",
        default=None,
        choices=OPTIMIZER_IMPLEMENTATIONS,
        help="how the training run steps it: multi-tensor (PyTorch's default on CUDA), for-loop "
        "(foreach=False) or fused (fused=True, FusedAdam); default multi-tensor",
    )
    parser.add_argument(
        "--max-grad-norm",
        type=float,
        default=None,
        metavar="NORM",
        help="the global gradient norm the training run clips to (clip_grad_norm_); default: no clipping",
    )


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` pairs; values are JSON when they parse as JSON (4, 0.1, true, [1, 2]), else strings."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise CaptureError(f"--set {item!r}: expected KEY=VALUE")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        overrides[key.strip()] = value
    return overrides


def build_on_meta(builder: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[Any, Callable[[int], Any]]:
    """Call the builder so that it allocates nothing: with `device="meta"` if it takes one, else
    inside `torch.device("meta")`."""
    import torch

    parameters = inspect.signature(builder).parameters
    takes_device = "device" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    try:
        with torch.device("meta"):
            built = builder(**kwargs, device="meta") if takes_device else builder(**kwargs)
    except StratagemError:
        raise
    except Exception as error:
        raise CaptureError(
            f"builder {builder.__qualname__} failed: {type(error).__name__}: {first_line(error)}"
        ) from error
    if not (
        isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module) and callable(built[1])
    ):
        raise CaptureError(
            f"builder {builder.__qualname__} must return (module, make_batch), got {type(built).__name__}"
        )
    return built


def make_example(make_batch: Callable[[int], Any], batch: int) -> Any:
    """The builder's example batch of `batch` samples, on meta; its failure names --batch."""
    import torch

    try:
        with torch.device("meta"):
            return make_batch(batch)
    except StratagemError:
        raise
    except Exception as error:
        raise CaptureError(
            f"--batch {batch}: the builder's make_batch failed: {type(error).__name__}: {first_line(error)}"
        ) from None


def first_line(error: BaseException) -> str:
    """An exception's message without the C++ stack torch appends to some."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def optimizer_kind(args: argparse.Namespace) -> str:
    return DEFAULT_OPTIMIZER if args.optimizer is None else str(args.optimizer)


def optimizer_implementation(args: argparse.Namespace) -> str:
    return args.optimizer_implementation or "multi-tensor"


def refuse_capture_options(args: argparse.Namespace, model: str) -> None:
    """Options that configure a capture, refused beside a graph captured already, which would ignore them."""
    options = (
        ("--size", args.size),
        ("--set", args.overrides),
        ("--optimizer", args.optimizer),
        ("--optimizer-implementation", args.optimizer_implementation),
        ("--max-grad-norm", args.max_grad_norm),
    )
    given = [option for option, value in options if value is not None and value != []]
    if given:
        raise CaptureError(
            f"{given[0]}: configures a builder to capture, but {model} is a graph captured already; "
            "drop the option or name the builder"
        )
