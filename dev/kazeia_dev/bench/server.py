"""``script/bench server``: the Wyoming server over the protocol, measured by ``wyoming-bench``.

Starts ``python -m wyoming_kazeia`` on a free loopback port with the random ``0.6b`` checkpoint
(q8_0 talker, f16 decoder, cached like the other benches), runs ``wyoming-bench tts`` against it
in both modes (one-shot ``synthesize`` and streaming ``synthesize-start/chunk/stop``) and reports
its medians: time to first audio (TTFA, wyoming-bench's "TTFT"), total time and RTF. In the same
run, the engine called in-process (``Engine.synthesize``, a fresh process, the same model, text,
frames and settings; one-shot and streaming) gives the baseline of the protocol's overhead.

Random weights never emit end-of-speech, so every sentence is cut at ``--frames`` frames (80 ms
each): the audio length per sentence is fixed, as a real model's would be for a short sentence.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from wyoming_kazeia.settings import EngineSettings

from .common import (
    REPO_ROOT,
    BenchError,
    default_cache_dir,
    loadavg,
    logger,
    machine_info,
    machine_line,
    print_result,
    run_json_child,
)
from .engine_runs import engine_row_cmd, ensure_engine_dir

TEXTS = [
    "The living room lights are now on.",
    "It is twenty one degrees inside and the forecast says light rain this evening.",
]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "server",
        help="the Wyoming server over the protocol (wyoming-bench): TTFA and RTF",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    p.add_argument("--model-dir", type=Path, help="a converted model instead of the random one")
    p.add_argument("--frames", type=int, default=40, help="frames per sentence (default 40)")
    p.add_argument("--stream-chunk", type=int, default=4)
    defaults = EngineSettings()
    p.add_argument("--threads", type=int, default=defaults.threads, help="generator threads")
    p.add_argument("--decoder-threads", type=int, default=defaults.decoder_threads)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=bench_server)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    """Until the server answers describe with its model loaded (it listens before that)."""
    from wyoming_kazeia.health_check import probe, ready_programs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"the server exited with {proc.returncode} (see its log)")
        info = asyncio.run(probe(f"tcp://127.0.0.1:{port}", 1.0))
        if info is not None and ready_programs(info):
            return
        time.sleep(0.2)
    raise BenchError("the server did not get ready")


def parse_wyoming_bench(text: str) -> dict[str, dict[str, float]]:
    """{mode: {ttfa_ms, total_ms, rtf, audio_s, ok, fail}} from wyoming-bench's report (the
    medians of its per-mode blocks)."""
    result: dict[str, dict[str, float]] = {}
    mode = None
    for line in text.splitlines():
        header = re.match(r"\[(non_streaming|streaming)\] ok=(\d+) fail=(\d+)", line)
        if header:
            mode = header.group(1)
            result[mode] = {"ok": int(header.group(2)), "fail": int(header.group(3))}
            continue
        if mode is None:
            continue
        row = re.match(r"\s+(TTFT \(ms\)|Total \(ms\)|RTF \(x\))\s+([\d.\s]+)$", line)
        if row:
            median = float(row.group(2).split()[2])  # min mean median p95 max
            key = {"TTFT (ms)": "ttfa_ms", "Total (ms)": "total_ms", "RTF (x)": "rtf"}
            result[mode][key[row.group(1)]] = median
        audio = re.match(r"\s+Audio\s+mean=([\d.]+)s", line)
        if audio:
            result[mode]["audio_s"] = float(audio.group(1))
            mode = None
    return result


async def describe_during_synthesis(uri: str, n: int = 10) -> list[float]:
    """Milliseconds of `describe` -> `info` round trips (a new connection each, as Home
    Assistant makes them) while another connection's synthesis runs."""
    from wyoming.client import AsyncClient
    from wyoming.info import Describe
    from wyoming.tts import Synthesize

    async with AsyncClient.from_uri(uri) as speaking:
        await speaking.write_event(Synthesize(" ".join(TEXTS)).event())
        while (event := await speaking.read_event()) is not None and event.type != "audio-chunk":
            pass  # audio flows: the engine is busy
        times = []
        for _ in range(n):
            start = time.perf_counter()
            async with AsyncClient.from_uri(uri) as client:
                await client.write_event(Describe().event())
                while (event := await client.read_event()) is not None and event.type != "info":
                    pass
            times.append(1e3 * (time.perf_counter() - start))
            await asyncio.sleep(0.1)
    return times


