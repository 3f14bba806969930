"""The decoder bench's account of the weights a one-frame push reads, the FLOP a frame computes,
the bandwidth and compute peak probes, and the engine bench's player at real time (its prebuffer
table)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gguf
import pytest
from kazeia_dev.bench.common import BenchTimeout, dev_child_env, read_rates
from kazeia_dev.bench.decoder import (
    decoder_columns_per_frame,
    decoder_gflop_per_frame,
    gguf_u32_list,
    streamed_weight_mb,
    winograd_tiles_per_frame,
)
from kazeia_dev.bench.engine_figures import (
    T,
    add_row_ratios,
    generator_gflop_per_frame,
    memory_floor,
    runs_against_floor,
    target_verdicts,
)
from kazeia_dev.bench.engine_report import (
    _loaded_lines,
    _memory_floor_lines,
    _player_lines,
    _verdict,
)
from kazeia_dev.bench.ideal_program import (
    IDEAL_PROGRAM,
    MAX_UNITS,
    ideal_figures,
    ideal_run,
    ideal_units,
)
from kazeia_dev.bench.player import Chunk, least_hold, let_out, player_figures, underruns
from kazeia_dev.bench.prebuffer import replay, slowed

from wyoming_kazeia import _native
from wyoming_kazeia.pacing import Prebuffer, SpeechRates
from wyoming_kazeia.settings import usable_cpus


@pytest.mark.parametrize("model", ["tiny-0.6b", "tiny-1.7b"])
def test_columns_per_frame_follow_the_upsampling(decoder_gguf: dict[str, Path], model: str) -> None:
    reader = gguf.GGUFReader(decoder_gguf[model])

    def u32(key: str) -> list[int]:
        return gguf_u32_list(reader, f"kazeia.decoder.{key}")

    ratios, rates, hop = u32("upsampling_ratios"), u32("upsample_rates"), u32("hop_length")[0]
    columns = {
        t.name: decoder_columns_per_frame(t.name, ratios, rates)
        for t in reader.tensors
        if len(t.shape) == 2 and "codebook" not in t.name and "dwconv" not in t.name
    }
    assert columns["dec.voc.conv_out.weight"] == hop  # the last conv runs at the sample rate
    assert columns["dec.tfm.blk.0.attn_q.weight"] == columns["dec.pre_conv.weight"] == 1
    assert columns["dec.up.0.trans.weight"] == 1 and columns["dec.up.0.pwconv1.weight"] == ratios[0]
    assert columns["dec.voc.conv_in.weight"] == math.prod(ratios)
    assert columns["dec.voc.blk.0.up.weight"] == math.prod(ratios)
    assert columns["dec.voc.blk.0.res.0.conv1.weight"] == math.prod(ratios) * rates[0]

    total, low = streamed_weight_mb(decoder_gguf[model])
    matrices = sum(int(t.n_bytes) for t in reader.tensors if t.name in columns) / 1e6
    assert total == pytest.approx(matrices) and 0 < low < total


@pytest.mark.parametrize("model", ["tiny-0.6b", "tiny-1.7b"])
def test_flop_per_frame_counts_each_weight_per_row_or_column(
    talker_gguf: dict[str, Path], decoder_gguf: dict[str, Path], model: str
) -> None:
    reader = gguf.GGUFReader(talker_gguf[model])

    def hp(key: str) -> int:
        return int(reader.fields[f"kazeia.{key}"].contents())

    def weights(prefix: str) -> int:
        return sum(int(t.n_elements) for t in reader.tensors if t.name.startswith(prefix))

    near, far = (generator_gflop_per_frame(talker_gguf[model], c) for c in (10, 110))
    # 100 more positions: only the talker's attention grows, 2 x 2 FLOP per key dimension.
    attention = 4 * 100 * hp("talker.num_layers") * hp("talker.num_heads") * hp("talker.head_dim")
    assert 1e9 * (far["talker_gflop"] - near["talker_gflop"]) == pytest.approx(attention)
    assert far["predictor_gflop"] == near["predictor_gflop"]
    # A row through the talker's codec head; 16 rows through the predictor's layers.
    assert 1e9 * near["talker_gflop"] > 2 * weights("tlk.codec_head")
    assert 1e9 * near["predictor_gflop"] > 2 * 16 * weights("cp.blk.0.ffn_up")

    reader = gguf.GGUFReader(decoder_gguf[model])
    matrices = [t for t in reader.tensors if len(t.shape) == 2 and "codebook" not in t.name]
    hop = gguf_u32_list(reader, "kazeia.decoder.hop_length")[0]
    conv_out = next(t for t in matrices if t.name == "dec.voc.conv_out.weight")
    flop = 1e9 * decoder_gflop_per_frame(decoder_gguf[model])
    assert flop > 2 * sum(int(t.n_elements) for t in matrices)  # each sees >= 1 column
    assert flop > 2 * int(conv_out.n_elements) * hop  # the last conv at the sample rate


def test_winograd_performs_fewer_multiply_adds_in_the_residual_convs(
    decoder_gguf: dict[str, Path],
) -> None:
    """The performed count replaces each residual unit's 7-tap conv (14 products per pair of
    columns) by its Winograd tiles (8 per pair, a leftover column a tile of its own): 18 tiles
    for a frame of 32 columns at dilation 9 (pairs 0-8 with 9-17, 18-22 with 27-31, 23-26 each
    with the column a dilation before), half the columns where the dilation divides them."""
    assert winograd_tiles_per_frame(32, 9) == 18
    assert winograd_tiles_per_frame(32, 3) == 17
    assert winograd_tiles_per_frame(1920, 1) == winograd_tiles_per_frame(1920, 3) == 960
    nominal = decoder_gflop_per_frame(decoder_gguf["tiny-0.6b"])
    performed = decoder_gflop_per_frame(decoder_gguf["tiny-0.6b"], winograd=True)
    assert 0.5 * nominal < performed < 0.9 * nominal


def _parent_floor_line(floor: dict[str, float]) -> str:
    """The report's floor line at the parent's probe for `floor`, beside one generator run."""
    alone = {
        "talker_ms": 1.0,
        "predictor_ms": 2.0,
        "talker_runs_ms": [1.0],
        "predictor_runs_ms": [2.0],
        "probes_gb_s": [10.0, 10.0],
        "probes_median_gb_s": [8.0, 8.0],
    }
    result = {
        "memory_floor": floor,
        "rows": {"subprocess": {"generator_alone": alone}},
        "config": {"bandwidth_threads": 1},
    }
    return _memory_floor_lines(result)[-2]


def test_the_floor_line_sets_the_code_predictor_against_both_read_rates(
    talker_gguf: dict[str, Path], tmp_path: Path
) -> None:
    """A frame's floor: the talker's and the code predictor's bytes (15 passes of one pass's
    layers and one head) at the read bandwidth of a large buffer, and the code predictor's also
    at the rate of re-reading one pass's bytes (its weights partly stay in the cache), all in
    the report's line."""
    (tmp_path / "talker.gguf").symlink_to(talker_gguf["tiny-0.6b"])
    floor = memory_floor(tmp_path, 1)
    assert floor["predictor_mb"] == pytest.approx(15 * floor["predictor_pass_mb"])
    for part, rate in (("talker", "read_gb_s"), ("predictor", "read_gb_s")):
        assert floor[f"{part}_floor_ms"] == pytest.approx(floor[f"{part}_mb"] / floor[rate])
    assert floor["predictor_cached_floor_ms"] == pytest.approx(
        floor["predictor_mb"] / floor["reread_gb_s"]
    )
    line = _parent_floor_line(floor)
    assert (
        f"{floor['predictor_cached_floor_ms']:.1f} ms at the {floor['reread_gb_s']:.1f} GB/s"
        in line
    )
    assert f"(floor {floor['talker_floor_ms']:.1f} ms)" in line


