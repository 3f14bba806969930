"""script/soak: the real server under mixed clients for a while, reporting what went wrong.

    script/soak [--minutes 10] [--model DIR] [--seed N]

Starts `python -m wyoming_kazeia` on a loopback port (the model: a converted folder, default a
tiny random checkpoint made into .bench/soak-tiny once) and runs, together until the time is up:
clients that leave mid-answer (Home Assistant's client leaving its `async with`, or a reset),
slow readers, pipelined requests on one connection, streamed text (synthesize-start/chunk/stop),
and a describe every 100 ms. After each leaving client a probe asks "Hello there." and must get
its first audio within WEDGE_S: one that does not is a wedge. Prints a markdown report: requests
per kind and their failures, wedges, describe's median / p99 / worst latency, the server's RSS
every 30 s, and whether SIGTERM then ended it within 2 s. Exit status 1 when anything failed.
Traffic goes to 127.0.0.1 only; every loop is bounded by the run's deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

ROOT = Path(__file__).resolve().parents[2]
WEDGE_S = 5.0  # a probe's first audio later than this after a client left: a wedge
READ_S = 30.0  # any single read longer than this: a hang
SENTENCE = "This is one sentence of a long answer from the soak test."


@dataclass
class Report:
    ok: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    wedges: int = 0
    probe_s: list[float] = field(default_factory=list)
    describe_s: list[float] = field(default_factory=list)
    rss_mb: list[tuple[float, float]] = field(default_factory=list)

    def fail(self, kind: str, why: str) -> None:
        self.failed[kind] += 1
        if len(self.failures) < 20:
            self.failures.append(f"{kind}: {why}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_model(seed: int) -> Path:
    """A converted tiny random checkpoint, made once."""
    from kazeia_dev.random_checkpoint import main as random_checkpoint
    from wyoming_kazeia.convert import convert

    out = ROOT / ".bench" / f"soak-tiny-{seed}"
    if not (out / "model" / "talker.gguf").is_file():
        out.mkdir(parents=True, exist_ok=True)
        ckpt = out / "ckpt"
        assert random_checkpoint([str(ckpt), "--size", "tiny", "--seed", str(seed), "-q"]) == 0
        convert(ckpt, out / "model", "f32")
    return out / "model"


async def read(client: AsyncTcpClient) -> Event | None:
    return await asyncio.wait_for(client.read_event(), READ_S)


async def until_audio_stop(client: AsyncTcpClient, slow: float = 0.0) -> int:
    """Reads one answer; its audio-chunk count (ValueError on an error event)."""
    chunks = 0
    while (event := await read(client)) is not None:
        if event.type == "error":
            raise ValueError(event.data.get("text", "error"))
        if event.type == "audio-chunk":
            chunks += 1
            if slow:
                await asyncio.sleep(slow)
        if event.type == "audio-stop":
            return chunks
    raise ConnectionError("connection closed before audio-stop")


async def probe(port: int, report: Report) -> None:
    start = time.monotonic()
    try:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize("Hello there.").event())
            while (event := await asyncio.wait_for(client.read_event(), WEDGE_S)) is not None:
                if event.type == "audio-chunk":
                    report.probe_s.append(time.monotonic() - start)
                    return
        report.fail("probe", "no audio")
    except asyncio.TimeoutError:
        report.wedges += 1
        report.fail("probe", f"no first audio within {WEDGE_S:.0f} s: a wedge")


async def leaver(port: int, rng: random.Random, report: Report) -> None:
    sentences = rng.choice((1, 5, 30))
    after = rng.choice((1, 5, 20, 100))
    reset = rng.random() < 0.5
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    await client.write_event(Synthesize(" ".join([SENTENCE] * sentences)).event())
    chunks = 0
    while chunks < after and (event := await read(client)) is not None:
        if event.type == "audio-stop":
            break
        chunks += event.type == "audio-chunk"
    if reset and client._writer is not None:
        sock = client._writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await client.disconnect()
    report.ok["leaving"] += 1
    await probe(port, report)


async def slow_reader(port: int, report: Report) -> None:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(f"{SENTENCE} {SENTENCE}").event())
        await until_audio_stop(client, slow=0.02)
    report.ok["slow reader"] += 1


async def pipeliner(port: int, report: Report) -> None:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for text in ("One.", "Two.", "Three."):
            await client.write_event(Synthesize(text).event())
        for _ in range(3):
            await until_audio_stop(client)
    report.ok["pipelined"] += 1


async def streamer(port: int, report: Report) -> None:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart().event())
        for word in f"{SENTENCE} And a second one".split():
            await client.write_event(SynthesizeChunk(word + " ").event())
        await client.write_event(SynthesizeStop().event())
        while (event := await read(client)) is not None and event.type != "synthesize-stopped":
            if event.type == "error":
                raise ValueError(event.data.get("text", "error"))
    report.ok["streamed"] += 1


async def describer(port: int, deadline: float, report: Report) -> None:
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Describe().event())
                while (event := await read(client)) is not None and event.type != "info":
                    pass
            report.describe_s.append(time.monotonic() - start)
        except (OSError, asyncio.TimeoutError) as err:
            report.fail("describe", repr(err))
        await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - start)))


async def worker(port: int, deadline: float, rng: random.Random, report: Report) -> None:
    kinds = {
        "leaving": lambda: leaver(port, rng, report),
        "slow reader": lambda: slow_reader(port, report),
        "pipelined": lambda: pipeliner(port, report),
        "streamed": lambda: streamer(port, report),
    }
    while time.monotonic() < deadline:
        kind = rng.choice(list(kinds))
        try:
            await kinds[kind]()
        except (OSError, ValueError, asyncio.TimeoutError) as err:
            report.fail(kind, repr(err))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def sample_rss(pid: int, start: float, deadline: float, report: Report) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            report.rss_mb.append((time.monotonic() - start, rss_mb(pid)))
        await asyncio.sleep(min(30.0, max(0.0, deadline - time.monotonic())))


async def soak(port: int, pid: int, seconds: float, seed: int) -> Report:
    report = Report()
    start = time.monotonic()
    deadline = start + seconds
    rngs = [random.Random(seed + i) for i in range(3)]
    await asyncio.gather(
        describer(port, deadline, report),
        sample_rss(pid, start, deadline, report),
        *(worker(port, deadline, rng, report) for rng in rngs),
    )
    with contextlib.suppress(OSError):
        report.rss_mb.append((time.monotonic() - start, rss_mb(pid)))
    return report


def wait_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    from wyoming_kazeia.health_check import probe as describe_probe
    from wyoming_kazeia.health_check import ready_programs

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"soak: the server exited with {proc.returncode} before it was ready")
        with contextlib.suppress(OSError):
            info = asyncio.run(describe_probe(f"tcp://127.0.0.1:{port}", 2))
            if info is not None and ready_programs(info):
                return
        time.sleep(0.2)
    sys.exit("soak: the server was not ready within 300 s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def print_report(report: Report, minutes: float, stop_s: float | None, model: Path) -> bool:
    print(f"# Soak: {minutes:g} min, model {model}\n")
    print("| clients | done | failed |\n|---|---:|---:|")
    for kind in sorted(set(report.ok) | set(report.failed)):
        print(f"| {kind} | {report.ok[kind]} | {report.failed[kind]} |")
    probes = report.probe_s
    print(
        f"\nwedges: {report.wedges} (probes after a client left: {len(probes)}, first audio "
        f"median {statistics.median(probes) * 1000 if probes else 0:.0f} ms, worst "
        f"{max(probes, default=0) * 1000:.0f} ms)"
    )
    d = report.describe_s
    print(
        f"describe: {len(d)} answered, median {statistics.median(d) * 1000 if d else 0:.1f} ms, "
        f"p99 {percentile(d, 0.99) * 1000:.1f} ms, worst {max(d, default=0) * 1000:.1f} ms"
    )
    print("RSS (MB) over time: " + ", ".join(f"{t:.0f} s {mb:.0f}" for t, mb in report.rss_mb))
    print("SIGTERM: " + (f"ended in {stop_s:.2f} s" if stop_s is not None else "did not end"))
    for failure in report.failures:
        print(f"- {failure}")
    return not report.failed and not report.wedges and stop_s is not None and stop_s < 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="script/soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--model", type=Path, help="a converted model folder (default: tiny)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = args.model or tiny_model(args.seed)
    port = free_port()
    server = [sys.executable, "-m", "wyoming_kazeia", "--uri", f"tcp://127.0.0.1:{port}"]
    server += ["--model", str(model), "--max-frames", "60", "--seed", str(args.seed)]
    (ROOT / ".bench").mkdir(exist_ok=True)
    log = open(ROOT / ".bench" / "soak-server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(server, stderr=log)
    stop_s: float | None = None
    try:
        wait_ready(proc, port)
        print(f"soak: serving {model} on port {port}, {args.minutes:g} min", file=sys.stderr)
        report = asyncio.run(soak(port, proc.pid, args.minutes * 60, args.seed))
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
            stop_s = time.monotonic() - start
    finally:
        proc.kill()
        proc.wait()
        log.close()
    return 0 if print_report(report, args.minutes, stop_s, model) else 1


if __name__ == "__main__":
    sys.exit(main())
