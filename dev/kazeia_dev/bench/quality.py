"""``script/bench quality``: what the talker's weight types cost against f32.

On the full-size random checkpoint of ``--size``, the talker converted to each ``--types`` runs
greedy (the trace the parity tests use) on the same prompts as the f32 talker: the talker's
logits (first code of each frame) and the code predictor's (codes 1-15) are compared with f32's
while the inputs are still the same (up to the first frame whose codes differ), and the codes
themselves over ``--frames`` frames. Then the f32 run's codes are decoded by the f32 decoder and
by the decoder the quantized models ship (f16 matrices): the audio error. Random weights have no
meaning to keep; what this measures is how far each type moves the computation.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import (
    BenchError,
    default_cache_dir,
    ensure_checkpoint,
    ensure_decoder,
    ensure_talker,
    logger,
    machine_info,
    machine_line,
    print_result,
    snr_db,
)
from .generate import prompt_ids

QUALITY_TYPES = ("q8_0", "q6_k", "q5_k", "q4_k", "q4_k_mix")
# Sentences of the prompts (the checkpoint's own tokenizer makes their ids).
QUALITY_TEXTS = (
    "Hello, world! This is a test of the Qwen3 TTS engine.",
    "The kitchen lights are off and the front door is locked.",
    "Tomorrow will be sunny in the morning, with a few showers after four.",
    "Your timer for the pasta is done.",
    "I have added milk, eggs and bread to the shopping list.",
    "The washing machine has finished its cycle.",
)
SUPPRESSED = 2048  # talker vocabulary from here on: control tokens, never sampled as codes


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "quality",
        help="talker weight types against f32: logit error, greedy agreement, decoder audio error",
        description=(
            "Convert the random checkpoint's talker to f32 and each --types, run each greedily "
            "on the same prompts for --frames frames, and compare with f32: talker and code-"
            "predictor logits (relative RMS error, KL, top-1 agreement) while the inputs agree, "
            "codes over all frames (frames before the first difference, identical frames); then "
            "the f32 decoder against the f16 decoder of the quantized models on the f32 codes. "
            "Also each type's file size and ms per frame. Prints a markdown table (or JSON)."
        ),
    )
    p.add_argument("--size", choices=("0.6b", "1.7b"), default="0.6b", help="default 0.6b")
    p.add_argument("--cache-dir", type=Path, help="default: .bench/ in the repository root")
    p.add_argument(
        "--types",
        default=",".join(QUALITY_TYPES),
        help=f"comma-separated weight types against f32 (default {','.join(QUALITY_TYPES)})",
    )
    p.add_argument("--frames", type=int, default=200, help="frames per prompt (default 200)")
    p.add_argument("--threads", type=int, default=2, help="default 2")
    p.add_argument("--speaker", default="vivian", help="default vivian")
    p.add_argument("--language", default="english", help="default english")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=bench_quality)


def _rel_rms(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - ref) ** 2)) / np.sqrt(np.mean(ref**2)))


def mean_kl(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    """Mean KL(ref || other) of the softmax distributions, row by row (also the bound of
    tests/test_quantization.py)."""

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    lp, lq = log_softmax(ref_logits), log_softmax(logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


def compare_traces(
    ref: dict[str, np.ndarray], other: dict[str, np.ndarray]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Codes over every frame; and the logits of both runs while their inputs agree: the
    talker's for frames up to the first that differs (frame t's logits come from the prompt
    and frames < t), the code predictor's heads of those frames while the frame's earlier
    codes agree."""
    codes_r, codes_o = ref["codes"], other["codes"]
    n = min(len(codes_r), len(codes_o))
    same = np.all(codes_r[:n] == codes_o[:n], axis=1)
    first_diff = int(np.argmin(same)) if not same.all() else n
    t_last = min(first_diff + 1, n)
    cp_r, cp_o = [], []
    for t in range(t_last):
        for g in range(codes_r.shape[1] - 1):
            if not np.array_equal(codes_r[t, : g + 1], codes_o[t, : g + 1]):
                break
            cp_r.append(ref["cp_logits"][t, g])
            cp_o.append(other["cp_logits"][t, g])
    width = ref["cp_logits"].shape[-1]
    codes = {
        "frames": n,
        "first_diff": first_diff,
        "same_frames": float(same.mean()),
        "same_code0": float(np.mean(codes_r[:n, 0] == codes_o[:n, 0])),
    }
    logits = {
        "talker_ref": ref["talker_logits"][:t_last, :SUPPRESSED],
        "talker": other["talker_logits"][:t_last, :SUPPRESSED],
        "cp_ref": np.array(cp_r).reshape(-1, width),
        "cp": np.array(cp_o).reshape(-1, width),
    }
    return codes, logits


