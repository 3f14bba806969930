"""The markdown report of ``script/bench engine``."""

from __future__ import annotations

import statistics
from typing import Any

from .common import bf16_peak_note, fmt, machine_line, ok, performed_note
from .engine_figures import T, runs_against_floor
from .engine_runs import PLACED, PLACED_KEYS, VOICE_CHUNK, row_label
from .peers import peer_lines

# What the columns of the tables mean.
LEGEND = (
    "decoder / talker / predictor s = the engine's metrics (decoder: time in push/decode, or in "
    "the kazeia-decoder subprocess with its start and model load); total and TTFA (time to the "
    "first audio chunk) = the engine's metrics too, from the start of the synthesis (the caller's "
    "view from the synthesize() call is in --json: wall_s, first_chunk_wall_s); RTF = total / "
    "audio s; (cold) = the process's first synthesis, the warm-up; total vs one-shot = total / "
    "total of the one-shot row of the same table; slowdown = total (TTFA) under load / the mean "
    "of the same row run alone just before and just after it, with as many syntheses (vs the "
    "unloaded table: against that table's row, run minutes earlier); engine cores = the CPU "
    "seconds of the engine's threads (and of its kazeia-decoder child) over the wall time from "
    "the synthesize() call to the last chunk consumed (wall_s in --json; alone: both runs' mean "
    "CPU seconds over their mean wall time); cores alone / loaded (how much less of the cores the "
    "engine got beside the competing processes) times engine CPU vs alone (CPU seconds per "
    "synthesis loaded / alone: what the contention costs in work, and any change of the box's "
    "speed) is the slowdown of that wall time, the slowdown column's within a few %; both count "
    "the pools' polling, which alone keeps idle cores busy and loaded gives its turns to the "
    "other processes; load CPU share = the mean fraction of a CPU each load process got over the "
    "whole loaded child (its start, model load and warm-up too, not only the timed syntheses); "
    "ideal program = one single-thread process per usable core, sharing a fixed amount of work "
    "(products of a cache-resident matrix) in small units, never waiting for another: alone, "
    "beside the same load, alone again: its cores alone / loaded is the share of the cores the "
    "scheduler leaves a program with one thread per core and nothing lost to waits, its slowdown "
    "that share times what the box's speed did meanwhile (its load CPU share counts the load's "
    "0.5 s head start over a short run); each row's wall-time slowdown and cores alone / loaded "
    "against the ideal program's follow the table (--json: wall_slowdown, vs_ideal, "
    "cores_vs_ideal); peak RSS = VmHWM of the whole process (+ the peak of the kazeia-decoder "
    "subprocess); medians over the runs."
)


def engine_table(result: dict[str, Any]) -> str:
    """The markdown report of the ``engine`` bench."""
    t = result["config"].get("target_values", T)
    lines = _rows_lines(result, t)
    lines += _player_lines(result)
    lines += _memory_floor_lines(result)
    lines += _decoder_compute_lines(result)
    lines += _long_lines(result, t)
    lines += _placed_lines(result)
    lines += _voice_lines(result, t)
    lines += _loaded_lines(result, t)
    lines += _summary_lines(result, t)
    lines += peer_lines(result)
    lines.append(LEGEND)
    return "\n".join(lines)


def _verdict(flags: dict[str, bool | None]) -> str:
    """``ok`` when every flag holds, else ``MISSED`` and the rows that missed; the rows not
    measured (None) are named as such."""
    bad = [row_label(n) for n, good in flags.items() if good is False]
    unmeasured = [row_label(n) for n, good in flags.items() if good is None]
    if len(unmeasured) == len(flags) and flags:
        return "not measured"
    verdict = "ok" if not bad else f"MISSED ({', '.join(bad)})"
    if unmeasured:
        verdict += f"; not measured: {', '.join(unmeasured)}"
    return verdict


def _label(name: str, row: dict[str, Any], frames: int) -> str:
    """A row's label, flagged where it gave another number of frames than the run's."""
    text = row_label(name)
    if row["n_frames"] != frames:
        text += f" ({row['n_frames']} frames!)"
    return text


def _peak(row: dict[str, Any]) -> str:
    text = f"{row['peak_rss_mb']:.0f}"
    if row["decoder_subprocess_peak_rss_mb"] > 0:
        text += f" + {row['decoder_subprocess_peak_rss_mb']:.0f}"
    return text


