"""The loaded table's reference: a program that keeps every core busy alone and never waits.

One single-thread process per usable core, sharing a fixed number of work units (each a few
products of a cache-resident 256x256 matrix) through a pipe, one byte a unit: no process ever
waits for another, and none is left with more than one unit once the others have run out. Its
slowdown beside the competing load is the share of the cores the scheduler leaves a program that
used them all alone, with nothing lost to waits; the engine's loaded rows are set against it in
the same run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from wyoming_kazeia.settings import usable_cpus

from .common import BenchError, BenchTimeout, logger

# argv: the pipe's read end, the products per unit.
IDEAL_PROGRAM = (
    "import os, sys\n"
    "import numpy as np\n"
    "a = np.random.default_rng(0).random((256, 256))\n"
    "b = np.empty_like(a)\n"
    "units, products = int(sys.argv[1]), int(sys.argv[2])\n"
    "while os.read(units, 1):\n"
    "    for _ in range(products):\n"
    "        np.matmul(a, a, out=b)\n"
)
PRODUCTS_PER_UNIT = 16  # a unit: about 10 ms on a core of today
MAX_UNITS = 60000  # all written before the processes start: within a pipe's 64 KiB
IDEAL_ALONE_S = 4.0  # about how long a run alone takes (calibrated once per bench)


def ideal_run(units: int, timeout_s: float) -> dict[str, float]:
    """One run of ``units`` work units: ``wall_s`` until every process has ended, ``cpu_s``
    the CPU seconds of them all (each reaped with its own resource usage, so no other child of
    the bench counts)."""
    if not 1 <= units <= MAX_UNITS:
        raise BenchError(f"the ideal program: {units} units, not within 1..{MAX_UNITS}")
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"u" * units)
    finally:
        os.close(write_end)  # the processes read to its end
    start = time.perf_counter()
    try:
        args = [str(read_end), str(PRODUCTS_PER_UNIT)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", IDEAL_PROGRAM, *args], env=env, pass_fds=(read_end,)
            )
            for _ in range(usable_cpus())
        ]
    finally:
        os.close(read_end)
    cpu_s = 0.0
    try:
        for p in procs:
            while (time.perf_counter() - start) < timeout_s:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    p.returncode = os.waitstatus_to_exitcode(status)
                    cpu_s += usage.ru_utime + usage.ru_stime
                    break
                time.sleep(0.005)
            else:
                raise BenchTimeout(f"the ideal program: not done within {timeout_s:.0f} s")
            if p.returncode != 0:
                raise BenchError(f"the ideal program failed with exit status {p.returncode}")
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                p.wait()
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu_s}


def ideal_units() -> int:
    """The number of units that keeps every core busy for about IDEAL_ALONE_S alone."""
    units = 8 * usable_cpus()
    while True:
        wall_s = ideal_run(units, 60.0)["wall_s"]
        if wall_s >= 0.5 or units * 4 > MAX_UNITS:
            return max(1, min(MAX_UNITS, round(units * IDEAL_ALONE_S / wall_s)))
        units *= 4


def ideal_figures(runs: dict[str, Any]) -> dict[str, Any]:
    """The ideal program's figures from its runs ``before``, ``loaded`` and ``after``: the
    slowdown against the mean of the runs alone, and its two factors (as the engine rows')."""
    alone = {k: (runs["before"][k] + runs["after"][k]) / 2 for k in ("wall_s", "cpu_s")}
    loaded = runs["loaded"]
    alone_cores = alone["cpu_s"] / alone["wall_s"]
    cores = loaded["cpu_s"] / loaded["wall_s"]
    figures = {
        "processes": usable_cpus(),
        "slowdown": loaded["wall_s"] / alone["wall_s"],
        "cores": cores,
        "alone_cores": alone_cores,
        "cores_alone_vs_loaded": alone_cores / cores,
        "cpu_vs_alone": loaded["cpu_s"] / alone["cpu_s"],
    }
    logger.info(
        "ideal program: %.2f s loaded, %.2f and %.2f s alone around it: slowdown %.2fx",
        loaded["wall_s"],
        runs["before"]["wall_s"],
        runs["after"]["wall_s"],
        figures["slowdown"],
    )
    return figures
