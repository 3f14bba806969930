"""The streaming engine on a tiny random checkpoint: exact streaming, cancellation, placement."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from kazeia_dev.random_checkpoint import main as random_checkpoint

from wyoming_kazeia._native import testing
from wyoming_kazeia.convert import convert
from wyoming_kazeia.engine import Engine
from wyoming_kazeia.errors import EngineError
from wyoming_kazeia.native import (
    DECODER_GPU_CHUNK_FRAMES,
    CoreShare,
    DecoderStream,
    ModelError,
    SpeechDecoder,
)
from wyoming_kazeia.settings import EngineSettings, SettingsError, usable_cpus
from wyoming_kazeia.synthesis import ONE_PASS_PUSH_FRAMES

TEXT = "Hello there, this is a small test of the streaming engine."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("engine") / "ckpt"
    assert random_checkpoint([str(path), "--size", "tiny", "--seed", "3", "-q"]) == 0
    return path


@pytest.fixture(scope="module")
def model_dir(checkpoint: Path) -> Path:
    out = checkpoint.parent / "model"
    convert(checkpoint, out, "f32")
    return out


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(model_dir, EngineSettings(max_frames=40, seed=11))


def pcm(engine: Engine, **overrides: Any) -> np.ndarray:
    return np.concatenate(list(engine.synthesize(TEXT, "vivian", **overrides)))


def test_one_shot_audio(engine: Engine) -> None:
    s = engine.synthesize(TEXT, "vivian", stream_chunk=0)
    chunks = list(s)
    assert len(chunks) == 1 and chunks[0].dtype == np.int16
    assert len(chunks[0]) == 40 * 1920
    m = s.metrics
    assert (m.n_frames, m.n_chunks) == (40, 1)
    assert m.audio_s == pytest.approx(3.2) and m.total_s > 0 and m.rtf > 0 and m.ttfa_s > 0


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_streamed_equals_one_shot(engine: Engine, chunk: int) -> None:
    one_shot = pcm(engine, stream_chunk=0)
    s = engine.synthesize(TEXT, "vivian", stream_chunk=chunk)
    chunks = list(s)
    # First chunk: one frame (first audio soonest); then chunks of `chunk` frames.
    assert len(chunks[0]) == 1920
    assert all(len(c) == chunk * 1920 for c in chunks[1:-1])
    assert s.metrics.n_chunks == 1 + -(-39 // chunk)
    # What the prebuffer learns from: the first chunk's audio and the longest after it.
    assert s.metrics.first_chunk_s == pytest.approx(0.08)
    assert s.metrics.largest_chunk_s == pytest.approx(min(chunk, 39) * 0.08)
    streamed = np.concatenate(chunks)
    assert streamed.shape == one_shot.shape
    assert np.abs(streamed.astype(np.int32) - one_shot).max() <= 1


def test_the_service_pushes_as_many_frames_as_a_gpu_decoder_graph_holds(engine: Engine) -> None:
    """The default stream chunk and the one-pass decode's pushes are the native decoder's GPU
    graph width: no graph on a GPU computes padding (one constant, native speech_decoder.h)."""
    assert EngineSettings().stream_chunk == ONE_PASS_PUSH_FRAMES == DECODER_GPU_CHUNK_FRAMES
    chunks = list(engine.synthesize(TEXT, "vivian"))  # the default stream chunk
    assert {len(c) for c in chunks[1:-1]} == {DECODER_GPU_CHUNK_FRAMES * 1920}


@pytest.mark.parametrize("chunk", [0, 1, 4])
def test_subprocess_decoder_streams_the_in_process_chunks(engine: Engine, chunk: int) -> None:
    """The kazeia-decoder child gets the same pushes as the in-process decoder: the same
    chunks, the same samples."""
    ours = list(engine.synthesize(TEXT, "vivian", stream_chunk=chunk, decoder_subprocess=True))
    in_process = list(engine.synthesize(TEXT, "vivian", stream_chunk=chunk))
    assert [len(c) for c in ours] == [len(c) for c in in_process]
    assert np.array_equal(np.concatenate(ours), np.concatenate(in_process))


def test_the_engines_generator_and_decoder_share_the_cores(model_dir: Path) -> None:
    """The engine's generator and in-process decoder hold one CoreShare over the CPUs this
    process may run on, and a streamed synthesis measures its pushes there: the decoder marks
    them, and the generation's pool counts its products beside them."""
    engine = Engine(model_dir, EngineSettings(max_frames=40, seed=11))
    share = engine.generator.core_share
    assert share is not None and engine.decoder.core_share is share
    assert share.cores == usable_cpus()
    assert share.last_push_cpu_share == -1.0
    pcm(engine)
    assert share.last_push_cpu_share >= 0.0
    engine.apply_settings(engine.settings.replace(decoder_threads=1))  # a new decoder
    assert engine.decoder.core_share is share and engine.generator.core_share is share


