"""Benchmarks of the native engine (``script/bench COMMAND [options]``).

Commands (one function per bench, ``bench_<command>``):

``decoder``
    The native speech decoder on the full-size decoder of a random ``0.6b`` checkpoint (or of
    ``--model-dir``): one-shot ``decode`` and streaming ``push`` of k frames, each configuration
    in a fresh subprocess so that its peak RSS is its own, medians over ``--repeats``; beside it
    the official PyTorch decoder (fp32) when the reference environment is installed, and the
    largest difference between the two waveforms.

Progress is logged to stderr; the result goes to stdout as a markdown table, or as one JSON object
with ``--json``. The random checkpoint and its conversion are cached (default ``.bench/`` in the
repository root) and reused.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("bench")

SAMPLE_RATE = 24000
HOP = 1920  # samples per 80 ms frame
NUM_QUANTIZERS = 16
CODEBOOK_SIZE = 2048
WARMUP_FRAMES = 4

# Targets of the decoder issue.
TARGET_FULL_RTF = 1.2
TARGET_STREAM_RATIO = 1.10
TARGET_RSS_MB = 700.0

RANDOM_CHECKPOINT = "wyoming_kazeia.dev.random_checkpoint"
REPO_ROOT = Path(__file__).resolve().parents[2]
OFFICIAL_SCRIPT = Path(__file__).resolve().with_name("official_decoder.py")

# The child (one measured configuration) runs as `python -c CHILD_BOOT ARGS...`, so that it never
# shows up among the public subcommands.
CHILD_BOOT = "import sys; from wyoming_kazeia.dev.bench import child_main; sys.exit(child_main())"


class BenchError(RuntimeError):
    """A bench could not run (missing input, failed child process)."""


# --------------------------------------------------------------------------- helpers


def status_mb(key: str) -> float:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status in MB (0.0 where unavailable)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def default_cache_dir() -> Path:
    """``.bench/`` in the repository root (editable install), else in the current directory."""
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / ".bench"
    return Path.cwd() / ".bench"


def default_reference_python() -> Path:
    """``$REFERENCE_PYTHON`` or ``build/reference-venv/bin/python`` (as script/make-reference)."""
    env = os.environ.get("REFERENCE_PYTHON")
    if env:
        return Path(env)
    return REPO_ROOT / "build" / "reference-venv" / "bin" / "python"


def ggml_cpu_features() -> list[str]:
    """The x86 features the bundled ggml CPU backend was compiled with (empty if unknown)."""
    try:
        from wyoming_kazeia import _native

        lib = ctypes.CDLL(str(Path(_native.__file__).parent / "lib" / "libkazeia-ggml-cpu.so"))
    except (ImportError, OSError):
        return []
    names = ("sse3", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512", "avx512_vnni")
    found = []
    for name in names:
        func = getattr(lib, f"ggml_cpu_has_{name}", None)
        if func is not None and func():
            found.append(name.upper())
    return found


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _warn_if_busy(machine: dict[str, Any]) -> None:
    load = machine["loadavg_at_start"]
    if load and load[0] > 0.5:
        logger.warning(
            "load average %.2f before the bench: if other work is running, timings will be noisy",
            load[0],
        )


def machine_info() -> dict[str, Any]:
    """CPU model, CPU counts, ggml build features, load average, OS and Python."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    load = _loadavg()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count() or 0,
        "usable_cpus": usable,
        "ggml_cpu_features": ggml_cpu_features(),
        "loadavg_at_start": load,
        "loadavg_at_end": [],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def ensure_model(cache_dir: Path, size: str, out_type: str = "f32", seed: int = 0) -> Path:
    """A converted random checkpoint in ``cache_dir`` (created once, then reused).

    ``ck-SIZE`` is written by ``wyoming_kazeia.dev.random_checkpoint`` and ``m-SIZE`` (f32) or
    ``m-SIZE-TYPE`` by ``wyoming_kazeia.convert``; both are built under a ``.tmp`` name and
    renamed when complete, so an interrupted run never leaves a half-written folder in use.
    Returns the converted folder; the checkpoint is ``cache_dir / f"ck-{size}"``.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    ckpt = cache_dir / f"ck-{size}"
    model = cache_dir / (f"m-{size}" if out_type == "f32" else f"m-{size}-{out_type}")
    if (model / "decoder.gguf").is_file():
        logger.info("reusing %s", model)
        return model
    if not (ckpt / "speech_tokenizer" / "config.json").is_file():
        _build_dir(
            ckpt,
            lambda out: [RANDOM_CHECKPOINT, str(out), "--size", size, "--seed", str(seed)],
            f"random {size} checkpoint (seed {seed})",
        )
    else:
        logger.info("reusing %s", ckpt)
    _build_dir(
        model,
        lambda out: ["wyoming_kazeia.convert", str(ckpt), str(out), "--type", out_type],
        f"{out_type} conversion of {ckpt.name}",
    )
    return model


def _build_dir(target: Path, module_argv: Callable[[Path], list[str]], what: str) -> None:
    """Run ``python -m`` with ``module_argv(TMP)``, then rename TMP to ``target``."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    logger.info("writing the %s to %s (once) ...", what, target)
    start = time.monotonic()
    argv = module_argv(tmp)
    proc = subprocess.run([sys.executable, "-m", *argv], stdout=sys.stderr)
    if proc.returncode != 0:
        raise BenchError(f"python -m {argv[0]} failed with exit status {proc.returncode}")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    logger.info("%s ready in %.0f s", target, time.monotonic() - start)


