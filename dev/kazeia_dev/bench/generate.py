"""``script/bench generate``: the native talker + code predictor by weight type."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from wyoming_kazeia.native import PROMPT_ROLE_TOKENS, PROMPT_TRAILER_TOKENS
from wyoming_kazeia.settings import QUANT_TYPES, EngineSettings

from ..reference.official_decoder import status_mb  # the one /proc reader (stdlib only)
from .common import (
    CHILD_BOOT,
    GEN_SENTENCE,
    REFERENCE_KIT,
    WARMUP_FRAMES,
    BenchError,
    add_official_args,
    blas_threads_env,
    decoder_facts,
    default_cache_dir,
    ensure_talker,
    frame_seconds,
    loadavg,
    logger,
    machine_info,
    machine_line,
    official_child,
    ok,
    print_result,
    run_json_child,
    warn_if_busy,
)
from .targets import TARGETS

T = TARGETS["generate"]  # this bench's targets
GEN_TYPES = ("f32", "q8_0", "q4_k")
# The assistant prompt of GEN_SENTENCE with the real Qwen2 BPE ids (make_reference's default
# input): used when the checkpoint's tokenizer cannot be loaded.
FALLBACK_PROMPT_IDS = [
    151644, 77091, 198, 9707, 11, 1879, 0, 1096, 374, 264, 1273, 315, 279, 1207, 16948, 18,
    350, 9951, 4712, 13, 151645, 198, 151644, 77091, 198,
]  # fmt: skip


OFFICIAL_GENERATE_SCRIPT = REFERENCE_KIT / "official_generate.py"


def add_parser(subparsers: Any) -> None:
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
    p.add_argument(
        "--threads",
        type=int,
        default=2,
        help="engine and torch threads (default 2; the engine's idle workers yield their cores, "
        "as the service's do)",
    )
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
    add_official_args(p, "the (slow, ~1 s per frame) official generate", 1)
    p.set_defaults(func=bench_generate)


def _parse_types(text: str) -> list[str]:
    types = [x.strip() for x in text.split(",") if x.strip()]
    bad = [t for t in types if t not in QUANT_TYPES]
    if not types or bad:
        raise BenchError(
            f"--types takes a comma-separated subset of {','.join(QUANT_TYPES)}: {text!r}"
        )
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
            role, trailer = PROMPT_ROLE_TOKENS, PROMPT_TRAILER_TOKENS
            fixed = FALLBACK_PROMPT_IDS
            if ids[:role] == fixed[:role] and ids[-trailer:] == fixed[-trailer:]:
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
    warn_if_busy(machine)
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
    # The decoder of the same model says how long a frame is.
    has_decoder = args.model_dir is not None and (args.model_dir / "decoder.gguf").is_file()
    facts_source = args.model_dir if has_decoder else checkpoint
    if facts_source is None:
        raise BenchError("--model-dir has no decoder.gguf: give --checkpoint for its frame rate")
    frame_ms = 1e3 * frame_seconds(decoder_facts(facts_source))
    ids, ids_source = prompt_ids(tokenizer_dir, args.text)
    logger.info("prompt: %d token ids (%s)", len(ids), ids_source)

    env = blas_threads_env(args.threads)
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
        row["rtf"] = row["total_ms_per_frame"] / frame_ms
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

    official = _run_official_generate(args, checkpoint, ids, env, frame_ms)
    machine["loadavg_at_end"] = loadavg()

    targets: dict[str, Any] = {}
    if "q8_0" in rows:
        q8 = rows["q8_0"]
        targets.update(
            q8_talker_ok=q8["talker_ms_per_frame"] <= T["q8_talker_ms"],
            q8_predictor_ok=q8["predictor_ms_per_frame"] <= T["q8_predictor_ms"],
            q8_total_ok=q8["total_ms_per_frame"] <= T["q8_total_ms"],
            q8_rss_ok=q8["peak_rss_mb"] <= T["q8_peak_rss_mb"],
        )
    if "q4_k" in rows:
        targets["q4_total_ok"] = rows["q4_k"]["total_ms_per_frame"] <= T["q4_total_ms"]
    targets.update(
        q8_talker_ms_max=T["q8_talker_ms"],
        q8_predictor_ms_max=T["q8_predictor_ms"],
        q8_total_ms_max=T["q8_total_ms"],
        q4_total_ms_max=T["q4_total_ms"],
        q8_rss_mb_max=T["q8_peak_rss_mb"],
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
    }
    return print_result(result, generate_table, args.json)


def _run_official_generate(
    args: argparse.Namespace,
    checkpoint: Path | None,
    ids: list[int],
    env: dict[str, str],
    frame_ms: float,
) -> dict[str, Any]:
    """Measure the official generate, or say why not (``status`` is ``ok`` when measured)."""
    result = official_child(
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
        result["rtf"] = result["total_ms_per_frame"] / frame_ms
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
                f"talker <= {T['q8_talker_ms']:.0f}: {ok(tg['q8_talker_ok'])}; code predictor "
                f"<= {T['q8_predictor_ms']:.0f}: {ok(tg['q8_predictor_ok'])}; total <= "
                f"{T['q8_total_ms']:.0f}: {ok(tg['q8_total_ok'])}; peak RSS <= "
                f"{T['q8_peak_rss_mb']:.0f} MB: {ok(tg['q8_rss_ok'])}"
            )
        elif name == "q4_k":
            target = f"total <= {T['q4_total_ms']:.0f}: {ok(tg['q4_total_ok'])}"
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
                f"q8_0 talker <= {T['q8_talker_ms']:.0f} ms/frame: {ok(tg['q8_talker_ok'])}; "
                f"code predictor <= {T['q8_predictor_ms']:.0f}: {ok(tg['q8_predictor_ok'])}; "
                f"total <= {T['q8_total_ms']:.0f}: {ok(tg['q8_total_ok'])}; peak RSS <= "
                f"{T['q8_peak_rss_mb']:.0f} MB: {ok(tg['q8_rss_ok'])}"
            )
        if "q4_total_ok" in tg:
            parts.append(f"q4_k total <= {T['q4_total_ms']:.0f} ms/frame: {ok(tg['q4_total_ok'])}")
        lines.append("Targets (2-core AVX2 box): " + "; ".join(parts))
    lines.append("Peers: script/bench engine --peers measures vox-tts in the same run")
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
        "the whole child process, the stacks' weights (private memory) from the load on; (file) = "
        "its file-backed part: the rest of the talker GGUF is memory-mapped, so only the pages "
        "touched (e.g. the used rows of the text table) count."
    )
    return "\n".join(lines)


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
    # The service's pools (engine.py): with more threads than cores, a pool whose idle workers
    # keep their cores makes every task wait for a descheduled thread.
    gen = Generator(str(args.gguf), threads=args.threads, polite=True)
    gen.kv_cache_type = EngineSettings().kv_cache_type  # the service's
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