def generator_beside_push(decoder: SpeechDecoder, stream: DecoderStream) -> dict[str, int]:
    """Runs a generator's pool, with the decoder's CoreShare, beside a push of 400 frames."""
    codes = np.zeros((400, decoder.num_quantizers), dtype=np.int32)
    assert decoder.core_share is not None
    return testing.generator_beside_push(stream, codes, decoder.core_share)


@pytest.mark.parametrize(("cores", "alone"), [(2, True), (3, False)])
def test_a_cpu_decoder_push_has_the_generator_beside_it_compute_alone(
    model_dir: Path, cores: int, alone: bool
) -> None:
    """While a 2-thread CPU decoder push computes on a box of 2 cores, the generator beside
    it computes on its own thread alone; on 3 cores it keeps its threads. A push with no
    generator computing beside it measures nothing."""
    share = CoreShare(cores=cores)
    decoder = SpeechDecoder(str(model_dir / "decoder.gguf"), threads=2, core_share=share)
    decoder.stream().push(np.zeros((40, decoder.num_quantizers), dtype=np.int32))
    assert share.last_push_cpu_share == -1.0
    got = generator_beside_push(decoder, decoder.stream())
    assert got["runs"] > 0
    assert (got["alone"] > 0) is alone, got
    assert not share.generator_alone  # the push is over


