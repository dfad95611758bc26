"""A rank process dies with the process that started it: no trial outlives a crashed service.

Two guards, because either alone has a gap. On Linux the kernel's parent-death signal
(`prctl(PR_SET_PDEATHSIG, SIGKILL)`) kills the rank the moment its parent goes, even by `kill -9`; it
fires when the parent *thread* that started the rank ends, which in the service is the job thread
that waits for the trial anyway. Everywhere, a heartbeat thread checks once per `interval_s` that
the parent is still the one that started the rank, and exits otherwise; it also closes the window
before the signal was armed, in which the parent may already have died.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
HEARTBEAT_S = 0.5


def die_with_parent(parent_pid: int, *, interval_s: float = HEARTBEAT_S) -> None:
    """Arm both guards for `parent_pid`; exit at once if it is already gone."""
    if sys.platform.startswith("linux"):
        libc_name = ctypes.util.find_library("c")
        if libc_name:
            ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(70)
    threading.Thread(target=_watch, args=(parent_pid, interval_s), name="lifeline", daemon=True).start()


def _watch(parent_pid: int, interval_s: float) -> None:
    stop = threading.Event()
    while not stop.wait(interval_s):
        if os.getppid() != parent_pid:
            os._exit(70)
