"""``script/bench engine``: the streaming engine, unloaded and beside competing load."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from wyoming_kazeia.settings import PARTS, EngineSettings

from ..reference.official_decoder import status_mb  # the one /proc reader (stdlib only)
from .common import (
    CHILD_BOOT,
    GEN_SENTENCE,
    BenchError,
    decoder_facts,
    default_cache_dir,
    ensure_checkpoint,
    ensure_decoder,
    ensure_model,
    ensure_talker,
    fmt,
    frame_seconds,
    loadavg,
    logger,
    machine_info,
    machine_line,
    max_abs_diff,
    ok,
    parse_chunks,
    print_result,
    run_json_child,
    usable_cpus,
    warn_if_busy,
)
from .peers import VOX_VERSION, vox_rows
from .targets import ENGINE_TARGETS_BY_MODEL, TARGETS

T = TARGETS["engine"]  # this bench's targets (0.6B q8_0; see engine_targets)
# --------------------------------------------------------------------------- engine bench

# The tokenizer files and config.json the engine reads from its model folder (beside the GGUFs).
ENGINE_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json")
ENGINE_FILES = ("talker.gguf", "decoder.gguf", *ENGINE_TOKENIZER_FILES)
ENGINE_TALKER_TYPE = "q8_0"
ENGINE_CHUNKS = "1,4,8"
# The cloned-voice rows: streaming chunk, the reference recording's transcript.
VOICE_CHUNK = 4
PLACED = "placed"  # the row with parts on --talker-, --predictor-, --decoder-backend devices
# The placed row's ratios to the CPU's; generator_s: talker, code predictor and whole frames
PLACED_KEYS = ("total_s", "ttfa_s", "decoder_s", "generator_s")
GENERATOR_KEYS = ("talker_s", "predictor_s", "frame_graph_s")
REF_TEXT = "Good morning, my dear. Did you sleep well last night?"


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


def add_parser(subparsers: Any) -> None:
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
        "{cache dir}/e-SIZE-TYPE, links to the cached random checkpoint of --size, its --type "
        "talker and the decoder converted at that type)",
    )
    p.add_argument(
        "--size", choices=("0.6b", "1.7b"), default="0.6b", help="the random model (default 0.6b)"
    )
    p.add_argument(
        "--type",
        choices=("q8_0", "q4_k", "f16", "f32"),
        default=ENGINE_TALKER_TYPE,
        help=f"the talker's weight type (default {ENGINE_TALKER_TYPE})",
    )
    p.add_argument("--cache-dir", type=Path, help="default: .bench/ in the repository root")
    defaults = EngineSettings()
    p.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help=f"generator threads (default {defaults.threads}, the service's)",
    )
    p.add_argument(
        "--decoder-threads",
        type=int,
        default=defaults.decoder_threads,
        help=f"decoder threads (default {defaults.decoder_threads}, the service's)",
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
    p.add_argument(
        "--voices",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the cloned-voice rows on a random 0.6b Base model (x-vector, in context, "
        "and in context with the CustomVoice model loaded beside; default on)",
    )
    p.add_argument(
        "--ref-seconds",
        type=float,
        default=6.0,
        help="length of the cloned voice's reference recording (default 6)",
    )
    p.add_argument(
        "--long-frames",
        type=int,
        default=0,
        help="also a row of one synthesis this long (e.g. 1500 = 2 min): its cost per frame "
        "against the k=4 row's, and its peak RSS against the K/V cache it needs (default: none)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help=f"also vox-tts {VOX_VERSION} (PyPI; installed under build/peers/, its model made by "
        "its own converter from the same random checkpoint), one row per --chunks value with "
        "the same text, speaker, seed, frames and threads, and the ratios to ours",
    )
    for part, what in zip(PARTS, ("talker", "code predictor", "speech decoder"), strict=True):
        p.add_argument(
            f"--{part}-backend",
            metavar="DEVICE",
            help=f"also a stream k={VOICE_CHUNK} row with the {what} on this device (vulkan[:N], "
            "cuda[:N], auto; a ggml built with it: script/setup --backend vulkan|cuda), beside "
            "the CPU rows, with its ratios to the CPU row (default: no such row)",
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
    talker = ensure_talker(cache_dir, size, talker_type)  # (made again when outdated)
    if (folder / "decoder.gguf").resolve() != decoder.resolve():
        shutil.rmtree(folder, ignore_errors=True)  # built by an older bench: another decoder
    if all((folder / name).is_file() for name in ENGINE_FILES):
        logger.info("reusing %s", folder)
        return folder
    sources = {"talker.gguf": talker, "decoder.gguf": decoder}
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


def engine_row_cmd(
    args: argparse.Namespace,
    model_dir: Path,
    chunk: int,
    subproc: bool,
    repeats: int,
    out: Path,
    clone: tuple[str, Path | None] | None = None,
    placement: tuple[str, ...] | None = None,
) -> list[str]:
    cmd = [
        sys.executable,
        "-c",
        CHILD_BOOT,
        "engine",
        str(model_dir),
        "--warmup-frames",
        str(min(args.frames, 40)),
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
    if placement is not None:
        for part, device in zip(PARTS, placement, strict=True):
            cmd += [f"--{part}-backend", device]
    if clone is not None:
        cmd += ["--clone", clone[0], "--ref-seconds", str(args.ref_seconds)]
        if clone[1] is not None:
            cmd += ["--also-load", str(clone[1])]
    return cmd


def _label(name: str) -> str:
    if name == "oneshot":
        return "one-shot (chunk 0)"
    if name == "subprocess":
        return f"subprocess decoder (k={VOICE_CHUNK})"
    if name == "clone_xvec":
        return f"cloned voice, x-vector (k={VOICE_CHUNK})"
    if name == "clone_icl":
        return f"cloned voice, in context (k={VOICE_CHUNK})"
    if name == "clone_icl_both":
        return "cloned voice, in context, CustomVoice loaded too"
    if name == PLACED:
        return f"stream k={VOICE_CHUNK}, placed on the devices below"
    return f"stream k={name.removeprefix('stream_k')}"


def weights_read_per_frame(talker_gguf: Path) -> dict[str, float]:
    """MB of weights a frame reads: the talker step (its layers, final norm and codec head) and
    the code predictor's 15 sub-steps (its layers and norm each time, one of its heads, and its
    input projection where the model has one). Embedding rows are negligible."""
    import gguf

    reader = gguf.GGUFReader(talker_gguf)
    size = {t.name: int(t.n_bytes) for t in reader.tensors}
    talker = sum(
        n for name, n in size.items() if name.startswith(("tlk.blk.", "tlk.norm", "tlk.codec_head"))
    )
    steps = 15
    stack = sum(
        n for name, n in size.items() if name.startswith(("cp.blk.", "cp.norm", "cp.in_proj"))
    )
    predictor = steps * stack + size.get("cp.heads.weight", 0)  # each sub-step one of 15 heads
    return {"talker_mb": talker / 1e6, "predictor_mb": predictor / 1e6}


def engine_targets(size: str, talker_type: str) -> dict[str, float]:
    """The targets of a model: TARGETS["engine"] (0.6B q8_0) with those of other sizes and
    weight types over it."""
    return {**T, **ENGINE_TARGETS_BY_MODEL.get((size, talker_type), {})}


def bench_engine(args: argparse.Namespace) -> int:
    """The ``engine`` bench: fresh-process rows (one-shot, streaming, subprocess decoder), then
    the same rows beside a competing load."""
    t = engine_targets(args.size, args.type)
    if min(args.threads, args.decoder_threads, args.repeats, args.load_repeats) < 1:
        raise BenchError("--threads, --decoder-threads, --repeats, --load-repeats must be >= 1")
    if args.frames < 1 or args.load_procs < 1:
        raise BenchError("--frames and --load-procs must be >= 1")
    chunks = parse_chunks(args.chunks)
    most = EngineSettings.bounds("stream_chunk").high
    if most is not None and max(chunks) > most:
        raise BenchError(f"--chunks: stream_chunk is at most {most:g}")
    machine = machine_info()
    warn_if_busy(machine)
    cache_dir = args.cache_dir or default_cache_dir()
    if args.model_dir is not None:
        model_dir = args.model_dir
        missing = [name for name in ENGINE_FILES if not (model_dir / name).is_file()]
        if missing:
            raise BenchError(f"{model_dir} lacks {', '.join(missing)}")
    else:
        model_dir = ensure_engine_dir(cache_dir, args.size, args.type)
    audio_s = args.frames * frame_seconds(decoder_facts(model_dir))

    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(args.threads)
    configs = (
        [("oneshot", 0, False)]
        + [(f"stream_k{k}", k, False) for k in chunks]
        + [("subprocess", VOICE_CHUNK, True)]
    )
    # Cloned voices: the Base model's own rows (its audio is another voice's: not compared).
    clones: dict[str, tuple[str, Path | None]] = {}
    base_dir = None
    if args.voices:
        base_dir = ensure_model(cache_dir, args.size, args.type, variant="base")
        clones = {
            "clone_xvec": ("xvec", None),
            "clone_icl": ("icl", None),
            "clone_icl_both": ("icl", model_dir),
        }
    rows: dict[str, dict[str, Any]] = {}
    loaded: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kazeia-bench-") as tmp_name:
        tmp = Path(tmp_name)
        audio: dict[str, np.ndarray] = {}
        for name, chunk, subproc in configs:
            out = tmp / f"{name}.npy"
            cmd = engine_row_cmd(args, model_dir, chunk, subproc, args.repeats, out)
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
        placed: dict[str, Any] | None = None
        placement = tuple(getattr(args, f"{part}_backend") or "cpu" for part in PARTS)
        if any(device != "cpu" for device in placement):
            out = tmp / "placed.npy"
            cmd = engine_row_cmd(
                args, model_dir, VOICE_CHUNK, False, args.repeats, out, placement=placement
            )
            placed = run_json_child(cmd, f"engine {_label(PLACED)}", env)
            cpu_row = rows[f"stream_k{VOICE_CHUNK}"] if VOICE_CHUNK in chunks else None
            for row in (placed, cpu_row or {}):
                row["generator_s"] = sum(row.get(k, 0.0) for k in GENERATOR_KEYS)
            if cpu_row is not None:
                placed["vs_cpu"] = {
                    key: placed[key] / cpu_row[key] for key in PLACED_KEYS if cpu_row[key] > 0
                }
            logger.info(
                "%s (%s): total %.2f s, RTF %.2f, first audio %.0f ms",
                _label(PLACED),
                placed["devices"],
                placed["total_s"],
                placed["rtf"],
                1e3 * placed["ttfa_s"],
            )
        long_row: dict[str, Any] | None = None
        if args.long_frames > 0:
            out = tmp / "long.npy"
            long_args = argparse.Namespace(**{**vars(args), "frames": args.long_frames})
            cmd = engine_row_cmd(long_args, model_dir, VOICE_CHUNK, False, 1, out)
            long_row = run_json_child(cmd, f"engine {args.long_frames} frames", env)
            long_row["audio_samples"] = int(np.load(out).size)
            logger.info(
                "%d frames: total %.1f s, RTF %.2f, peak RSS %.0f MB",
                args.long_frames,
                long_row["total_s"],
                long_row["rtf"],
                long_row["peak_rss_mb"],
            )
        voice_rows: dict[str, dict[str, Any]] = {}
        for name, clone in clones.items():
            assert base_dir is not None
            out = tmp / f"{name}.npy"
            cmd = engine_row_cmd(args, base_dir, VOICE_CHUNK, False, args.repeats, out, clone)
            row = run_json_child(cmd, f"engine {_label(name)}", env)
            row["audio_samples"] = int(np.load(out).size)
            voice_rows[name] = row
            logger.info(
                "%s: prompt %.2f s, RTF %.2f, first audio %.0f ms, peak RSS %.0f MB",
                _label(name),
                row["prompt_s"],
                row["rtf"],
                1e3 * row["ttfa_s"],
                row["peak_rss_mb"],
            )
        peer_rows: dict[str, dict[str, Any]] = {}
        if args.peers:
            checkpoint = ensure_checkpoint(cache_dir, args.size)
            peer_rows = vox_rows(args, cache_dir, checkpoint, chunks, env)
            for k in chunks:
                ours, peer = rows[f"stream_k{k}"], peer_rows[f"vox_k{k}"]
                peer["ours_vs_peer"] = {
                    "rtf": ours["rtf"] / peer["rtf"],
                    "ttfa": ours["ttfa_s"] / peer["ttfa_s"],
                    "peak_rss": ours["engine_peak_rss_mb"] / peer["peak_rss_mb"],
                }
        if args.load:
            for name, chunk, subproc in configs:
                out = tmp / f"{name}-loaded.npy"
                cmd = engine_row_cmd(args, model_dir, chunk, subproc, args.load_repeats, out)
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
    machine["loadavg_at_end"] = loadavg()
    # The memory floor of a frame: its weights at the read bandwidth measured now (the box's
    # bandwidth moves with its other tenants).
    from wyoming_kazeia import _native

    floor: dict[str, float] = weights_read_per_frame(model_dir / "talker.gguf")
    bandwidth_threads = min(args.threads, usable_cpus())  # a thread per core reads fastest
    floor["read_gb_s"] = _native.testing.read_bandwidth(256, bandwidth_threads)
    for part in ("talker", "predictor"):
        floor[f"{part}_floor_ms"] = floor[f"{part}_mb"] / floor["read_gb_s"]

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
        "ttfa_ms_max": t["ttfa_ms"],
        "ttfa_ok": {n: 1e3 * rows[n]["ttfa_s"] <= t["ttfa_ms"] for n in stream_names},
        "stream_ratio_max": t["stream_ratio"],
        "stream_ratio_ok": {n: rows[n]["vs_oneshot"] <= t["stream_ratio"] for n in stream_names},
        "rtf_max": t["rtf"],
        "rtf_ok": {n: r["rtf"] <= t["rtf"] for n, r in rows.items()},
        "rss_mb_max": t["peak_rss_mb"],
        "rss_ok": {n: r["engine_peak_rss_mb"] <= t["peak_rss_mb"] for n, r in rows.items()},
        "slowdown_max": t["load_slowdown"],
        "slowdown_ok": {
            n: "failed" not in r and r["slowdown"] <= t["load_slowdown"] for n, r in loaded.items()
        },
        "clone_ttfa_ms_max": t["clone_ttfa_ms"],
        "clone_ttfa_ok": {
            n: 1e3 * r["ttfa_s"] <= t["clone_ttfa_ms"] for n, r in voice_rows.items()
        },
    }
    builtin = rows.get(f"stream_k{VOICE_CHUNK}")
    if long_row is not None and builtin is not None:
        per_frame = long_row["total_s"] / long_row["n_frames"]
        long_row["ms_per_frame"] = 1e3 * per_frame
        long_row["ms_per_frame_short"] = 1e3 * builtin["total_s"] / builtin["n_frames"]
        long_row["cost_ratio"] = per_frame / (builtin["total_s"] / builtin["n_frames"])
        long_row["rss_growth_mb"] = long_row["peak_rss_mb"] - builtin["peak_rss_mb"]
        # The int16 audio this bench's consumer keeps, twice at its end (its chunks and their
        # concatenation); the engine hands each chunk over.
        long_row["audio_mb"] = (
            2 * 2 * (long_row["audio_samples"] - builtin["audio_samples"]) / 2**20
            if "audio_samples" in long_row and "audio_samples" in builtin
            else 0.0
        )
        long_row["kv_cache_mb"] = (
            long_row["kv_bytes_per_frame"] * (long_row["n_frames"] - builtin["n_frames"]) / 2**20
        )
        targets["long_ratio_max"] = t["long_ratio"]
        targets["long_ok"] = {
            "cost": long_row["cost_ratio"] <= t["long_ratio"],
            "rss": long_row["rss_growth_mb"] <= long_row["kv_cache_mb"] + long_row["audio_mb"],
        }
    for row in voice_rows.values():
        if builtin is not None:
            row["ttfa_vs_builtin"] = row["ttfa_s"] / builtin["ttfa_s"]
            row["rtf_vs_builtin"] = row["rtf"] / builtin["rtf"]
    result = {
        "bench": "engine",
        "machine": machine,
        "config": {
            "model_dir": str(model_dir),
            "talker": str((model_dir / "talker.gguf").resolve()),
            "talker_mb": (model_dir / "talker.gguf").stat().st_size / 1e6,
            "decoder": str((model_dir / "decoder.gguf").resolve()),
            "decoder_mb": (model_dir / "decoder.gguf").stat().st_size / 1e6,
            "size": args.size,
            "type": args.type,
            "target_values": t,
            "threads": args.threads,
            "decoder_threads": args.decoder_threads,
            "bandwidth_threads": bandwidth_threads,
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
        "voice_rows": voice_rows,
        "long_row": long_row,
        "placed_row": placed,
        "memory_floor": floor,
        "base_model_dir": None if base_dir is None else str(base_dir),
        "loaded_rows": loaded,
        "targets": targets,
        "peer_rows": peer_rows,
    }
    return print_result(result, engine_table, args.json)


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
    t = c.get("target_values", T)

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
            target.append(f"TTFA <= {t['ttfa_ms']:.0f}: {ok(tg['ttfa_ok'][name])}")
        if name in tg["stream_ratio_ok"]:
            target.append(f"<= {t['stream_ratio']:.2f}x: {ok(tg['stream_ratio_ok'][name])}")
        target.append(f"RTF <= {t['rtf']}: {ok(tg['rtf_ok'][name])}")
        target.append(f"RSS <= {t['peak_rss_mb']:.0f}: {ok(tg['rss_ok'][name])}")
        lines.append(f"| {label(name, row)} {cells(row)}| {'; '.join(target)} |")

    floor = result.get("memory_floor")
    alone = (rows.get("subprocess") or {}).get("generator_alone")
    if floor is not None and alone is not None:
        lines += [
            "",
            f"Memory floor per frame (the generator alone, in the subprocess-decoder row's "
            f"process after its runs): talker {alone['talker_ms']:.1f} ms/frame for "
            f"{floor['talker_mb']:.0f} MB of weights (floor {floor['talker_floor_ms']:.1f} ms), "
            f"code predictor {alone['predictor_ms']:.1f} ms/frame for "
            f"{floor['predictor_mb']:.0f} MB (floor {floor['predictor_floor_ms']:.1f} ms), at the "
            f"{floor['read_gb_s']:.1f} GB/s read bandwidth measured after the rows "
            f"({c['bandwidth_threads']} threads)",
        ]

    long_row = result.get("long_row")
    if long_row is not None and "cost_ratio" in long_row:
        ok_long = tg["long_ok"]
        lines += [
            "",
            f"Long synthesis (stream k={VOICE_CHUNK}, one run after a 40-frame warm-up): "
            f"{long_row['n_frames']} frames in {long_row['total_s']:.1f} s, "
            f"{long_row['ms_per_frame']:.1f} ms/frame against {long_row['ms_per_frame_short']:.1f} "
            f"for {c['frames']} frames = {long_row['cost_ratio']:.2f}x (target <= "
            f"{t['long_ratio']:.2f}x: {ok(ok_long['cost'])}); peak RSS "
            f"{long_row['peak_rss_mb']:.0f} MB, +{long_row['rss_growth_mb']:.0f} MB for a K/V "
            "cache of "
            f"{long_row['kv_cache_mb']:.0f} MB and {long_row.get('audio_mb', 0.0):.1f} MB of audio "
            f"the bench's consumer keeps (target: no more: {ok(ok_long['rss'])})",
        ]

    placed = result.get("placed_row")
    if placed is not None:
        devices, vs = placed["devices"], placed.get("vs_cpu") or {}
        frames = placed["n_frames"]
        lines += [
            "",
            f"Placed on a device: talker on {devices['talker']}, code predictor on "
            f"{devices['predictor']}, decoder on {devices['decoder']} (stream k={VOICE_CHUNK}, "
            f"the CPU row beside it in the table above):",
            "",
            "| row | total s | RTF | TTFA ms (cold) | decoder s | talker s | predictor s "
            "| whole frames s | computations per frame (predictor's) "
            "| vs CPU total / TTFA / decoder / generator |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            f"| {_label(PLACED)} | {placed['total_s']:.2f} | {placed['rtf']:.2f} "
            f"| {1e3 * placed['ttfa_s']:.0f} ({1e3 * placed['cold_ttfa_s']:.0f}) "
            f"| {placed['decoder_s']:.2f} | {placed['talker_s']:.2f} | {placed['predictor_s']:.2f} "
            f"| {placed['frame_graph_s']:.2f} | {placed['computations'] / frames:.1f} "
            f"({placed['predictor_computations'] / frames:.1f}) | "
            + " / ".join(fmt(vs.get(k), ".2f", "x") for k in PLACED_KEYS)
            + " |",
        ]
        whole = placed.get("whole_frames")
        if whole is not None:
            every_run = whole["whole_ms_runs"] + whole["apart_ms_runs"]
            spread, runs = max(every_run) / min(every_run), len(whole["whole_ms_runs"])
            lines += [
                "",
                f"Frames computed whole on {devices['talker']} vs apart (the generator alone, "
                f"{whole['frames']} frames after the first, medians of {runs} "
                f"runs of each, alternating; max/min of all runs {spread:.2f}): whole "
                f"{whole['whole_ms']:.1f} ms a frame in {whole['whole_computations']:.0f} "
                f"computation(s), apart {whole['apart_ms']:.1f} ms in "
                f"{whole['apart_computations']:.0f}: {whole['whole_ms'] / whole['apart_ms']:.2f}x; "
                f"the same codes: {'yes' if whole['same_codes'] else 'NO'}",
            ]

    voice_rows = result.get("voice_rows") or {}
    if voice_rows:
        lines += [
            "",
            f"Cloned voices on {result['base_model_dir']} (the same threads, frames and text; "
            f"a {voice_rows[next(iter(voice_rows))]['ref_seconds']:.0f} s reference recording; "
            "its prompt made once, then the warm-up and the timed runs):",
            "",
            "| row | prompt s | TTFA ms (cold) | vs built-in k=4 | RTF | vs built-in | peak RSS MB "
            "| target |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, row in voice_rows.items():
            lines.append(
                f"| {_label(name)} | {row['prompt_s']:.2f} | {1e3 * row['ttfa_s']:.0f} "
                f"({1e3 * row['cold_ttfa_s']:.0f}) | {fmt(row.get('ttfa_vs_builtin'), '.2f', 'x')} "
                f"| {row['rtf']:.2f} | {fmt(row.get('rtf_vs_builtin'), '.2f', 'x')} "
                f"| {row['peak_rss_mb']:.0f} | TTFA <= {t['clone_ttfa_ms']:.0f}: "
                f"{ok(tg['clone_ttfa_ok'][name])} |"
            )

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
                    f"| slowdown <= {t['load_slowdown']}x: MISSED |"
                )
                continue
            share = row["load"].get("cpu_share")
            lines.append(
                f"| {label(name, row)} {cells(row)}"
                f"| {row['slowdown']:.2f}x ({row['ttfa_slowdown']:.2f}x) "
                f"| {fmt(None if share is None else 100 * share, '.0f', '%')} "
                f"| slowdown <= {t['load_slowdown']}x: {ok(tg['slowdown_ok'][name])} |"
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
        f"first audio <= {t['ttfa_ms']:.0f} ms: {_verdict(tg['ttfa_ok'])}",
        f"streaming total <= {t['stream_ratio']:.2f}x one-shot: {_verdict(tg['stream_ratio_ok'])}",
        f"end-to-end RTF <= {t['rtf']}: {_verdict(tg['rtf_ok'])}",
        f"peak RSS <= {t['peak_rss_mb']:.0f} MB at {c['type']}: {_verdict(tg['rss_ok'])}",
    ]
    if c["load"]:
        parts.append(
            f"slowdown beside a {c['load_procs']}-process load <= {t['load_slowdown']}x: "
            f"{_verdict(tg['slowdown_ok'])}"
        )
    lines.append("Targets (2-core AVX2 box): " + "; ".join(parts))
    lines += peer_lines(result)
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


def peer_lines(result: dict[str, Any]) -> list[str]:
    """The peers' table (``--peers``): each vox row beside our streaming row of that chunk."""
    peers = result.get("peer_rows") or {}
    if not peers:
        return ["Peers: not in this run (--peers measures vox-tts in the same run)"]
    c, rows = result["config"], result["rows"]
    first = next(iter(peers.values()))
    lines = [
        "",
        f"Peers in the same run: vox-tts {VOX_VERSION} on {first['model']} "
        f"({first['model_mb']:.0f} MB, built by its converter from the same checkpoint), "
        f"device cpu, {first['threads']} threads (the box's cores), the same text, speaker, seed "
        "and frames; a warm-up, "
        f"then {c['repeats']} timed per row (medians); ours = our stream row of the same chunk:",
        "",
        "| row | total s | RTF | TTFA ms (cold) | peak RSS MB | ours: RTF | ours: TTFA "
        "| ours: peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in peers.values():
        ours = rows[f"stream_k{row['chunk']}"]
        r = row["ours_vs_peer"]
        lines.append(
            f"| vox, {row['chunk']}-frame chunks | {row['total_s']:.2f} | {row['rtf']:.2f} "
            f"| {1e3 * row['ttfa_s']:.0f} ({1e3 * row['cold_ttfa_s']:.0f}) "
            f"| {row['peak_rss_mb']:.0f} | {ours['rtf']:.2f} ({r['rtf']:.2f}x) "
            f"| {1e3 * ours['ttfa_s']:.0f} ({r['ttfa']:.2f}x) "
            f"| {ours['engine_peak_rss_mb']:.0f} ({r['peak_rss']:.2f}x) |"
        )
    lines.append("(ours: our figure and ours / vox's: below 1x, ours is faster or smaller)")
    return lines


PEAK_RSS_WRAPPER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "p.returncode = os.waitstatus_to_exitcode(status)\n"
    "with open(sys.argv[1], 'a', encoding='ascii') as f:\n"
    "    f.write(f'{usage.ru_maxrss}\\n')\n"
    "sys.exit(p.returncode if p.returncode >= 0 else 1)\n"
)


