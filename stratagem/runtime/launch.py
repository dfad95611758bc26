"""Start N ranks of a training script with a strategy, torchrun-style, and join them in the script.

`python -m stratagem.launch --strategy best.json --nproc-per-node N script.py [args]` runs N copies
of the script on this node with the environment torchrun would give them (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus STRATAGEM_STRATEGY, the strategy file.
The script calls `init_from_env()` and then `stratagem.distribute(...)`. On a real cluster torchrun
itself works the same way: set STRATAGEM_STRATEGY and let torchrun provide the rest.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from stratagem.errors import InvalidStrategyError, StratagemError, UnsupportedStrategyError
from stratagem.ir import Strategy, parse_device
from stratagem.rank_env import rank_environment

STRATEGY_ENV = "STRATAGEM_STRATEGY"
MAX_PORT = 65535


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    strategy: Strategy | None
    """The strategy named by STRATAGEM_STRATEGY, when set."""


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise UnsupportedStrategyError(f"environment variable {name}={raw!r} is not an integer") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _backend(strategy: Strategy | None, rank: int) -> str:
    if strategy is not None and rank < len(strategy.replicas):
        return "nccl" if parse_device(strategy.replicas[rank])[1] == "GPU" else "gloo"
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_from_env(*, backend: str | None = None, timeout_s: float = 300.0) -> DistEnv:
    """Initialize the default process group from torchrun-style variables (a single rank when none are set).

    The backend follows this rank's replica in STRATAGEM_STRATEGY (NCCL for a GPU, gloo for a CPU),
    or CUDA's availability when no strategy is named.
    """
    path = os.environ.get(STRATEGY_ENV)
    strategy = Strategy.load(path) if path else None
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)
    chosen = backend or os.environ.get("STRATAGEM_BACKEND") or _backend(strategy, rank)
    if dist.is_initialized():
        return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, dist.get_backend(), strategy)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        if world_size > 1:
            raise UnsupportedStrategyError(
                "MASTER_PORT is not set; launch with `python -m stratagem.launch` or torchrun"
            )
        os.environ["MASTER_PORT"] = str(free_port())
    if chosen == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group(chosen, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return DistEnv(rank, world_size, local_rank, chosen, strategy)


def launch(
    script: str,
    script_args: list[str] | None = None,
    *,
    strategy: str | Path,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    python: str = sys.executable,
) -> int:
    """Run `nproc_per_node` ranks of `script` on this node; return the first failing exit code (0 when all succeed)."""
    strategy_path = Path(strategy).resolve()
    parsed = Strategy.load(strategy_path)
    world_size = nnodes * nproc_per_node
    if world_size != len(parsed.replicas):
        raise InvalidStrategyError(
            f"replicas: the strategy has {len(parsed.replicas)} replicas but nnodes({nnodes}) * nproc_per_node({nproc_per_node}) = {world_size}"
        )
    port = master_port or free_port()
    procs = []
    for local_rank in range(nproc_per_node):
        env = rank_environment(
            RANK=str(node_rank * nproc_per_node + local_rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(nproc_per_node),
            GROUP_RANK=str(node_rank),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(port),
        )
        env[STRATEGY_ENV] = str(strategy_path)
        procs.append(subprocess.Popen([python, script, *(script_args or [])], env=env))
    return _join(procs)


def _join(procs: list[subprocess.Popen]) -> int:
    """Wait for every rank; when one fails, stop the others (they would hang in a collective)."""
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                _stop(procs)
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(procs)
        return 130


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stratagem.launch", description="Run a training script under a Stratagem strategy."
    )
    parser.add_argument("--strategy", required=True, help="strategy JSON file (rank i runs replicas[i])")
    parser.add_argument("--nproc-per-node", type=int, required=True, help="ranks to start on this node")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=None)
    parser.add_argument("script", help="the training script; it calls stratagem.runtime.init_from_env()")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    return parser


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What every rank would otherwise die of, each with a traceback of its own: one line naming the argument."""
    if args.nproc_per_node < 1 or args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        return "need --nproc-per-node >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes"
    if args.master_port is not None and not 0 <= args.master_port <= MAX_PORT:
        return f"--master-port: must be between 0 (any free port) and {MAX_PORT}, got {args.master_port}"
    script = Path(args.script)
    if not script.exists():
        return f"script: {script}: no such file"
    if script.is_dir() and not (script / "__main__.py").is_file():
        return f"script: {script} is a directory without a __main__.py, not a Python script"
    try:
        Path(args.strategy).read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        return f"--strategy: {args.strategy}: not UTF-8 text (byte {error.start}: {error.reason})"
    except OSError:
        pass  # launch() reports a missing or unreadable strategy file itself
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = _argument_problem(args)
    if problem is not None:
        print(f"stratagem.launch: error: {problem}", file=sys.stderr)
        return 2
    try:
        return launch(
            args.script,
            args.script_args,
            strategy=args.strategy,
            nproc_per_node=args.nproc_per_node,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
        )
    except (StratagemError, OSError) as error:
        print(f"stratagem.launch: error: {error}", file=sys.stderr)
        return 2
