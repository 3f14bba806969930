"""`python -m wyoming_kazeia` as a user starts it: flags, model management, fail-fast startup,
unix:// and stdio:// serving, SIGTERM."""

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

import pytest
from wyoming.client import AsyncClient
from wyoming.tts import Synthesize

from wyoming_kazeia.models import DEFAULT_MODEL
from wyoming_kazeia.settings import EngineSettings

SERVER = [sys.executable, "-m", "wyoming_kazeia"]
FRAMES = ["--max-frames", "6", "--seed", "1"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_help_documents_every_setting_with_its_variable() -> None:
    out = run_cli("--help").stdout
    for name, env, _, _ in EngineSettings.describe():
        assert "--" + name.replace("_", "-") in out and env in out
    for flag in ("--samples-per-chunk", "--zeroconf", "--log-format", "--mqtt-host", "--voice"):
        assert flag in out
    assert run_cli("--version").stdout.strip() == "0.1.0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/nonexistent/model"], "not found"),
        (["--threads", "0"], "invalid threads (KZTTS_THREADS)"),
        (["--stream-chunk", "many"], "KZTTS_STREAM_CHUNK"),
        (["--uri", "unix:///tmp/x.sock", "--zeroconf"], "needs a tcp:// --uri"),
    ],
)
def test_bad_startup_fails_fast_with_a_clear_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_cli("--data-dir", str(tmp_path), "--uri", "tcp://127.0.0.1:1", *args)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_corrupt_model_fails_fast(tiny_model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    talker = broken / "talker.gguf"
    talker.write_bytes(talker.read_bytes()[: talker.stat().st_size // 2])
    result = run_cli("--model", str(broken), "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert "talker.gguf" in result.stderr and "Traceback" not in result.stderr


def test_unknown_default_voice_lists_the_voices(tiny_model: Path, tmp_path: Path) -> None:
    result = run_cli("--model", str(tiny_model), "--data-dir", str(tmp_path), "--voice", "bob")
    assert result.returncode == 1 and "vivian-fr" in result.stderr


def test_offline_repo_id_says_what_to_download(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = run_cli("--data-dir", str(tmp_path), env=env)  # the default model: a repo id
    assert result.returncode == 1
    assert f"cannot download {DEFAULT_MODEL}" in result.stderr
    assert str(tmp_path / "hf" / DEFAULT_MODEL.replace("/", "--")) in result.stderr


def wait_for_socket(proc: subprocess.Popen[str], path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)


async def synthesize(uri: str, text: str) -> int:
    """Samples of audio received for `text`."""
    samples = 0
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Synthesize(text).event())
        while (event := await client.read_event()) is not None and event.type != "audio-stop":
            assert event.type in ("audio-start", "audio-chunk"), event
            samples += len(event.payload or b"") // 2
    return samples


def test_repo_id_checkpoint_is_converted_once_then_served_over_unix_socket(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A repo id whose checkpoint is already in the data dir: converted once, cached."""
    data = tmp_path / "data"
    ckpt = tiny_model.parent / "ckpt"
    shutil.copytree(ckpt, data / "hf" / DEFAULT_MODEL.replace("/", "--"))
    sock = tmp_path / "tts.sock"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KZTTS_QUANT": "q8_0"}
    for _ in range(2):
        proc = subprocess.Popen(
            [*SERVER, "--uri", f"unix://{sock}", "--data-dir", str(data), *FRAMES],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            wait_for_socket(proc, sock)
            assert asyncio.run(synthesize(f"unix://{sock}", "Hello.")) == 6 * 1920
        finally:
            proc.send_signal(signal.SIGTERM)  # docker stop
            _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
    converted = list((data / "converted").iterdir())
    assert len(converted) == 1 and "q8_0" in converted[0].name


def test_sigterm_during_a_synthesis_stops_promptly(tiny_model: Path, tmp_path: Path) -> None:
    sock = tmp_path / "tts.sock"
    cmd = [*SERVER, "--uri", f"unix://{sock}", "--model", str(tiny_model), "--max-frames", "5000"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)

    async def interrupt() -> float:
        async with AsyncClient.from_uri(f"unix://{sock}") as client:
            await client.write_event(Synthesize("A synthesis of some 400 seconds.").event())
            while (event := await client.read_event()) is not None:
                if event.type == "audio-chunk":
                    break
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
            return time.monotonic() - start

    try:
        wait_for_socket(proc, sock)
        assert asyncio.run(interrupt()) < 5
    finally:
        proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    assert "synthesis cancelled" in stderr


def test_stdio_answers_every_piped_request(tiny_model: Path, tmp_path: Path) -> None:
    requests = b"".join(
        json.dumps({"type": "synthesize", "data": {"text": text}}).encode() + b"\n"
        for text in ("One.", "Two.")
    )
    result = subprocess.run(
        [*SERVER, "--uri", "stdio://", "--model", str(tiny_model), *FRAMES],
        input=requests,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    types = []
    out = result.stdout
    while out:
        line, out = out.split(b"\n", 1)
        header = json.loads(line)
        skip = header.get("data_length", 0) + header.get("payload_length", 0)
        out = out[skip:]
        types.append(header["type"])
    assert types.count("audio-start") == types.count("audio-stop") == 2
    assert types[-1] == "audio-stop" and "error" not in types
