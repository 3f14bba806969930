"""Your own voices from the command line: the voice library (python -m wyoming_kazeia.voices)
and the voice flags of python -m wyoming_kazeia.synth, as real subprocesses on converted
reference models (Base, VoiceDesign). Audio parity itself is test_voice_engine.py's."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import REFERENCE, ref_array
from test_server_cli import free_uri, wait_until_ready
from wyoming.client import AsyncClient
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_kazeia.convert import convert
from wyoming_kazeia.engine import Engine
from wyoming_kazeia.errors import ModelNotFoundError
from wyoming_kazeia.health_check import probe
from wyoming_kazeia.voices.library import VoiceLibrary

BASE = "tiny-base-0.6b"
TEXTS = json.loads((REFERENCE / BASE / "ref" / "manifest.json").read_text())["_notes"][
    "voice_texts"
]


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"wyoming_kazeia.{module}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in (BASE, "tiny-design-1.7b"):
        out[name] = tmp_path_factory.mktemp(name)
        convert(REFERENCE / name / "model", out[name], "f32")
    return out


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("recordings")
    rec = {name: folder / name for name in ("ref.wav", "stereo16k.flac", "note.txt")}
    sf.write(rec["ref.wav"], ref_array(BASE, "ref_audio"), 24000, subtype="PCM_24")
    mono16k = ref_array(BASE, "ref_audio_16k")
    sf.write(rec["stereo16k.flac"], np.stack([mono16k, mono16k], axis=1), 16000)
    rec["note.txt"].write_text("not audio")
    for name, samples in {
        "silent.wav": np.zeros(48000),
        "short.wav": ref_array(BASE, "ref_audio")[:12000],
        "long.wav": np.tile(ref_array(BASE, "ref_audio"), 18),
        "ten_seconds.wav": np.tile(ref_array(BASE, "ref_audio"), 9)[:240000],
        "empty.wav": np.zeros(0),
    }.items():
        rec[name] = folder / name
        sf.write(rec[name], samples.astype(np.float32), 24000)
    return rec


def test_a_recording_becomes_a_voice_whose_prompt_is_computed_once(
    tmp_path: Path,
    models: dict[str, Path],
    recordings: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = str(tmp_path / "data")
    stereo16k = str(recordings["stereo16k.flac"])
    added = run(
        "voices", "--data-dir", data, "add", "grandma", "--audio", stereo16k,
        "--text", TEXTS["ref_text"], "--language", "fr", "--model", str(models[BASE]),
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("added grandma: cloned from a 2.6 s recording")
    listed = run("voices", "--data-dir", data, "list")
    assert listed.stdout.split("\t")[:3] == ["grandma", "clone", "french"]
    folder = tmp_path / "data" / "voices" / "grandma"
    prompts = list(folder.glob("prompt-*.npz"))
    assert len(prompts) == 1

    # The stored prompt is read back, never computed again, also by a copy of the model
    # elsewhere (it is named by the model's content) ...
    library = VoiceLibrary(tmp_path / "data")
    (voice,), problems = library.scan()
    assert problems == []
    model = tmp_path / "model"
    shutil.copytree(models[BASE], model)
    mtime = prompts[0].stat().st_mtime_ns
    with caplog.at_level("INFO"):
        prompt = library.prompt(voice, Engine(model))
    assert "prompt computed" not in caplog.text and prompts[0].stat().st_mtime_ns == mtime
    # ... and it is the official prompt of that recording (16 kHz stereo: averaged, resampled
    # with soxr as the official with librosa).
    assert prompt.speaker_embedding is not None and prompt.ref_codes is not None
    assert np.abs(prompt.speaker_embedding - ref_array(BASE, "ref16k_xvector")).max() < 1e-4
    assert np.array_equal(prompt.ref_codes, ref_array(BASE, "ref16k_codes"))
    # A model without its encoders says so.
    (model / "speaker_encoder.gguf").unlink()
    with pytest.raises(ModelNotFoundError, match="lacks speaker_encoder.gguf"):
        library.prompt(voice, Engine(model))

    assert run("voices", "--data-dir", data, "remove", "grandma").returncode == 0
    assert not folder.exists() and run("voices", "--data-dir", data, "list").stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--audio", "empty.wav"], "is empty"),
        (["--audio", "silent.wav"], "is silent"),
        (["--audio", "short.wav"], "0.50 s long: a voice needs at least 1 s"),
        (["--audio", "long.wav"], "21.6 s long: at most 20 s"),
        (["--audio", "note.txt"], "cannot read"),
        (["--audio", "missing.wav"], "cannot read"),
        (["--audio", "ref.wav", "--text", "مرحبا"], "a script the models do not speak"),
        (["--audio", "ref.wav", "--language", "xx"], "unknown language 'xx'"),
        (["--audio", "ref.wav", "--describe", "a voice"], "give one of"),
        (["--text", "words"], "give one of"),
        (["--speaker", "ryan"], "give one of"),
    ],
)
def test_a_bad_voice_is_refused_clearly_and_nothing_is_stored(
    tmp_path: Path, recordings: dict[str, Path], args: list[str], message: str
) -> None:
    folder = recordings["ref.wav"].parent
    args = [str(folder / a) if a.endswith((".wav", ".txt", ".flac")) else a for a in args]
    result = run("voices", "--data-dir", str(tmp_path), "add", "bad", *args)
    one_line_error(result, message)
    assert not (tmp_path / "voices" / "bad").exists()


def test_names_are_safe_and_unique(tmp_path: Path, recordings: dict[str, Path]) -> None:
    data, ref = str(tmp_path), str(recordings["ref.wav"])
    for name in ("../up", "Grandma", "a b", "x" * 33, "9lives", "a.wav"):
        one_line_error(run("voices", "--data-dir", data, "add", name, "--audio", ref), "invalid")
    assert run("voices", "--data-dir", data, "add", "me", "--audio", ref).returncode == 0
    one_line_error(run("voices", "--data-dir", data, "add", "me", "--audio", ref), "exists")
    one_line_error(run("voices", "--data-dir", data, "remove", "nobody"), "no voice named")


def test_a_long_reference_is_taken_with_a_note_on_first_audio(
    tmp_path: Path, recordings: dict[str, Path]
) -> None:
    """Over 6 s, an in-context voice is added, and the user is told that its first audio
    waits for the whole reference; a voice-print clone of the same recording is not slower,
    so it gets no note."""
    data, audio = str(tmp_path), str(recordings["ten_seconds.wav"])
    icl = run(
        "voices", "--data-dir", data, "add", "long", "--audio", audio, "--text", "Hello there."
    )
    assert icl.returncode == 0, icl.stderr
    assert "10.0 s long" in icl.stderr and "first audio" in icl.stderr
    xvec = run("voices", "--data-dir", data, "add", "print", "--audio", audio)
    assert xvec.returncode == 0 and xvec.stderr == ""


def test_a_corrupt_voice_is_reported_and_skipped(
    tmp_path: Path, recordings: dict[str, Path]
) -> None:
    data = str(tmp_path)
    for name in ("good", "broken", "noaudio"):
        run("voices", "--data-dir", data, "add", name, "--audio", str(recordings["ref.wav"]))
    (tmp_path / "voices" / "broken" / "voice.json").write_text("{not json")
    (tmp_path / "voices" / "noaudio" / "reference.wav").unlink()
    listed = run("voices", "--data-dir", data, "list")
    assert listed.returncode == 0
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["good"]
    assert "voice 'broken'" in listed.stderr and "voice 'noaudio'" in listed.stderr


def test_a_model_of_another_kind_does_not_take_the_voice(
    tmp_path: Path, models: dict[str, Path], recordings: dict[str, Path]
) -> None:
    result = run(
        "voices", "--data-dir", str(tmp_path), "add", "me", "--audio", str(recordings["ref.wav"]),
        "--model", str(models["tiny-design-1.7b"]),
    )  # fmt: skip
    one_line_error(result, "a clone voice needs a 'base' model")
    assert not (tmp_path / "voices" / "me").exists()


# --------------------------------------------------------------------------- synth


def test_synth_clones_a_recording_and_writes_the_official_codes(
    tmp_path: Path, models: dict[str, Path], recordings: dict[str, Path]
) -> None:
    common = [
        "--model", str(models[BASE]), "--data-dir", str(tmp_path), "--text", TEXTS["text"],
        "--language", "en", "--ref-audio", str(recordings["ref.wav"]), "--greedy",
        "--repetition-penalty", "1.0", "--max-frames", "23",
    ]  # fmt: skip
    modes = {
        "clone_icl": ["--ref-text", TEXTS["ref_text"]],
        "clone_xvec_nonstream": ["--x-vector-only", "--non-streaming"],
    }
    for mode, flags in modes.items():
        codes = tmp_path / f"{mode}.npy"
        out = tmp_path / f"{mode}.wav"
        result = run("synth", *common, *flags, "--codes-out", str(codes), "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert np.array_equal(np.load(codes), ref_array(BASE, f"{mode}_codes")), mode
        assert sf.info(str(out)).frames == 23 * 1920


def test_synth_speaks_a_described_voice(tmp_path: Path, models: dict[str, Path]) -> None:
    name = "tiny-design-1.7b"
    texts = json.loads((REFERENCE / name / "ref" / "manifest.json").read_text())["_notes"]
    codes = tmp_path / "codes.npy"
    result = run(
        "synth", "--model", str(models[name]), "--text", texts["voice_texts"]["text"],
        "--language", "english", "--instruct", texts["voice_texts"]["design"], "--non-streaming",
        "--greedy", "--repetition-penalty", "1", "--max-frames", "23", "--codes-out", str(codes),
        "--out", str(tmp_path / "out.wav"), "--data-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert np.array_equal(np.load(codes), ref_array(name, "design_codes"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ref-audio", "ref.wav"], "needs --ref-text TEXT (in context) or --x-vector-only"),
        (["--ref-text", "hello"], "go with --ref-audio"),
        (["--voice", "vivian"], "no built-in speakers"),
        (["--instruct", "slowly"], "takes no instruction"),
    ],
)
def test_synth_says_what_a_base_model_needs(
    tmp_path: Path,
    models: dict[str, Path],
    recordings: dict[str, Path],
    args: list[str],
    message: str,
) -> None:
    folder = recordings["ref.wav"].parent
    args = [str(folder / a) if a.endswith(".wav") else a for a in args]
    result = run(
        "synth", "--model", str(models[BASE]), "--data-dir", str(tmp_path), "--text", "Hi",
        "--out", str(tmp_path / "o.wav"), *args,
    )  # fmt: skip
    one_line_error(result, message)


# --------------------------------------------------------------------------- the server


def describe_voices(uri: str) -> list[str]:
    info = asyncio.run(probe(uri, 5))
    assert info is not None
    return [v.name for v in info.tts[0].voices]


async def speak(uri: str, text: str, voice: str) -> tuple[int, list[str]]:
    """(samples, event types) of a one-shot request."""
    samples, types = 0, []
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Synthesize(text, SynthesizeVoice(voice)).event())
        while (event := await client.read_event()) is not None:
            types.append(event.type)
            samples += len(event.payload or b"") // 2 if event.type == "audio-chunk" else 0
            if event.type in ("audio-stop", "error"):
                break
    return samples, types


def test_a_voice_added_while_the_server_runs_is_served_and_its_prompt_kept(
    tmp_path: Path, models: dict[str, Path], recordings: dict[str, Path]
) -> None:
    data = tmp_path / "data"
    uri_args = free_uri()
    uri = uri_args[1]
    cmd = [
        sys.executable, "-m", "wyoming_kazeia", "--model", str(models[BASE]),
        "--data-dir", str(data), *uri_args, "--max-frames", "6", "--seed", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_ready(proc, uri)
        assert describe_voices(uri) == []  # a Base model: no voices of its own
        samples, types = asyncio.run(speak(uri, "Hello.", "grandma"))
        assert types == ["error"]
        added = run(
            "voices", "--data-dir", str(data), "add", "grandma", "--audio",
            str(recordings["ref.wav"]), "--text", TEXTS["ref_text"], "--language", "en",
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        voices = describe_voices(uri)  # no restart
        assert "grandma" in voices and "grandma-fr" in voices
        samples, types = asyncio.run(speak(uri, "Hello.", "grandma"))
        assert types[0] == "audio-start" and types[-1] == "audio-stop"
        assert samples == 6 * 1920
    finally:
        proc.send_signal(signal.SIGTERM)
        _, first = proc.communicate(timeout=30)
    assert proc.returncode == 0, first
    assert "voices: added grandma" in first and "voice 'grandma': prompt computed" in first
    (prompt,) = (data / "voices" / "grandma").glob("prompt-*.npz")
    mtime = prompt.stat().st_mtime_ns

    # A restart reads the prompt: nothing is computed again, the voice speaks at once (it is
    # also the default voice now, and warms the engine up).
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_ready(proc, uri)
        samples, types = asyncio.run(speak(uri, "Hello again.", "grandma-en"))
        assert samples == 6 * 1920
    finally:
        proc.send_signal(signal.SIGTERM)
        _, second = proc.communicate(timeout=30)
    assert proc.returncode == 0, second
    assert "prompt computed" not in second and "warm-up synthesis:" in second
    assert prompt.stat().st_mtime_ns == mtime


def test_one_server_speaks_the_built_in_speakers_and_cloned_voices(
    tmp_path: Path, tiny_model: Path, models: dict[str, Path], recordings: dict[str, Path]
) -> None:
    """A CustomVoice main model and a Base voice model: the clone's model is loaded on the
    first request for it, and says so."""
    data = tmp_path / "data"
    added = run(
        "voices", "--data-dir", str(data), "add", "grandma", "--audio",
        str(recordings["ref.wav"]), "--text", TEXTS["ref_text"],
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    uri_args = free_uri()
    uri = uri_args[1]
    cmd = [
        sys.executable, "-m", "wyoming_kazeia", "--model", str(tiny_model),
        "--voice-model", str(models[BASE]), "--data-dir", str(data), *uri_args,
        "--max-frames", "6", "--seed", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_ready(proc, uri)
        voices = describe_voices(uri)
        assert "vivian" in voices and "grandma" in voices and "grandma-en" in voices
        for voice in ("vivian", "grandma", "vivian-fr", "grandma-fr"):
            samples, types = asyncio.run(speak(uri, "Hello.", voice))
            assert types[-1] == "audio-stop" and samples == 6 * 1920, (voice, types)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert stderr.count("loading the voice model") == 1, stderr


def test_an_hour_long_recording_is_refused_from_its_header_without_being_read(
    tmp_path: Path,
) -> None:
    """A 60-minute WAV (165 MB of 24 kHz 16-bit PCM, written in blocks): refused by its header's
    length at once, without reading its samples: the CLI's peak RSS stays below the file's size
    (its samples as float32 alone would be twice that)."""
    hour = tmp_path / "hour.wav"
    with sf.SoundFile(hour, "w", 24000, 1, subtype="PCM_16") as f:
        block = (0.1 * np.sin(np.arange(24000 * 60) / 7.0)).astype(np.float32)
        for _ in range(60):
            f.write(block)
    script = (
        "import sys\n"
        "from wyoming_kazeia.voices.__main__ import main\n"
        "code = main(sys.argv[1:])\n"
        # VmHWM: this process's own peak (ru_maxrss counts pytest's, inherited at the fork)
        "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        "print(peak.split()[1], file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script, "--data-dir", str(tmp_path), "add", "hour", "--audio",
         str(hour)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - start
    *lines, peak_kb = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "3600.0 s long: at most 20 s" in "\n".join(lines)
    assert int(peak_kb) * 1024 < hour.stat().st_size, peak_kb
    assert seconds < 5 and not (tmp_path / "voices" / "hour").exists()


def test_a_recording_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "voice.wav"
    os.mkfifo(fifo)
    start = time.monotonic()
    result = run("voices", "--data-dir", str(tmp_path), "add", "fifo", "--audio", str(fifo))
    one_line_error(result, "is not a regular file (a FIFO)")
    assert time.monotonic() - start < 10
