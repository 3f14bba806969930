"""Peer engines measured in the same run as ours (``script/bench engine --peers``).

vox-tts (PyPI, its own C++ engine) is installed into an environment of its own under
``build/peers/``, its model is made by its own converter from the same random checkpoint our
rows use, and each of its rows runs in a fresh process with the same text, speaker, language,
seed, frame count and threads as ours. Nothing of a peer is imported into this process. The
report's peers table sets each of its rows beside ours.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from wyoming_kazeia.settings import usable_cpus

from .common import (
    REPO_ROOT,
    BenchError,
    ensure_checkpoint,
    logger,
    run_json_child,
)

VOX_VERSION = "0.19.5"
# Our weight types -> vox's converter options: the talker and code predictor quantized alike,
# the rest f16 and the speech decoder f16, as in our q8_0 / q4_k models.
VOX_QUANT = {"q8_0": "q8", "q4_k": "q4"}

# One vox row in a fresh process of vox's environment: a warm-up synthesis, then `repeats`
# timed ones, each consumed as a caller would. argv: model, threads, chunk frames, frames,
# repeats, seed, speaker, language, text. Prints one JSON line.
VOX_CHILD = r"""
import json, statistics, sys, time
import vox

model, threads, chunk, frames, repeats, seed, speaker, language, text = sys.argv[1:]
threads, chunk, frames, repeats, seed = map(int, (threads, chunk, frames, repeats, seed))
start = time.perf_counter()
engine = vox.Engine(model, device="cpu", threads=threads)
voice = engine.speaker_voice(speaker)
load_s = time.perf_counter() - start


def run():
    t0 = time.perf_counter()
    first, samples = None, 0
    for piece in engine.stream(text, voice, seed=seed, chunk_frames=chunk, max_frames=frames,
                               language=language):
        if first is None:
            first = time.perf_counter() - t0
        samples += len(piece)
    return first, time.perf_counter() - t0, samples / engine.sample_rate


cold = run()
runs = [run() for _ in range(repeats)]
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({
    "version": vox.__version__ if hasattr(vox, "__version__") else "",
    "load_s": load_s,
    "cold_ttfa_s": cold[0],
    "ttfa_s": statistics.median(r[0] for r in runs),
    "total_s": statistics.median(r[1] for r in runs),
    "audio_s": statistics.median(r[2] for r in runs),
    "peak_rss_mb": int(hwm.split()[1]) / 1024,
    "runs": runs,
}))
"""


def vox_python() -> Path:
    """The Python of vox's environment (``build/peers/vox-VERSION``), made on first use."""
    env = REPO_ROOT / "build" / "peers" / f"vox-{VOX_VERSION}"
    python = env / "bin" / "python"
    stamp = env / "installed"
    if stamp.is_file():
        return python
    logger.info("installing vox-tts %s into %s (PyPI) ...", VOX_VERSION, env)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(env)],
        [str(python), "-m", "pip", "install", "-q", f"vox-tts=={VOX_VERSION}"],
    ]
    for cmd in steps:
        if subprocess.run(cmd, stdout=sys.stderr).returncode != 0:
            raise BenchError(
                f"--peers: cannot install vox-tts {VOX_VERSION} ({' '.join(cmd[-2:])} failed; "
                "it needs PyPI and a wheel for this platform)"
            )
    stamp.write_text(f"vox-tts=={VOX_VERSION}\n")
    return python


def vox_model(cache_dir: Path, checkpoint: Path, size: str, talker_type: str) -> Path:
    """``cache_dir / vox-SIZE-QUANT.tmod``, built by vox's own converter from `checkpoint`."""
    quant = VOX_QUANT.get(talker_type)
    if quant is None:
        raise BenchError(f"--peers: vox has no counterpart of --type {talker_type}")
    out = cache_dir / f"vox-{VOX_VERSION}-{size}-{quant}.tmod"
    if out.is_file():
        logger.info("reusing %s", out)
        return out
    tmp = out.with_name(out.name + ".tmp")
    cmd = [
        str(vox_python()), "-m", "vox", "build", "--model", str(checkpoint),
        "--dtype", "f16", "--codec-dtype", "f16", "--quant", quant, "--no-hash", "-o", str(tmp),
    ]  # fmt: skip
    logger.info("converting %s with vox's converter (--quant %s) ...", checkpoint, quant)
    if subprocess.run(cmd, stdout=sys.stderr).returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BenchError(f"--peers: vox's converter failed on {checkpoint}")
    tmp.rename(out)
    return out


def vox_rows(
    args: Any, cache_dir: Path, checkpoint: Path, chunks: list[int], env: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """vox's rows, ``vox_k{K}`` for each streaming chunk K (frames), in fresh processes."""
    model = vox_model(cache_dir, checkpoint, args.size, args.type)
    rows = {}
    for k in chunks:
        cmd = [
            str(vox_python()), "-c", VOX_CHILD, str(model), str(usable_cpus()), str(k),
            str(args.frames), str(args.repeats), str(args.seed), args.speaker, args.language,
            args.text,
        ]  # fmt: skip
        row = run_json_child(cmd, f"vox-tts {VOX_VERSION}, {k}-frame chunks", env)
        row["rtf"] = row["total_s"] / row["audio_s"] if row["audio_s"] else float("nan")
        row["chunk"] = k
        row["threads"] = usable_cpus()
        row["model"] = str(model)
        row["model_mb"] = model.stat().st_size / 1e6
        rows[f"vox_k{k}"] = row
        logger.info(
            "vox %d-frame chunks: total %.2f s, RTF %.2f, first audio %.0f ms, peak RSS %.0f MB",
            k,
            row["total_s"],
            row["rtf"],
            1e3 * row["ttfa_s"],
            row["peak_rss_mb"],
        )
    return rows


def vox_rows_beside_ours(
    args: Any,
    cache_dir: Path,
    chunks: list[int],
    ours: dict[str, dict[str, Any]],
    env: dict[str, str],
) -> dict[str, dict[str, Any]]:
    """vox's rows on the checkpoint of ``--size``, each with the ratios of our stream row of the
    same chunk (in ``ours``) to it."""
    checkpoint = ensure_checkpoint(cache_dir, args.size)
    peer_rows = vox_rows(args, cache_dir, checkpoint, chunks, env)
    for k in chunks:
        row, peer = ours[f"stream_k{k}"], peer_rows[f"vox_k{k}"]
        peer["ours_vs_peer"] = {
            "rtf": row["rtf"] / peer["rtf"],
            "ttfa": row["ttfa_s"] / peer["ttfa_s"],
            "peak_rss": row["engine_peak_rss_mb"] / peer["peak_rss_mb"],
        }
    return peer_rows


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