def forced_logits(
    ref: dict[str, np.ndarray], forced: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every position of a run teacher-forced with the f32 run's codes: the same inputs."""
    n = len(ref["codes"])
    width = ref["cp_logits"].shape[-1]
    return {
        "talker_ref": ref["talker_logits"][:n, :SUPPRESSED],
        "talker": forced["talker_logits"][:n, :SUPPRESSED],
        "cp_ref": ref["cp_logits"][:n].reshape(-1, width),
        "cp": forced["cp_logits"][:n].reshape(-1, width),
    }


def logit_errors(ref: np.ndarray, other: np.ndarray) -> dict[str, Any]:
    """Relative RMS error, mean KL, top-1 agreement, and the error against the reference's own
    top-1 margin (median |error| and median top-1 - top-2 gap, in logits)."""
    if not len(ref):
        return {"rel_rms": None, "kl": None, "top1": None, "abs_err": None, "margin": None, "n": 0}
    top2 = np.sort(ref, axis=-1)[:, -2:]
    return {
        "rel_rms": _rel_rms(other, ref),
        "kl": mean_kl(ref, other),
        "top1": float(np.mean(ref.argmax(-1) == other.argmax(-1))),
        "abs_err": float(np.median(np.abs(other - ref))),
        "margin": float(np.median(top2[:, 1] - top2[:, 0])),
        "n": len(ref),
    }


def _speed(gen: Any, ids: np.ndarray, args: argparse.Namespace) -> dict[str, float]:
    """ms per frame of talker and code predictor (40 sampled frames after a warm-up)."""
    stats = []
    for _ in range(2):
        it = gen.frames(ids, args.speaker, args.language, seed=0, max_frames=40)
        n = sum(1 for _ in it)
        stats.append({k: it.stats[k] / max(n, 1) for k in ("talker_ms", "predictor_ms")})
    return stats[-1]


def bench_quality(args: argparse.Namespace) -> int:
    from wyoming_kazeia._native import testing
    from wyoming_kazeia.native import Generator, SpeechDecoder

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    from wyoming_kazeia.convert import OUT_TYPES

    bad = [t for t in types if t not in OUT_TYPES or t == "f32"]
    if not types or bad:
        raise BenchError(f"--types: a subset of {', '.join(OUT_TYPES[1:])}: {args.types!r}")
    if args.frames < 2 or args.threads < 1:
        raise BenchError("--frames >= 2 and --threads >= 1")
    machine = machine_info()
    cache_dir = args.cache_dir or default_cache_dir()
    ckpt = ensure_checkpoint(cache_dir, args.size)
    talkers = {t: ensure_talker(cache_dir, args.size, t) for t in ["f32", *types]}
    prompts = [np.array(prompt_ids(ckpt, text)[0], dtype=np.int32) for text in QUALITY_TEXTS]

    traces: dict[str, list[dict[str, np.ndarray]]] = {}
    forced: dict[str, list[dict[str, np.ndarray]]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for t, path in talkers.items():
        gen = Generator(str(path), threads=args.threads, polite=True)  # the service's pools
        start = time.monotonic()
        traces[t] = [
            testing.trace(gen, ids, args.speaker, args.language, False, args.frames)
            for ids in prompts
        ]
        if t != "f32":  # the same again, fed the f32 run's codes (teacher forcing)
            forced[t] = [
                testing.trace(gen, ids, args.speaker, args.language, False, args.frames,
                              forced_codes=ref["codes"])
                for ids, ref in zip(prompts, traces["f32"], strict=True)
            ]  # fmt: skip
        logger.info("%s: %d prompts x %d frames in %.0f s", t, len(prompts), args.frames,
                    time.monotonic() - start)  # fmt: skip
        rows[t] = {"file_mb": path.stat().st_size / 1e6, **_speed(gen, prompts[0], args)}
        del gen
    for t in types:
        pairs = [compare_traces(r, o) for r, o in zip(traces["f32"], traces[t], strict=True)]
        rows[t]["prompts"] = [codes for codes, _ in pairs]
        for key in ("same_frames", "same_code0"):
            rows[t][key] = statistics.median(codes[key] for codes, _ in pairs)
        for part in ("talker", "cp"):
            ref = np.concatenate([logits[f"{part}_ref"] for _, logits in pairs])
            other = np.concatenate([logits[part] for _, logits in pairs])
            rows[t][part] = logit_errors(ref, other)
        teacher = [forced_logits(r, f) for r, f in zip(traces["f32"], forced[t], strict=True)]
        for part in ("talker", "cp"):
            ref = np.concatenate([logits[f"{part}_ref"] for logits in teacher])
            other = np.concatenate([logits[part] for logits in teacher])
            rows[t][f"{part}_forced"] = logit_errors(ref, other)
        logger.info(
            "%s: talker logits %.2e rel, codes identical for %s frames", t,
            rows[t]["talker"]["rel_rms"], [codes["first_diff"] for codes, _ in pairs],
        )  # fmt: skip

    # The decoder: f32 against the f16 matrices every quantized model ships, on f32's codes.
    codes = np.concatenate([tr["codes"] for tr in traces["f32"]])
    wavs = {
        t: SpeechDecoder(str(ensure_decoder(cache_dir, args.size, t)), threads=args.threads).decode(
            codes
        )
        for t in ("f32", "q8_0")
    }
    ref, f16 = wavs["f32"].astype(np.float64), wavs["q8_0"].astype(np.float64)
    err = f16 - ref
    decoder = {
        "frames": int(len(codes)),
        "rel_rms": float(np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(ref**2))),
        "max_abs": float(np.abs(err).max()),
        "snr_db": snr_db(ref, f16),
    }
    result = {
        "bench": "quality",
        "machine": machine,
        "config": {
            "size": args.size,
            "checkpoint": str(ckpt),
            "frames": args.frames,
            "prompts": list(QUALITY_TEXTS),
            "threads": args.threads,
            "speaker": args.speaker,
            "language": args.language,
        },
        "rows": rows,
        "decoder": decoder,
    }
    return print_result(result, quality_table, args.json)


def quality_table(result: dict[str, Any]) -> str:
    c, rows, d = result["config"], result["rows"], result["decoder"]
    lines = [
        machine_line(result["machine"]),
        f"Talker weight types against f32 on {c['checkpoint']} ({c['size']}): greedy, "
        f"{len(c['prompts'])} prompts x {c['frames']} frames, {c['speaker']}, {c['language']}; "
        "medians over the prompts",
        "",
        "| type | talker MB | talker logits: rel. RMS, KL, top-1 agreement (n) | median abs. "
        "error / f32 top-2 gap | code predictor logits: rel. RMS, KL, top-1 agreement (n) "
        "| median abs. error / gap | free greedy: frames equal to f32 before the first "
        "difference | code 0 equal | talker ms/frame | predictor ms/frame |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def errors(e: dict[str, Any]) -> str:
        if not e["n"]:
            return "- | -"
        return (
            f"{e['rel_rms']:.2e}, {e['kl']:.1e}, {100 * e['top1']:.0f}% ({e['n']}) "
            f"| {e['abs_err']:.3f} / {e['margin']:.3f}"
        )

    for t, r in rows.items():
        speed = f"| {r['talker_ms']:.1f} | {r['predictor_ms']:.1f} |"
        if t == "f32":
            lines.append(f"| f32 | {r['file_mb']:.0f} | - | - | - | - | - | - {speed}")
            continue
        firsts = ", ".join(str(p["first_diff"]) for p in r["prompts"])
        lines.append(
            f"| {t} | {r['file_mb']:.0f} | {errors(r['talker_forced'])} "
            f"| {errors(r['cp_forced'])} "
            f"| {firsts} of {c['frames']} | {100 * r['same_code0']:.0f}% {speed}"
        )
    lines += [
        "",
        f"Decoder (the f16 matrices of every quantized model) against f32, {d['frames']} frames of "
        f"the f32 run's codes: relative RMS error {d['rel_rms']:.2e}, max |error| "
        f"{d['max_abs']:.2e}, SNR {d['snr_db']:.1f} dB",
        "Logits: each type teacher-forced with the f32 run's codes (the same inputs at every "
        "position: talker per frame, code predictor per frame and head); top-1 agreement = the "
        "greedy choice equals f32's; rel. RMS = RMS(type - f32) / RMS(f32) over the codec "
        "logits; KL(f32 || type) of the softmax. Free greedy: each type on its own; random "
        "weights give flat distributions (small top-2 gaps), so a run leaves f32's path at its "
        "first flipped choice. ms/frame: 40 sampled frames after a warm-up, in this process.",
    ]
    return "\n".join(lines)