def test_a_generation_marks_itself_computing_while_it_computes_a_frame(engine: Engine) -> None:
    """While a generation on the CPU computes a frame, the engine's CoreShare says so (its
    decoder's pushes then leave the generator a core); between frames and after, it does not."""
    share = engine.generator.core_share
    assert share is not None
    ids = np.asarray(engine.tokenizer.prompt_ids(TEXT))
    frames = engine.generator.frames(ids, "vivian", "english", seed=11, max_frames=8)
    computing = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal computing
        while not done.is_set():
            computing += share.generator_computing
            time.sleep(0.0002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    got = 0
    try:
        for _ in frames:
            got += 1
            assert not share.generator_computing, f"computing after frame {got}"
    finally:
        done.set()
        watcher.join(timeout=10)
    assert got >= 1 and computing > 0, "never seen computing"
    assert not share.generator_computing


@pytest.mark.parametrize("generator_computing", [True, False])
def test_a_cpu_decoder_stream_leaves_a_core_to_a_generation_computing(
    model_dir: Path, generator_computing: bool
) -> None:
    """A CPU decoder stream of 2 threads on 2 shared cores computes a push on the pushing
    thread alone while a generation computes beside it, and on both threads otherwise: the
    share of the process's CPU time that the pushing thread spent."""
    share = CoreShare(cores=2)
    decoder = SpeechDecoder(str(model_dir / "decoder.gguf"), threads=2, core_share=share)
    codes = np.zeros((200, decoder.num_quantizers), dtype=np.int32)
    got = testing.push_cpu_seconds(decoder.stream(), codes, share, generator_computing)
    on_caller = got["thread_s"] / got["process_s"]
    assert (on_caller > 0.9) is generator_computing, got


# A busy process that ends by itself, should the test be killed before it kills it.
BUSY_FOR_A_MINUTE = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"


def test_beside_busy_processes_the_generator_keeps_its_threads(model_dir: Path) -> None:
    """A push during which the process got less than OTHERS_BUSY_BELOW of the cores (two busy
    processes beside it on the same 2 CPUs) has the generator keep its threads during the next
    pushes, where alone it would give the busy processes the cores; once a push gets
    OTHERS_GONE_FROM of them again, the generator computes alone again."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("one CPU: no cores to share")
    share = CoreShare(cores=2)
    decoder = SpeechDecoder(str(model_dir / "decoder.gguf"), threads=2, core_share=share)
    mine = os.sched_getaffinity(0)
    busy: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(2):
            busy.append(subprocess.Popen([sys.executable, "-c", BUSY_FOR_A_MINUTE]))
            os.sched_setaffinity(busy[-1].pid, cpus)
        os.sched_setaffinity(0, cpus)  # this thread, and the threads it starts
        stream = decoder.stream()
        generator_beside_push(decoder, stream)
        assert share.last_push_cpu_share < CoreShare.OTHERS_BUSY_BELOW
        got = generator_beside_push(decoder, stream)
        assert got["alone"] == 0, f"alone beside busy processes: {got}"
    finally:
        for p in busy:
            p.kill()
        os.sched_setaffinity(0, mine)
        for p in busy:
            p.wait(timeout=10)
    generator_beside_push(decoder, stream)
    assert share.last_push_cpu_share >= CoreShare.OTHERS_GONE_FROM
    assert generator_beside_push(decoder, stream)["alone"] > 0


def test_a_changed_thread_count_keeps_the_loaded_generator(model_dir: Path) -> None:
    """A live change of the generator's threads takes effect without loading its weights again
    (the same generator object, now with the new count) and speaks the same samples; a count
    out of bounds is refused and changes nothing."""
    engine = Engine(model_dir, EngineSettings(max_frames=12, seed=11, threads=2))
    before = pcm(engine)
    generator = engine.generator
    engine.apply_settings(engine.settings.replace(threads=3))
    assert engine.generator is generator and generator.threads == 3
    assert np.array_equal(pcm(engine), before)
    with pytest.raises(ValueError, match=r"threads must be in 1\.\.512"):
        generator.threads = 0
    assert generator.threads == 3


def test_the_decoder_precision_applies_in_process_and_in_the_decoder_process(
    model_dir: Path,
) -> None:
    """decoder_precision bf16 reaches both placements (the same samples from each), and a
    live change back to f32 reloads the decoder: the f32 samples again."""
    engine = Engine(model_dir, EngineSettings(max_frames=12, seed=11))
    f32 = pcm(engine)
    engine.apply_settings(engine.settings.replace(decoder_precision="bf16"))
    bf16 = pcm(engine)
    assert engine.decoder.precision == "bf16"
    assert not np.array_equal(bf16, f32)
    assert np.array_equal(pcm(engine, decoder_subprocess=True), bf16)
    engine.apply_settings(engine.settings.replace(decoder_precision="f32"))
    assert np.array_equal(pcm(engine), f32)
    # One synthesis cannot change what the engine has loaded: an error, never ignored.
    with pytest.raises(SettingsError, match="decoder_precision: the engine's"):
        engine.synthesize(TEXT, "vivian", decoder_precision="bf16")


def test_subprocess_placement_loads_no_in_process_decoder(model_dir: Path) -> None:
    """The kazeia-decoder process holds the only copy of the decoder weights."""
    engine = Engine(model_dir, EngineSettings(max_frames=8, seed=11, decoder_subprocess=True))
    assert len(np.concatenate(list(engine.synthesize(TEXT, "vivian")))) == 8 * 1920
    assert engine._decoder is None
    # A synthesis placed in process loads it on first use.
    assert len(np.concatenate(list(engine.synthesize(TEXT, "vivian", decoder_subprocess=False))))
    assert engine._decoder is not None


@pytest.mark.parametrize("damage", ["truncate", "talker"])
def test_subprocess_placement_checks_the_decoder_file_at_load(
    model_dir: Path, tmp_path: Path, damage: str
) -> None:
    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    decoder = broken / "decoder.gguf"
    if damage == "truncate":
        decoder.write_bytes(decoder.read_bytes()[: decoder.stat().st_size // 2])
    else:  # a valid GGUF of the wrong kind
        shutil.copy(model_dir / "talker.gguf", decoder)
    with pytest.raises(ModelError, match="decoder.gguf"):
        Engine(broken, EngineSettings(decoder_subprocess=True))


def test_killed_decoder_subprocess_is_an_error_then_recovers(
    engine: Engine, crashing_command: list[str]
) -> None:
    saved = engine.decoder_command
    engine.decoder_command = crashing_command
    try:
        with pytest.raises(EngineError, match="decoder subprocess failed"):
            pcm(engine, decoder_subprocess=True)
    finally:
        engine.decoder_command = saved
    assert len(pcm(engine, decoder_subprocess=True)) == 40 * 1920


def test_cancellation_stops_and_leaks_no_thread(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    eng = Engine(model_dir, EngineSettings(max_frames=2000, seed=1, stream_chunk=1))
    before = threading.active_count()
    s = eng.synthesize(TEXT, "vivian")
    next(s)
    time.sleep(0.2)  # chunks queue up unread: closing must not depend on reading them
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="wyoming_kazeia.synthesis"):
        s.close()
    assert "synthesis cancelled after" in caplog.text
    assert time.monotonic() - t0 < 1.0
    assert s.metrics.n_frames < 2000
    assert threading.active_count() == before
    with pytest.raises(StopIteration):
        next(s)


def test_the_one_pass_decode_is_cancellable(model_dir: Path) -> None:
    """stream_chunk 0 gives its audio at the end (decoded in pushes while the frames come);
    closing the synthesis while the decoder is behind stops it between pushes, not after the
    whole decode, and nothing is emitted."""
    eng = Engine(model_dir, EngineSettings(max_frames=1500, seed=1, stream_chunk=0))
    s = eng.synthesize(TEXT, "vivian")
    deadline = time.monotonic() + 60
    while s.metrics.n_frames < 1500:  # every frame generated: the decode is under way
        assert time.monotonic() < deadline
        time.sleep(0.001)
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 0.3
    assert s.metrics.n_chunks == 0  # nothing was emitted


def test_empty_text_no_audio(engine: Engine) -> None:
    for text in ("", "   \n\t"):
        s = engine.synthesize(text, "vivian")
        assert list(s) == []
        assert s.metrics.n_frames == 0


def test_runaway_guard_bounds_frames(model_dir: Path) -> None:
    eng = Engine(model_dir, EngineSettings(seed=2, stream_chunk=0))  # max_frames=0: by text
    s = eng.synthesize("Hi.", "vivian")
    list(s)
    assert 2 <= s.metrics.n_frames <= 40 + 12 * 4


def test_unknown_speaker_and_language(engine: Engine) -> None:
    with pytest.raises(ValueError, match="unknown speaker 'bob'; valid speakers: aiden"):
        engine.synthesize(TEXT, "bob")
    with pytest.raises(ValueError, match="unknown language 'elvish'; valid languages: auto"):
        engine.synthesize(TEXT, "vivian", "elvish")


def test_two_engines_and_concurrent_syntheses(model_dir: Path, engine: Engine) -> None:
    expected = pcm(engine)
    other = Engine(model_dir, EngineSettings(max_frames=40, seed=11))
    results: dict[str, np.ndarray] = {}

    def run(name: str, eng: Engine) -> None:
        results[name] = pcm(eng)

    threads = [
        threading.Thread(target=run, args=(f"t{i}", e))
        for i, e in enumerate([engine, engine, other])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in results.values():
        assert np.array_equal(out, expected)


def test_settings_validation_and_env() -> None:
    s = EngineSettings.from_env(
        {
            "KZTTS_THREADS": "3",
            "KZTTS_STREAM_CHUNK": "0",
            "KZTTS_DECODER_SUBPROC": "yes",
            "KZTTS_SEED": "",
            "KZTTS_TOP_P": "0.5",
        }
    )
    assert (s.threads, s.stream_chunk, s.decoder_subprocess, s.seed, s.top_p) == (
        3,
        0,
        True,
        None,
        0.5,
    )
    with pytest.raises(
        SettingsError, match=r"invalid threads \(KZTTS_THREADS\) = 0; allowed: 1..64"
    ):
        EngineSettings(threads=0)
    with pytest.raises(SettingsError, match="KZTTS_QUANT.*allowed: f32|f16|q8_0|q4_k"):
        EngineSettings.from_env({"KZTTS_QUANT": "q3"})
    with pytest.raises(SettingsError, match="invalid KZTTS_STREAM_CHUNK='four'"):
        EngineSettings.from_env({"KZTTS_STREAM_CHUNK": "four"})
    with pytest.raises(SettingsError, match="unknown setting"):
        EngineSettings().replace(colour="blue")
    with pytest.raises(SettingsError, match="top_p"):
        EngineSettings().replace(top_p=1.5)


def test_synth_cli_from_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    cmd = [
        sys.executable,
        "-m",
        "wyoming_kazeia.synth",
        "--model",
        str(checkpoint),
        "--text",
        TEXT,
        "--out",
        str(out),
        "--seed",
        "4",
        "--json-metrics",
        "--data-dir",
        str(tmp_path / "c"),
    ]
    env = {"KZTTS_MAX_FRAMES": "20", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    metrics = json.loads(r.stdout)
    assert metrics["n_frames"] == 20
    audio, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and len(audio) == 20 * 1920
    # The converted cache is reused: no second conversion.
    r2 = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r2.returncode == 0 and "converting" not in r2.stderr


def test_engine_missing_model(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="has no talker.gguf"):
        Engine(tmp_path)


def test_leaving_a_synthesis_with_block_stops_it_and_its_threads(model_dir: Path) -> None:
    """Cancellation is explicit (no finalizer takes locks or crosses threads): the `with`
    block's end cancels the synthesis and waits for its threads."""
    eng = Engine(model_dir, EngineSettings(max_frames=5000, seed=1, stream_chunk=2))
    before = threading.active_count()
    with eng.synthesize(TEXT, "vivian") as s:
        next(s)
    assert threading.active_count() == before
    assert s.metrics.n_frames < 5000


def test_interpreter_exit_with_a_running_synthesis(model_dir: Path) -> None:
    """Exiting while a synthesis runs stops it cleanly (no crash of native threads)."""
    script = (
        "import sys\n"
        "from wyoming_kazeia.engine import Engine\n"
        "from wyoming_kazeia.settings import EngineSettings\n"
        "e = Engine(sys.argv[1], EngineSettings(max_frames=100000, seed=1, stream_chunk=2))\n"
        "s = e.synthesize('Hello there, a long one.', 'vivian')\n"
        "next(s)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(model_dir)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr[-2000:]
