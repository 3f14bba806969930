"""``script/bench engine``: the streaming engine, unloaded and beside competing load.

Its command line and its run: the rows are measured in ``engine_runs`` (each in a fresh
``engine_child``, the loaded ones beside ``competing_load``), the figures derived from them in
``engine_figures``, vox-tts beside them in ``peers``, the markdown report in ``engine_report``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from wyoming_kazeia.settings import PARTS, QUANT_TYPES, EngineSettings

from .common import (
    GEN_SENTENCE,
    BenchError,
    blas_threads_env,
    decoder_facts,
    default_cache_dir,
    ensure_model,
    frame_seconds,
    loadavg,
    machine_info,
    parse_chunks,
    print_result,
    read_probe_threads,
    warn_if_busy,
)
from .competing_load import LOAD_PROGRAMS
from .engine_figures import (
    add_long_figures,
    add_row_ratios,
    add_voice_ratios,
    decoder_compute,
    engine_targets,
    memory_floor,
    target_verdicts,
)
from .engine_report import engine_table
from .engine_runs import (
    ENGINE_FILES,
    VOICE_CHUNK,
    Clone,
    RowRunner,
    clone_configs,
    compare_audio,
    ensure_engine_dir,
    row_configs,
    run_ideal_row,
    run_loaded_rows,
    run_long_row,
    run_placed_row,
    run_rows,
    run_voice_rows,
)
from .peers import VOX_VERSION, vox_rows_beside_ours

ENGINE_TALKER_TYPE = "q8_0"
ENGINE_CHUNKS = "1,4,8"


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
            "RSS; for each streaming row, a player at real time's underruns as the chunks come "
            "and through the service's prebuffer, and its hold. Then the same rows again "
            "beside --load-procs busy processes (--no-load to skip), each between two runs "
            "of the same row alone: slowdown loaded / alone, and last a program that never "
            "waits (one process per core) beside the same load, for reference. Prints a "
            "markdown table (or JSON with --json) on stdout."
        ),
    )
    add_model_options(p)
    add_synthesis_options(p)
    _add_run_options(p)
    _add_load_options(p)
    _add_row_options(p)
    p.set_defaults(func=bench_engine)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The model and the threads of every row (``engine_runs.engine_row_cmd`` reads them)."""
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
        choices=QUANT_TYPES,
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
        "--kv-cache-type",
        choices=EngineSettings.bounds("kv_cache_type").choices,
        default=defaults.kv_cache_type,
        help=f"the talker's K/V cache (default {defaults.kv_cache_type}, the service's)",
    )
    p.add_argument(
        "--decoder-precision",
        choices=EngineSettings.bounds("decoder_precision").choices,
        default=defaults.decoder_precision,
        help=f"the decoder's products (default {defaults.decoder_precision}, the service's)",
    )


