"""Whether the kernel's out-of-memory killer acted: the evidence that turns a SIGKILL into `oom`.

A rank killed by SIGKILL may have been chosen by the OOM killer, or killed by an operator, a container
runtime or a supervisor. Only the kernel's own counters tell: `oom_kill` in the memory cgroup's
`memory.events` (cgroup v2) or `memory.oom_control` (v1), and the machine-wide `oom_kill` of
`/proc/vmstat`. A trial reads them when its ranks start and again when one dies.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kill_count() -> int | None:
    """OOM kills the kernel counted so far, in this process's memory cgroup and machine-wide; None if unreadable."""
    counts = [c for c in (_cgroup_count(), _counter(Path("/proc/vmstat"), "oom_kill")) if c is not None]
    return sum(counts) if counts else None


def oom_killed_since(before: int | None) -> bool:
    """True when the kernel counts more OOM kills now than at `before`."""
    now = oom_kill_count()
    return before is not None and now is not None and now > before


def _cgroup_count() -> int | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.lstrip("/")
        if hierarchy == "0" and controllers == "":
            return _counter(CGROUP_ROOT / relative / "memory.events", "oom_kill")
        if "memory" in controllers.split(","):
            return _counter(CGROUP_ROOT / "memory" / relative / "memory.oom_control", "oom_kill")
    return None


def _counter(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None
