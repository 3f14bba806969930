"""Shared runner of the benches: machine facts, cached random models, fresh-process
children, report formatting."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from wyoming_kazeia import native
from wyoming_kazeia.settings import usable_cpus

logger = logging.getLogger("bench")

WARMUP_FRAMES = 4


RANDOM_CHECKPOINT = "kazeia_dev.random_checkpoint"
DEV_ROOT = Path(__file__).resolve().parents[2]  # dev/: on PYTHONPATH for every child
REPO_ROOT = DEV_ROOT.parent
REFERENCE_KIT = DEV_ROOT / "kazeia_dev" / "reference"  # scripts run by the reference Python
OFFICIAL_SCRIPT = REFERENCE_KIT / "official_decoder.py"

# The child (one measured configuration) runs as `python -c CHILD_BOOT ARGS...`, so that it never
# shows up among the public subcommands.
CHILD_BOOT = "import sys; from kazeia_dev.bench.child import child_main; sys.exit(child_main())"


def bf16_peak_note(precision: str) -> str:
    """After a decoder's share of the FP32 peak: where its bf16 products ran (this process's
    path: the bench's children take the same KAZEIA_KERNELS), whose own peak is not probed."""
    if precision != "bf16":
        return ""
    return (
        f"; its products are bf16, on {native.decoder_bf16_isa()} here, whose own peak is not "
        "probed: the share can pass 100%"
    )


def performed_note(compute: dict[str, Any], rate: float | None = None) -> str:
    """Where the decoder's kernels perform fewer multiply-adds than its layers' nominal count
    (the f32 residual convs in Winograd's form), how many, and the performed rate: of `rate`
    (nominal GFLOP/s) against the peak, else as a factor of the nominal rates."""
    performed = compute.get("performed_gflop_per_frame")
    if performed is None or performed >= compute["gflop_per_frame"]:
        return ""
    ratio = performed / compute["gflop_per_frame"]
    note = (
        f"; its kernels perform {performed:.2f} of the {compute['gflop_per_frame']:.2f} GFLOP "
        "(the residual convs in Winograd's form)"
    )
    if rate is None:
        return note + f": {ratio:.2f}x those rates"
    share = 100 * rate * ratio / compute["peak_gflop_s"]
    return note + f": {rate * ratio:.0f} GFLOP/s performed, {share:.0f}% of the peak"


class BenchError(RuntimeError):
    """A bench could not run (missing input, failed child process)."""


class BenchTimeout(BenchError):
    """A measuring child gave no result within its time and was killed."""


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


def loadavg() -> list[float]:
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
        f"ggml CPU build: {features}; our kernels: {m.get('kernel_isa', 'unknown')}; load "
        f"average {m['loadavg_at_start']} at start, "
        f"{m['loadavg_at_end']} at end"
    )


def warn_if_busy(machine: dict[str, Any]) -> None:
    load = machine["loadavg_at_start"]
    if load and load[0] > 0.5:
        logger.warning(
            "load average %.2f before the bench: if other work is running, timings will be noisy",
            load[0],
        )


# An FMA peak of n threads on n physical cores under this share of n times one thread's: most
# likely other work held a core through the probe's passes (or a CPU quota caps the process).
FMA_PEAK_SCALING_MIN = 0.6


# The buffer of the read probes the benches set beside the weights a frame or a push reads:
# larger than the last-level cache of any box measured, so that it comes from memory as they do.
READ_PROBE_MB = 256


def read_rates(passes: list[list[float]]) -> dict[str, float]:
    """A read probe's passes in GB/s (``_native.testing.read_bandwidth_passes``: one list for each
    way of reading) as the benches set them beside runs: the best pass, and the median pass of
    the way that gave it (the other way's passes ran at other moments). On a box whose
    bandwidth moves with its other tenants the best pass can catch a fast moment that a run of
    seconds does not get on average, where the median pass is nearer; a vCPU the host gives away
    for part of the probe lowers the median, not the best. Where both ways reach the same best
    pass, the first way's median."""
    way = max(passes, key=max)
    return {"best": max(way), "median": statistics.median(way)}


def read_probe_threads(threads: int) -> int:
    """The threads of a read probe beside a stage of `threads` threads: one per usable CPU at
    most (a thread per core reads fastest)."""
    return min(threads, usable_cpus())


def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on (SMT siblings share one core's
    FMA pipes, which one thread of the probe already fills)."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(path.read_text().strip())
        except OSError:
            cores.add(str(cpu))  # no topology: count the CPU as a core
    return max(1, len(cores))