def add_synthesis_options(p: argparse.ArgumentParser) -> None:
    """What every synthesis says, and how long it is (``engine_runs.engine_row_cmd`` reads
    them)."""
    p.add_argument(
        "--frames",
        type=int,
        default=40,
        help="max_frames of every synthesis, 80 ms each (default 40; random weights never emit "
        "eos, so every synthesis gives this many)",
    )
    p.add_argument("--text", default=GEN_SENTENCE, help="the sentence (default: ~10 words)")
    p.add_argument("--speaker", default="vivian", help="default vivian")
    p.add_argument("--language", default="english", help="default english")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of every synthesis")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """The syntheses of every row."""
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


def _add_load_options(p: argparse.ArgumentParser) -> None:
    """The competing load."""
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
        help="spin: a pure Python busy loop; matmul: a one-thread numpy 512x512 matmul loop; "
        "comes-and-goes: a busy loop for 0.5-3 s, then idle for 0.5-3 s, by turns (default spin)",
    )
    p.add_argument(
        "--voices",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the cloned-voice rows on a random 0.6b Base model (x-vector, in context, "
        "and in context with the CustomVoice model loaded beside; default on)",
    )


def _add_row_options(p: argparse.ArgumentParser) -> None:
    """The rows beyond the unloaded and loaded ones, and the output."""
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


def bench_engine(args: argparse.Namespace) -> int:
    """The ``engine`` bench: fresh-process rows (one-shot, streaming, subprocess decoder), then
    the same rows beside a competing load."""
    t = engine_targets(args.size, args.type)
    chunks = _checked_chunks(args)
    machine = machine_info()
    warn_if_busy(machine)
    cache_dir = args.cache_dir or default_cache_dir()
    model_dir = checked_model_dir(args, cache_dir)
    audio_s = args.frames * frame_seconds(decoder_facts(model_dir))

    env = blas_threads_env(args.threads)
    configs = row_configs(chunks)
    clones: dict[str, Clone] = {}
    base_dir = None
    if args.voices:
        base_dir = ensure_model(cache_dir, args.size, args.type, variant="base")
        clones = clone_configs(model_dir)
    with tempfile.TemporaryDirectory(prefix="kazeia-bench-") as tmp_name:
        runner = RowRunner(args, model_dir, Path(tmp_name), env)
        rows, audio = run_rows(runner, configs)
        placed = run_placed_row(runner, rows, chunks)
        long_row = run_long_row(runner)
        voice_rows = run_voice_rows(runner, base_dir, clones)
        peer_rows = vox_rows_beside_ours(args, cache_dir, chunks, rows, env) if args.peers else {}
        loaded = run_loaded_rows(runner, configs, rows, audio) if args.load else {}
        ideal = run_ideal_row(args) if args.load else None
        compare_audio(rows, loaded, audio)
    machine["loadavg_at_end"] = loadavg()
    bandwidth_threads = read_probe_threads(args.threads)
    floor = memory_floor(model_dir, bandwidth_threads)
    compute = decoder_compute(model_dir, rows, args.decoder_threads, args.decoder_precision)

    add_row_ratios(rows, loaded, ideal)
    targets = target_verdicts(t, rows, loaded, voice_rows)
    builtin = rows.get(f"stream_k{VOICE_CHUNK}")
    if builtin is not None:
        if long_row is not None:
            add_long_figures(long_row, builtin, t, targets)
        add_voice_ratios(voice_rows, builtin)
    result = {
        "bench": "engine",
        "machine": machine,
        "config": _config(args, model_dir, t, chunks, bandwidth_threads, audio_s),
        "rows": rows,
        "voice_rows": voice_rows,
        "long_row": long_row,
        "placed_row": placed,
        "memory_floor": floor,
        "decoder_compute": compute,
        "base_model_dir": None if base_dir is None else str(base_dir),
        "loaded_rows": loaded,
        "ideal_row": ideal,
        "targets": targets,
        "peer_rows": peer_rows,
    }
    return print_result(result, engine_table, args.json)


def _checked_chunks(args: argparse.Namespace) -> list[int]:
    """``--chunks``, once every numeric option is checked."""
    if min(args.threads, args.decoder_threads, args.repeats, args.load_repeats) < 1:
        raise BenchError("--threads, --decoder-threads, --repeats, --load-repeats must be >= 1")
    if args.frames < 1 or args.load_procs < 1:
        raise BenchError("--frames and --load-procs must be >= 1")
    chunks = parse_chunks(args.chunks)
    most = EngineSettings.bounds("stream_chunk").high
    if most is not None and max(chunks) > most:
        raise BenchError(f"--chunks: stream_chunk is at most {most:g}")
    return chunks


def checked_model_dir(args: argparse.Namespace, cache_dir: Path) -> Path:
    """``--model-dir`` when it holds every file the engine reads, else the cached random one."""
    if args.model_dir is None:
        return ensure_engine_dir(cache_dir, args.size, args.type)
    missing = [name for name in ENGINE_FILES if not (args.model_dir / name).is_file()]
    if missing:
        raise BenchError(f"{args.model_dir} lacks {', '.join(missing)}")
    return args.model_dir


def _config(
    args: argparse.Namespace,
    model_dir: Path,
    t: dict[str, float],
    chunks: list[int],
    bandwidth_threads: int,
    audio_s: float,
) -> dict[str, Any]:
    """The run's configuration in the result."""
    return {
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
        "decoder_precision": args.decoder_precision,
        "kv_cache_type": args.kv_cache_type,
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
    }