def _synthesis_run(
    engine: Any, args: argparse.Namespace, voice: Any = None, **overrides: Any
) -> tuple[dict[str, float], np.ndarray]:
    """One synthesis, consumed as a caller would; returns (metrics, int16 audio)."""
    t0 = time.perf_counter()
    if voice is None:
        s = engine.synthesize(args.text, speaker=args.speaker, language=args.language, **overrides)
    else:
        s = engine.synthesize(args.text, language=args.language, voice=voice, **overrides)
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
        talker_backend=args.talker_backend,
        predictor_backend=args.predictor_backend,
        decoder_backend=args.decoder_backend,
    )
    rss_start = status_mb("VmRSS")
    start = time.perf_counter()
    beside = Engine(args.also_load, settings) if args.also_load else None
    engine = Engine(args.model_dir, settings)
    load_s = time.perf_counter() - start
    rss_load = status_mb("VmRSS")
    voice, prompt_s = None, 0.0
    if args.clone:
        from ..reference.make_reference import reference_audio

        recording = reference_audio(args.ref_seconds, 24000, 7)
        start = time.perf_counter()
        voice = engine.clone_prompt(recording, 24000, REF_TEXT if args.clone == "icl" else None)
        engine.prepare_voice(voice)
        prompt_s = time.perf_counter() - start
        logger.info("voice prompt: %.2f s", prompt_s)
    if beside is not None:  # its warm-up: its pages resident, as in a server
        _synthesis_run(beside, args)

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
        warm = {"max_frames": args.warmup_frames} if args.warmup_frames else {}
        cold, _ = _synthesis_run(engine, args, voice, **warm)
        engine.decoder_command = command
        if peak_file.is_file():
            decoder_peak_mb = max(int(x) for x in peak_file.read_text().split()) / 1024.0
    logger.info("warm-up: first audio %.0f ms, total %.2f s", 1e3 * cold["ttfa_s"], cold["total_s"])
    runs: list[dict[str, float]] = []
    audios: list[np.ndarray] = []
    for i in range(args.repeats):
        metrics, audio = _synthesis_run(engine, args, voice)
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
    # The memory-floor line's figures: the generator with nothing decoding beside it (in the
    # subprocess row, whose process holds no decoder).
    alone = _generator_alone(engine, args) if args.subprocess and voice is None else None
    devices = engine.devices
    shared_gpu = devices["talker"] == devices["predictor"] != "cpu"
    whole = _whole_vs_apart(engine, args) if shared_gpu and voice is None else None
    result: dict[str, Any] = {
        k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("n_frames", "rtf")
    }
    child_peak = decoder_peak_mb
    peak = status_mb("VmHWM")
    result.update(
        rtf=result["total_s"] / result["audio_s"] if result["audio_s"] else float("nan"),
        n_frames=min(int(r["n_frames"]) for r in runs),
        n_chunks=int(result["n_chunks"]),
        devices=dict(engine.devices),
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
        prompt_s=prompt_s,
        ref_seconds=args.ref_seconds if args.clone else 0.0,
        kv_bytes_per_frame=_kv_bytes_per_position(engine.generator.hparams),
        generator_alone=alone,
        whole_frames=whole,
    )
    return result