def fma_peak(threads: int) -> tuple[float, float]:
    """The FP32 multiply-add peak of `threads` threads and of one thread (GFLOP/s), measured
    now; a warning where the threads' did not scale from one thread's over the physical
    cores they can use, which makes the decoder's share of it read too high."""
    from wyoming_kazeia import _native

    peak = _native.testing.fma_peak(threads)
    one = _native.testing.fma_peak(1)
    cores = min(threads, physical_cores())
    if cores > 1 and peak < FMA_PEAK_SCALING_MIN * cores * one:
        logger.warning(
            "the FMA peak of %d threads on %d cores measured %.0f GFLOP/s against %.0f for one "
            "thread: most likely other work held a core meanwhile (or a CPU quota caps this "
            "process), and the decoder's share of the peak reads too high",
            threads,
            cores,
            peak,
            one,
        )
    return peak, one


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
    usable = usable_cpus()
    load = loadavg()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count() or 0,
        "usable_cpus": usable,
        "cpu_flags": [f.upper() for f in CPU_FLAGS if f in flags],
        "ggml_cpu_features": native.ggml_cpu_features(),
        "kernel_isa": native.KERNEL_ISA,
        "loadavg_at_start": load,
        "loadavg_at_end": [],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _variant_suffix(variant: str) -> str:
    return "" if variant == "custom_voice" else f"-{variant}"


def ensure_checkpoint(
    cache_dir: Path, size: str, seed: int = 0, variant: str = "custom_voice"
) -> Path:
    """The random checkpoint ``cache_dir / f"ck-{size}"`` (``ck-{size}-{variant}`` for a Base
    or VoiceDesign one; written once by ``kazeia_dev.random_checkpoint``, then reused)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    ckpt = cache_dir / f"ck-{size}{_variant_suffix(variant)}"
    if not (ckpt / "speech_tokenizer" / "config.json").is_file():
        _build_dir(
            ckpt,
            lambda out: [
                "-m",
                RANDOM_CHECKPOINT,
                str(out),
                "--size",
                size,
                "--seed",
                str(seed),
                "--variant",
                variant,
            ],  # fmt: skip
            f"random {size} {variant} checkpoint (seed {seed})",
        )
    else:
        logger.info("reusing %s", ckpt)
    return ckpt


def ensure_model(
    cache_dir: Path, size: str, out_type: str = "f32", seed: int = 0, variant: str = "custom_voice"
) -> Path:
    """A converted random checkpoint in ``cache_dir`` (created once, then reused).

    ``ck-SIZE`` is written by ``kazeia_dev.random_checkpoint`` and ``m-SIZE`` (f32) or
    ``m-SIZE-TYPE`` by ``wyoming_kazeia.convert``; both are built under a ``.tmp`` name and
    renamed when complete, so an interrupted run never leaves a half-written folder in use.
    Returns the converted folder; the checkpoint is ``cache_dir / f"ck-{size}"``. A Base or
    VoiceDesign variant's folders carry its name (``ck-SIZE-base``, ``m-SIZE-base-TYPE``).
    """
    name = f"m-{size}{_variant_suffix(variant)}"
    model = cache_dir / (name if out_type == "f32" else f"{name}-{out_type}")
    if not all(_current(model / f"{p}.gguf", p) for p in ("talker", "decoder")):
        shutil.rmtree(model, ignore_errors=True)  # written by an older build: made again
    if (model / "decoder.gguf").is_file():
        logger.info("reusing %s", model)
        return model
    ckpt = ensure_checkpoint(cache_dir, size, seed, variant)
    _build_dir(
        model,
        lambda out: ["-m", "wyoming_kazeia.convert", str(ckpt), str(out), "--type", out_type],
        f"{out_type} conversion of {ckpt.name}",
    )
    return model


# `python -c` program writing one part's GGUF: convert_part(PART, CHECKPOINT, OUT, TYPE).
CONVERT_PART = (
    "import logging, sys; from pathlib import Path; "
    "from wyoming_kazeia import convert; "
    "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s'); "
    "Path(sys.argv[3]).parent.mkdir(parents=True, exist_ok=True); "
    "convert.convert_part(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])"
)


def ensure_talker(cache_dir: Path, size: str, out_type: str, seed: int = 0) -> Path:
    """``cache_dir / f"t-{size}-{out_type}" / "talker.gguf"`` of the random checkpoint."""
    return _ensure_part(cache_dir, "talker", f"t-{size}-{out_type}", size, out_type, seed)


def ensure_decoder(cache_dir: Path, size: str, out_type: str, seed: int = 0) -> Path:
    """``cache_dir / f"d-{size}-{out_type}" / "decoder.gguf"`` of the random checkpoint (what
    the converter writes for ``--type out_type``: f16 GEMM matrices unless f32)."""
    return _ensure_part(cache_dir, "decoder", f"d-{size}-{out_type}", size, out_type, seed)


def _current(path: Path, part: str) -> bool:
    """False when `path` is a GGUF of `part` in another format version than this build reads
    (a cache from an older build); True when it is current or absent."""
    if not path.is_file():
        return True
    from wyoming_kazeia.convert import PARTS

    info = next(p for p in PARTS if p["name"] == part)
    import gguf

    reader = gguf.GGUFReader(path)
    field = reader.fields.get(info["format_version_key"])
    current = field is not None and int(field.contents()) == int(info["format_version"])
    if not current:
        logger.info("%s is of another format version: converting again", path)
    return current


def _ensure_part(
    cache_dir: Path, part: str, name: str, size: str, out_type: str, seed: int
) -> Path:
    """Only one part is converted (no other GGUF, no tokenizer files); the folder is built
    under a ``.tmp`` name and renamed when complete, then reused. Returns the part's GGUF."""
    folder = cache_dir / name
    gguf = folder / f"{part}.gguf"
    if not _current(gguf, part):
        shutil.rmtree(folder, ignore_errors=True)  # written by an older build: made again
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


