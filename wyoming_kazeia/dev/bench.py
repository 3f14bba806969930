"""Benchmarks of the native engine (``script/bench COMMAND [options]``).

Commands (one function per bench, ``bench_<command>``):

``decoder``
    The native speech decoder on the full-size decoder of a random ``0.6b`` checkpoint (or of
    ``--model-dir``): one-shot ``decode`` and streaming ``push`` of k frames, each configuration
    in a fresh subprocess so that its peak RSS is its own, medians over ``--repeats``; beside it
    the official PyTorch decoder (fp32) when the reference environment is installed, and the
    largest difference between the two waveforms.

``generate``
    The native talker + code predictor (token ids -> codes) of the random ``0.6b`` checkpoint,
    its talker converted to each ``--types`` (f32, q8_0, q4_k), each in a fresh subprocess: time
    to the first frame, talker and code-predictor ms per steady-state frame (the engine's stats),
    total ms per frame, RSS after load and peak RSS, medians over ``--repeats``; beside it the
    official PyTorch ``generate`` (fp32) when the reference environment is installed.

``server``
    The Wyoming server over the protocol with ``wyoming-bench`` (see ``bench_server.py``).

``engine``
    The streaming engine (``Engine.synthesize``: text -> int16 PCM chunks) on the random ``0.6b``
    checkpoint (q8_0 talker, f16 decoder), a fixed number of frames: one-shot, streaming with
    k-frame chunks and the subprocess decoder, each in a fresh subprocess after a warm-up
    synthesis: decoder / talker / code-predictor seconds, total, RTF, time to first audio, peak
    RSS, medians over ``--repeats``; then the same rows beside busy competing processes.

Progress is logged to stderr; the result goes to stdout as a markdown table, or as one JSON object
with ``--json``. The random checkpoint and its conversion are cached (default ``.bench/`` in the
repository root) and reused.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .official_decoder import status_mb  # the one /proc reader (stdlib only)

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


def machine_line(m: dict[str, Any]) -> str:
    """The ``Machine:`` line of a report."""
    features = " ".join(m["ggml_cpu_features"]) or "unknown"
    flags = " ".join(m.get("cpu_flags", [])) or "unknown"
    return (
        f"Machine: {m['cpu']}, {m['cpus']} CPUs ({m['usable_cpus']} usable), CPU flags: {flags}; "
        f"ggml CPU build: {features}; load average {m['loadavg_at_start']} at start, "
        f"{m['loadavg_at_end']} at end"
    )


def _warn_if_busy(machine: dict[str, Any]) -> None:
    load = machine["loadavg_at_start"]
    if load and load[0] > 0.5:
        logger.warning(
            "load average %.2f before the bench: if other work is running, timings will be noisy",
            load[0],
        )


# CPU flags that matter to ggml's CPU kernels (shown beside the features ggml was built with).
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def machine_info() -> dict[str, Any]:
    """CPU model, CPU counts, CPU flags, ggml build features, load average, OS and Python."""
    cpu = platform.processor() or "unknown"
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first CPU is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "model name" in fields:
        cpu = fields["model name"]
        if "cpu family" in fields and "model" in fields:
            cpu += f" (family {fields['cpu family']}, model {fields['model']})"
    flags = set(fields.get("flags", "").split())
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    load = _loadavg()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count() or 0,
        "usable_cpus": usable,
        "cpu_flags": [f.upper() for f in CPU_FLAGS if f in flags],
        "ggml_cpu_features": ggml_cpu_features(),
        "loadavg_at_start": load,
        "loadavg_at_end": [],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def ensure_checkpoint(cache_dir: Path, size: str, seed: int = 0) -> Path:
    """The random checkpoint ``cache_dir / f"ck-{size}"`` (written once by
    ``wyoming_kazeia.dev.random_checkpoint``, then reused)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    ckpt = cache_dir / f"ck-{size}"
    if not (ckpt / "speech_tokenizer" / "config.json").is_file():
        _build_dir(
            ckpt,
            lambda out: ["-m", RANDOM_CHECKPOINT, str(out), "--size", size, "--seed", str(seed)],
            f"random {size} checkpoint (seed {seed})",
        )
    else:
        logger.info("reusing %s", ckpt)
    return ckpt


def ensure_model(cache_dir: Path, size: str, out_type: str = "f32", seed: int = 0) -> Path:
    """A converted random checkpoint in ``cache_dir`` (created once, then reused).

    ``ck-SIZE`` is written by ``wyoming_kazeia.dev.random_checkpoint`` and ``m-SIZE`` (f32) or
    ``m-SIZE-TYPE`` by ``wyoming_kazeia.convert``; both are built under a ``.tmp`` name and
    renamed when complete, so an interrupted run never leaves a half-written folder in use.
    Returns the converted folder; the checkpoint is ``cache_dir / f"ck-{size}"``.
    """
    model = cache_dir / (f"m-{size}" if out_type == "f32" else f"m-{size}-{out_type}")
    if (model / "decoder.gguf").is_file():
        logger.info("reusing %s", model)
        return model
    ckpt = ensure_checkpoint(cache_dir, size, seed)
    _build_dir(
        model,
        lambda out: ["-m", "wyoming_kazeia.convert", str(ckpt), str(out), "--type", out_type],
        f"{out_type} conversion of {ckpt.name}",
    )
    return model


# `python -c` program writing one part's GGUF: convert_PART(CHECKPOINT, OUT, TYPE).
CONVERT_PART = (
    "import logging, sys; from pathlib import Path; "
    "from wyoming_kazeia import convert; "
    "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s'); "
    "Path(sys.argv[3]).parent.mkdir(parents=True, exist_ok=True); "
    "getattr(convert, 'convert_' + sys.argv[1])(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])"
)


def ensure_talker(cache_dir: Path, size: str, out_type: str, seed: int = 0) -> Path:
    """``cache_dir / f"t-{size}-{out_type}" / "talker.gguf"`` of the random checkpoint."""
    return _ensure_part(cache_dir, "talker", f"t-{size}-{out_type}", size, out_type, seed)


def ensure_decoder(cache_dir: Path, size: str, out_type: str, seed: int = 0) -> Path:
    """``cache_dir / f"d-{size}-{out_type}" / "decoder.gguf"`` of the random checkpoint (what
    the converter writes for ``--type out_type``: f16 GEMM matrices unless f32)."""
    return _ensure_part(cache_dir, "decoder", f"d-{size}-{out_type}", size, out_type, seed)


def _ensure_part(
    cache_dir: Path, part: str, name: str, size: str, out_type: str, seed: int
) -> Path:
    """Only one part is converted (no other GGUF, no tokenizer files); the folder is built
    under a ``.tmp`` name and renamed when complete, then reused. Returns the part's GGUF."""
    folder = cache_dir / name
    gguf = folder / f"{part}.gguf"
    if gguf.is_file():
        logger.info("reusing %s", gguf)
        return gguf
    ckpt = ensure_checkpoint(cache_dir, size, seed)
    _build_dir(
        folder,
        lambda out: ["-c", CONVERT_PART, part, str(ckpt), str(out / f"{part}.gguf"), out_type],
        f"{out_type} {part} of {ckpt.name}",
    )
    return gguf


def _build_dir(target: Path, python_argv: Callable[[Path], list[str]], what: str) -> None:
    """Run ``python *python_argv(TMP)`` (``-m MODULE ...`` or ``-c CODE ...``), then rename TMP
    to ``target``."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    logger.info("writing the %s to %s (once) ...", what, target)
    start = time.monotonic()
    argv = python_argv(tmp)
    proc = subprocess.run([sys.executable, *argv], stdout=sys.stderr)
    if proc.returncode != 0:
        raise BenchError(f"writing the {what} failed with exit status {proc.returncode}")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    logger.info("%s ready in %.0f s", target, time.monotonic() - start)


def run_json_child(
    cmd: list[str], what: str, env: dict[str, str] | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """Run a measuring child (stderr passes through); parse the JSON on its last stdout line.

    With ``timeout`` (seconds) a child still running then is killed and a BenchError raised."""
    logger.info("%s: fresh process ...", what)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise BenchError(f"{what}: no result within {timeout:.0f} s (child killed)") from err
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise BenchError(f"{what}: child process failed with exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _ok(flag: bool) -> str:
    """A target's verdict in the reports."""
    return "ok" if flag else "MISSED"


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
    _add_official_args(p, "the (slow) official decoder", 3)
    p.set_defaults(func=bench_decoder)