def _generator_alone(engine: Any, args: argparse.Namespace) -> dict[str, float]:
    """Talker and code-predictor ms per frame of the row's text with no decoder running,
    medians over the row's repeats."""
    ids = np.asarray(engine.tokenizer.prompt_ids(args.text))
    talker, predictor = [], []
    for _ in range(args.repeats):
        it = engine.generator.frames(
            ids, args.speaker, args.language, seed=args.seed, max_frames=args.frames
        )
        frames = sum(1 for _ in it)
        stats = it.stats
        it.close()
        talker.append(stats["talker_ms"] / max(frames, 1))
        predictor.append(stats["predictor_ms"] / max(frames, 1))
    return {"talker_ms": statistics.median(talker), "predictor_ms": statistics.median(predictor)}


WHOLE_FRAMES_COMPARED = 16  # frames after the first, per run of each mode


def _whole_vs_apart(engine: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The generator alone with its talker and code predictor on one GPU: ms and graph
    computations per frame after the first (the prefill's), each frame computed whole in one
    graph, and apart (the talker's step and code 0, then the code predictor's frame graph),
    medians over the row's repeats, alternating; and whether both drew the same codes."""
    ids = np.asarray(engine.tokenizer.prompt_ids(args.text))
    frames = min(args.frames, WHOLE_FRAMES_COMPARED + 1)
    per_frame: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    codes: dict[bool, np.ndarray] = {}
    for _ in range(args.repeats):
        for whole in (True, False):
            it = engine.generator.frames(
                ids,
                args.speaker,
                args.language,
                seed=args.seed,
                max_frames=frames,
                whole_frames=whole,
            )
            got = [next(it)]
            first, t0 = dict(it.stats), time.perf_counter()
            got += list(it)
            n = max(len(got) - 1, 1)
            ms = 1e3 * (time.perf_counter() - t0) / n
            per_frame[whole].append((ms, (it.stats["computations"] - first["computations"]) / n))
            codes[whole] = np.stack(got)
    same = bool(np.array_equal(codes[True], codes[False]))
    out: dict[str, Any] = {"frames": frames - 1, "same_codes": same}
    for whole, name in ((True, "whole"), (False, "apart")):
        out[f"{name}_ms"] = statistics.median(ms for ms, _ in per_frame[whole])
        out[f"{name}_ms_runs"] = [ms for ms, _ in per_frame[whole]]
        out[f"{name}_computations"] = statistics.median(c for _, c in per_frame[whole])
    return out


def _kv_bytes_per_position(hp: dict[str, Any]) -> int:
    """Bytes the talker's K/V cache (f32) holds per position."""
    kv_dim = int(hp["kazeia.talker.num_kv_heads"]) * int(hp["kazeia.talker.head_dim"])
    return int(hp["kazeia.talker.num_layers"]) * 2 * kv_dim * 4