# A full-size checkpoint or conversion takes minutes on 2 cores; an hour means it hangs.
BUILD_DIR_S = 3600


def blas_threads_env(threads: int) -> dict[str, str]:
    """This process's environment with numpy's BLAS (OpenMP, MKL, OpenBLAS) held to `threads`
    threads: a measured child or a load process beside it takes no more cores than asked."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    return env


def dev_child_env() -> dict[str, str]:
    """This process's environment with dev/ first on PYTHONPATH: a child started with
    ``-m kazeia_dev...`` imports it whether the caller is script/bench or pytest (whose
    ``pythonpath`` setting reaches only its own process)."""
    env = dict(os.environ)
    paths = [str(DEV_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _build_dir(target: Path, python_argv: Callable[[Path], list[str]], what: str) -> None:
    """Run ``python *python_argv(TMP)`` (``-m MODULE ...`` or ``-c CODE ...``), then rename TMP
    to ``target``."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    logger.info("writing the %s to %s (once) ...", what, target)
    start = time.monotonic()
    argv = python_argv(tmp)
    try:
        proc = subprocess.run(
            [sys.executable, *argv], stdout=sys.stderr, env=dev_child_env(), timeout=BUILD_DIR_S
        )
    except subprocess.TimeoutExpired as err:
        raise BenchError(f"writing the {what}: not done within {BUILD_DIR_S} s (killed)") from err
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
        raise BenchTimeout(f"{what}: no result within {timeout:.0f} s (child killed)") from err
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise BenchError(f"{what}: child process failed with exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def decoder_facts(path: Path) -> dict[str, Any]:
    """The speech decoder's hyper-parameters ({GGUF key: value}) of a decoder.gguf, a converted
    model folder, or a checkpoint (through the converter's table): sample rate, hop, codebooks
    always come from the model."""
    from wyoming_kazeia.convert import part_metadata
    from wyoming_kazeia.native import read_decoder_hparams

    if path.is_dir() and (path / "decoder.gguf").is_file():
        path = path / "decoder.gguf"
    if path.is_file():
        return read_decoder_hparams(str(path)).as_dict
    return {key: value for key, value, _ in part_metadata("decoder", path)}


def frame_seconds(facts: dict[str, Any]) -> float:
    """Seconds of audio per frame (80 ms for the 12 Hz models)."""
    return float(facts["kazeia.decoder.hop_length"] / facts["kazeia.decoder.sample_rate"])


def ok(flag: bool) -> str:
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


def snr_db(ref: np.ndarray, other: np.ndarray) -> float:
    """How far `other` lies below `ref`'s signal: 10 log10(sum ref^2 / sum (other - ref)^2) over
    the common length, in dB (higher is closer)."""
    n = min(ref.size, other.size)
    r = ref[:n].astype(np.float64)
    return float(10 * np.log10(np.sum(r**2) / np.sum((other[:n].astype(np.float64) - r) ** 2)))


# --------------------------------------------------------------------------- decoder bench


def print_result(
    result: dict[str, Any], table: Callable[[dict[str, Any]], str], as_json: bool
) -> int:
    """The bench's output on stdout: one JSON object, or the markdown table."""
    sys.stdout.write((json.dumps(result, indent=1) if as_json else table(result)) + "\n")
    return 0


def add_official_args(p: argparse.ArgumentParser, what: str, repeats: int) -> None:
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


def parse_chunks(text: str) -> list[int]:
    try:
        chunks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        chunks = []
    if not chunks or min(chunks) < 1:
        raise BenchError(f"--chunks must be positive integers, got {text!r}")
    return chunks


def official_child(
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


GEN_SENTENCE = "Hello, world! This is a test of the Qwen3 TTS engine."


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
