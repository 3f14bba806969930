"""The engine bench's measuring child: one engine configuration in a fresh process.

``script/bench engine`` runs each of its rows as ``bench-child engine MODEL_DIR ...``
(``child.py``): the engine loaded, a warm-up synthesis, then the timed ones; the row's figures
on stdout as one JSON object, the last run's audio in ``--out``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from wyoming_kazeia._native import testing
from wyoming_kazeia.native import Generator
from wyoming_kazeia.settings import EngineSettings

from ..reference.official_decoder import status_mb  # the one /proc reader (stdlib only)
from .common import READ_PROBE_MB, logger, read_probe_threads, read_rates
from .player import Chunk, learn, player_figures, warm_rates

# The cloned-voice rows' reference recording's transcript.
REF_TEXT = "Good morning, my dear. Did you sleep well last night?"

PEAK_RSS_WRAPPER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "p.returncode = os.waitstatus_to_exitcode(status)\n"
    "with open(sys.argv[1], 'a', encoding='ascii') as f:\n"
    "    f.write(f'{usage.ru_maxrss}\\n')\n"
    "sys.exit(p.returncode if p.returncode >= 0 else 1)\n"
)

WHOLE_FRAMES_COMPARED = 16  # frames after the first, per run of each mode


def _synthesis_run(
    engine: Any, args: argparse.Namespace, voice: Any = None, **overrides: Any
) -> tuple[dict[str, float], np.ndarray, list[Chunk]]:
    """One synthesis, consumed as a caller would; returns (metrics, int16 audio, each chunk's
    arrival in seconds after the call and its length in seconds). Its CPU seconds count every
    thread of this process and a kazeia-decoder child (waited for when the synthesis ends)."""
    cpu0 = _engine_cpu_s()
    t0 = time.perf_counter()
    if voice is None:
        s = engine.synthesize(args.text, speaker=args.speaker, language=args.language, **overrides)
    else:
        s = engine.synthesize(args.text, language=args.language, voice=voice, **overrides)
    chunks: list[np.ndarray] = []
    arrivals: list[Chunk] = []
    for chunk in s:
        arrivals.append((time.perf_counter() - t0, len(chunk) / engine.sample_rate))
        chunks.append(chunk)
    wall = time.perf_counter() - t0
    cpu = _engine_cpu_s() - cpu0
    metrics: dict[str, float] = dict(s.metrics.as_dict())
    metrics["wall_s"] = wall
    metrics["cpu_s"] = cpu
    metrics["first_chunk_wall_s"] = arrivals[0][0] if arrivals else float("nan")
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return metrics, audio, arrivals


def _engine_cpu_s() -> float:
    """CPU seconds of this process's threads and of its children that have been waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def child_engine(args: argparse.Namespace) -> dict[str, Any]:
    """One engine configuration in this (fresh) process: load, a warm-up synthesis, time."""
    from wyoming_kazeia.engine import Engine

    settings = EngineSettings(
        threads=args.threads,
        decoder_threads=args.decoder_threads,
        decoder_precision=args.decoder_precision,
        kv_cache_type=args.kv_cache_type,
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
    voice, prompt_s = _cloned_voice(engine, args)
    if beside is not None:  # its warm-up: its pages resident, as in a server
        _synthesis_run(beside, args)
    cold, cold_arrivals, decoder_peak_mb = _warm_up(engine, args, voice)
    logger.info("warm-up: first audio %.0f ms, total %.2f s", 1e3 * cold["ttfa_s"], cold["total_s"])
    runs, audios, arrivals = _timed_runs(engine, args, voice, cold_arrivals)
    np.save(args.out, audios[-1])
    # The row's memory is its syntheses': read before the read probes below allocate theirs.
    peak, rss_end = status_mb("VmHWM"), status_mb("VmRSS")
    # The memory-floor line's figures: the generator with nothing decoding beside it (in the
    # subprocess row, whose process holds no decoder).
    alone = _generator_alone(engine, args) if args.subprocess and voice is None else None
    devices = engine.devices
    shared_gpu = devices["talker"] == devices["predictor"] != "cpu"
    whole = _whole_vs_apart(engine, args) if shared_gpu and voice is None else None
    result = _run_figures(engine, args, runs, audios, cold)
    child_peak = decoder_peak_mb
    result.update(
        load_s=load_s,
        rss_start_mb=rss_start,
        rss_load_mb=rss_load,
        rss_end_mb=rss_end,
        peak_rss_mb=peak,
        decoder_subprocess_peak_rss_mb=child_peak,
        engine_peak_rss_mb=peak + child_peak,
        prompt_s=prompt_s,
        ref_seconds=args.ref_seconds if args.clone else 0.0,
        kv_bytes_per_frame=_kv_bytes_per_position(engine.generator),
        kv_cache_type=engine.generator.kv_cache_type,
        generator_alone=alone,
        whole_frames=whole,
    )
    if args.arrivals:  # each synthesis's chunks as they came, the warm-up's first
        result["arrivals"] = [cold_arrivals, *arrivals]
    return result


def _cloned_voice(engine: Any, args: argparse.Namespace) -> tuple[Any, float]:
    """The voice of ``--clone`` (None without) and the seconds its prompt took."""
    if not args.clone:
        return None, 0.0
    from ..reference.make_reference import reference_audio

    recording = reference_audio(args.ref_seconds, 24000, 7)
    start = time.perf_counter()
    voice = engine.clone_prompt(recording, 24000, REF_TEXT if args.clone == "icl" else None)
    engine.prepare_voice(voice)
    prompt_s = time.perf_counter() - start
    logger.info("voice prompt: %.2f s", prompt_s)
    return voice, prompt_s


def _warm_up(
    engine: Any, args: argparse.Namespace, voice: Any
) -> tuple[dict[str, float], list[Chunk], float]:
    """The warm-up synthesis: its metrics, its chunks' arrivals, and the kazeia-decoder
    subprocess's peak RSS (MB; 0 without the subprocess).

    It runs the subprocess under PEAK_RSS_WRAPPER (not RUSAGE_CHILDREN of this process: Linux
    counts a forked child's pre-exec copy of the parent in it); the timed runs use the plain
    command."""
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
        cold, _, arrivals = _synthesis_run(engine, args, voice, **warm)
        engine.decoder_command = command
        if peak_file.is_file():
            decoder_peak_mb = max(int(x) for x in peak_file.read_text().split()) / 1024.0
    return cold, arrivals, decoder_peak_mb


def _timed_runs(
    engine: Any, args: argparse.Namespace, voice: Any, cold_arrivals: list[Chunk]
) -> tuple[list[dict[str, float]], list[np.ndarray], list[list[Chunk]]]:
    """The ``--repeats`` timed syntheses: their metrics, audio and chunks' arrivals; a streaming
    row's metrics also with a player's figures (``player.player_figures``), its hold taught as
    the service's (by the warm-up, then by each run before)."""
    rates = warm_rates(cold_arrivals) if args.chunk > 0 else None
    runs: list[dict[str, float]] = []
    audios: list[np.ndarray] = []
    every_arrivals: list[list[Chunk]] = []
    for i in range(args.repeats):
        metrics, audio, arrivals = _synthesis_run(engine, args, voice)
        if rates is not None:
            metrics.update(player_figures(arrivals, rates, len(args.text)))
            learn(rates, arrivals, len(args.text))
        runs.append(metrics)
        audios.append(audio)
        every_arrivals.append(arrivals)
        logger.info(
            "run %d/%d: %d frames, %d chunks, first audio %.0f ms, total %.2f s (decoder %.2f, "
            "talker %.2f, code predictor %.2f)%s",
            i + 1,
            args.repeats,
            metrics["n_frames"],
            metrics["n_chunks"],
            1e3 * metrics["ttfa_s"],
            metrics["total_s"],
            metrics["decoder_s"],
            metrics["talker_s"],
            metrics["predictor_s"],
            _player_note(metrics),
        )
    return runs, audios, every_arrivals


def _player_note(metrics: dict[str, float]) -> str:
    """A run's player figures for its log line (none for the one-shot row)."""
    if "underruns" not in metrics:
        return ""
    return (
        f"; a player at real time: {metrics['underruns']:.0f} underruns "
        f"({metrics['silence_s']:.2f} s silent) as it comes, "
        f"{metrics['prebuffer_underruns']:.0f} prebuffered (held "
        f"{metrics['prebuffer_held_s']:.2f} s)"
    )


def _run_figures(
    engine: Any,
    args: argparse.Namespace,
    runs: list[dict[str, float]],
    audios: list[np.ndarray],
    cold: dict[str, float],
) -> dict[str, Any]:
    """The row's timing figures: medians of the timed runs, the warm-up's, the configuration."""
    result: dict[str, Any] = {
        k: statistics.median(r[k] for r in runs) for k in runs[0] if k not in ("n_frames", "rtf")
    }
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
    )
    return result