def run_json_child(cmd: list[str], what: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a measuring child (stderr passes through); parse the JSON on its last stdout line."""
    logger.info("%s: fresh process ...", what)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise BenchError(f"{what}: child process failed with exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float | None:
    """max |a - b| over the common length (None when either is empty)."""
    n = min(a.size, b.size)
    if n == 0:
        return None
    return float(np.max(np.abs(a[:n].astype(np.float64) - b[:n].astype(np.float64))))


# --------------------------------------------------------------------------- decoder bench


def add_decoder_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "decoder",
        help="native speech decoder: one-shot and streaming speed, peak RSS, official PyTorch",
        description=(
            "Benchmark the native speech decoder (full-size 0.6b decoder, random weights, f32) on "
            "random codes: one-shot decode and streaming push of k frames, each in a fresh "
            "process (median seconds over --repeats, RTF = compute s / audio s, peak RSS), and "
            "the official PyTorch decoder (fp32, one forward) when the reference environment "
            "exists. Prints a markdown table (or JSON with --json) on stdout."
        ),
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        help="converted model folder with decoder.gguf (default: a random 0.6b checkpoint "
        "generated and converted to f32 in the cache dir)",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        help="Hugging Face checkpoint of --model-dir for the official decoder (default: the "
        "cached random checkpoint when --model-dir is not given)",
    )
    p.add_argument("--cache-dir", type=Path, help="default: .bench/ in the repository root")
    p.add_argument("--threads", type=int, default=2, help="decoder threads (default 2)")
    p.add_argument("--frames", type=int, default=100, help="frames T, 80 ms each (default 100)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per row (default 5)")
    p.add_argument(
        "--chunks",
        default="1,4",
        help="comma-separated streaming chunk sizes k in frames (default 1,4)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random codes (default 0)")
    p.add_argument(
        "--official-repeats",
        type=int,
        default=3,
        help="timed runs of the (slow) official decoder (default 3)",
    )
    p.add_argument("--no-official", action="store_true", help="skip the official decoder")
    p.add_argument(
        "--reference-python",
        type=Path,
        default=None,
        help="interpreter with qwen-tts (default: $REFERENCE_PYTHON or "
        "build/reference-venv/bin/python)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=bench_decoder)


def _parse_chunks(text: str) -> list[int]:
    try:
        chunks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        chunks = []
    if not chunks or min(chunks) < 1:
        raise BenchError(f"--chunks must be positive integers, got {text!r}")
    return chunks


def bench_decoder(args: argparse.Namespace) -> int:
    """The ``decoder`` bench: fresh-process rows for ours, then the official decoder."""
    if args.threads < 1 or args.frames < 1 or args.repeats < 1 or args.official_repeats < 1:
        raise BenchError("--threads, --frames, --repeats and --official-repeats must be >= 1")
    chunks = _parse_chunks(args.chunks)
    machine = machine_info()
    _warn_if_busy(machine)
    cache_dir = args.cache_dir or default_cache_dir()
    if args.model_dir is not None:
        model_dir = args.model_dir
        checkpoint = args.checkpoint
    else:
        model_dir = ensure_model(cache_dir, "0.6b")
        checkpoint = args.checkpoint or cache_dir / "ck-0.6b"
    gguf = model_dir / "decoder.gguf"
    if not gguf.is_file():
        raise BenchError(f"{gguf} not found")

    frames = args.frames
    audio_s = frames * HOP / SAMPLE_RATE
    rng = np.random.default_rng(args.seed)
    codes = rng.integers(0, CODEBOOK_SIZE, size=(frames, NUM_QUANTIZERS), dtype=np.int64)
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(args.threads)

    rows: dict[str, dict[str, Any]] = {}
    wavs: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="kazeia-bench-") as tmp_name:
        tmp = Path(tmp_name)
        codes_path = tmp / "codes.npy"
        np.save(codes_path, codes)
        configs = [("full", 0)] + [(f"stream_k{k}", k) for k in chunks]
        for name, chunk in configs:
            wav_path = tmp / f"{name}.npy"
            cmd = [
                sys.executable,
                "-c",
                CHILD_BOOT,
                "decoder",
                str(gguf),
                str(codes_path),
                "--threads",
                str(args.threads),
                "--repeats",
                str(args.repeats),
                "--chunk",
                str(chunk),
                "--out",
                str(wav_path),
            ]
            rows[name] = run_json_child(cmd, name.replace("_k", " k="), env)
            wavs[name] = np.load(wav_path)
            logger.info("%s: median %.3f s", name, rows[name]["median_s"])

        official = _run_official(args, checkpoint, codes_path, tmp / "official.npy", env)
        if official.get("status") == "ok":
            wavs["official"] = np.load(tmp / "official.npy")

    machine["loadavg_at_end"] = _loadavg()
    full_s = rows["full"]["median_s"]
    for row in rows.values():
        row["rtf"] = row["median_s"] / audio_s
        row["vs_full"] = row["median_s"] / full_s
    if official.get("status") == "ok":
        official["rtf"] = official["median_s"] / audio_s
        official["vs_full"] = official["median_s"] / full_s
        official["ours_over_official"] = full_s / official["median_s"]

    diffs: dict[str, float | None] = {}
    for name in rows:
        if name != "full":
            diffs[f"{name}_vs_full"] = max_abs_diff(wavs[name], wavs["full"])
    diffs["full_vs_official"] = (
        max_abs_diff(wavs["full"], wavs["official"]) if "official" in wavs else None
    )

    stream_names = [n for n in rows if n != "full"]
    targets = {
        "full_rtf_max": TARGET_FULL_RTF,
        "full_rtf_ok": rows["full"]["rtf"] <= TARGET_FULL_RTF,
        "stream_ratio_max": TARGET_STREAM_RATIO,
        "stream_ratio_ok": all(rows[n]["vs_full"] <= TARGET_STREAM_RATIO for n in stream_names),
        "rss_mb_max": TARGET_RSS_MB,
        "rss_ok": all(r["peak_rss_mb"] <= TARGET_RSS_MB for r in rows.values()),
    }
    result = {
        "bench": "decoder",
        "machine": machine,
        "config": {
            "model": str(gguf),
            "model_mb": gguf.stat().st_size / 1e6,
            "checkpoint": None if checkpoint is None else str(checkpoint),
            "threads": args.threads,
            "frames": frames,
            "audio_s": audio_s,
            "repeats": args.repeats,
            "official_repeats": args.official_repeats,
            "chunks": chunks,
            "warmup_frames": WARMUP_FRAMES,
            "codes_seed": args.seed,
        },
        "rows": rows,
        "official": official,
        "max_abs_diff": diffs,
        "targets": targets,
    }
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    else:
        sys.stdout.write(decoder_table(result) + "\n")
    return 0


def _run_official(
    args: argparse.Namespace,
    checkpoint: Path | None,
    codes_path: Path,
    out_path: Path,
    env: dict[str, str],
) -> dict[str, Any]:
    """Measure the official decoder, or say why not (``status`` is ``ok`` when measured)."""
    python = args.reference_python or default_reference_python()
    if args.no_official:
        return {"status": "skipped (--no-official)"}
    if not python.is_file():
        return {
            "status": "not installed",
            "detail": f"{python} not found (script/make-reference --setup)",
        }
    if checkpoint is None or not (checkpoint / "speech_tokenizer" / "config.json").is_file():
        return {
            "status": "no checkpoint",
            "detail": "give --checkpoint (the Hugging Face folder of --model-dir)",
        }
    cmd = [
        str(python),
        str(OFFICIAL_SCRIPT),
        str(checkpoint / "speech_tokenizer"),
        str(codes_path),
        "--threads",
        str(args.threads),
        "--repeats",
        str(args.official_repeats),
        "--warmup-frames",
        str(WARMUP_FRAMES),
        "--out",
        str(out_path),
    ]
    try:
        result = run_json_child(cmd, "official PyTorch decoder", env)
    except BenchError as err:
        logger.error("%s", err)
        return {"status": "failed", "detail": str(err)}
    result["status"] = "ok"
    result["interpreter"] = str(python)
    logger.info("official: median %.3f s", result["median_s"])
    return result


def decoder_table(result: dict[str, Any]) -> str:
    """The markdown report of the ``decoder`` bench."""
    m, c, rows, off = result["machine"], result["config"], result["rows"], result["official"]
    diffs, tg = result["max_abs_diff"], result["targets"]
    features = " ".join(m["ggml_cpu_features"]) or "unknown"
    lines = [
        f"Machine: {m['cpu']}, {m['cpus']} CPUs ({m['usable_cpus']} usable), ggml CPU build: "
        f"{features}; load average {m['loadavg_at_start']} at start, {m['loadavg_at_end']} at end",
        f"Decoder: {c['model']} ({c['model_mb']:.0f} MB); threads {c['threads']}, frames "
        f"{c['frames']} ({c['audio_s']:.2f} s of audio), repeats {c['repeats']} (official "
        f"{c['official_repeats']}), warm-up {c['warmup_frames']} frames, codes seed "
        f"{c['codes_seed']}",
        "",
        "| row | median s | min s | RTF | vs full decode | push mean / max ms | load s "
        "| RSS after load MB | peak RSS MB | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def ok(flag: bool) -> str:
        return "ok" if flag else "MISSED"

    for name, row in rows.items():
        rss_ok = row["peak_rss_mb"] <= TARGET_RSS_MB
        if name == "full":
            label, push = "full decode", "-"
            target = f"RTF <= {TARGET_FULL_RTF}: {ok(row['rtf'] <= TARGET_FULL_RTF)}"
        else:
            label = f"stream k={row['chunk']}"
            push = f"{row['push_mean_ms']:.1f} / {row['push_max_ms']:.1f}"
            good = row["vs_full"] <= TARGET_STREAM_RATIO
            target = f"<= {TARGET_STREAM_RATIO:.2f}x full: {ok(good)}"
        target += f"; RSS <= {TARGET_RSS_MB:.0f} MB: {ok(rss_ok)}"
        lines.append(
            f"| {label} | {row['median_s']:.3f} | {row['min_s']:.3f} | {row['rtf']:.3f} "
            f"| {row['vs_full']:.3f}x "
            f"| {push} | {row['load_s']:.2f} | {row['rss_load_mb']:.0f} "
            f"| {row['peak_rss_mb']:.0f} | {target} |"
        )
    if off.get("status") == "ok":
        lines.append(
            f"| official PyTorch fp32 | {off['median_s']:.3f} | {off['min_s']:.3f} "
            f"| {off['rtf']:.3f} "
            f"| {off['vs_full']:.3f}x | - | {off['load_s']:.2f} | {off['rss_load_mb']:.0f} "
            f"| {off['peak_rss_mb']:.0f} | - |"
        )
    else:
        lines.append(f"| official PyTorch fp32 | {off['status']} | - | - | - | - | - | - | - | - |")
    lines.append("")
    if off.get("status") == "ok":
        lines.append(
            f"ours / official (full decode): {off['ours_over_official']:.3f} "
            f"(official torch {off['torch']}, {off['threads']} threads, whole speech tokenizer "
            "loaded, one decoder forward)"
        )
    elif "detail" in off:
        lines.append(f"official: {off['status']}: {off['detail']}")
    lines.append(
        "max |difference|: "
        + ", ".join(f"{k} {fmt(v, '.3e')}" for k, v in diffs.items())
        + " (reported, not asserted)"
    )
    lines.append(
        f"Targets: full decode RTF <= {TARGET_FULL_RTF}: {ok(tg['full_rtf_ok'])}; streaming "
        f"total <= {TARGET_STREAM_RATIO:.2f}x full: {ok(tg['stream_ratio_ok'])}; decoder peak "
        f"RSS <= {TARGET_RSS_MB:.0f} MB: {ok(tg['rss_ok'])}"
    )
    lines.append(
        "RTF (from the median) = compute s / audio s; vs full decode = median / median of the "
        "one-shot row; push max = the slowest push of a run, median over runs; RSS = the whole "
        "child process (Python + numpy included)."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- child processes


def child_decoder(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration of our decoder in this (fresh) process: load, warm up, time."""
    from wyoming_kazeia.native import SpeechDecoder

    codes = np.ascontiguousarray(np.load(args.codes), dtype=np.int32)
    frames = int(codes.shape[0])
    rss_start = status_mb("VmRSS")
    start = time.perf_counter()
    dec = SpeechDecoder(str(args.gguf), threads=args.threads)
    load_s = time.perf_counter() - start
    rss_load = status_mb("VmRSS")
    k = args.chunk
    warm = codes[: max(1, min(WARMUP_FRAMES, frames))]

    times: list[float] = []
    push_ms: list[float] = []
    push_max_ms: list[float] = []
    push_first_ms: list[float] = []
    wav: np.ndarray | None = None
    if k == 0:
        dec.decode(warm)
        for i in range(args.repeats):
            start = time.perf_counter()
            wav = dec.decode(codes)
            times.append(time.perf_counter() - start)
            logger.info("full decode %d/%d: %.3f s", i + 1, args.repeats, times[-1])
    else:
        s = dec.stream()
        for j in range(0, warm.shape[0], k):
            s.push(warm[j : j + k])
        for i in range(args.repeats):
            parts: list[np.ndarray] = []
            pushes: list[float] = []
            start = time.perf_counter()
            s = dec.stream()
            for j in range(0, frames, k):
                t0 = time.perf_counter()
                parts.append(s.push(codes[j : j + k]))
                pushes.append(time.perf_counter() - t0)
            times.append(time.perf_counter() - start)
            wav = np.concatenate(parts)
            push_ms.extend(1e3 * p for p in pushes)
            push_max_ms.append(1e3 * max(pushes))
            push_first_ms.append(1e3 * pushes[0])
            logger.info("stream k=%d %d/%d: %.3f s", k, i + 1, args.repeats, times[-1])
    assert wav is not None
    if args.out is not None:
        np.save(args.out, np.asarray(wav, dtype=np.float32))
    result: dict[str, Any] = {
        "kind": "full" if k == 0 else "stream",
        "chunk": k,
        "frames": frames,
        "threads": args.threads,
        "load_s": load_s,
        "times_s": times,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "rss_start_mb": rss_start,
        "rss_load_mb": rss_load,
        "peak_rss_mb": status_mb("VmHWM"),
    }
    if k:
        result.update(
            pushes_per_run=-(-frames // k),
            push_mean_ms=statistics.fmean(push_ms),
            push_max_ms=statistics.median(push_max_ms),
            push_first_ms=statistics.median(push_first_ms),
        )
    return result


CHILDREN: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "decoder": child_decoder,
}


def child_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a measuring child: prints one JSON object on stdout."""
    parser = argparse.ArgumentParser(prog="bench-child")
    sub = parser.add_subparsers(dest="child", required=True)
    p = sub.add_parser("decoder")
    p.add_argument("gguf", type=Path)
    p.add_argument("codes", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--chunk", type=int, default=0, help="0: one-shot decode; k: push k frames")
    p.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    _setup_logging()
    result = CHILDREN[args.child](args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


# --------------------------------------------------------------------------- main

# Later benches (generate, engine, server) add an add_<name>_parser here.
PARSERS: tuple[Callable[[Any], None], ...] = (add_decoder_parser,)


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="script/bench",
        description="Benchmarks of the Kazeia native engine (progress on stderr, results on "
        "stdout).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in PARSERS:
        add(sub)
    args = parser.parse_args(argv)
    _setup_logging()
    try:
        return int(args.func(args))
    except BenchError as err:
        logger.error("%s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
