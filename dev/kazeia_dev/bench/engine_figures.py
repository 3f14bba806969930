"""The engine bench's figures derived from its rows: the targets of a model and their verdicts,
the ratios between rows, the long synthesis's cost and memory, a frame's memory floor and the
FLOP its generator computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wyoming_kazeia._native import testing

from .common import READ_PROBE_MB, fma_peak, read_rates
from .targets import ENGINE_TARGETS_BY_MODEL, TARGETS

# What a loaded row keeps of the runs alone around it, and of their mean.
ALONE_KEYS = ("total_s", "ttfa_s", "cpu_s", "wall_s")

T = TARGETS["engine"]  # this bench's targets (0.6B q8_0; see engine_targets)

Rows = dict[str, dict[str, Any]]


def engine_targets(size: str, talker_type: str) -> dict[str, float]:
    """The targets of a model: TARGETS["engine"] (0.6B q8_0) with those of other sizes and
    weight types over it."""
    return {**T, **ENGINE_TARGETS_BY_MODEL.get((size, talker_type), {})}


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
    return {
        "talker_mb": talker / 1e6,
        "predictor_mb": predictor / 1e6,
        "predictor_pass_mb": predictor / steps / 1e6,
    }


def generator_gflop_per_frame(talker_gguf: Path, context: int) -> dict[str, float]:
    """GFLOP a frame computes, 2 per multiply-add: the talker step (its layers and codec head on
    one row, its attention over `context` positions) and the code predictor (its layers and input
    projection on the frame's rows, a 2-row first pass and one row per later sub-step; one of its
    heads per sub-step; each row's attention over the rows up to it). Norms, RoPE and sampling
    (a few operations per value) are left out."""
    import gguf

    reader = gguf.GGUFReader(talker_gguf)

    def hp(key: str) -> int:
        return int(reader.fields[f"kazeia.{key}"].contents())

    def weights(*prefixes: str) -> int:  # of the matrices
        return sum(
            int(t.n_elements)
            for t in reader.tensors
            if len(t.shape) >= 2 and t.name.startswith(prefixes)
        )

    def attention(part: str, positions: int) -> int:  # the scores and the weighted sum
        heads = hp(f"{part}.num_layers") * hp(f"{part}.num_heads") * hp(f"{part}.head_dim")
        return 4 * heads * positions

    talker = 2 * weights("tlk.blk.", "tlk.codec_head") + attention("talker", context)
    rows = hp("talker.num_code_groups")  # codes 1..15: 2 rows, then 1 per sub-step
    predictor = (
        2 * rows * weights("cp.blk.", "cp.in_proj")
        + 2 * weights("cp.heads")
        + attention("predictor", rows * (rows + 1) // 2)
    )
    return {"talker_gflop": talker / 1e9, "predictor_gflop": predictor / 1e9}


def runs_against_floor(times_ms: list[float], probes_gb_s: list[float], mb: float) -> list[float]:
    """Each run's time against the memory floor of its `mb` at the read bandwidth measured
    around it: the mean of the probes just before and just after it (one more probe than runs).
    A box's bandwidth moves with its other tenants from one second to the next, so a probe
    taken apart from a run can set it against a rate it never had."""
    if len(probes_gb_s) != len(times_ms) + 1:
        raise ValueError(
            f"runs_against_floor: {len(times_ms)} runs need {len(times_ms) + 1} read probes, "
            f"got {len(probes_gb_s)}"
        )
    return [t * (probes_gb_s[i] + probes_gb_s[i + 1]) / 2 / mb for i, t in enumerate(times_ms)]


def memory_floor(model_dir: Path, bandwidth_threads: int) -> dict[str, float]:
    """The memory floor of a frame: its weights at the read bandwidth measured now (the box's
    bandwidth moves with its other tenants). The code predictor reads the same weights in each of
    its passes, so where the CPU's last-level cache holds a good part of them it comes under
    that floor: its floor from the cache is its bytes at the rate of reading a buffer of one
    pass's size again and again."""
    floor: dict[str, float] = weights_read_per_frame(model_dir / "talker.gguf")
    rates = read_rates(testing.read_bandwidth_passes(READ_PROBE_MB, bandwidth_threads))
    floor["read_gb_s"], floor["read_median_gb_s"] = rates["best"], rates["median"]
    for part in ("talker", "predictor"):
        floor[f"{part}_floor_ms"] = floor[f"{part}_mb"] / floor["read_gb_s"]
    pass_mb = max(1, round(floor["predictor_pass_mb"]))
    floor["reread_gb_s"] = testing.read_bandwidth(pass_mb, bandwidth_threads)
    floor["predictor_cached_floor_ms"] = floor["predictor_mb"] / floor["reread_gb_s"]
    return floor


def decoder_compute(
    model_dir: Path, rows: dict[str, Any], decoder_threads: int, precision: str
) -> dict[str, Any]:
    """The decoder's FLOP per second in each row (its GFLOP per frame over its seconds per
    frame) against the FP32 multiply-add peak of its threads, measured now, and the GFLOP per
    frame its kernels perform (fewer in f32: the residual convs in Winograd's form)."""
    from .decoder import decoder_gflop_per_frame

    gflop = decoder_gflop_per_frame(model_dir / "decoder.gguf")
    performed = decoder_gflop_per_frame(model_dir / "decoder.gguf", winograd=precision == "f32")
    peak, one_thread = fma_peak(decoder_threads)
    rates = {
        name: gflop * row["n_frames"] / row["decoder_s"]
        for name, row in rows.items()
        if "failed" not in row and row.get("decoder_s", 0) > 0
    }
    return {
        "gflop_per_frame": gflop,
        "performed_gflop_per_frame": performed,
        "peak_gflop_s": peak,
        "one_thread_gflop_s": one_thread,
        "peak_isa": testing.FMA_PEAK_ISA,
        "threads": decoder_threads,
        "row_gflop_s": rates,
    }


def add_row_ratios(rows: Rows, loaded: Rows, ideal: dict[str, Any] | None = None) -> None:
    """Each row's total against its table's one-shot row, each loaded row's slowdown, and,
    where the ideal program ran, its wall time's slowdown and its cores alone / loaded against
    the ideal program's (``vs_ideal``, ``cores_vs_ideal``)."""
    for table in (rows, loaded):
        ok_rows = {n: r for n, r in table.items() if "failed" not in r}
        if "oneshot" in ok_rows:
            for row in ok_rows.values():
                row["vs_oneshot"] = row["total_s"] / ok_rows["oneshot"]["total_s"]
    for name, row in loaded.items():
        if "failed" not in row:
            # The same row alone: the mean of its runs just before and just after.
            runs = row["alone_runs"]
            alone = row["alone"] = mean_of(runs, ALONE_KEYS)
            row["slowdown"] = row["total_s"] / alone["total_s"]
            row["ttfa_slowdown"] = row["ttfa_s"] / alone["ttfa_s"]
            row["slowdown_vs_table"] = row["total_s"] / rows[name]["total_s"]
            # Both factors count the pools' polling, which alone keeps idle cores busy and
            # loaded gives its turns away.
            row.update(load_factors(alone, row))
            if ideal is not None and "failed" not in ideal:
                row["vs_ideal"] = row["wall_slowdown"] / ideal["wall_slowdown"]
                row["cores_vs_ideal"] = (
                    row["cores_alone_vs_loaded"] / ideal["cores_alone_vs_loaded"]
                )


def mean_of(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    """The mean of each of ``keys`` over ``runs``: a loaded run's baseline from the runs alone
    around it."""
    return {k: sum(r[k] for r in runs) / len(runs) for k in keys}


def load_factors(alone: dict[str, Any], loaded: dict[str, Any]) -> dict[str, float]:
    """A run beside the competing load against the same run alone (each with ``wall_s`` and
    ``cpu_s``): the slowdown of its wall time and its two factors, whose product it is: the
    cores it kept busy alone against those it got loaded (CPU seconds over wall seconds), and
    its CPU seconds loaded against alone."""
    alone_cores = alone["cpu_s"] / alone["wall_s"]
    cores = loaded["cpu_s"] / loaded["wall_s"]
    return {
        "wall_slowdown": loaded["wall_s"] / alone["wall_s"],
        "cores": cores,
        "alone_cores": alone_cores,
        "cores_alone_vs_loaded": alone_cores / cores,
        "cpu_vs_alone": loaded["cpu_s"] / alone["cpu_s"],
    }


def target_verdicts(
    t: dict[str, float], rows: Rows, loaded: Rows, voice_rows: Rows
) -> dict[str, Any]:
    """Every target's bound and, by row, whether the row met it."""
    stream_names = [n for n in rows if n.startswith("stream_k")]
    return {
        "ttfa_ms_max": t["ttfa_ms"],
        "ttfa_ok": {n: 1e3 * rows[n]["ttfa_s"] <= t["ttfa_ms"] for n in stream_names},
        "stream_ratio_max": t["stream_ratio"],
        "stream_ratio_ok": {n: rows[n]["vs_oneshot"] <= t["stream_ratio"] for n in stream_names},
        "rtf_max": t["rtf"],
        "rtf_ok": {n: r["rtf"] <= t["rtf"] for n, r in rows.items()},
        "rss_mb_max": t["peak_rss_mb"],
        "rss_ok": {n: r["engine_peak_rss_mb"] <= t["peak_rss_mb"] for n, r in rows.items()},
        "slowdown_max": t["load_slowdown"],
        # None: not measured (the row's run alone before it failed).
        "slowdown_ok": {n: _slowdown_ok(r, t["load_slowdown"]) for n, r in loaded.items()},
        "clone_ttfa_ms_max": t["clone_ttfa_ms"],
        "clone_ttfa_ok": {
            n: 1e3 * r["ttfa_s"] <= t["clone_ttfa_ms"] for n, r in voice_rows.items()
        },
    }


def _slowdown_ok(row: dict[str, Any], bound: float) -> bool | None:
    """Whether a loaded row's slowdown is within ``bound``; a row that failed under load
    missed, one whose run alone before it failed was not measured."""
    if "failed" not in row:
        return bool(row["slowdown"] <= bound)
    return None if row["failed_stage"] == "alone" else False


def add_long_figures(
    long_row: dict[str, Any],
    builtin: dict[str, Any],
    t: dict[str, float],
    targets: dict[str, Any],
) -> None:
    """The long synthesis against the built-in voice's stream row of the same chunk: its cost
    per frame, its RSS growth against the K/V cache and audio it adds, and their targets."""
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
    # The cache's slots are cleared (touched) a block at a time as it grows: up to one block
    # ahead of the frames.
    long_row["kv_block_mb"] = long_row["kv_bytes_per_frame"] * testing.KV_BLOCK / 2**20
    targets["long_ratio_max"] = t["long_ratio"]
    allowed_mb = long_row["kv_cache_mb"] + long_row["kv_block_mb"] + long_row["audio_mb"]
    targets["long_ok"] = {
        "cost": long_row["cost_ratio"] <= t["long_ratio"],
        "rss": long_row["rss_growth_mb"] <= allowed_mb,
    }


def add_voice_ratios(voice_rows: Rows, builtin: dict[str, Any]) -> None:
    """Each cloned voice's first audio and RTF against the built-in voice's stream row."""
    for row in voice_rows.values():
        row["ttfa_vs_builtin"] = row["ttfa_s"] / builtin["ttfa_s"]
        row["rtf_vs_builtin"] = row["rtf"] / builtin["rtf"]
