"""The competing CPU load the engine bench runs its rows beside (``script/bench engine``), and
the neighbour ``script/bench prebuffer`` records beside."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from .common import BenchError, blas_threads_env

# One competing-load process: `python -c PROGRAM DEADLINE_S`. The deadline bounds it even if the
# bench itself is killed (the bench also kills it at the end of every row, and on Linux the
# kernel kills it with its parent).
LOAD_PROGRAMS = {
    "spin": (
        "import sys, time\n"
        "end = time.monotonic() + float(sys.argv[1])\n"
        "while time.monotonic() < end:\n"
        "    pass\n"
    ),
    "matmul": (
        "import sys, time\n"
        "import numpy as np\n"
        "a = np.random.default_rng(0).random((512, 512))\n"
        "b = np.empty_like(a)\n"
        "end = time.monotonic() + float(sys.argv[1])\n"
        "while time.monotonic() < end:\n"
        "    np.matmul(a, a, out=b)\n"
    ),
    # A neighbour that comes and goes: busy for 0.5-3 s, then idle for 0.5-3 s, by turns
    "comes-and-goes": (
        "import random, sys, time\n"
        "end = time.monotonic() + float(sys.argv[1])\n"
        "while time.monotonic() < end:\n"
        "    busy = time.monotonic() + random.uniform(0.5, 3.0)\n"
        "    while time.monotonic() < min(busy, end):\n"
        "        pass\n"
        "    time.sleep(random.uniform(0.5, 3.0))\n"
    ),
}
NEIGHBOUR = "comes-and-goes"  # the prebuffer bench's neighbour
LOAD_MIN_S = 60.0  # bounds of one loaded row (the load processes' deadline, the child's timeout)
LOAD_MAX_S = 600.0


def load_bound_s(row_wall_s: float) -> float:
    """The bound of a loaded row, from the unloaded row's wall time: generous (the unloaded row
    ran more syntheses), within LOAD_MIN_S..LOAD_MAX_S."""
    return min(LOAD_MAX_S, max(LOAD_MIN_S, 8.0 * row_wall_s + 30.0))


def start_single_thread(
    program: str, *args: str, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """``python -c PROGRAM ARGS...`` as a single-thread process beside the engine (numpy's BLAS
    held to one thread), without stdin or stdout, killed when the bench dies."""
    return subprocess.Popen(
        [sys.executable, "-c", program, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        env=blas_threads_env(1),
        pass_fds=pass_fds,
        preexec_fn=_die_with_parent,
    )


def _die_with_parent() -> None:
    """``preexec_fn`` of a process beside the engine: SIGKILL when the bench dies (Linux
    prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (/proc/PID/stat), None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def competing_load(n: int, kind: str, bound_s: float) -> Iterator[dict[str, Any]]:
    """``n`` busy single-thread processes for the duration of the ``with`` block.

    Each exits by itself after ``bound_s`` seconds; all are killed when the block ends (however
    it ends). The yielded dict receives ``cpu_share``: the mean fraction of a CPU each got."""
    procs: list[subprocess.Popen[bytes]] = []
    info: dict[str, Any] = {"procs": n, "kind": kind, "bound_s": bound_s}
    start = time.monotonic()
    try:
        for _ in range(n):
            procs.append(start_single_thread(LOAD_PROGRAMS[kind], f"{bound_s:.0f}"))
        time.sleep(0.5)  # started and busy before the measured child starts
        if any(p.poll() is not None for p in procs):
            raise BenchError("a competing-load process exited at once")
        yield info
    finally:
        wall = time.monotonic() - start
        cpu = [_proc_cpu_s(p.pid) for p in procs if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        known = [c for c in cpu if c is not None]
        if known and wall > 0:
            info["cpu_share"] = sum(known) / (len(known) * wall)