def _print_result(
    result: dict[str, Any], table: Callable[[dict[str, Any]], str], as_json: bool
) -> int:
    """The bench's output on stdout: one JSON object, or the markdown table."""
    sys.stdout.write((json.dumps(result, indent=1) if as_json else table(result)) + "\n")
    return 0


def _add_official_args(p: argparse.ArgumentParser, what: str, repeats: int) -> None:
    """The options of a row measured with the official implementation, and --json."""
    p.add_argument(
        "--official-repeats",
        type=int,
        default=repeats,
        help=f"timed runs of {what} (default {repeats})",
    )
    p.add_argument("--no-official", action="store_true", help=f"skip {what}")
    p.add_argument(
        "--reference-python",
        type=Path,
        default=None,
        help="interpreter with qwen-tts (default: $REFERENCE_PYTHON or "
        "build/reference-venv/bin/python)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _parse_chunks(text: str) -> list[int]:
    try:
        chunks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        chunks = []
    if not chunks or min(chunks) < 1:
        raise BenchError(f"--chunks must be positive integers, got {text!r}")
    return chunks


# A GEMM over c columns does 2c FLOP per weight it reads: at <= 4 columns per frame that is
# < 2 FLOP per byte of f32 weights, far below what the cores do per byte the memory delivers,
# so in a one-frame push those layers wait on memory; the vocoder layers see >= 32 columns.
STREAMED_COLUMNS_MAX = 4


def decoder_columns_per_frame(name: str, ratios: Sequence[int], rates: Sequence[int]) -> int:
    """How many time columns per frame the matrix `name` of a decoder GGUF multiplies (its
    layer's input length per frame): 1 at the frame rate, then times each upsampling."""
    parts = name.split(".")
    pre = int(np.prod(ratios))
    if parts[1] == "up":  # dec.up.I.(trans|pwconv1|pwconv2).weight
        i = int(parts[2])
        return int(np.prod(ratios[: i + (parts[3] != "trans")]))
    if parts[1] == "voc":
        if parts[2] == "conv_in":
            return pre
        if parts[2] == "conv_out":
            return pre * int(np.prod(rates))
        b = int(parts[3])  # dec.voc.blk.B.(up|res...)
        return pre * int(np.prod(rates[: b + (parts[4] != "up")]))
    return 1  # quantizer projections, pre-conv, transformer


def gguf_u32_list(reader: Any, key: str) -> list[int]:
    """A u32 array of GGUF metadata (gguf.GGUFReader) as a list."""
    field = reader.fields[key]
    return [int(field.parts[i][0]) for i in field.data]


def streamed_weight_mb(gguf_path: Path) -> tuple[float, float]:
    """(MB of every weight matrix, MB of those in layers that see <= STREAMED_COLUMNS_MAX
    columns per frame): what a one-frame push must read from memory, and the part of it that
    no compute hides. The codebooks are left out (a frame reads 16 of their rows)."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    ratios = gguf_u32_list(reader, "kazeia.decoder.upsampling_ratios")
    rates = gguf_u32_list(reader, "kazeia.decoder.upsample_rates")
    total = low = 0
    for t in reader.tensors:
        if len(t.shape) != 2 or "codebook" in t.name or "dwconv" in t.name:
            continue
        total += int(t.n_bytes)
        if decoder_columns_per_frame(t.name, ratios, rates) <= STREAMED_COLUMNS_MAX:
            low += int(t.n_bytes)
    return total / 1e6, low / 1e6


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

    from wyoming_kazeia import _native

    # Measured now, beside the rows: the box's bandwidth moves with its other tenants.
    total_mb, low_mb = streamed_weight_mb(gguf)
    bandwidth = _native.read_bandwidth(256, args.threads)
    machine["loadavg_at_end"] = _loadavg()
    full_s = rows["full"]["median_s"]
    weights = {
        "total_mb": total_mb,
        "low_rate_mb": low_mb,
        "read_gb_s": bandwidth,
        "low_rate_read_ms": low_mb / bandwidth,
        "full_ms_per_frame": 1e3 * full_s / frames,
        "full_chunk_frames": _native.decoder_arch()["max_chunk_frames"],
    }
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
        "weights": weights,
        "targets": targets,
    }
    return _print_result(result, decoder_table, args.json)


def _run_official(
    args: argparse.Namespace,
    checkpoint: Path | None,
    codes_path: Path,
    out_path: Path,
    env: dict[str, str],
) -> dict[str, Any]:
    """Measure the official decoder, or say why not (``status`` is ``ok`` when measured)."""
    tok = checkpoint / "speech_tokenizer" if checkpoint else None
    result = _official_child(
        args,
        tok / "config.json" if tok else None,
        lambda: [
            str(OFFICIAL_SCRIPT),
            str(tok),
            str(codes_path),
            "--threads",
            str(args.threads),
            "--repeats",
            str(args.official_repeats),
            "--warmup-frames",
            str(WARMUP_FRAMES),
            "--out",
            str(out_path),
        ],
        "official PyTorch decoder",
        env,
    )
    if result["status"] == "ok":
        logger.info("official: median %.3f s", result["median_s"])
    return result


def _official_child(
    args: argparse.Namespace,
    needed: Path | None,
    argv: Callable[[], list[str]],
    what: str,
    env: dict[str, str],
) -> dict[str, Any]:
    """Runs an official script under the reference interpreter (``status`` ``ok``, with its
    JSON result), or says why not: skipped, not installed, no checkpoint (``needed``, a file of
    it, missing) or failed."""
    python = args.reference_python or default_reference_python()
    if args.no_official:
        return {"status": "skipped (--no-official)"}
    if not python.is_file():
        return {
            "status": "not installed",
            "detail": f"{python} not found (script/make-reference --setup)",
        }
    if needed is None or not needed.is_file():
        return {
            "status": "no checkpoint",
            "detail": "give --checkpoint (the Hugging Face folder of --model-dir)",
        }
    try:
        result = run_json_child([str(python), *argv()], what, env)
    except BenchError as err:
        logger.error("%s", err)
        return {"status": "failed", "detail": str(err)}
    result["status"] = "ok"
    result["interpreter"] = str(python)
    return result


def decoder_table(result: dict[str, Any]) -> str:
    """The markdown report of the ``decoder`` bench."""
    m, c, rows, off = result["machine"], result["config"], result["rows"], result["official"]
    diffs, tg = result["max_abs_diff"], result["targets"]
    lines = [
        machine_line(m),
        f"Decoder: {c['model']} ({c['model_mb']:.0f} MB); threads {c['threads']}, frames "
        f"{c['frames']} ({c['audio_s']:.2f} s of audio), repeats {c['repeats']} (official "
        f"{c['official_repeats']}), warm-up {c['warmup_frames']} frames, codes seed "
        f"{c['codes_seed']}",
        "",
        "| row | median s | min s | RTF | vs full decode | push mean / max ms | load s "
        "| RSS after load MB | peak RSS MB | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    for name, row in rows.items():
        rss_ok = row["peak_rss_mb"] <= TARGET_RSS_MB
        if name == "full":
            label, push = "full decode", "-"
            target = f"RTF <= {TARGET_FULL_RTF}: {_ok(row['rtf'] <= TARGET_FULL_RTF)}"
        else:
            label = f"stream k={row['chunk']}"
            push = f"{row['push_mean_ms']:.1f} / {row['push_max_ms']:.1f}"
            good = row["vs_full"] <= TARGET_STREAM_RATIO
            target = f"<= {TARGET_STREAM_RATIO:.2f}x full: {_ok(good)}"
        target += f"; RSS <= {TARGET_RSS_MB:.0f} MB: {_ok(rss_ok)}"
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
    w = result["weights"]
    lines.append(
        f"Weights a one-frame push reads: {w['total_mb']:.0f} MB, {w['low_rate_mb']:.0f} MB of "
        f"them in layers that see <= {STREAMED_COLUMNS_MAX} columns per frame (quantizer, "
        "transformer, upsamplers, vocoder input and first upsampling), where no compute hides "
        f"the read: at the read bandwidth measured after the rows, {w['read_gb_s']:.1f} GB/s "
        f"({c['threads']} threads), >= {w['low_rate_read_ms']:.1f} ms per push, against "
        f"{w['full_ms_per_frame']:.1f} ms per frame for the whole full decode (which reads "
        f"them once per {w['full_chunk_frames']} frames)."
    )
    lines.append(
        f"Targets: full decode RTF <= {TARGET_FULL_RTF}: {_ok(tg['full_rtf_ok'])}; streaming "
        f"total <= {TARGET_STREAM_RATIO:.2f}x full: {_ok(tg['stream_ratio_ok'])}; decoder peak "
        f"RSS <= {TARGET_RSS_MB:.0f} MB: {_ok(tg['rss_ok'])}"
    )
    lines.append(
        "RTF (from the median) = compute s / audio s; vs full decode = median / median of the "
        "one-shot row; push max = the slowest push of a run, median over runs; RSS = the whole "
        "child process (Python + numpy included)."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- generate bench

GEN_TYPES = ("f32", "q8_0", "q4_k")
FRAME_MS = 1000.0 * HOP / SAMPLE_RATE  # 80 ms of audio per frame
GEN_SENTENCE = "Hello, world! This is a test of the Qwen3 TTS engine."
# The assistant prompt of GEN_SENTENCE with the real Qwen2 BPE ids (make_reference's default
# input): used when the checkpoint's tokenizer cannot be loaded.
FALLBACK_PROMPT_IDS = [
    151644, 77091, 198, 9707, 11, 1879, 0, 1096, 374, 264, 1273, 315, 279, 1207, 16948, 18,
    350, 9951, 4712, 13, 151645, 198, 151644, 77091, 198,
]  # fmt: skip

# Targets of the talker / code predictor issue (2-core AVX2 box, 2 threads).
TARGET_Q8_TALKER_MS = 25.0
TARGET_Q8_PREDICTOR_MS = 50.0
TARGET_Q8_TOTAL_MS = 75.0
TARGET_Q4_TOTAL_MS = 55.0
TARGET_Q8_RSS_MB = 900.0

# DESIGN.md section 3: the same random 0.6B weights, 2 threads, 40 frames, on one 2-core box.
PEER_FIGURES = (
    "official PyTorch fp32 1050 ms/frame (talker ~310 + code predictor 758)",
    "qwentts.cpp q8_0 118 ms/frame (46 + 72), 4.65 GB",
    "vox q8 129 ms/frame (34 + 95), 1.23 GB",
)
OFFICIAL_GENERATE_SCRIPT = Path(__file__).resolve().with_name("official_generate.py")


def add_generate_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate",
        help="native talker + code predictor: ms per frame by weight type, peak RSS, official",
        description=(
            "Benchmark the native talker + code predictor (text token ids -> 16 codes per 80 ms "
            "frame) of a random 0.6b checkpoint converted to each --types, each in a fresh "
            "process: time to the first frame, talker and code-predictor ms per steady-state "
            "frame, total ms per frame, RSS after load and peak RSS (medians over --repeats); "
            "beside it the official PyTorch generate (fp32) when the reference environment "
            "exists. Prints a markdown table (or JSON with --json) on stdout."
        ),
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        help="converted model folder with talker.gguf (one row; default: the random 0.6b "
        "checkpoint's talker converted to each --types in the cache dir)",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        help="Hugging Face checkpoint of --model-dir, for the tokenizer and the official row "
        "(default: the cached random checkpoint when --model-dir is not given)",
    )
    p.add_argument("--cache-dir", type=Path, help="default: .bench/ in the repository root")
    p.add_argument(
        "--types",
        default=",".join(GEN_TYPES),
        help=f"comma-separated talker weight types, one row each (default {','.join(GEN_TYPES)})",
    )
    p.add_argument("--threads", type=int, default=2, help="engine and torch threads (default 2)")
    p.add_argument("--frames", type=int, default=40, help="frames per run, 80 ms each (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row (default 3)")
    p.add_argument(
        "--mode",
        choices=("stream", "nonstream"),
        default="stream",
        help="text mode: stream (text fed one token per frame, default) or nonstream",
    )
    p.add_argument("--text", default=GEN_SENTENCE, help="the sentence (default: ~10 words)")
    p.add_argument("--speaker", default="vivian", help="default vivian")
    p.add_argument("--language", default="english", help="default english")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of every run (default 0)")
    _add_official_args(p, "the (slow, ~1 s per frame) official generate", 1)
    p.set_defaults(func=bench_generate)


def _parse_types(text: str) -> list[str]:
    types = [x.strip() for x in text.split(",") if x.strip()]
    bad = [t for t in types if t not in ("f32", "f16", "q8_0", "q4_k")]
    if not types or bad:
        raise BenchError(f"--types takes a comma-separated subset of f32,f16,q8_0,q4_k: {text!r}")
    return types


def prompt_ids(tokenizer_dir: Path | None, text: str) -> tuple[list[int], str]:
    """Token ids of the assistant prompt of ``text`` and where they came from.

    Uses the checkpoint's tokenizer files (vocab.json/merges.txt, through transformers'
    Qwen2TokenizerFast); falls back to FALLBACK_PROMPT_IDS (the real Qwen2 ids of GEN_SENTENCE).
    """
    prompt = f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
    if tokenizer_dir is not None and (tokenizer_dir / "vocab.json").is_file():
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            ids = [int(x) for x in tok(prompt)["input_ids"]]
        except Exception as err:  # any failure: the fixed ids still make a valid prompt
            logger.warning("tokenizer of %s failed (%s): using fixed ids", tokenizer_dir, err)
        else:
            if ids[:3] == FALLBACK_PROMPT_IDS[:3] and ids[-5:] == FALLBACK_PROMPT_IDS[-5:]:
                return ids, f"tokenizer of {tokenizer_dir}"
            logger.warning("unexpected prompt ids from %s: using fixed ids", tokenizer_dir)
    if text != GEN_SENTENCE:
        raise BenchError("--text needs the checkpoint's tokenizer files, which failed")
    return list(FALLBACK_PROMPT_IDS), "fixed Qwen2 ids"


def bench_generate(args: argparse.Namespace) -> int:
    """The ``generate`` bench: fresh-process rows per weight type, then the official generate."""
    if min(args.threads, args.frames, args.repeats, args.official_repeats) < 1:
        raise BenchError("--threads, --frames, --repeats and --official-repeats must be >= 1")
    if args.frames < 3:
        raise BenchError("--frames must be >= 3 (steady-state frames follow the first)")
    machine = machine_info()
    _warn_if_busy(machine)
    cache_dir = args.cache_dir or default_cache_dir()
    talkers: dict[str, Path] = {}
    if args.model_dir is not None:
        talkers[args.model_dir.name] = args.model_dir / "talker.gguf"
        checkpoint = args.checkpoint
        tokenizer_dir = args.checkpoint or args.model_dir
    else:
        # Every conversion first, so that none runs beside a measurement.
        for out_type in _parse_types(args.types):
            talkers[out_type] = ensure_talker(cache_dir, "0.6b", out_type)
        checkpoint = args.checkpoint or cache_dir / "ck-0.6b"
        tokenizer_dir = checkpoint
    for gguf in talkers.values():
        if not gguf.is_file():
            raise BenchError(f"{gguf} not found")
    ids, ids_source = prompt_ids(tokenizer_dir, args.text)
    logger.info("prompt: %d token ids (%s)", len(ids), ids_source)

    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(args.threads)
    rows: dict[str, dict[str, Any]] = {}
    for name, gguf in talkers.items():
        cmd = [
            sys.executable,
            "-c",
            CHILD_BOOT,
            "generate",
            str(gguf),
            "--ids",
            ",".join(map(str, ids)),
            "--threads",
            str(args.threads),
            "--repeats",
            str(args.repeats),
            "--frames",
            str(args.frames),
            "--mode",
            args.mode,
            "--seed",
            str(args.seed),
            "--speaker",
            args.speaker,
            "--language",
            args.language,
        ]
        row = run_json_child(cmd, f"generate {name}", env)
        row["talker_file"] = str(gguf)
        row["talker_mb"] = gguf.stat().st_size / 1e6
        row["rtf"] = row["total_ms_per_frame"] / FRAME_MS
        rows[name] = row
        logger.info(
            "%s: %.1f ms/frame (talker %.1f, code predictor %.1f), first frame %.0f ms",
            name,
            row["total_ms_per_frame"],
            row["talker_ms_per_frame"],
            row["predictor_ms_per_frame"],
            row["first_frame_ms"],
        )
        if row["eos_before_max"]:
            logger.warning("%s: eos after %d of %d frames", name, row["frames"], args.frames)

    official = _run_official_generate(args, checkpoint, ids, env)
    machine["loadavg_at_end"] = _loadavg()

    targets: dict[str, Any] = {}
    if "q8_0" in rows:
        q8 = rows["q8_0"]
        targets.update(
            q8_talker_ok=q8["talker_ms_per_frame"] <= TARGET_Q8_TALKER_MS,
            q8_predictor_ok=q8["predictor_ms_per_frame"] <= TARGET_Q8_PREDICTOR_MS,
            q8_total_ok=q8["total_ms_per_frame"] <= TARGET_Q8_TOTAL_MS,
            q8_rss_ok=q8["peak_rss_mb"] <= TARGET_Q8_RSS_MB,
        )
    if "q4_k" in rows:
        targets["q4_total_ok"] = rows["q4_k"]["total_ms_per_frame"] <= TARGET_Q4_TOTAL_MS
    targets.update(
        q8_talker_ms_max=TARGET_Q8_TALKER_MS,
        q8_predictor_ms_max=TARGET_Q8_PREDICTOR_MS,
        q8_total_ms_max=TARGET_Q8_TOTAL_MS,
        q4_total_ms_max=TARGET_Q4_TOTAL_MS,
        q8_rss_mb_max=TARGET_Q8_RSS_MB,
    )
    if official.get("status") == "ok" and "q8_0" in rows:
        official["q8_0_speedup"] = (
            official["total_ms_per_frame"] / rows["q8_0"]["total_ms_per_frame"]
        )
    result = {
        "bench": "generate",
        "machine": machine,
        "config": {
            "model": (
                str(args.model_dir)
                if args.model_dir is not None
                else f"random 0.6b checkpoint {checkpoint}"
            ),
            "checkpoint": None if checkpoint is None else str(checkpoint),
            "threads": args.threads,
            "frames": args.frames,
            "repeats": args.repeats,
            "official_repeats": args.official_repeats,
            "mode": args.mode,
            "text": args.text,
            "prompt_ids": ids,
            "prompt_ids_source": ids_source,
            "speaker": args.speaker,
            "language": args.language,
            "seed": args.seed,
            "warmup_frames": WARMUP_FRAMES,
        },
        "rows": rows,
        "official": official,
        "targets": targets,
        "peers_measured_elsewhere": list(PEER_FIGURES),
    }
    return _print_result(result, generate_table, args.json)


def _run_official_generate(
    args: argparse.Namespace, checkpoint: Path | None, ids: list[int], env: dict[str, str]
) -> dict[str, Any]:
    """Measure the official generate, or say why not (``status`` is ``ok`` when measured)."""
    result = _official_child(
        args,
        checkpoint / "config.json" if checkpoint else None,
        lambda: [
            str(OFFICIAL_GENERATE_SCRIPT),
            str(checkpoint),
            "--ids",
            ",".join(map(str, ids)),
            "--frames",
            str(args.frames),
            "--mode",
            args.mode,
            "--speaker",
            args.speaker,
            "--language",
            args.language,
            "--threads",
            str(args.threads),
            "--repeats",
            str(args.official_repeats),
            "--seed",
            str(args.seed),
        ],
        "official PyTorch generate",
        env,
    )
    if result["status"] == "ok":
        result["rtf"] = result["total_ms_per_frame"] / FRAME_MS
        logger.info("official: %.0f ms/frame", result["total_ms_per_frame"])
    return result


def generate_table(result: dict[str, Any]) -> str:
    """The markdown report of the ``generate`` bench."""
    m, c, rows, off = result["machine"], result["config"], result["rows"], result["official"]
    tg = result["targets"]
    lines = [
        machine_line(m),
        f"Talker + code predictor: {c['model']}; {c['mode']} text mode, "
        f"{len(c['prompt_ids'])} prompt ids ({c['prompt_ids_source']}), speaker {c['speaker']}, "
        f"{c['language']}, seed {c['seed']}; threads {c['threads']}, frames {c['frames']}, "
        f"repeats {c['repeats']} (official {c['official_repeats']}), warm-up "
        f"{c['warmup_frames']} frames",
        "",
        "| row | talker file MB | first frame ms (start / setup / prefill) "
        "| talker ms/frame | code predictor ms/frame | other ms/frame | total ms/frame (min) "
        "| RTF "
        "| frames | load s | RSS after load MB (file) | peak RSS MB | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    for name, row in rows.items():
        if name == "q8_0":
            target = (
                f"talker <= {TARGET_Q8_TALKER_MS:.0f}: {_ok(tg['q8_talker_ok'])}; code predictor "
                f"<= {TARGET_Q8_PREDICTOR_MS:.0f}: {_ok(tg['q8_predictor_ok'])}; total <= "
                f"{TARGET_Q8_TOTAL_MS:.0f}: {_ok(tg['q8_total_ok'])}; peak RSS <= "
                f"{TARGET_Q8_RSS_MB:.0f} MB: {_ok(tg['q8_rss_ok'])}"
            )
        elif name == "q4_k":
            target = f"total <= {TARGET_Q4_TOTAL_MS:.0f}: {_ok(tg['q4_total_ok'])}"
        else:
            target = "-"
        frames = f"{row['frames']}" + (" (eos!)" if row["eos_before_max"] else "")
        lines.append(
            f"| ours {name} | {row['talker_mb']:.0f} "
            f"| {row['first_frame_ms']:.0f} ({row['start_ms']:.0f} / "
            f"{row['graph_setup_ms']:.1f} / {row['prefill_ms']:.0f}) "
            f"| {row['talker_ms_per_frame']:.1f} | {row['predictor_ms_per_frame']:.1f} "
            f"| {row['other_ms_per_frame']:.1f} | {row['total_ms_per_frame']:.1f} "
            f"({row['total_ms_per_frame_min']:.1f}) "
            f"| {row['rtf']:.2f} | {frames} | {row['load_s']:.2f} "
            f"| {row['rss_load_mb']:.0f} ({row['rss_file_load_mb']:.0f}) "
            f"| {row['peak_rss_mb']:.0f} | {target} |"
        )
    if off.get("status") == "ok":
        frames = f"{off['frames']}" + (" (eos!)" if off["eos_before_max"] else "")
        lines.append(
            f"| official PyTorch fp32 | - | end only (prefill {off['prefill_ms']:.0f}) "
            f"| {off['talker_ms_per_frame']:.1f} | {off['predictor_ms_per_frame']:.1f} "
            f"| {off['other_ms_per_frame']:.1f} | {off['total_ms_per_frame']:.1f} "
            f"({min(r['total_ms_per_frame'] for r in off['runs']):.1f}) "
            f"| {off['rtf']:.2f} | {frames} | {off['load_s']:.2f} | {off['rss_load_mb']:.0f} "
            f"| {off['peak_rss_mb']:.0f} | - |"
        )
    else:
        lines.append(
            f"| official PyTorch fp32 | {off['status']} | - | - | - | - | - | - | - | - | - | - "
            "| - |"
        )
    lines.append("")
    lines.append(
        "ours, per row: "
        + "; ".join(
            f"{name}: first frame of the process's first generation "
            f"{row['cold_first_frame_ms']:.0f} ms, RSS at the end {row['rss_end_mb']:.0f} MB "
            f"(anon {row['rss_anon_end_mb']:.0f}, "
            f"file {row['rss_file_end_mb']:.0f}), same codes every run: "
            f"{'yes' if row['same_codes_every_run'] else 'NO'}"
            for name, row in rows.items()
        )
    )
    if off.get("status") == "ok":
        speedup = off.get("q8_0_speedup")
        lines.append(
            "official: torch "
            f"{off['torch']}, {off['threads']} threads, model.generate (do_sample, default "
            "sampling), whole model loaded with the speech tokenizer"
            + (f"; official / ours q8_0 total ms per frame: {speedup:.1f}x" if speedup else "")
        )
    elif "detail" in off:
        lines.append(f"official: {off['status']}: {off['detail']}")
    if tg.get("q8_talker_ok") is not None or tg.get("q4_total_ok") is not None:
        parts = []
        if "q8_talker_ok" in tg:
            parts.append(
                f"q8_0 talker <= {TARGET_Q8_TALKER_MS:.0f} ms/frame: {_ok(tg['q8_talker_ok'])}; "
                f"code predictor <= {TARGET_Q8_PREDICTOR_MS:.0f}: {_ok(tg['q8_predictor_ok'])}; "
                f"total <= {TARGET_Q8_TOTAL_MS:.0f}: {_ok(tg['q8_total_ok'])}; peak RSS <= "
                f"{TARGET_Q8_RSS_MB:.0f} MB: {_ok(tg['q8_rss_ok'])}"
            )
        if "q4_total_ok" in tg:
            parts.append(
                f"q4_k total <= {TARGET_Q4_TOTAL_MS:.0f} ms/frame: {_ok(tg['q4_total_ok'])}"
            )
        lines.append("Targets (2-core AVX2 box): " + "; ".join(parts))
    lines.append(
        "Peers (DESIGN.md, measured elsewhere, not in this run; 2 threads, 40 frames): "
        + "; ".join(PEER_FIGURES)
    )
    lines.append(
        "first frame = from the frames() call to the first frame (start = the frames() call: "
        "text projection, KV cache and graph setup; setup = graph_setup_ms; prefill = talker "
        "forward of the prompt, from runs with max_frames=1, after the warm-up: rows the engine "
        "caches per voice are not recomputed; the process's first generation, with its page "
        "faults, is listed below the table); the first frame also carries its "
        "code predictor (the talker step that feeds it back runs at the next request). "
        "talker / code "
        "predictor ms/frame = engine stats over the frames after the first (talker per step); "
        "other = the rest of that wall time (sampling, Python); total = wall from the frames() "
        "call to the last frame / frames (min: the best run); RTF = total / 80 ms; medians over "
        "the repeats; RSS = "
        "the whole child process; (file) = its file-backed part: the talker GGUF is "
        "memory-mapped, so only the pages touched (e.g. the used rows of the text table) count."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- engine bench

# The tokenizer files and config.json the engine reads from its model folder (beside the GGUFs).
ENGINE_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json")
ENGINE_FILES = ("talker.gguf", "decoder.gguf", *ENGINE_TOKENIZER_FILES)
ENGINE_TALKER_TYPE = "q8_0"
ENGINE_CHUNKS = "1,4,8"

# Targets of the streaming-engine issue (2-core AVX2 box, 2 + 2 threads).
TARGET_TTFA_MS = 200.0
TARGET_ENGINE_STREAM_RATIO = 1.05
TARGET_ENGINE_RTF = 2.2
TARGET_ENGINE_RSS_MB = 1100.0
TARGET_LOAD_SLOWDOWN = 2.5

# Measured elsewhere (DESIGN.md), not in this run.
ENGINE_PEER_FIGURES = (
    "vox q8: first audio 0.41 s with 1-frame chunks (1.09 s with 4), RTF 2.9, 1.2 GB",
    "qwentts.cpp q8_0: first audio 0.92 s, RTF 3.6-3.8, 4.5 GB (~20x slower per frame under a "
    "competing load)",
    "official PyTorch: RTF ~16",
)

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
}
LOAD_MIN_S = 60.0  # bounds of one loaded row (the load processes' deadline, the child's timeout)
LOAD_MAX_S = 600.0


def add_engine_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "engine",
        help="streaming engine (text -> PCM chunks): first audio, RTF, chunk sizes, subprocess "
        "decoder, slowdown under a competing load",
        description=(
            "Benchmark the streaming engine (Engine.synthesize: text -> 24 kHz int16 chunks) on "
            "a random 0.6b checkpoint (q8_0 talker, f16 decoder), --frames frames forced: "
            "one-shot (stream_chunk 0), streaming with --chunks, and the subprocess decoder, "
            "each in a fresh process (a warm-up synthesis, then medians over --repeats): "
            "decoder / talker / code-predictor seconds, total, RTF, time to first audio, peak "
            "RSS. Then the same rows again beside --load-procs busy processes (--no-load to "
            "skip): slowdown loaded / unloaded. Prints a markdown table (or JSON with --json) "
            "on stdout."
        ),
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        help="model folder with talker.gguf, decoder.gguf and the tokenizer files (default: "
        f"{{cache dir}}/e-0.6b-{ENGINE_TALKER_TYPE}, links to the cached random 0.6b checkpoint, "
        f"its {ENGINE_TALKER_TYPE} talker and the decoder converted at that type)",
    )
    p.add_argument("--cache-dir", type=Path, help="default: .bench/ in the repository root")
    p.add_argument("--threads", type=int, default=2, help="generator threads (default 2)")
    p.add_argument(
        "--decoder-threads", type=int, default=None, help="decoder threads (default: --threads)"
    )
    p.add_argument(
        "--frames",
        type=int,
        default=40,
        help="max_frames of every synthesis, 80 ms each (default 40; random weights never emit "
        "eos, so every synthesis gives this many)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed syntheses per row (default 3)")
    p.add_argument(
        "--load-repeats",
        type=int,
        default=2,
        help="timed syntheses per row under the competing load (default 2)",
    )
    p.add_argument(
        "--chunks",
        default=ENGINE_CHUNKS,
        help=f"comma-separated stream_chunk values, one streaming row each (default "
        f"{ENGINE_CHUNKS}; the one-shot and subprocess rows always run)",
    )
    p.add_argument("--text", default=GEN_SENTENCE, help="the sentence (default: ~10 words)")
    p.add_argument("--speaker", default="vivian", help="default vivian")
    p.add_argument("--language", default="english", help="default english")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of every synthesis")
    p.add_argument(
        "--load",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run every row beside a competing CPU load (default on; --no-load skips it)",
    )
    p.add_argument(
        "--load-procs", type=int, default=2, help="competing single-thread processes (default 2)"
    )
    p.add_argument(
        "--load-kind",
        choices=tuple(LOAD_PROGRAMS),
        default="spin",
        help="spin: a pure Python busy loop; matmul: a one-thread numpy 512x512 matmul loop "
        "(default spin)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=bench_engine)


def ensure_engine_dir(cache_dir: Path, size: str = "0.6b", talker_type: str = "q8_0") -> Path:
    """``cache_dir / f"e-{size}-{talker_type}"``: a model folder for ``Engine`` made of relative
    symbolic links to the cached talker (``t-SIZE-TYPE``), the decoder the converter writes for
    that type (``d-SIZE-TYPE``) and the tokenizer files of the checkpoint (``ck-SIZE``), which
    are built first when missing. Made under a ``.tmp`` name and renamed; reused while every link
    resolves and points at those files."""
    folder = cache_dir / f"e-{size}-{talker_type}"
    decoder = ensure_decoder(cache_dir, size, talker_type)
    if (folder / "decoder.gguf").resolve() != decoder.resolve():
        shutil.rmtree(folder, ignore_errors=True)  # built by an older bench: another decoder
    if all((folder / name).is_file() for name in ENGINE_FILES):
        logger.info("reusing %s", folder)
        return folder
    sources = {
        "talker.gguf": ensure_talker(cache_dir, size, talker_type),
        "decoder.gguf": decoder,
    }
    ckpt = ensure_checkpoint(cache_dir, size)
    sources.update({name: ckpt / name for name in ENGINE_TOKENIZER_FILES})
    missing = [str(src) for src in sources.values() if not src.is_file()]
    if missing:
        raise BenchError(f"cannot build {folder}: missing {', '.join(missing)}")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, src in sources.items():
        (tmp / name).symlink_to(os.path.relpath(src, folder))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    logger.info("%s ready (links)", folder)
    return folder


def _die_with_parent() -> None:
    """``preexec_fn`` of a load process: SIGKILL when the bench dies (Linux prctl)."""
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
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    procs: list[subprocess.Popen[bytes]] = []
    info: dict[str, Any] = {"procs": n, "kind": kind, "bound_s": bound_s}
    start = time.monotonic()
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", LOAD_PROGRAMS[kind], f"{bound_s:.0f}"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    env=env,
                    preexec_fn=_die_with_parent,
                )
            )
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


def _engine_row_cmd(
    args: argparse.Namespace, model_dir: Path, chunk: int, subproc: bool, repeats: int, out: Path
) -> list[str]:
    cmd = [
        sys.executable,
        "-c",
        CHILD_BOOT,
        "engine",
        str(model_dir),
        "--threads",
        str(args.threads),
        "--decoder-threads",
        str(args.decoder_threads),
        "--chunk",
        str(chunk),
        "--repeats",
        str(repeats),
        "--frames",
        str(args.frames),
        "--seed",
        str(args.seed),
        "--text",
        args.text,
        "--speaker",
        args.speaker,
        "--language",
        args.language,
        "--out",
        str(out),
    ]
    if subproc:
        cmd.append("--subprocess")
    return cmd


def _label(name: str) -> str:
    if name == "oneshot":
        return "one-shot (chunk 0)"
    if name == "subprocess":
        return "subprocess decoder"
    return f"stream k={name.removeprefix('stream_k')}"


def bench_engine(args: argparse.Namespace) -> int:
    """The ``engine`` bench: fresh-process rows (one-shot, streaming, subprocess decoder), then
    the same rows beside a competing load."""
    if args.decoder_threads is None:
        args.decoder_threads = args.threads
    if min(args.threads, args.decoder_threads, args.repeats, args.load_repeats) < 1:
        raise BenchError("--threads, --decoder-threads, --repeats, --load-repeats must be >= 1")
    if args.frames < 1 or args.load_procs < 1:
        raise BenchError("--frames and --load-procs must be >= 1")
    chunks = _parse_chunks(args.chunks)
    if max(chunks) > 64:
        raise BenchError("--chunks: stream_chunk is at most 64")
    machine = machine_info()
    _warn_if_busy(machine)
    cache_dir = args.cache_dir or default_cache_dir()
    if args.model_dir is not None:
        model_dir = args.model_dir
        missing = [name for name in ENGINE_FILES if not (model_dir / name).is_file()]
        if missing:
            raise BenchError(f"{model_dir} lacks {', '.join(missing)}")
    else:
        model_dir = ensure_engine_dir(cache_dir, "0.6b", ENGINE_TALKER_TYPE)
    audio_s = args.frames * HOP / SAMPLE_RATE

    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(args.threads)
    configs = (
        [("oneshot", 0, False)]
        + [(f"stream_k{k}", k, False) for k in chunks]
        + [("subprocess", 0, True)]
    )
    rows: dict[str, dict[str, Any]] = {}
    loaded: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kazeia-bench-") as tmp_name:
        tmp = Path(tmp_name)
        audio: dict[str, np.ndarray] = {}
        for name, chunk, subproc in configs:
            out = tmp / f"{name}.npy"
            cmd = _engine_row_cmd(args, model_dir, chunk, subproc, args.repeats, out)
            start = time.monotonic()
            row = run_json_child(cmd, f"engine {_label(name)}", env)
            row["row_wall_s"] = time.monotonic() - start
            audio[name] = np.load(out)
            rows[name] = row
            logger.info(
                "%s: total %.2f s, RTF %.2f, first audio %.0f ms",
                _label(name),
                row["total_s"],
                row["rtf"],
                1e3 * row["ttfa_s"],
            )
        if args.load:
            for name, chunk, subproc in configs:
                out = tmp / f"{name}-loaded.npy"
                cmd = _engine_row_cmd(args, model_dir, chunk, subproc, args.load_repeats, out)
                # A generous bound: 8x the unloaded row (which ran more syntheses), 60-600 s.
                bound = min(LOAD_MAX_S, max(LOAD_MIN_S, 8.0 * rows[name]["row_wall_s"] + 30.0))
                what = f"engine {_label(name)} beside {args.load_procs} {args.load_kind} processes"
                try:
                    with competing_load(args.load_procs, args.load_kind, bound) as info:
                        row = run_json_child(cmd, what, env, timeout=bound)
                except BenchError as err:
                    logger.error("%s", err)
                    loaded[name] = {"failed": str(err), "bound_s": bound}
                    continue
                row["load"] = info
                audio[f"{name}-loaded"] = np.load(out)
                loaded[name] = row
                logger.info(
                    "%s under load: total %.2f s (%.2fx), first audio %.0f ms",
                    _label(name),
                    row["total_s"],
                    row["total_s"] / rows[name]["total_s"],
                    1e3 * row["ttfa_s"],
                )

        ref = audio["oneshot"]
        for table, suffix in ((rows, ""), (loaded, "-loaded")):
            for name, row in table.items():
                if "failed" in row:
                    continue
                diff = max_abs_diff(audio[name + suffix], ref)
                row["audio_max_abs_diff_vs_oneshot"] = None if diff is None else int(diff)
                row["audio_samples"] = int(audio[name + suffix].size)
    machine["loadavg_at_end"] = _loadavg()

    for table in (rows, loaded):
        ok_rows = {n: r for n, r in table.items() if "failed" not in r}
        if "oneshot" in ok_rows:
            for row in ok_rows.values():
                row["vs_oneshot"] = row["total_s"] / ok_rows["oneshot"]["total_s"]
    for name, row in loaded.items():
        if "failed" not in row:
            row["slowdown"] = row["total_s"] / rows[name]["total_s"]
            row["ttfa_slowdown"] = row["ttfa_s"] / rows[name]["ttfa_s"]

    stream_names = [n for n in rows if n.startswith("stream_k")]
    targets: dict[str, Any] = {
        "ttfa_ms_max": TARGET_TTFA_MS,
        "ttfa_ok": {n: 1e3 * rows[n]["ttfa_s"] <= TARGET_TTFA_MS for n in stream_names},
        "stream_ratio_max": TARGET_ENGINE_STREAM_RATIO,
        "stream_ratio_ok": {
            n: rows[n]["vs_oneshot"] <= TARGET_ENGINE_STREAM_RATIO for n in stream_names
        },
        "rtf_max": TARGET_ENGINE_RTF,
        "rtf_ok": {n: r["rtf"] <= TARGET_ENGINE_RTF for n, r in rows.items()},
        "rss_mb_max": TARGET_ENGINE_RSS_MB,
        "rss_ok": {n: r["engine_peak_rss_mb"] <= TARGET_ENGINE_RSS_MB for n, r in rows.items()},
        "slowdown_max": TARGET_LOAD_SLOWDOWN,
        "slowdown_ok": {
            n: "failed" not in r and r["slowdown"] <= TARGET_LOAD_SLOWDOWN
            for n, r in loaded.items()
        },
    }
    result = {
        "bench": "engine",
        "machine": machine,
        "config": {
            "model_dir": str(model_dir),
            "talker": str((model_dir / "talker.gguf").resolve()),
            "talker_mb": (model_dir / "talker.gguf").stat().st_size / 1e6,
            "decoder": str((model_dir / "decoder.gguf").resolve()),
            "decoder_mb": (model_dir / "decoder.gguf").stat().st_size / 1e6,
            "threads": args.threads,
            "decoder_threads": args.decoder_threads,
            "frames": args.frames,
            "audio_s": audio_s,
            "repeats": args.repeats,
            "load_repeats": args.load_repeats,
            "chunks": chunks,
            "text": args.text,
            "speaker": args.speaker,
            "language": args.language,
            "seed": args.seed,
            "load": args.load,
            "load_procs": args.load_procs,
            "load_kind": args.load_kind,
        },
        "rows": rows,
        "loaded_rows": loaded,
        "targets": targets,
        "peers_measured_elsewhere": list(ENGINE_PEER_FIGURES),
    }
    return _print_result(result, engine_table, args.json)


def _verdict(flags: dict[str, bool]) -> str:
    """``ok`` when every flag holds, else ``MISSED`` and the rows that missed."""
    bad = [_label(n) for n, good in flags.items() if not good]
    return "ok" if not bad else f"MISSED ({', '.join(bad)})"


def engine_table(result: dict[str, Any]) -> str:
    """The markdown report of the ``engine`` bench."""
    m, c, rows, loaded, tg = (
        result["machine"],
        result["config"],
        result["rows"],
        result["loaded_rows"],
        result["targets"],
    )

    def label(name: str, row: dict[str, Any]) -> str:
        text = _label(name)
        if row["n_frames"] != c["frames"]:
            text += f" ({row['n_frames']} frames!)"
        return text

    def peak(row: dict[str, Any]) -> str:
        text = f"{row['peak_rss_mb']:.0f}"
        if row["decoder_subprocess_peak_rss_mb"] > 0:
            text += f" + {row['decoder_subprocess_peak_rss_mb']:.0f}"
        return text

    def cells(row: dict[str, Any]) -> str:
        return (
            f"| {row['decoder_s']:.2f} | {row['total_s']:.2f} | {row['rtf']:.2f} "
            f"| {1e3 * row['ttfa_s']:.0f} ({1e3 * row['cold_ttfa_s']:.0f}) | {row['n_chunks']} "
            f"| {row['talker_s']:.2f} | {row['predictor_s']:.2f} "
            f"| {fmt(row.get('vs_oneshot'), '.3f', 'x')} | {peak(row)} "
        )

    lines = [
        machine_line(m),
        f"Engine: {c['model_dir']} (talker {c['talker_mb']:.0f} MB, decoder "
        f"{c['decoder_mb']:.0f} MB); threads {c['threads']} + decoder {c['decoder_threads']}; "
        f"{c['frames']} frames forced ({c['audio_s']:.2f} s of audio); speaker {c['speaker']}, "
        f"{c['language']}, seed {c['seed']}; text {c['text']!r}; a warm-up synthesis, then "
        f"{c['repeats']} timed per row (medians)",
        "",
        "| row | decoder s | total s | RTF | TTFA ms (cold) | chunks | talker s | predictor s "
        "| total vs one-shot | peak RSS MB | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in rows.items():
        target = []
        if name in tg["ttfa_ok"]:
            target.append(f"TTFA <= {TARGET_TTFA_MS:.0f}: {_ok(tg['ttfa_ok'][name])}")
            target.append(
                f"<= {TARGET_ENGINE_STREAM_RATIO:.2f}x: {_ok(tg['stream_ratio_ok'][name])}"
            )
        target.append(f"RTF <= {TARGET_ENGINE_RTF}: {_ok(tg['rtf_ok'][name])}")
        target.append(f"RSS <= {TARGET_ENGINE_RSS_MB:.0f}: {_ok(tg['rss_ok'][name])}")
        lines.append(f"| {label(name, row)} {cells(row)}| {'; '.join(target)} |")

    if c["load"]:
        lines += [
            "",
            f"Beside a competing load of {c['load_procs']} busy single-thread processes "
            f"({c['load_kind']}), {c['load_repeats']} timed syntheses per row after the warm-up:",
            "",
            "| row | decoder s | total s | RTF | TTFA ms (cold) | chunks | talker s | predictor s "
            "| total vs one-shot | peak RSS MB | slowdown total (TTFA) | load CPU share "
            "| target |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, row in loaded.items():
            if "failed" in row:
                lines.append(
                    f"| {_label(name)} | {row['failed']} | - | - | - | - | - | - | - | - "
                    f"| > {row['bound_s'] / rows[name]['row_wall_s']:.0f}x (row wall) | - "
                    f"| slowdown <= {TARGET_LOAD_SLOWDOWN}x: MISSED |"
                )
                continue
            share = row["load"].get("cpu_share")
            lines.append(
                f"| {label(name, row)} {cells(row)}"
                f"| {row['slowdown']:.2f}x ({row['ttfa_slowdown']:.2f}x) "
                f"| {fmt(None if share is None else 100 * share, '.0f', '%')} "
                f"| slowdown <= {TARGET_LOAD_SLOWDOWN}x: {_ok(tg['slowdown_ok'][name])} |"
            )

    lines.append("")
    all_rows = {_label(n): r for n, r in rows.items()}
    all_rows.update({f"{_label(n)} loaded": r for n, r in loaded.items() if "failed" not in r})
    lines.append(
        "audio: "
        + "; ".join(
            f"{n}: {r['audio_samples']} samples, max |diff| vs one-shot "
            f"{fmt(r['audio_max_abs_diff_vs_oneshot'], 'd')} LSB, same every run: "
            f"{'yes' if r['same_audio_every_run'] else 'NO'}"
            for n, r in all_rows.items()
        )
    )
    lines.append(
        "load s / RSS after load MB: "
        + "; ".join(
            f"{_label(n)}: {r['load_s']:.2f} / {r['rss_load_mb']:.0f}" for n, r in rows.items()
        )
    )
    parts = [
        f"first audio <= {TARGET_TTFA_MS:.0f} ms: {_verdict(tg['ttfa_ok'])}",
        f"streaming total <= {TARGET_ENGINE_STREAM_RATIO:.2f}x one-shot: "
        f"{_verdict(tg['stream_ratio_ok'])}",
        f"end-to-end RTF <= {TARGET_ENGINE_RTF}: {_verdict(tg['rtf_ok'])}",
        f"peak RSS <= {TARGET_ENGINE_RSS_MB:.0f} MB at {ENGINE_TALKER_TYPE}: "
        f"{_verdict(tg['rss_ok'])}",
    ]
    if c["load"]:
        parts.append(
            f"slowdown beside a {c['load_procs']}-process load <= {TARGET_LOAD_SLOWDOWN}x: "
            f"{_verdict(tg['slowdown_ok'])}"
        )
    lines.append("Targets (2-core AVX2 box): " + "; ".join(parts))
    lines.append(
        "Peers (DESIGN.md, measured elsewhere, not in this run): " + "; ".join(ENGINE_PEER_FIGURES)
    )
    lines.append(
        "decoder / talker / predictor s = the engine's metrics (decoder: time in push/decode, or "
        "in the kazeia-decoder subprocess with its start and model load); total and TTFA (time "
        "to the first audio chunk) = the engine's metrics too, from the start of the synthesis "
        "(the caller's view from the synthesize() call is in --json: wall_s, "
        "first_chunk_wall_s); RTF = total / audio s; (cold) = the process's first synthesis, "
        "the warm-up; total vs one-shot = total / total of the "
        "one-shot row of the same table; slowdown = total (TTFA) under load / without; load CPU "
        "share = the mean fraction of a CPU each load process got; peak RSS = VmHWM of the "
        "whole process (+ the peak of the kazeia-decoder subprocess); medians over the runs."
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


def _generation_run(gen: Any, ids: np.ndarray, args: argparse.Namespace, max_frames: int) -> Any:
    """One generation through the frame iterator, timed per frame; returns (metrics, codes)."""
    t0 = time.perf_counter()
    it = gen.frames(
        ids,
        args.speaker,
        args.language,
        non_streaming=args.mode == "nonstream",
        seed=args.seed,
        max_frames=max_frames,
    )
    t_start = time.perf_counter()
    codes: list[np.ndarray] = []
    first: dict[str, float] = {}
    t_first = t_last = t_start
    for frame in it:
        t_last = time.perf_counter()
        codes.append(frame)
        if not first:
            t_first = t_last
            first = dict(it.stats)
    end = dict(it.stats)
    n = len(codes)
    if n < 2:
        raise BenchError(f"only {n} frame(s) came (eos): no steady state to measure")
    # The frame after the first: each next() runs the code predictor of its frame, then the talker
    # step that feeds the frame back, except for the frame that reaches max_frames.
    steps = (n - 1) - (1 if n == max_frames else 0)
    d_talker = end["talker_ms"] - first["talker_ms"]
    d_predictor = end["predictor_ms"] - first["predictor_ms"]
    talker_step = d_talker / steps if steps > 0 else float("nan")
    metrics = {
        "frames": n,
        "first_frame_ms": 1e3 * (t_first - t0),
        "start_ms": 1e3 * (t_start - t0),
        "graph_setup_ms": end["graph_setup_ms"],
        "first_talker_ms": first["talker_ms"],
        "first_predictor_ms": first["predictor_ms"],
        "talker_ms_per_frame": talker_step,
        "predictor_ms_per_frame": d_predictor / (n - 1),
        "other_ms_per_frame": (1e3 * (t_last - t_first) - d_talker - d_predictor) / (n - 1),
        "total_ms_per_frame": 1e3 * (t_last - t0) / n,
        "wall_ms": 1e3 * (t_last - t0),
        "talker_ms": end["talker_ms"],
        "predictor_ms": end["predictor_ms"],
    }
    return metrics, np.stack(codes)


def child_generate(args: argparse.Namespace) -> dict[str, Any]:
    """One talker GGUF in this (fresh) process: load, warm up, time ``frames()`` runs."""
    from wyoming_kazeia.native import Generator

    ids = np.asarray([int(x) for x in args.ids.split(",") if x.strip()], dtype=np.int64)
    rss_start = status_mb("VmRSS")
    start = time.perf_counter()
    gen = Generator(str(args.gguf), threads=args.threads)
    load_s = time.perf_counter() - start
    rss_load = status_mb("VmRSS")
    rss_file_load = status_mb("RssFile")

    cold, _ = _generation_run(gen, ids, args, WARMUP_FRAMES)
    logger.info("warm-up (%d frames): first frame %.0f ms", WARMUP_FRAMES, cold["first_frame_ms"])
    # With max_frames=1 no talker step follows the frame: the talker time is the prefill alone.
    prefill_ms: list[float] = []
    one_frame_ms: list[float] = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        it = gen.frames(
            ids,
            args.speaker,
            args.language,
            non_streaming=args.mode == "nonstream",
            seed=args.seed,
            max_frames=1,
        )
        if len(list(it)) != 1:
            raise BenchError("a max_frames=1 run gave no frame")
        one_frame_ms.append(1e3 * (time.perf_counter() - t0))
        prefill_ms.append(float(it.stats["talker_ms"]))
    runs: list[dict[str, float]] = []
    codes: list[np.ndarray] = []
    for i in range(args.repeats):
        metrics, frames = _generation_run(gen, ids, args, args.frames)
        runs.append(metrics)
        codes.append(frames)
        logger.info(
            "run %d/%d: %d frames, %.1f ms/frame (talker %.1f, code predictor %.1f)",
            i + 1,
            args.repeats,
            metrics["frames"],
            metrics["total_ms_per_frame"],
            metrics["talker_ms_per_frame"],
            metrics["predictor_ms_per_frame"],
        )
    keys = [k for k in runs[0] if k != "frames"]
    result: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in keys}
    n = min(r["frames"] for r in runs)
    result.update(
        total_ms_per_frame_min=min(r["total_ms_per_frame"] for r in runs),
        frames=n,
        frames_requested=args.frames,
        eos_before_max=n < args.frames,
        same_codes_every_run=all(
            c.shape == codes[0].shape and bool(np.array_equal(c, codes[0])) for c in codes
        ),
        prefill_ms=statistics.median(prefill_ms),
        one_frame_run_ms=statistics.median(one_frame_ms),
        cold_first_frame_ms=cold["first_frame_ms"],
        cold_start_ms=cold["start_ms"],
        runs=runs,
        mode=args.mode,
        prompt_tokens=int(ids.size),
        threads=args.threads,
        load_s=load_s,
        rss_start_mb=rss_start,
        rss_load_mb=rss_load,
        rss_file_load_mb=rss_file_load,
        rss_end_mb=status_mb("VmRSS"),
        rss_file_end_mb=status_mb("RssFile"),
        rss_anon_end_mb=status_mb("RssAnon"),
        peak_rss_mb=status_mb("VmHWM"),
    )
    return result


# `python -c PEAK_RSS_WRAPPER FILE CMD...`: runs CMD, appends its peak RSS (kB, wait4) to FILE,
# exits with its status. The wrapper's own ~10 MB is the floor of the figure.
PEAK_RSS_WRAPPER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "p.returncode = os.waitstatus_to_exitcode(status)\n"
    "with open(sys.argv[1], 'a', encoding='ascii') as f:\n"
    "    f.write(f'{usage.ru_maxrss}\\n')\n"
    "sys.exit(p.returncode if p.returncode >= 0 else 1)\n"
)


def _synthesis_run(engine: Any, args: argparse.Namespace) -> tuple[dict[str, float], np.ndarray]:
    """One synthesis, consumed as a caller would; returns (metrics, int16 audio)."""
    t0 = time.perf_counter()
    s = engine.synthesize(args.text, speaker=args.speaker, language=args.language)
    chunks: list[np.ndarray] = []
    t_first = None
    for chunk in s:
        if t_first is None:
            t_first = time.perf_counter()
        chunks.append(chunk)
    wall = time.perf_counter() - t0
    metrics: dict[str, float] = dict(s.metrics.as_dict())
    metrics["wall_s"] = wall
    metrics["first_chunk_wall_s"] = float("nan") if t_first is None else t_first - t0
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return metrics, audio


def child_engine(args: argparse.Namespace) -> dict[str, Any]:
    """One engine configuration in this (fresh) process: load, a warm-up synthesis, time."""
    from wyoming_kazeia.engine import Engine
    from wyoming_kazeia.settings import EngineSettings

    settings = EngineSettings(
        threads=args.threads,
        decoder_threads=args.decoder_threads,
        stream_chunk=args.chunk,
        decoder_subprocess=args.subprocess,
        seed=args.seed,
        max_frames=args.frames,
    )
    rss_start = status_mb("VmRSS")
    start = time.perf_counter()
    engine = Engine(args.model_dir, settings)
    load_s = time.perf_counter() - start
    rss_load = status_mb("VmRSS")

    # The warm-up runs the kazeia-decoder subprocess under PEAK_RSS_WRAPPER (its peak RSS; not
    # RUSAGE_CHILDREN of this process: Linux counts a forked child's pre-exec copy of the parent
    # in it); the timed runs use the plain command.
    decoder_peak_mb = 0.0
    with tempfile.TemporaryDirectory(prefix="kazeia-bench-") as tmp:
        peak_file = Path(tmp) / "peak_kb"
        command = list(engine.decoder_command)
        if args.subprocess:
            engine.decoder_command = [
                sys.executable,
                "-c",
                PEAK_RSS_WRAPPER,
                str(peak_file),
                *command,
            ]
        cold, _ = _synthesis_run(engine, args)
        engine.decoder_command = command
        if peak_file.is_file():
            decoder_peak_mb = max(int(x) for x in peak_file.read_text().split()) / 1024.0
    logger.info("warm-up: first audio %.0f ms, total %.2f s", 1e3 * cold["ttfa_s"], cold["total_s"])
    runs: list[dict[str, float]] = []
    audios: list[np.ndarray] = []
    for i in range(args.repeats):
        metrics, audio = _synthesis_run(engine, args)
        runs.append(metrics)
        audios.append(audio)
        logger.info(
            "run %d/%d: %d frames, %d chunks, first audio %.0f ms, total %.2f s (decoder %.2f, "
            "talker %.2f, code predictor %.2f)",
            i + 1,
            args.repeats,
            metrics["n_frames"],
            metrics["n_chunks"],
            1e3 * metrics["ttfa_s"],
            metrics["total_s"],
            metrics["decoder_s"],
            metrics["talker_s"],
            metrics["predictor_s"],
        )
    np.save(args.out, audios[-1])
    result: dict[str, Any] = {
        k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("n_frames", "rtf")
    }
    child_peak = decoder_peak_mb
    peak = status_mb("VmHWM")
    result.update(
        rtf=result["total_s"] / result["audio_s"] if result["audio_s"] else float("nan"),
        n_frames=min(int(r["n_frames"]) for r in runs),
        n_chunks=int(result["n_chunks"]),
        cold_ttfa_s=cold["ttfa_s"],
        cold_total_s=cold["total_s"],
        cold_first_chunk_wall_s=cold["first_chunk_wall_s"],
        same_audio_every_run=all(
            a.shape == audios[0].shape and bool(np.array_equal(a, audios[0])) for a in audios
        ),
        runs=runs,
        chunk=args.chunk,
        decoder_subprocess=args.subprocess,
        threads=args.threads,
        decoder_threads=args.decoder_threads,
        load_s=load_s,
        rss_start_mb=rss_start,
        rss_load_mb=rss_load,
        rss_end_mb=status_mb("VmRSS"),
        peak_rss_mb=peak,
        decoder_subprocess_peak_rss_mb=child_peak,
        engine_peak_rss_mb=peak + child_peak,
    )
    return result


CHILDREN: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "decoder": child_decoder,
    "generate": child_generate,
    "engine": child_engine,
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
    p = sub.add_parser("generate")
    p.add_argument("gguf", type=Path)
    p.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--mode", choices=("stream", "nonstream"), default="stream")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speaker", default="vivian")
    p.add_argument("--language", default="english")
    p = sub.add_parser("engine")
    p.add_argument("model_dir", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decoder-threads", type=int, default=2)
    p.add_argument("--chunk", type=int, default=4, help="stream_chunk (0: decode at the end)")
    p.add_argument("--subprocess", action="store_true", help="decoder_subprocess=True")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", default=GEN_SENTENCE)
    p.add_argument("--speaker", default="vivian")
    p.add_argument("--language", default="english")
    p.add_argument("--out", type=Path, required=True, help="npy file: the last run's audio")
    args = parser.parse_args(argv)
    _setup_logging()
    result = CHILDREN[args.child](args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


# --------------------------------------------------------------------------- main

PARSERS: tuple[Callable[[Any], None], ...] = (
    add_decoder_parser,
    add_generate_parser,
    add_engine_parser,
)


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
    from .bench_server import add_server_parser  # it builds on this module's helpers

    for add in (*PARSERS, add_server_parser):
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
