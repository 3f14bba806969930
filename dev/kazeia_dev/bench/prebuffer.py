"""``script/bench prebuffer``: the service's hold (``wyoming_kazeia.pacing.Prebuffer``) on a box
whose speed moves between answers.

A number of answers are synthesized in one engine child (stream chunks, the default model)
and their chunks' arrivals recorded, with a neighbour that comes and goes beside them if asked.
Each recording is then replayed through the hold as the service would meet it (its rates taught
by the warm-up, then by each answer before), at the speed it was recorded and at faster ones
(every time divided by the speed: a faster box with the same jitter), and again with every
n-th answer slowed down after its first chunk (a box that slowed down between answers, which
its last answers could not tell). A player at real time counts the underruns
(``player.underruns``); the hold's cost is the first audio's added delay, beside the least
each answer needed (``player.least_hold``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wyoming_kazeia.pacing import Prebuffer

from .common import (
    BenchError,
    blas_threads_env,
    default_cache_dir,
    loadavg,
    machine_info,
    machine_line,
    print_result,
    run_json_child,
    warn_if_busy,
)
from .competing_load import NEIGHBOUR, competing_load
from .engine import add_model_options, add_synthesis_options, checked_model_dir
from .engine_runs import engine_row_cmd
from .player import Chunk, learn, least_hold, let_out, underruns, warm_rates

# Bound of the recording child, generous for a box several times slower than real time (a
# frame is 80 ms of audio); the neighbour's deadline the same.
RECORD_S_PER_FRAME = 0.5
RECORD_MIN_S = 120.0
# What a replay reads of a saved recording.
RECORDING_FIELDS = ("arrivals", "chars", "model_dir", "chunk", "frames", "neighbour",
                    "decoder_precision", "rtf")  # fmt: skip


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "prebuffer",
        help="the service's hold on answers recorded here, replayed faster and with some "
        "answers slowed down: underruns and the first audio's added delay",
        description=(
            "Record --answers streamed syntheses of the default model in one engine child "
            "(optionally beside a neighbour that is busy and idle by turns), then replay their "
            "chunks' arrivals through the service's prebuffer (its rates taught as the "
            "service's) at each of --speeds, as recorded and with one answer in --slow-every "
            "--slow times slower after its first chunk; a player at real time counts the "
            "underruns, beside the hold each answer needed at the least. Prints a markdown "
            "table (or JSON with --json) on stdout."
        ),
    )
    add_model_options(p)
    add_synthesis_options(p)
    p.add_argument("--answers", type=int, default=30, help="answers recorded (default 30)")
    p.add_argument("--chunk", type=int, default=4, help="stream_chunk (default 4)")
    p.add_argument(
        "--neighbour",
        action="store_true",
        help="record beside a single-thread process busy for 0.5-3 s, then idle for 0.5-3 s, "
        "by turns",
    )
    p.add_argument(
        "--speeds",
        default="1,1.3,1.6,2",
        help="comma-separated speed-ups of the replays (default 1,1.3,1.6,2)",
    )
    p.add_argument(
        "--slow-every",
        type=int,
        default=3,
        help="in the slowed replays, one answer in this many is slowed (default 3)",
    )
    p.add_argument(
        "--slow",
        type=float,
        default=1.45,
        help="how much slower those answers are after their first chunk (default 1.45)",
    )
    p.add_argument("--save", type=Path, help="write the recording here (JSON)")
    p.add_argument("--replay", type=Path, help="replay this recording instead of recording")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=bench_prebuffer)


def bench_prebuffer(args: argparse.Namespace) -> int:
    speeds = _checked_options(args)
    if args.replay is not None:
        recording = _read_recording(args.replay)
    else:
        recording = _record(args)
        if args.save is not None:
            args.save.write_text(json.dumps(recording))
    replays = [
        {"speed": speed, "slow_every": every, **replay(recording, speed, every, args.slow)}
        for speed in speeds
        for every in (0, args.slow_every)
    ]
    result = {
        "bench": "prebuffer",
        "recording": {k: v for k, v in recording.items() if k != "arrivals"},
        "slow": args.slow,
        "slow_every": args.slow_every,
        "replays": replays,
    }
    return print_result(result, prebuffer_table, args.json)


def _checked_options(args: argparse.Namespace) -> list[float]:
    """``--speeds``, once every option is checked."""
    try:
        speeds = [float(s) for s in args.speeds.split(",")]
    except ValueError as err:
        raise BenchError(f"--speeds: not a list of numbers: {args.speeds!r}") from err
    if not all(math.isfinite(s) and s > 0 for s in speeds) or not args.slow >= 1:
        raise BenchError("--speeds must be finite and > 0, --slow >= 1")
    if args.slow_every < 1:
        raise BenchError("--slow-every must be >= 1")
    if args.replay is not None and (args.save is not None or args.neighbour):
        raise BenchError("--save and --neighbour are for a recording, not for --replay")
    if args.replay is None and (args.answers < 1 or args.chunk < 1 or args.frames < 1):
        raise BenchError("--answers, --chunk and --frames must be >= 1")
    return speeds


def _read_recording(path: Path) -> dict[str, Any]:
    """A recording saved by ``--save``, its arrivals checked."""
    try:
        text = path.read_text()
    except OSError as err:
        raise BenchError(f"--replay {path}: {err.strerror or err}") from err
    try:
        recording = json.loads(text)
        fields = {k: recording[k] for k in RECORDING_FIELDS}
        int(fields["chars"])
        answers = [[(float(at), float(seconds)) for at, seconds in a] for a in fields["arrivals"]]
    except (ValueError, KeyError, TypeError) as err:
        raise BenchError(f"--replay {path}: not a recording of this bench ({err!r})") from err
    if len(answers) < 2 or not all(answers):
        raise BenchError(f"--replay {path}: a warm-up and at least one answer, each with chunks")
    if any(b[0] < a[0] for answer in answers for a, b in itertools.pairwise(answer)):
        raise BenchError(f"--replay {path}: an answer's chunks out of the order they came in")
    return {**recording, "arrivals": answers}


def _record(args: argparse.Namespace) -> dict[str, Any]:
    """The answers' arrivals (the warm-up's first), from one engine child."""
    model_dir = checked_model_dir(args, args.cache_dir or default_cache_dir())
    bound_s = max(RECORD_MIN_S, RECORD_S_PER_FRAME * args.frames * (args.answers + 1))
    env = blas_threads_env(args.threads)  # main() put dev/ on this process's PYTHONPATH
    machine = machine_info()
    warn_if_busy(machine)
    with (
        tempfile.TemporaryDirectory(prefix="kazeia-bench-") as tmp,
        competing_load(1, NEIGHBOUR, bound_s) if args.neighbour else contextlib.nullcontext(),
    ):
        cmd = engine_row_cmd(
            args, model_dir, args.chunk, False, args.answers, Path(tmp) / "audio.npy"
        )
        row = run_json_child([*cmd, "--arrivals"], "prebuffer: recording", env, timeout=bound_s)
    machine["loadavg_at_end"] = loadavg()
    return {
        "machine": machine,
        "recorded_at": time.strftime("%Y-%m-%d %H:%M", time.localtime()),
        "model_dir": str(model_dir),
        "chunk": args.chunk,
        "frames": args.frames,
        "neighbour": args.neighbour,
        "decoder_precision": args.decoder_precision,
        "chars": len(args.text),
        "rtf": row["rtf"],
        "arrivals": row["arrivals"],
    }


def slowed(chunks: Sequence[Chunk], factor: float) -> list[Chunk]:
    """The chunks of an answer `factor` times slower after its first chunk."""
    if not chunks:
        return []
    first = chunks[0][0]
    return [(first + (at - first) * factor, seconds) for at, seconds in chunks]


def replay(
    recording: dict[str, Any], speed: float, slow_every: int, slow: float
) -> dict[str, float]:
    """The recording's answers through the hold at `speed` times their speed, every
    `slow_every`-th answer `slow` times slower after its first chunk (0: none): the answers
    that ran dry, the underruns in all, the hold's median and most, and the median of the
    least hold each answer needed (seconds)."""

    def at_speed(chunks: Sequence[Sequence[float]]) -> list[Chunk]:
        return [(at / speed, seconds) for at, seconds in chunks]

    chars = int(recording["chars"])
    warm_up, *answers = recording["arrivals"]
    rates = warm_rates(at_speed(warm_up))
    dry = total = 0
    held: list[float] = []
    least: list[float] = []
    for i, answer in enumerate(answers):
        chunks = at_speed(answer)
        if slow_every and i % slow_every == slow_every - 1:
            chunks = slowed(chunks, slow)
        hold = Prebuffer(rates, chars)
        count, _ = underruns(let_out(chunks, hold))
        dry, total = dry + (count > 0), total + count
        held.append(hold.held_s)
        least.append(least_hold(chunks))
        learn(rates, chunks, chars)
    return {
        "answers": len(answers),
        "answers_dry": dry,
        "underruns": total,
        "held_median_s": statistics.median(held),
        "held_max_s": max(held),
        "least_median_s": statistics.median(least),
    }


def prebuffer_table(result: dict[str, Any]) -> str:
    rec = result["recording"]
    machine = rec.get("machine")
    lines = [
        machine_line(machine) if machine else "Machine: not in the recording",
        f"Recording{' of ' + rec['recorded_at'] if 'recorded_at' in rec else ''}: "
        f"{rec['model_dir']}, stream chunk {rec['chunk']}, {rec['frames']} frames an "
        f"answer, decoder {rec['decoder_precision']}, "
        f"{'beside a neighbour busy and idle by turns' if rec['neighbour'] else 'alone'}; "
        f"median RTF {rec['rtf']:.2f}. Replayed through this build's prebuffer at each speed "
        f"(every time divided by it), as recorded and with one answer in "
        f"{result['slow_every']} {result['slow']:g}x slower after its first chunk; a player "
        f"at real time. Least needed = the shortest hold, released as a chunk arrives, after "
        f"which the answer would not have run dry, knowing all its arrivals.",
        "",
        "| speed | slowed answers | answers that ran dry | underruns | first audio held, "
        "median s | most s | least needed, median s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["replays"]:
        slowed_note = f"1 in {r['slow_every']}" if r["slow_every"] else "none"
        lines.append(
            f"| {r['speed']:g}x | {slowed_note} | {r['answers_dry']} of {r['answers']} "
            f"| {r['underruns']} | {r['held_median_s']:.2f} | {r['held_max_s']:.2f} "
            f"| {r['least_median_s']:.2f} |"
        )
    return "\n".join(lines)