def _cells(row: dict[str, Any]) -> str:
    """The cells a row has in the unloaded and in the loaded table."""
    return (
        f"| {row['decoder_s']:.2f} | {row['total_s']:.2f} | {row['rtf']:.2f} "
        f"| {1e3 * row['ttfa_s']:.0f} ({1e3 * row['cold_ttfa_s']:.0f}) | {row['n_chunks']} "
        f"| {row['talker_s']:.2f} | {row['predictor_s']:.2f} "
        f"| {fmt(row.get('vs_oneshot'), '.3f', 'x')} | {_peak(row)} "
    )


def _rows_lines(result: dict[str, Any], t: dict[str, float]) -> list[str]:
    """The machine, the configuration and the table of the unloaded rows."""
    c, tg = result["config"], result["targets"]
    lines = [
        machine_line(result["machine"]),
        f"Engine: {c['model_dir']} (talker {c['talker_mb']:.0f} MB, decoder "
        f"{c['decoder_mb']:.0f} MB); threads {c['threads']} + decoder {c['decoder_threads']} "
        f"({c.get('decoder_precision', 'f32')}), talker K/V cache {c.get('kv_cache_type', 'f32')}; "
        f"{c['frames']} frames forced ({c['audio_s']:.2f} s of audio); speaker {c['speaker']}, "
        f"{c['language']}, seed {c['seed']}; text {c['text']!r}; a warm-up synthesis, then "
        f"{c['repeats']} timed per row (medians)",
        "",
        "| row | decoder s | total s | RTF | TTFA ms (cold) | chunks | talker s | predictor s "
        "| total vs one-shot | peak RSS MB | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in result["rows"].items():
        target = []
        if name in tg["ttfa_ok"]:
            target.append(f"TTFA <= {t['ttfa_ms']:.0f}: {ok(tg['ttfa_ok'][name])}")
        if name in tg["stream_ratio_ok"]:
            target.append(f"<= {t['stream_ratio']:.2f}x: {ok(tg['stream_ratio_ok'][name])}")
        target.append(f"RTF <= {t['rtf']}: {ok(tg['rtf_ok'][name])}")
        target.append(f"RSS <= {t['peak_rss_mb']:.0f}: {ok(tg['rss_ok'][name])}")
        lines.append(f"| {_label(name, row, c['frames'])} {_cells(row)}| {'; '.join(target)} |")
    return lines


def _player_lines(result: dict[str, Any]) -> list[str]:
    """The prebuffer table: a player at real time fed each streaming row's chunks as they come,
    and let out through the service's prebuffer (unloaded rows, then loaded ones)."""
    tables = ((result["rows"], ""), (result.get("loaded_rows") or {}, " loaded"))
    streamed = [
        (row_label(name) + suffix, row)
        for table, suffix in tables
        for name, row in table.items()
        if "underruns" in row
    ]
    if not streamed:
        return []
    lines = [
        "",
        "Prebuffer: a player at real time (24 kHz; it starts with the first audio it gets) fed "
        "each timed run's chunks as they came, and let out through the service's hold "
        "(pacing.Prebuffer, its rates taught as the service's: by the warm-up, then by each "
        "run before); underruns = times it ran dry, silence = seconds it waited, held = the "
        "first audio's added delay, least needed = the shortest hold, released as a chunk "
        "arrives, after which it would not have run dry (knowing all the arrivals); medians "
        "over the runs (the most of one run):",
        "",
        "| row | produced x real time | as it comes: underruns | silence s "
        "| prebuffered: underruns (most) | silence s | held s | least needed s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return lines + [
        f"| {label} | {_production_rate(row):.2f} | {row['underruns']:g} "
        f"| {row['silence_s']:.2f} | {row['prebuffer_underruns']:g} "
        f"({max(run['prebuffer_underruns'] for run in row['runs']):g}) "
        f"| {row['prebuffer_silence_s']:.2f} | {row['prebuffer_held_s']:.2f} "
        f"| {row['least_hold_s']:.2f} |"
        for label, row in streamed
    ]


def _production_rate(row: dict[str, Any]) -> float:
    """Seconds of audio a second after the first chunk (what the service learns), medians."""
    after = row["total_s"] - row["ttfa_s"]
    return row["audio_s"] / after if after > 0 else float("nan")


def _memory_floor_lines(result: dict[str, Any]) -> list[str]:
    """The generator alone against the memory floor of its weights (the subprocess row's):
    at the probes the parent takes after every row, and each run at the read bandwidth
    probed around it in the row's process."""
    floor = result.get("memory_floor")
    alone = (result["rows"].get("subprocess") or {}).get("generator_alone")
    if floor is None or alone is None:
        return []
    probes = alone["probes_gb_s"]
    medians = alone["probes_median_gb_s"]

    def around(part: str) -> str:
        ratios = runs_against_floor(alone[f"{part}_runs_ms"], probes, floor[f"{part}_mb"])
        median_pass_ratios = runs_against_floor(
            alone[f"{part}_runs_ms"], medians, floor[f"{part}_mb"]
        )
        return (
            f"{statistics.median(ratios):.2f}x its floor ({min(ratios):.2f}-{max(ratios):.2f}x "
            f"over {_count(len(ratios), 'run')}; {statistics.median(median_pass_ratios):.2f}x "
            f"at the probes' median passes)"
        )

    return [
        "",
        f"Memory floor per frame (the generator alone, in the subprocess-decoder row's "
        f"process after its runs): talker {alone['talker_ms']:.1f} ms/frame for "
        f"{floor['talker_mb']:.0f} MB of weights (floor {floor['talker_floor_ms']:.1f} ms), "
        f"code predictor {alone['predictor_ms']:.1f} ms/frame for "
        f"{floor['predictor_mb']:.0f} MB (floor {floor['predictor_floor_ms']:.1f} ms; "
        f"{floor['predictor_cached_floor_ms']:.1f} ms at the {floor['reread_gb_s']:.1f} GB/s "
        f"of re-reading one pass's {floor['predictor_pass_mb']:.0f} MB, partly from the "
        f"cache), at the {floor['read_gb_s']:.1f} GB/s read bandwidth measured after the rows "
        f"({_count(result['config']['bandwidth_threads'], 'thread')}; the probe's best pass, "
        f"its median pass {floor['read_median_gb_s']:.1f} GB/s)",
        f"Each run at the read bandwidth probed around it (the mean of the probes just before "
        f"and after it in that process, their best passes {min(probes):.1f}-{max(probes):.1f} "
        f"GB/s, median passes {min(medians):.1f}-{max(medians):.1f}, same threads; the ratios' "
        f"medians over the runs): talker {around('talker')}, code predictor "
        f"{around('predictor')} (from memory)",
    ]


def _count(n: int, noun: str) -> str:
    """'1 run', '3 runs'."""
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _decoder_compute_lines(result: dict[str, Any]) -> list[str]:
    """Each row's decoder against the FP32 multiply-add peak of its threads."""
    compute = result.get("decoder_compute")
    if not compute or not compute["row_gflop_s"]:
        return []
    peak = compute["peak_gflop_s"]
    shares = ", ".join(
        f"{row_label(name)} {rate:.0f} GFLOP/s = {100 * rate / peak:.0f}%"
        for name, rate in compute["row_gflop_s"].items()
    )
    return [
        "",
        f"Decoder against the compute peak: {compute['gflop_per_frame']:.2f} GFLOP per frame; "
        f"{shares} of the {peak:.0f} GFLOP/s FP32 multiply-add peak of its "
        f"{compute['threads']} threads ({compute['peak_isa']}, measured after the rows; one "
        f"thread {compute['one_thread_gflop_s']:.0f}; the decoder's time is the wall time of "
        "its calls, which share the cores with the generator where the two run at once)"
        + bf16_peak_note(result["config"].get("decoder_precision", "f32"))
        + performed_note(compute),
    ]


def _long_lines(result: dict[str, Any], t: dict[str, float]) -> list[str]:
    """The long synthesis (``--long-frames``) against the stream row of its chunk."""
    long_row = result.get("long_row")
    if long_row is None or "cost_ratio" not in long_row:
        return []
    ok_long = result["targets"]["long_ok"]
    return [
        "",
        f"Long synthesis (stream k={VOICE_CHUNK}, one run after a 40-frame warm-up): "
        f"{long_row['n_frames']} frames in {long_row['total_s']:.1f} s, "
        f"{long_row['ms_per_frame']:.1f} ms/frame against {long_row['ms_per_frame_short']:.1f} "
        f"for {result['config']['frames']} frames = {long_row['cost_ratio']:.3f}x (target <= "
        f"{t['long_ratio']:.2f}x: {ok(ok_long['cost'])}); peak RSS "
        f"{long_row['peak_rss_mb']:.0f} MB, +{long_row['rss_growth_mb']:.0f} MB for a K/V "
        f"cache of {long_row['kv_cache_mb']:.0f} MB ({long_row.get('kv_cache_type', 'f32')}; "
        f"{long_row['kv_block_mb']:.0f} MB more while a block of slots ahead is in use) and "
        f"{long_row.get('audio_mb', 0.0):.1f} MB of audio the bench's consumer keeps (target: "
        f"no more: {ok(ok_long['rss'])})",
    ]


def _placed_lines(result: dict[str, Any]) -> list[str]:
    """The row placed on devices, and its frames computed whole against apart."""
    placed = result.get("placed_row")
    if placed is None:
        return []
    devices, vs = placed["devices"], placed.get("vs_cpu") or {}
    frames = placed["n_frames"]
    lines = [
        "",
        f"Placed on a device: talker on {devices['talker']}, code predictor on "
        f"{devices['predictor']}, decoder on {devices['decoder']} (stream k={VOICE_CHUNK}, "
        f"the CPU row beside it in the table above):",
        "",
        "| row | total s | RTF | TTFA ms (cold) | decoder s | talker s | predictor s "
        "| whole frames s | computations per frame (predictor's) "
        "| vs CPU total / TTFA / decoder / generator |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {row_label(PLACED)} | {placed['total_s']:.2f} | {placed['rtf']:.2f} "
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
    return lines


def _voice_lines(result: dict[str, Any], t: dict[str, float]) -> list[str]:
    """The cloned voices' table."""
    voice_rows = result.get("voice_rows") or {}
    if not voice_rows:
        return []
    tg = result["targets"]
    lines = [
        "",
        f"Cloned voices on {result['base_model_dir']} (the same threads, frames and text; "
        f"a {voice_rows[next(iter(voice_rows))]['ref_seconds']:.0f} s reference recording; "
        "its prompt made once, then the warm-up and the timed runs):",
        "",
        "| row | prompt s | TTFA ms (cold) | vs built-in k=4 | RTF | vs built-in | peak RSS MB "
        "| target |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    return lines + [
        f"| {row_label(name)} | {row['prompt_s']:.2f} | {1e3 * row['ttfa_s']:.0f} "
        f"({1e3 * row['cold_ttfa_s']:.0f}) | {fmt(row.get('ttfa_vs_builtin'), '.2f', 'x')} "
        f"| {row['rtf']:.2f} | {fmt(row.get('rtf_vs_builtin'), '.2f', 'x')} "
        f"| {row['peak_rss_mb']:.0f} | TTFA <= {t['clone_ttfa_ms']:.0f}: "
        f"{ok(tg['clone_ttfa_ok'][name])} |"
        for name, row in voice_rows.items()
    ]


def _loaded_lines(result: dict[str, Any], t: dict[str, float]) -> list[str]:
    """The table of the rows beside the competing load, each slowed down from the same row run
    alone around it."""
    c = result["config"]
    if not c["load"]:
        return []
    rows, tg = result["rows"], result["targets"]
    lines = [
        "",
        f"Beside a competing load of {c['load_procs']} busy single-thread processes "
        f"({c['load_kind']}), {c['load_repeats']} timed syntheses per row after the warm-up, "
        "each row between two runs of the same row alone:",
        "",
        "| row | decoder s | total s | RTF | TTFA ms (cold) | chunks | talker s | predictor s "
        "| total vs one-shot | peak RSS MB | slowdown total (TTFA) "
        "| vs the unloaded table "
        "| engine cores loaded (alone) "
        "| cores alone / loaded | engine CPU vs alone | load CPU share | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in result["loaded_rows"].items():
        verdict = tg["slowdown_ok"][name]
        target = f"slowdown <= {t['load_slowdown']}x: " + (
            "not measured" if verdict is None else ok(verdict)
        )
        if "failed" in row:
            failed = f"{row['failed_stage']} run failed: {row['failed']}"
            # A loaded run killed at its bound took at least that long; one that failed
            # otherwise, or a run alone that failed, says nothing of the slowdown.
            slowdown = "-"
            if row["failed_stage"] == "loaded" and row["timed_out"]:
                slowdown = f"> {row['bound_s'] / rows[name]['row_wall_s']:.0f}x (row wall)"
            lines.append(
                f"| {row_label(name)} | {failed} | - | - | - | - | - | - | - | - "
                f"| {slowdown} | - | - | - | - | - | {target} |"
            )
            continue
        label = _label(name, row, c["frames"])
        if any(r["n_frames"] != c["frames"] for r in row["alone_runs"]):
            label += " (a run alone gave other frames!)"
        if "alone_after_failed" in row:
            label += f" (against the run alone before it only: {row['alone_after_failed']})"
        lines.append(
            f"| {label} {_cells(row)}"
            f"| {row['slowdown']:.2f}x ({row['ttfa_slowdown']:.2f}x) "
            f"| {row['slowdown_vs_table']:.2f}x "
            f"| {row['cores']:.2f} ({row['alone_cores']:.2f}) "
            f"| {row['cores_alone_vs_loaded']:.2f}x | {row['cpu_vs_alone']:.3f}x "
            f"| {_load_share(row)} "
            f"| {target} |"
        )
    return lines + _ideal_lines(result)


def _load_share(row: dict[str, Any]) -> str:
    """The mean share of a CPU each competing-load process got beside ``row``."""
    share = row["load"].get("cpu_share")
    return fmt(None if share is None else 100 * share, ".0f", "%")


def _ideal_lines(result: dict[str, Any]) -> list[str]:
    """The ideal program's line of the loaded table, and each loaded row's wall-time slowdown
    against the ideal program's."""
    ideal = result.get("ideal_row")
    if ideal is None:
        return []
    if "failed" in ideal:
        return [f"| ideal program | failed: {ideal['failed']} " + "| - " * 14 + "| reference |"]
    lines = [
        f"| ideal program ({ideal['processes']} processes that never wait) | - "
        f"| {ideal['runs']['loaded']['wall_s']:.2f} | - | - | - | - | - | - | - "
        f"| {ideal['wall_slowdown']:.2f}x (-) | - "
        f"| {ideal['cores']:.2f} ({ideal['alone_cores']:.2f}) "
        f"| {ideal['cores_alone_vs_loaded']:.2f}x | {ideal['cpu_vs_alone']:.3f}x "
        f"| {_load_share(ideal)} | reference |"
    ]
    against = [
        f"{row_label(name)} {row['wall_slowdown']:.2f}x / {ideal['wall_slowdown']:.2f}x = "
        f"{row['vs_ideal']:.2f}x (cores alone / loaded {row['cores_alone_vs_loaded']:.2f}x / "
        f"{ideal['cores_alone_vs_loaded']:.2f}x = {row['cores_vs_ideal']:.2f}x)"
        for name, row in result["loaded_rows"].items()
        if "vs_ideal" in row
    ]
    if against:
        lines += [
            "",
            "Each row's slowdown of the wall time (cores alone / loaded x engine CPU vs alone) "
            "against the ideal program's: " + "; ".join(against),
        ]
    return lines


def _summary_lines(result: dict[str, Any], t: dict[str, float]) -> list[str]:
    """Every row's audio, load time and RSS after load, and the verdict of every target."""
    c, rows, tg = result["config"], result["rows"], result["targets"]
    all_rows = {row_label(n): r for n, r in rows.items()}
    all_rows.update(
        {f"{row_label(n)} loaded": r for n, r in result["loaded_rows"].items() if "failed" not in r}
    )
    lines = [
        "",
        "audio: "
        + "; ".join(
            f"{n}: {r['audio_samples']} samples, max |diff| vs one-shot "
            f"{fmt(r['audio_max_abs_diff_vs_oneshot'], 'd')} LSB, same every run: "
            f"{'yes' if r['same_audio_every_run'] else 'NO'}"
            for n, r in all_rows.items()
        ),
        "load s / RSS after load MB: "
        + "; ".join(
            f"{row_label(n)}: {r['load_s']:.2f} / {r['rss_load_mb']:.0f}" for n, r in rows.items()
        ),
    ]
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
    return lines