def test_the_floor_is_set_at_the_probes_best_pass_with_its_median_beside_it(
    talker_gguf: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's floor line: the large buffer's probe read as its best pass (the floors) and
    the median of the way that gave it, both in the line; the re-read probe stays the real one."""
    from kazeia_dev.bench import engine_figures

    (tmp_path / "talker.gguf").symlink_to(talker_gguf["tiny-0.6b"])
    passes = [[30.0, 10.0, 12.0, 11.0], [20.0, 21.0, 22.0, 25.0]]
    probe = SimpleNamespace(
        read_bandwidth_passes=lambda megabytes, threads: passes,
        read_bandwidth=_native.testing.read_bandwidth,
    )
    monkeypatch.setattr(engine_figures, "testing", probe)
    floor = memory_floor(tmp_path, 1)
    assert (floor["read_gb_s"], floor["read_median_gb_s"]) == (30.0, 11.5)
    assert floor["talker_floor_ms"] == pytest.approx(floor["talker_mb"] / 30.0)
    assert (
        "at the 30.0 GB/s read bandwidth measured after the rows (1 thread; the probe's best "
        "pass, its median pass 11.5 GB/s)" in _parent_floor_line(floor)
    )


def test_each_run_is_set_against_the_read_bandwidth_probed_around_it() -> None:
    """A run's floor is its bytes at the mean of the probes just before and just after it, not
    at one probe taken apart from it (the box's bandwidth moves with its other tenants); the
    report gives the median over the runs and their range."""
    # 300 MB: 10 ms at 40 GB/s (probes 30 and 50) is 1.33x its 7.5 ms floor; 20 ms at 30 GB/s
    # (50 and 10) 2.0x its 10 ms.
    assert runs_against_floor([10.0, 20.0], [30.0, 50.0, 10.0], 300.0) == pytest.approx(
        [4 / 3, 2.0]
    )
    with pytest.raises(ValueError, match="2 runs need 3 read probes, got 2"):
        runs_against_floor([10.0, 20.0], [30.0, 50.0], 300.0)
    alone = {
        "talker_ms": 15.0,
        "predictor_ms": 50.0,
        "talker_runs_ms": [10.0, 20.0],
        "predictor_runs_ms": [40.0, 60.0],  # 1200 MB: 1.33x and 1.5x
        "probes_gb_s": [30.0, 50.0, 10.0],
        # The median passes: 10 ms at 30 GB/s (20, 40) 1.0x, 20 ms at 24 (40, 8) 1.6x; 40 ms
        # at 30 GB/s 1.0x, 60 ms at 24 1.2x.
        "probes_median_gb_s": [20.0, 40.0, 8.0],
    }
    floor = {
        "talker_mb": 300.0,
        "predictor_mb": 1200.0,
        "predictor_pass_mb": 80.0,
        "read_gb_s": 20.0,
        "read_median_gb_s": 18.0,
        "reread_gb_s": 40.0,
        "talker_floor_ms": 15.0,
        "predictor_floor_ms": 60.0,
        "predictor_cached_floor_ms": 30.0,
    }
    result = {
        "memory_floor": floor,
        "rows": {"subprocess": {"generator_alone": alone}},
        "config": {"bandwidth_threads": 2},
    }
    line = _memory_floor_lines(result)[-1]
    assert "their best passes 10.0-50.0 GB/s, median passes 8.0-40.0" in line
    assert (
        "talker 1.67x its floor (1.33-2.00x over 2 runs; 1.30x at the probes' median passes)"
        in line
    )
    assert (
        "code predictor 1.42x its floor (1.33-1.50x over 2 runs; 1.10x at the probes' median "
        "passes)" in line
    )


def test_the_generator_alone_runs_each_lie_between_two_read_probes(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The floor line's generator runs alternate with the read probes of the same process: a
    probe, a run, a probe, a run, a probe; the probes' rates and each run's times are kept."""
    from kazeia_dev.bench import engine_child

    from wyoming_kazeia.engine import Engine
    from wyoming_kazeia.settings import EngineSettings

    engine = Engine(tiny_model, EngineSettings(max_frames=8, seed=3))
    calls: list[str] = []
    passes: list[list[list[float]]] = []

    def probe(megabytes: int, threads: int) -> list[list[float]]:  # the real probe, recorded
        calls.append("probe")
        passes.append(_native.testing.read_bandwidth_passes(megabytes, threads))
        return passes[-1]

    class RecordedGenerator:  # the real generator, its frames() calls recorded
        def __init__(self, real: Any) -> None:
            self.real = real

        def frames(self, *args: Any, **kwargs: Any) -> Any:
            calls.append("run")
            return self.real.frames(*args, **kwargs)

    monkeypatch.setattr(engine_child, "testing", SimpleNamespace(read_bandwidth_passes=probe))
    monkeypatch.setattr(engine, "generator", RecordedGenerator(engine.generator))
    args = argparse.Namespace(
        text="Hello there.",
        speaker="vivian",
        language="english",
        seed=3,
        frames=8,
        repeats=2,
        threads=2,
    )
    alone = engine_child._generator_alone(engine, args)
    assert calls == ["probe", "run", "probe", "run", "probe"]
    assert alone["probes_gb_s"] == [read_rates(p)["best"] for p in passes]
    assert alone["probes_median_gb_s"] == [read_rates(p)["median"] for p in passes]
    assert len(alone["talker_runs_ms"]) == len(alone["predictor_runs_ms"]) == 2
    assert all(ms > 0 for ms in alone["talker_runs_ms"] + alone["predictor_runs_ms"])


def test_read_bandwidth_measures_and_rejects_bad_arguments() -> None:
    assert 0.1 < _native.testing.read_bandwidth(16, 2) < 10_000  # GB/s
    passes = _native.testing.read_bandwidth_passes(16, 2)
    assert len(passes) == 2 and len(passes[0]) == len(passes[1]) > 1  # one stream, 4 streams
    assert all(0.1 < gb_s < 10_000 for way in passes for gb_s in way)
    for probe in (_native.testing.read_bandwidth, _native.testing.read_bandwidth_passes):
        with pytest.raises(ValueError, match="read_bandwidth"):
            probe(0, 2)


def test_a_read_probe_gives_its_best_pass_and_the_median_of_that_way() -> None:
    """The median pass comes from the way of reading that gave the best pass, not the better of
    the two ways' medians (the ways ran at different moments)."""
    one_stream = [30.0, 10.0, 12.0, 11.0]  # the best pass, and a median of 11.5
    four_streams = [20.0, 21.0, 22.0, 25.0]  # the better median (21.5)
    assert read_rates([one_stream, four_streams]) == {"best": 30.0, "median": 11.5}
    assert read_rates([four_streams, one_stream]) == {"best": 30.0, "median": 11.5}
    assert read_rates([[9.0, 7.0, 8.0], [1.0, 2.0, 3.0]]) == {"best": 9.0, "median": 8.0}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 kernel paths")
@pytest.mark.parametrize("kernels", ["portable", "avx2", ""])
def test_the_fma_peak_runs_on_the_path_the_decoder_gemm_takes(kernels: str) -> None:
    """The compute peak the benches set the decoder against is measured on the decoder GEMM's
    own vector path, which KAZEIA_KERNELS narrows."""
    code = (
        "from wyoming_kazeia import _native as n; t = n.testing; "
        "print(t.FMA_PEAK_ISA, n.KERNEL_ISA, t.fma_peak(1), sep='|')"
    )
    env = {**os.environ, "KAZEIA_KERNELS": kernels}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    peak_isa, kernel_isa, gflop_s = out.stdout.strip().split("|")
    assert 0.1 < float(gflop_s) < 100_000
    if "decoder GEMM AVX-512" in kernel_isa:
        assert peak_isa == "AVX-512F"
    elif kernel_isa.startswith("AVX2"):
        assert peak_isa == "AVX2 FMA"
    else:
        assert peak_isa == "portable loop"
    if kernels == "portable":
        assert peak_isa == "portable loop"


def test_the_fma_peak_rejects_a_bad_thread_count() -> None:
    with pytest.raises(ValueError, match="fma_peak"):
        _native.testing.fma_peak(0)


def stream(rate: float, n: int, chunk_s: float = 0.32) -> list[Chunk]:
    """A synthesis's `n` chunks of `chunk_s` seconds produced at `rate` seconds of audio per
    second, the first one second after the request."""
    return [(1.0 + i * chunk_s / rate, chunk_s) for i in range(n)]


def test_a_player_runs_dry_when_the_chunks_come_late() -> None:
    assert underruns([]) == (0, 0.0)
    assert underruns(stream(1.0, 20)) == (0, 0.0)  # each chunk as the last one ends
    count, silent = underruns([(0.0, 1.0), (1.5, 1.0), (2.5, 1.0), (4.0, 1.0)])
    assert count == 2 and silent == pytest.approx(1.0)  # 0.5 s before the 2nd and the 4th


def test_the_least_hold_is_the_first_arrival_after_which_the_player_never_runs_dry() -> None:
    assert least_hold([]) == 0.0
    assert least_hold(stream(1.0, 20)) == 0.0  # each chunk as the last one ends
    # The player would need 1 s more in all (its silence as the chunks come), but the audio
    # goes out as a chunk arrives: released with the first it needs the second by 1.0; with the
    # second, its 2 s and the third (at 2.5) last until 4.5, past the fourth's 4.0.
    chunks = [(0.0, 1.0), (1.5, 1.0), (2.5, 1.0), (4.0, 1.0)]
    assert underruns(chunks)[1] == pytest.approx(1.0)
    assert least_hold(chunks) == 1.5
    assert least_hold([(at + 2.0, seconds) for at, seconds in chunks]) == 1.5


def test_the_hold_lets_a_slow_stream_out_without_a_gap() -> None:
    chunks = stream(0.5, 30)  # 9.6 s of audio in 19.2 s
    rates = SpeechRates()
    for _ in range(20):  # earlier answers of the same length and rate
        rates.learn(100, 9.6, 19.2)
    figures = player_figures(chunks, rates, 100)
    # As they come, the player waits 0.32 s before each chunk after the first.
    assert figures["underruns"] == 29 and figures["silence_s"] == pytest.approx(29 * 0.32)
    assert figures["prebuffer_underruns"] == 0 and figures["prebuffer_silence_s"] == 0.0
    assert 0 < figures["prebuffer_held_s"] < 19.2 - 1.0  # not the whole answer
    assert 0 < figures["least_hold_s"] <= figures["prebuffer_held_s"]
    # What the hold let out: every chunk, in order, none before it came.
    out = let_out(chunks, Prebuffer(rates, 100))
    assert [s for _, s in out] == [s for _, s in chunks]
    assert all(went >= came for (went, _), (came, _) in zip(out, chunks, strict=True))


def test_nothing_is_held_on_a_fast_box() -> None:
    rates = SpeechRates()
    rates.learn(None, 4.0, 2.0)  # the warm-up: twice real time
    figures = player_figures(stream(2.0, 20), rates, 60)
    assert figures == {
        "underruns": 0,
        "silence_s": 0.0,
        "prebuffer_underruns": 0,
        "prebuffer_silence_s": 0.0,
        "prebuffer_held_s": 0.0,
        "least_hold_s": 0.0,
    }


def recorded_answer(rate: float, chunks: int = 11, first_s: float = 0.1) -> list[list[float]]:
    """A streamed answer's arrivals as the engine child records them: a one-frame first chunk,
    then 4-frame chunks at `rate`, the first of them also waiting for the first's decoding."""
    answer = [[first_s, 0.08]]
    at = first_s + 0.1  # the first chunk's decoding
    for _ in range(chunks - 1):
        at += 0.32 / rate
        answer.append([at, 0.32])
    return answer


def test_a_slowed_answer_comes_later_after_its_first_chunk_only() -> None:
    answer = [(0.1, 0.08), (0.5, 0.32), (0.9, 0.32)]
    expected = [(0.1, 0.08), (0.7, 0.32), (1.3, 0.32)]
    assert slowed(answer, 1.5) == [pytest.approx(chunk) for chunk in expected]


def test_the_hold_keeps_a_box_that_slowed_down_between_answers_from_running_dry() -> None:
    """Answers at 1.3x real time, every third one 1.45x slower after its first chunk: the
    last answers' rate says 1.3x, the answer itself says less from its second chunk on."""
    recording = {"chars": 53, "arrivals": [recorded_answer(1.3) for _ in range(13)]}
    steady = replay(recording, 1.0, 0, 1.45)
    assert steady["answers"] == 12 and steady["answers_dry"] == 0
    jolted = replay(recording, 1.0, 3, 1.45)
    assert jolted["answers_dry"] == 0 and jolted["underruns"] == 0
    assert jolted["held_max_s"] > steady["held_max_s"]  # the slowed ones held longer
    # Replayed twice as fast, the same answers hold less.
    assert replay(recording, 2.0, 0, 1.45)["held_median_s"] < steady["held_median_s"]
    # Each steady answer needed its second chunk at hand: it comes 0.1 s (the first's
    # decoding) + 0.32 s / 1.3 after the first. The hold (no underrun) waited at least that.
    assert steady["least_median_s"] == pytest.approx(0.1 + 0.32 / 1.3)
    assert steady["least_median_s"] <= steady["held_median_s"]
    all_slowed = replay(recording, 1.0, 1, 1.45)
    assert steady["least_median_s"] < all_slowed["least_median_s"] <= all_slowed["held_median_s"]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """``script/bench ARGS`` (its module, as the script runs it)."""
    return subprocess.run(
        [sys.executable, "-m", "kazeia_dev.bench", *args],
        capture_output=True,
        text=True,
        env=dev_child_env(),
        timeout=120,
    )


def test_the_prebuffer_bench_replays_a_saved_recording_and_rejects_another_file(
    tmp_path: Path,
) -> None:
    saved = tmp_path / "recording.json"
    recording = {"chars": 53, "model_dir": "m", "chunk": 4, "frames": 40, "neighbour": False,
                 "decoder_precision": "f32", "rtf": 1.1,
                 "arrivals": [recorded_answer(0.9) for _ in range(4)]}  # fmt: skip
    saved.write_text(json.dumps(recording))
    run = bench("prebuffer", "--replay", str(saved), "--speeds", "1,2", "--slow-every", "2")
    assert run.returncode == 0, run.stderr
    table = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    expected = []
    for speed in (1.0, 2.0):
        for every, said in ((0, "none"), (2, "1 in 2")):
            r = replay(recording, speed, every, 1.45)
            expected.append(
                f"| {speed:g}x | {said} | {r['answers_dry']} of 3 | {r['underruns']} "
                f"| {r['held_median_s']:.2f} | {r['held_max_s']:.2f} "
                f"| {r['least_median_s']:.2f} |"
            )
    assert table[1:] == expected
    for name, other in (
        ("empty", {}),
        ("not-a-list", {**recording, "arrivals": 5}),
        ("not-pairs", {**recording, "arrivals": [[[0.1, 0.08, 1]], [[0.1]]]}),
        ("no-model", {k: v for k, v in recording.items() if k != "model_dir"}),
    ):
        (tmp_path / f"{name}.json").write_text(json.dumps(other))
        run = bench("prebuffer", "--replay", str(tmp_path / f"{name}.json"))
        assert run.returncode == 1 and "not a recording of this bench" in run.stderr, name
        assert "Traceback" not in run.stderr, name
    shuffled = {**recording, "arrivals": [recorded_answer(0.9), recorded_answer(0.9)[::-1]]}
    (tmp_path / "shuffled.json").write_text(json.dumps(shuffled))
    run = bench("prebuffer", "--replay", str(tmp_path / "shuffled.json"))
    assert run.returncode == 1 and "out of the order they came in" in run.stderr
    run = bench("prebuffer", "--replay", str(tmp_path / "missing.json"))
    assert run.returncode == 1 and "No such file" in run.stderr


def test_the_prebuffer_table_has_a_line_per_streaming_row() -> None:
    timing = {"total_s": 9.0, "ttfa_s": 1.0, "audio_s": 6.0}
    player = {
        "underruns": 7,
        "silence_s": 2.5,
        "prebuffer_underruns": 0,
        "prebuffer_silence_s": 0.0,
        "prebuffer_held_s": 2.75,
        "least_hold_s": 2.5,
    }
    runs = [{"prebuffer_underruns": n} for n in (3, 0, 0)]  # the first answer's estimate short
    row = {**timing, **player, "runs": runs}
    result = {
        "rows": {"oneshot": timing, "stream_k4": row},
        "loaded_rows": {"oneshot": {"failed": "timed out"}, "stream_k4": row},
    }
    lines = _player_lines(result)
    assert lines[-2:] == [
        "| stream k=4 | 0.75 | 7 | 2.50 | 0 (3) | 0.00 | 2.75 | 2.50 |",
        "| stream k=4 loaded | 0.75 | 7 | 2.50 | 0 (3) | 0.00 | 2.75 | 2.50 |",
    ]
    assert _player_lines({"rows": {"oneshot": timing}, "loaded_rows": {}}) == []


def test_a_bench_child_imports_the_dev_package_whatever_started_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checkpoint writers run ``python -m kazeia_dev...`` children: with dev/ on no
    PYTHONPATH (pytest puts it on its own sys.path only), such a child fails to import it unless
    given dev_child_env()."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    child = [sys.executable, "-c", "import kazeia_dev.random_checkpoint"]
    bare = subprocess.run(child, env=dict(os.environ), capture_output=True, text=True, cwd="/")
    assert bare.returncode != 0, "the case this guards against no longer fails"
    run = subprocess.run(child, env=dev_child_env(), capture_output=True, text=True, cwd="/")
    assert run.returncode == 0, run.stderr


# A decoder command that burns this much CPU before it becomes the real kazeia-decoder.
BURN_S = 0.3
BURN_THEN_EXEC = (
    "import os, sys, time\n"
    f"end = time.process_time() + {BURN_S}\n"
    "while time.process_time() < end:\n"
    "    pass\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def test_a_synthesis_counts_the_cpu_of_its_decoder_child(tiny_model: Path) -> None:
    from kazeia_dev.bench.engine_child import _synthesis_run

    from wyoming_kazeia.engine import Engine
    from wyoming_kazeia.settings import EngineSettings

    engine = Engine(tiny_model, EngineSettings(max_frames=8, seed=3, decoder_subprocess=True))
    engine.decoder_command = [sys.executable, "-c", BURN_THEN_EXEC, *engine.decoder_command]
    args = argparse.Namespace(text="Hello there.", speaker="vivian", language="english")
    own = time.process_time()
    metrics, audio, _ = _synthesis_run(engine, args)
    own = time.process_time() - own
    assert audio.size == 8 * 1920
    # The child's burn is counted beside this process's threads.
    assert metrics["cpu_s"] >= own + BURN_S


def _engine_row(total_s: float, ttfa_s: float, cpu_s: float, wall_s: float) -> dict[str, Any]:
    return {
        "decoder_s": 1.0, "total_s": total_s, "rtf": total_s / 3.2, "ttfa_s": ttfa_s,
        "cold_ttfa_s": 0.5, "n_chunks": 11, "talker_s": 1.0, "predictor_s": 1.5,
        "peak_rss_mb": 900.0, "decoder_subprocess_peak_rss_mb": 0.0, "engine_peak_rss_mb": 900.0,
        "n_frames": 40, "cpu_s": cpu_s, "wall_s": wall_s, "row_wall_s": 20.0,
    }  # fmt: skip


def _loaded_table(
    rows: dict[str, Any], loaded: dict[str, Any], ideal: dict[str, Any] | None = None
) -> tuple[list[str], str, list[str]]:
    """The loaded rows' table lines, the summary's verdict on them, and the lines after the
    table."""
    add_row_ratios(rows, loaded, ideal)
    targets = target_verdicts(T, rows, loaded, {})
    result: dict[str, Any] = {
        "config": {"load": True, "load_procs": 2, "load_kind": "spin", "load_repeats": 3,
                   "frames": 40},
        "rows": rows,
        "loaded_rows": loaded,
        "ideal_row": ideal,
        "targets": targets,
    }  # fmt: skip
    lines = _loaded_lines(result, T)
    table = [line for line in lines if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # every line has the header's cells
    after = lines[lines.index(table[-1]) + 1 :]
    return table[2:], _verdict(targets["slowdown_ok"]), after


def test_a_loaded_rows_slowdown_is_taken_against_the_runs_alone_around_it() -> None:
    rows = {name: _engine_row(3.0, 0.1, 6.0, 3.0) for name in ("oneshot", "stream_k4")}
    # The box slowed down while the row ran: alone 3.0 s before it and 4.0 s after.
    before = _engine_row(3.0, 0.10, 6.0, 3.2)
    after = _engine_row(4.0, 0.14, 7.0, 4.4)
    loaded_row = _engine_row(6.3, 0.30, 7.6, 6.8)
    loaded_row.update(load={"cpu_share": 0.5}, alone_runs=[before, after])
    (line,), verdict, _ = _loaded_table(rows, {"stream_k4": loaded_row})
    assert loaded_row["slowdown"] == pytest.approx(6.3 / 3.5)
    assert loaded_row["ttfa_slowdown"] == pytest.approx(0.30 / 0.12)
    assert loaded_row["slowdown_vs_table"] == pytest.approx(6.3 / 3.0)
    # Cores alone: both runs' mean CPU over their mean wall time; the two factors multiply to
    # the slowdown of the wall time.
    assert loaded_row["cores_alone_vs_loaded"] == pytest.approx((6.5 / 3.8) / (7.6 / 6.8))
    assert loaded_row["cpu_vs_alone"] == pytest.approx(7.6 / 6.5)
    factors = loaded_row["cores_alone_vs_loaded"] * loaded_row["cpu_vs_alone"]
    assert factors == pytest.approx(6.8 / 3.8)
    assert "| 1.80x (2.50x) | 2.10x | 1.12 (1.71) | 1.53x | 1.169x | 50% " in line
    assert line.endswith("| slowdown <= 2.0x: ok |") and verdict == "ok"


def test_a_row_whose_run_alone_failed_claims_no_slowdown_it_did_not_measure() -> None:
    names = ("oneshot", "stream_k1", "stream_k4", "subprocess")
    rows = {name: _engine_row(3.0, 0.1, 6.0, 3.0) for name in names}
    # Only the run alone after it failed: the row stands against the run before it.
    after_failed = _engine_row(9.0, 0.5, 8.0, 9.0)
    after_failed.update(
        load={"cpu_share": 0.5},
        alone_runs=[_engine_row(4.0, 0.25, 8.0, 4.0)],
        alone_after_failed="child process failed with exit status 1",
    )
    loaded = {
        "oneshot": {"failed": "no result", "failed_stage": "alone", "timed_out": True,
                    "bound_s": 60.0},
        "stream_k1": {"failed": "no result", "failed_stage": "loaded", "timed_out": True,
                      "bound_s": 60.0},
        "stream_k4": {"failed": "exit status 1", "failed_stage": "loaded", "timed_out": False,
                      "bound_s": 60.0},
        "subprocess": after_failed,
    }  # fmt: skip
    (alone, timed_out, crashed, after), verdict, _ = _loaded_table(rows, loaded)
    assert "alone run failed" in alone and "| - |" in alone
    assert alone.endswith("| slowdown <= 2.0x: not measured |")
    # A loaded run killed at its bound took at least the bound: 60 s / the row's 20 s wall.
    assert "| > 3x (row wall) |" in timed_out and timed_out.endswith("MISSED |")
    assert "x (row wall)" not in crashed and crashed.endswith("MISSED |")
    assert after_failed["slowdown"] == pytest.approx(9.0 / 4.0)
    assert "against the run alone before it only" in after and "| 2.25x (2.00x) |" in after
    assert after.endswith("MISSED |")
    assert verdict == (
        "MISSED (stream k=1, stream k=4, subprocess decoder (k=4)); "
        "not measured: one-shot (chunk 0)"
    )


def test_the_loaded_rows_are_set_against_the_ideal_program_beside_the_same_load() -> None:
    # Alone 4.0 and 3.6 s on both cores; beside the load 7.6 s on 1.1 cores.
    runs = {
        "before": {"wall_s": 4.0, "cpu_s": 8.0},
        "loaded": {"wall_s": 7.6, "cpu_s": 8.36},
        "after": {"wall_s": 3.6, "cpu_s": 7.2},
    }
    ideal = {**ideal_figures(runs), "runs": runs, "load": {"cpu_share": 0.5}}
    assert ideal["wall_slowdown"] == pytest.approx(2.0)
    assert ideal["cores_alone_vs_loaded"] == pytest.approx(2.0 / 1.1)
    assert ideal["cpu_vs_alone"] == pytest.approx(1.1)
    rows = {name: _engine_row(3.0, 0.1, 6.0, 3.0) for name in ("oneshot", "stream_k4")}
    loaded_row = _engine_row(6.0, 0.3, 7.0, 6.6)
    loaded_row.update(load={"cpu_share": 0.5}, alone_runs=[_engine_row(3.0, 0.1, 6.0, 3.0)])
    (line, ideal_line), _, after = _loaded_table(rows, {"stream_k4": loaded_row}, ideal)
    # The engine's wall time slowed down 2.2x where the ideal program's did 2.0x; it kept
    # 7.0 / 6.6 of its 2 cores, the ideal program 1.1 of 2.
    assert loaded_row["vs_ideal"] == pytest.approx(1.1)
    assert loaded_row["cores_vs_ideal"] == pytest.approx((2.0 / (7.0 / 6.6)) / (2.0 / 1.1))
    assert ideal_line.startswith("| ideal program (")
    assert "| 7.60 | - |" in ideal_line and "| 2.00x (-) | - | 1.10 (2.00) | 1.82x | 1.100x " in (
        ideal_line
    )
    assert ideal_line.endswith("| 50% | reference |")
    assert after[-1].endswith(
        "against the ideal program's: stream k=4 2.20x / 2.00x = 1.10x "
        "(cores alone / loaded 1.89x / 1.82x = 1.04x)"
    )


def test_a_failed_ideal_program_is_reported_and_sets_no_row_against_it() -> None:
    rows = {name: _engine_row(3.0, 0.1, 6.0, 3.0) for name in ("oneshot", "stream_k4")}
    loaded = {"stream_k4": {"failed": "no result", "failed_stage": "alone", "timed_out": True,
                            "bound_s": 60.0}}  # fmt: skip
    ideal = {"failed": "the ideal program: not done within 60 s"}
    (line, ideal_line), verdict, after = _loaded_table(rows, loaded, ideal)
    assert ideal_line.startswith("| ideal program | failed: the ideal program: not done")
    assert ideal_line.endswith("| reference |") and after == []
    # No row measured: the summary claims no "ok".
    assert verdict == "not measured"


def _ideal_processes() -> list[int]:
    """The live processes of the ideal program that this process started."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and IDEAL_PROGRAM.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def test_the_ideal_program_counts_the_cpu_of_all_its_processes() -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = ideal_run(4 * usable_cpus(), 60.0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Every process it started, and only those, reaped during the run.
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert run["cpu_s"] == pytest.approx(reaped, abs=0.01)
    assert run["cpu_s"] <= 1.1 * usable_cpus() * run["wall_s"]


def test_the_ideal_program_is_killed_at_its_deadline() -> None:
    start = time.monotonic()
    with pytest.raises(BenchTimeout, match="not done within 1 s"):
        ideal_run(MAX_UNITS, 1.0)
    assert time.monotonic() - start < 10.0
    assert _ideal_processes() == []


def test_the_ideal_program_is_calibrated_to_about_its_time_alone() -> None:
    units = ideal_units(1.5)
    wall_s = ideal_run(units, 60.0)["wall_s"]
    # Loose bounds: the box's speed moves between the calibration and the run.
    assert 0.5 < wall_s < 4.0