def bench_server(args: argparse.Namespace) -> int:
    machine = machine_info()
    model = args.model_dir or ensure_engine_dir(args.cache_dir, "0.6b", "q8_0")
    port = _free_port()
    log_path = args.cache_dir / "server-bench.log"
    cmd = [
        sys.executable,
        "-m",
        "wyoming_kazeia",
        "--uri",
        f"tcp://127.0.0.1:{port}",
        "--model",
        str(model),
        "--data-dir",
        str(args.cache_dir),
        "--max-frames",
        str(args.frames),
        "--stream-chunk",
        str(args.stream_chunk),
        "--threads",
        str(args.threads),
        "--decoder-threads",
        str(args.decoder_threads),
        "--seed",
        "0",
    ]
    logger.info("starting the server (log: %s)", log_path)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=REPO_ROOT)
        try:
            _wait_until_ready(port, proc)
            bench = [
                str(Path(sys.executable).with_name("wyoming-bench")),
                "tts",
                f"127.0.0.1:{port}",
                "--mode",
                "both",
                "--rounds",
                str(args.rounds),
                "--warmup",
                "1",
                "--texts",
                *TEXTS,
            ]
            logger.info("running %s", " ".join(bench))
            out = subprocess.run(bench, capture_output=True, text=True, timeout=3600)
            logger.info("describe round trips while a synthesis runs ...")
            describe_ms = asyncio.run(describe_during_synthesis(f"tcp://127.0.0.1:{port}"))
        finally:
            proc.terminate()
            proc.wait(30)
    if out.returncode != 0:
        raise BenchError(f"wyoming-bench failed: {out.stderr.strip()[-500:]}")
    modes = parse_wyoming_bench(out.stdout)
    if set(modes) != {"non_streaming", "streaming"}:
        raise BenchError(f"unexpected wyoming-bench output:\n{out.stdout}")
    # The server's engine, called in-process: the same model, text and settings.
    row = argparse.Namespace(
        threads=args.threads,
        decoder_threads=args.decoder_threads,
        frames=args.frames,
        seed=0,
        text=TEXTS[1],
        speaker="vivian",
        language="auto",
    )
    out_npy = args.cache_dir / "server-bench-engine.npy"
    cmd = engine_row_cmd(row, model, args.stream_chunk, False, args.rounds, out_npy)
    engine_row = run_json_child(cmd, "the engine in-process")
    machine["loadavg_at_end"] = loadavg()
    result = {
        "machine": machine,
        "model": str(model),
        "frames_per_sentence": args.frames,
        "stream_chunk": args.stream_chunk,
        "threads": args.threads,
        "decoder_threads": args.decoder_threads,
        "rounds": args.rounds,
        "texts": TEXTS,
        "modes": modes,
        "describe_ms_during_synthesis": describe_ms,
        "engine": {
            "ttfa_ms": 1e3 * engine_row["ttfa_s"],
            "total_ms": 1e3 * engine_row["total_s"],
            "rtf": engine_row["rtf"],
        },
    }
    return print_result(result, server_table, args.json)


def server_table(result: dict[str, Any]) -> str:
    lines = [
        machine_line(result["machine"]),
        f"Model: {result['model']} (random weights, q8_0 talker, f16 decoder); "
        f"{result['frames_per_sentence']} frames per sentence, stream chunk "
        f"{result['stream_chunk']}, {result['threads']} + {result.get('decoder_threads', 2)} "
        "threads; wyoming-bench medians over "
        f"{result['rounds']} rounds x {len(result['texts'])} texts",
        "",
        "| mode | ok | fail | TTFA ms | total ms | audio s | RTF | TTFA / in-process "
        "| RTF / in-process |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    e = result["engine"]
    for mode, m in result["modes"].items():
        lines.append(
            f"| {mode} | {m['ok']:.0f} | {m['fail']:.0f} | {m.get('ttfa_ms', 0):.0f} | "
            f"{m.get('total_ms', 0):.0f} | {m.get('audio_s', 0):.2f} | {m.get('rtf', 0):.2f} | "
            f"{m.get('ttfa_ms', 0) / e['ttfa_ms']:.2f}x | {m.get('rtf', 0) / e['rtf']:.2f}x |"
        )
    lines.append(
        f"| engine in-process | | | {e['ttfa_ms']:.0f} | {e['total_ms']:.0f} | | "
        f"{e['rtf']:.2f} | 1.00x | 1.00x |"
    )
    d = result["describe_ms_during_synthesis"]
    lines.append(
        f"\n`describe` -> `info` while a synthesis runs ({len(d)} new connections, 100 ms "
        f"apart): median {statistics.median(d):.1f} ms, max {max(d):.1f} ms (Home Assistant "
        "waits 1 s)."
    )
    lines.append(
        "\nThe in-process row is the server's engine called directly (a fresh process, the "
        "second text, stream chunk as the server's, a warm-up run, then medians); wyoming-bench "
        "adds connection, protocol and its own client time. The server streams audio in both "
        "modes, so one-shot requests get their first audio as early as streamed ones."
    )
    return "\n".join(lines)


if __name__ == "__main__":  # for a quick look at a saved report: python -m ... < report.txt
    print(json.dumps(parse_wyoming_bench(sys.stdin.read())))
