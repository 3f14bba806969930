"""``script/bench decoder``: the native speech decoder, one-shot and streaming."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wyoming_kazeia.native import DECODER_PRECISIONS

from ..reference.official_decoder import status_mb  # the one /proc reader (stdlib only)
from .common import (
    CHILD_BOOT,
    OFFICIAL_SCRIPT,
    READ_PROBE_MB,
    WARMUP_FRAMES,
    BenchError,
    add_official_args,
    bf16_peak_note,
    blas_threads_env,
    decoder_facts,
    default_cache_dir,
    ensure_model,
    fma_peak,
    fmt,
    frame_seconds,
    loadavg,
    logger,
    machine_info,
    machine_line,
    max_abs_diff,
    official_child,
    ok,
    parse_chunks,
    performed_note,
    print_result,
    run_json_child,
    snr_db,
    warn_if_busy,
)
from .targets import TARGETS

T = TARGETS["decoder"]  # this bench's targets


def add_parser(subparsers: Any) -> None:
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
    p.add_argument(
        "--precision",
        choices=DECODER_PRECISIONS,
        default="f32",
        help="the decoder's products (the service's decoder_precision; default f32)",
    )
    p.add_argument("--frames", type=int, default=100, help="frames T, 80 ms each (default 100)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per row (default 5)")
    p.add_argument(
        "--chunks",
        default="1,4",
        help="comma-separated streaming chunk sizes k in frames (default 1,4)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random codes (default 0)")
    add_official_args(p, "the (slow) official decoder", 3)
    p.set_defaults(func=bench_decoder)


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


# The dilations of each vocoder block's residual units (as native/src/speech_decoder_model.h
# has them: constants of the official code, not in the file), and the output channels of the
# decoder GEMM's weight panels (native/src/decoder_arch.h).
RES_DILATIONS = (1, 3, 9)
CONV_PANEL = 16


def winograd_tiles_per_frame(period: int, dilation: int) -> int:
    """The tiles of a conv in Winograd's form F(2, taps) over one frame's `period` columns, as
    the engine lays them out: one tile for each column of an even block of `dilation` columns
    (its pair a dilation later, or, at the end of the frame, a dilation earlier)."""
    return sum(1 for q in range(period) if (q // dilation) % 2 == 0)


def decoder_gflop_per_frame(gguf_path: Path, winograd: bool = False) -> float:
    """GFLOP the speech decoder computes per frame, 2 per multiply-add: every weight of each
    matrix (linear layers, convolutions, the depthwise ones, transposed convolutions) once per
    column it sees per frame (`decoder_columns_per_frame`), and the transformer's attention over
    its window. Codebook look-ups, SnakeBeta, norms and activations (a few operations per value)
    are left out. With `winograd`, the multiply-adds the CPU's f32 decoder performs: its
    residual units' first convs in Winograd's form where the engine takes it (taps > 1, output
    channels in whole panels of CONV_PANEL, frames of at least two dilations), taps + 1
    products of in x out per tile instead of taps per column; the transforms' few operations
    per value left out."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    ratios = gguf_u32_list(reader, "kazeia.decoder.upsampling_ratios")
    rates = gguf_u32_list(reader, "kazeia.decoder.upsample_rates")

    def multiply_adds(t: Any) -> int:
        columns = decoder_columns_per_frame(t.name, ratios, rates)
        parts = t.name.split(".")  # dec.voc.blk.B.res.U.conv1.weight
        if not (winograd and parts[-2:] == ["conv1", "weight"] and "res" in parts):
            return int(t.n_elements) * columns
        k_in, out = (int(n) for n in t.shape)
        taps = k_in // out  # a residual conv keeps its width
        dilation = RES_DILATIONS[int(parts[5])]
        if taps < 2 or out % CONV_PANEL or columns < 2 * dilation:
            return k_in * out * columns
        return winograd_tiles_per_frame(columns, dilation) * (taps + 1) * (k_in // taps) * out

    matrices = sum(
        multiply_adds(t) for t in reader.tensors if len(t.shape) == 2 and "codebook" not in t.name
    )

    def u32(key: str) -> int:
        return int(reader.fields[f"kazeia.decoder.{key}"].contents())

    # The scores and the weighted sum: 2 multiply-adds per head dimension and key, each layer.
    attention = 2 * u32("num_layers") * u32("num_heads") * u32("head_dim") * u32("sliding_window")
    return 2 * (matrices + attention) / 1e9


def bench_decoder(args: argparse.Namespace) -> int:
    """The ``decoder`` bench: fresh-process rows for ours, then the official decoder."""
    if args.threads < 1 or args.frames < 1 or args.repeats < 1 or args.official_repeats < 1:
        raise BenchError("--threads, --frames, --repeats and --official-repeats must be >= 1")
    chunks = parse_chunks(args.chunks)
    machine = machine_info()
    warn_if_busy(machine)
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
    facts = decoder_facts(gguf)
    audio_s = frames * frame_seconds(facts)
    rng = np.random.default_rng(args.seed)
    shape = (frames, facts["kazeia.decoder.num_quantizers"])
    codes = rng.integers(0, facts["kazeia.decoder.codebook_size"], size=shape, dtype=np.int64)
    env = blas_threads_env(args.threads)

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
                "--precision",
                args.precision,
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
        # bf16 rows: the official decoder in bf16 too, the precision its GPU examples load it
        # in, for its error beside ours (one decode: only its samples are used).
        official_bf16: dict[str, Any] = {}
        if args.precision == "bf16" and "official" in wavs:
            official_bf16 = _run_official(
                args, checkpoint, codes_path, tmp / "official_bf16.npy", env, "bf16"
            )
            if official_bf16.get("status") == "ok":
                wavs["official_bf16"] = np.load(tmp / "official_bf16.npy")

    from wyoming_kazeia import _native

    # Measured now, beside the rows: the box's bandwidth moves with its other tenants.
    total_mb, low_mb = streamed_weight_mb(gguf)
    bandwidth = _native.testing.read_bandwidth(READ_PROBE_MB, args.threads)
    peak, one_thread = fma_peak(args.threads)
    machine["loadavg_at_end"] = loadavg()
    full_s = rows["full"]["median_s"]
    gflop = decoder_gflop_per_frame(gguf)
    performed = decoder_gflop_per_frame(gguf, winograd=args.precision == "f32")
    weights = {
        "total_mb": total_mb,
        "low_rate_mb": low_mb,
        "read_gb_s": bandwidth,
        "low_rate_read_ms": low_mb / bandwidth,
        "full_ms_per_frame": 1e3 * full_s / frames,
        "full_chunk_frames": _native.DECODER_MAX_CHUNK_FRAMES,
    }
    compute = {
        "gflop_per_frame": gflop,
        "performed_gflop_per_frame": performed,
        "full_gflop_s": gflop * frames / full_s,
        "peak_gflop_s": peak,
        "one_thread_gflop_s": one_thread,
        "peak_isa": _native.testing.FMA_PEAK_ISA,
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

    # Error against the official f32 waveform, dB below its signal.
    error_db: dict[str, float] = {}
    if "official" in wavs:
        error_db["ours"] = snr_db(wavs["official"], wavs["full"])
        if "official_bf16" in wavs:
            error_db["official_bf16"] = snr_db(wavs["official"], wavs["official_bf16"])

    stream_names = [n for n in rows if n != "full"]
    targets = {
        "full_rtf_max": T["full_rtf"],
        "full_rtf_ok": rows["full"]["rtf"] <= T["full_rtf"],
        "stream_ratio_max": T["stream_ratio"],
        "stream_ratio_ok": all(rows[n]["vs_full"] <= T["stream_ratio"] for n in stream_names),
        "rss_mb_max": T["peak_rss_mb"],
        "rss_ok": all(r["peak_rss_mb"] <= T["peak_rss_mb"] for r in rows.values()),
        "peak_share_min": T["full_peak_share"],
        "peak_share_ok": compute["full_gflop_s"] >= T["full_peak_share"] * peak,
    }
    result = {
        "bench": "decoder",
        "machine": machine,
        "config": {
            "model": str(gguf),
            "model_mb": gguf.stat().st_size / 1e6,
            "checkpoint": None if checkpoint is None else str(checkpoint),
            "threads": args.threads,
            "precision": args.precision,
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
        "official_bf16": {k: v for k, v in official_bf16.items() if k in ("status", "detail")},
        "max_abs_diff": diffs,
        "error_db": error_db,
        "weights": weights,
        "compute": compute,
        "targets": targets,
    }
    return print_result(result, decoder_table, args.json)


def _run_official(
    args: argparse.Namespace,
    checkpoint: Path | None,
    codes_path: Path,
    out_path: Path,
    env: dict[str, str],
    dtype: str = "f32",
) -> dict[str, Any]:
    """Measure the official decoder in `dtype` (f32: --official-repeats decodes; bf16: one), or
    say why not (``status`` is ``ok`` when measured)."""
    tok = checkpoint / "speech_tokenizer" if checkpoint else None
    result = official_child(
        args,
        tok / "config.json" if tok else None,
        lambda: [
            str(OFFICIAL_SCRIPT),
            str(tok),
            str(codes_path),
            "--threads",
            str(args.threads),
            "--repeats",
            str(args.official_repeats if dtype == "f32" else 1),
            "--warmup-frames",
            str(WARMUP_FRAMES),
            "--dtype",
            dtype,
            "--out",
            str(out_path),
        ],
        "official PyTorch decoder",
        env,
    )
    if result["status"] == "ok":
        logger.info("official (%s): median %.3f s", dtype, result["median_s"])
    return result


def decoder_table(result: dict[str, Any]) -> str:
    """The markdown report of the ``decoder`` bench."""
    m, c, rows, off = result["machine"], result["config"], result["rows"], result["official"]
    diffs, tg = result["max_abs_diff"], result["targets"]
    lines = [
        machine_line(m),
        f"Decoder: {c['model']} ({c['model_mb']:.0f} MB, products in "
        f"{c.get('precision', 'f32')}); threads {c['threads']}, frames "
        f"{c['frames']} ({c['audio_s']:.2f} s of audio), repeats {c['repeats']} (official "
        f"{c['official_repeats']}), warm-up {c['warmup_frames']} frames, codes seed "
        f"{c['codes_seed']}",
        "",
        "| row | median s | min s | RTF | vs full decode | push mean / max ms | load s "
        "| RSS after load MB | peak RSS MB | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    for name, row in rows.items():
        rss_ok = row["peak_rss_mb"] <= T["peak_rss_mb"]
        if name == "full":
            label, push = "full decode", "-"
            target = f"RTF <= {T['full_rtf']}: {ok(row['rtf'] <= T['full_rtf'])}"
        else:
            label = f"stream k={row['chunk']}"
            push = f"{row['push_mean_ms']:.1f} / {row['push_max_ms']:.1f}"
            good = row["vs_full"] <= T["stream_ratio"]
            target = f"<= {T['stream_ratio']:.2f}x full: {ok(good)}"
        target += f"; RSS <= {T['peak_rss_mb']:.0f} MB: {ok(rss_ok)}"
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
    err = result.get("error_db", {})
    if err:
        line = (
            f"Error against the official f32 waveform, dB below its signal (higher is closer): "
            f"ours (products in {c.get('precision', 'f32')}) {err['ours']:.1f}"
        )
        if "official_bf16" in err:
            line += (
                f"; the official decoder in bf16 (weights and activations, as its GPU examples "
                f"load it) {err['official_bf16']:.1f}"
            )
        lines.append(line)
    off_bf16 = result.get("official_bf16", {})
    if off_bf16 and off_bf16.get("status") != "ok":
        lines.append(f"official bf16: {off_bf16['status']}: {off_bf16.get('detail', '')}")
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
    cp = result.get("compute")
    if cp:
        share = 100 * cp["full_gflop_s"] / cp["peak_gflop_s"]
        lines.append(
            f"Compute: {cp['gflop_per_frame']:.2f} GFLOP per frame; the full decode's "
            f"{cp['full_gflop_s']:.0f} GFLOP/s is {share:.0f}% "
            f"of the {cp['peak_gflop_s']:.0f} GFLOP/s FP32 multiply-add peak of its "
            f"{c['threads']} threads ({cp['peak_isa']}, measured after the rows; one thread "
            f"{cp['one_thread_gflop_s']:.0f})"
            + bf16_peak_note(c.get("precision", "f32"))
            + performed_note(cp, cp["full_gflop_s"])
            + "."
        )
    lines.append(
        f"Targets: full decode RTF <= {T['full_rtf']}: {ok(tg['full_rtf_ok'])}; streaming "
        f"total <= {T['stream_ratio']:.2f}x full: {ok(tg['stream_ratio_ok'])}; decoder peak "
        f"RSS <= {T['peak_rss_mb']:.0f} MB: {ok(tg['rss_ok'])}; full decode >= "
        f"{100 * T['full_peak_share']:.0f}% of the FMA peak: {ok(tg['peak_share_ok'])}"
    )
    lines.append(
        "RTF (from the median) = compute s / audio s; vs full decode = median / median of the "
        "one-shot row; push max = the slowest push of a run, median over runs; RSS = the whole "
        "child process (Python + numpy included)."
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- generate bench


# --------------------------------------------------------------------------- child processes


def child_decoder(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration of our decoder in this (fresh) process: load, warm up, time."""
    from wyoming_kazeia.native import SpeechDecoder

    codes = np.ascontiguousarray(np.load(args.codes), dtype=np.int32)
    frames = int(codes.shape[0])
    rss_start = status_mb("VmRSS")
    start = time.perf_counter()
    # The service's pools (engine.py), as `script/bench generate` builds its generator.
    dec = SpeechDecoder(str(args.gguf), threads=args.threads, polite=True, precision=args.precision)
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
