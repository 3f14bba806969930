"""The loaded table's reference: a program that keeps every core busy alone and never waits.

One single-thread process per usable core, sharing a fixed number of work units (each a few
products of a cache-resident 256x256 matrix) through a pipe, one byte a unit: no process ever
waits for another, and none is left with more than one unit once the others have run out. Run
alone, beside the competing load and alone again, its cores alone / loaded is the share of the
cores the scheduler leaves a program with one thread per core and nothing lost to waits, and its
slowdown that share times what the box's speed did meanwhile; the engine's loaded rows are set
against both in the same run."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from wyoming_kazeia.settings import usable_cpus

from .common import BenchError, BenchTimeout, logger
from .competing_load import start_single_thread
from .engine_figures import load_factors, mean_of

# argv: the pipe's read end (a file descriptor), the products per unit.
IDEAL_PROGRAM = (
    "import os, sys\n"
    "import numpy as np\n"
    "a = np.random.default_rng(0).random((256, 256))\n"
    "b = np.empty_like(a)\n"
    "fd, products = int(sys.argv[1]), int(sys.argv[2])\n"
    "while os.read(fd, 1):\n"
    "    for _ in range(products):\n"
    "        np.matmul(a, a, out=b)\n"
)
PRODUCTS_PER_UNIT = 16  # a unit: about 10 ms on a core of today
# Every unit is written before the processes start, without blocking: a pipe holds 64 KiB, or
# 4 KiB where the user has too many pipes (the write then falls short and the run says so).
MAX_UNITS = 60000
IDEAL_ALONE_S = 4.0  # about how long a run alone takes (calibrated once per bench)


def _unit_pipe(units: int) -> int:
    """The read end of a pipe that holds ``units`` bytes and whose write end is closed."""
    if not 1 <= units <= MAX_UNITS:
        raise BenchError(f"the ideal program: {units} units, not within 1..{MAX_UNITS}")
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        written = os.write(write_end, b"u" * units)
    except OSError as err:
        os.close(read_end)
        raise BenchError(f"the ideal program: cannot fill its pipe ({err})") from err
    finally:
        os.close(write_end)  # the processes read to its end
    if written != units:
        os.close(read_end)
        raise BenchError(f"the ideal program: its pipe took {written} of {units} units")
    return read_end


def ideal_run(units: int, timeout_s: float) -> dict[str, float]:
    """One run of ``units`` work units: ``wall_s`` until every process has ended, ``cpu_s``
    the CPU seconds of them all (each reaped with its own resource usage, so no other child of
    the bench counts). Past ``timeout_s`` every process is killed and BenchTimeout raised."""
    read_end = _unit_pipe(units)
    procs: list[subprocess.Popen[bytes]] = []
    start = time.perf_counter()
    cpu_s = 0.0
    try:
        try:
            for _ in range(usable_cpus()):
                procs.append(
                    start_single_thread(
                        IDEAL_PROGRAM, str(read_end), str(PRODUCTS_PER_UNIT), pass_fds=(read_end,)
                    )
                )
        except OSError as err:
            raise BenchError(f"the ideal program: cannot start its processes ({err})") from err
        finally:
            os.close(read_end)
        for p in procs:
            while True:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    p.returncode = os.waitstatus_to_exitcode(status)
                    cpu_s += usage.ru_utime + usage.ru_stime
                    break
                if time.perf_counter() - start >= timeout_s:
                    raise BenchTimeout(f"the ideal program: not done within {timeout_s:.0f} s")
                time.sleep(0.005)
            if p.returncode != 0:
                raise BenchError(f"the ideal program failed with exit status {p.returncode}")
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                p.wait()
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu_s}


def ideal_units(target_s: float = IDEAL_ALONE_S) -> int:
    """The number of units that keeps every core busy for about ``target_s`` alone: the cost
    of a unit from the last two of runs four times larger each, the first at least 1 s, so
    that the processes' start (Python and numpy) is not counted as work."""
    units, previous = 8 * usable_cpus(), None
    while True:
        wall_s = ideal_run(units, 60.0)["wall_s"]
        if previous is not None and wall_s >= 1.0:
            per_unit = (wall_s - previous[1]) / (units - previous[0])
            fixed_s = max(0.0, wall_s - units * per_unit)
            if per_unit <= 0:  # the box's speed moved more than the work: scale the last run
                per_unit, fixed_s = wall_s / units, 0.0
            return max(1, min(MAX_UNITS, round((target_s - fixed_s) / per_unit)))
        if units * 4 > MAX_UNITS:
            return MAX_UNITS
        previous = (units, wall_s)
        units *= 4


def ideal_figures(runs: dict[str, Any]) -> dict[str, Any]:
    """The ideal program's figures from its runs ``before``, ``loaded`` and ``after``: against
    the mean of the runs alone, as the engine's loaded rows (load_factors)."""
    alone = mean_of([runs["before"], runs["after"]], ("wall_s", "cpu_s"))
    figures = {"processes": usable_cpus(), **load_factors(alone, runs["loaded"])}
    logger.info(
        "ideal program: %.2f s loaded, %.2f and %.2f s alone around it: slowdown %.2fx",
        runs["loaded"]["wall_s"],
        runs["before"]["wall_s"],
        runs["after"]["wall_s"],
        figures["wall_slowdown"],
    )
    return figures