def _generator_alone(engine: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Talker and code-predictor ms per frame of the row's text with no decoder running:
    medians over the row's repeats, each run's (``*_runs_ms``), and the read bandwidth probed
    just before each run and after the last, which the report sets each run against: each
    probe's best pass (``probes_gb_s``, GB/s) and its median pass (``probes_median_gb_s``;
    ``read_rates``)."""
    threads = read_probe_threads(args.threads)

    def probe() -> dict[str, float]:
        return read_rates(testing.read_bandwidth_passes(READ_PROBE_MB, threads))

    ids = np.asarray(engine.tokenizer.prompt_ids(args.text))
    talker, predictor = [], []
    probes = [probe()]
    for _ in range(args.repeats):
        it = engine.generator.frames(
            ids, args.speaker, args.language, seed=args.seed, max_frames=args.frames
        )
        frames = sum(1 for _ in it)
        stats = it.stats
        it.close()
        talker.append(stats["talker_ms"] / max(frames, 1))
        predictor.append(stats["predictor_ms"] / max(frames, 1))
        probes.append(probe())
    return {
        "talker_ms": statistics.median(talker),
        "predictor_ms": statistics.median(predictor),
        "talker_runs_ms": talker,
        "predictor_runs_ms": predictor,
        "probes_gb_s": [p["best"] for p in probes],
        "probes_median_gb_s": [p["median"] for p in probes],
    }


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
            it = testing.frames(
                engine.generator,
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


def _kv_bytes_per_position(generator: Generator) -> int:
    """Bytes the talker's K/V cache (of the generator's type) holds per position."""
    hp = generator.hparams
    kv_dim = int(hp["kazeia.talker.num_kv_heads"]) * int(hp["kazeia.talker.head_dim"])
    value_bytes = {"f32": 4, "f16": 2}[generator.kv_cache_type]
    return int(hp["kazeia.talker.num_layers"]) * 2 * kv_dim * value_bytes
