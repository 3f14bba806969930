"""`python -m wyoming_kazeia` as a user starts it: flags, model management, fail-fast startup,
unix:// and stdio:// serving, SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kazeia_dev.random_checkpoint import main as random_checkpoint
from wyoming.client import AsyncClient
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_kazeia.health_check import probe, ready_programs
from wyoming_kazeia.models import DEFAULT_MODEL
from wyoming_kazeia.native import decoder_bf16_isa
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit status 1 and one error line that says `message`, no traceback."""
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line or "error:" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/nonexistent/model"], "not found"),
        (["--threads", "0"], "invalid --threads '0'; allowed: 1..64"),
        (["--threads", "abc"], "invalid --threads 'abc'"),
        (["--stream-chunk", "many"], "invalid --stream-chunk 'many'"),
        (["--backend", "gpu"], "invalid --backend 'gpu'; allowed: cpu|auto|vulkan[:N]|cuda[:N]"),
        (["--talker-backend", "cuda:3"], "no compute device 'cuda:3': devices here: cpu"),
        (["--decoder-backend", "vulkan:5"], "decoder_backend 'vulkan:5'"),
        (["--uri", "unix:///tmp/x.sock", "--zeroconf"], "needs a tcp:// --uri"),
        (["--uri", "http://127.0.0.1:10200"], "invalid --uri 'http://127.0.0.1:10200'"),
        (["--uri", "tcp://127.0.0.1:99999"], "invalid --uri 'tcp://127.0.0.1:99999'"),
        (["--uri", "tcp://127.0.0.1"], "tcp:// needs HOST:PORT"),
        (["--uri", "unix://" + __file__], "exists and is not a socket"),
    ],
)
def test_bad_startup_fails_fast_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    uri = ["--uri", f"tcp://127.0.0.1:{free_port()}"]
    one_line_error(run_cli("--data-dir", str(tmp_path), *uri, *args), message)
    assert Path(__file__).is_file()  # a --uri unix:// at a regular file left it alone


def test_a_bad_variable_is_named(tmp_path: Path) -> None:
    env = {**os.environ, "KZTTS_THREADS": "lots"}
    one_line_error(run_cli("--data-dir", str(tmp_path), env=env), "KZTTS_THREADS='lots'")
    env = {**os.environ, "KZTTS_DEBUG": "maybe"}
    one_line_error(run_cli("--data-dir", str(tmp_path), env=env), "KZTTS_DEBUG='maybe'")


def test_a_busy_port_is_one_line_before_any_model_work(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The default model, a repo id: no download is even tried (nothing says "download").
        result = run_cli("--data-dir", str(tmp_path), "--uri", f"tcp://127.0.0.1:{port}")
    one_line_error(result, f"cannot listen on tcp://127.0.0.1:{port}")
    assert "download" not in result.stderr and not (tmp_path / "converted").exists()


def test_a_model_folder_without_its_tokenizer_is_one_line(tiny_model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "no-vocab"
    shutil.copytree(tiny_model, broken)
    (broken / "vocab.json").unlink()
    result = run_cli("--model", str(broken), "--data-dir", str(tmp_path), *free_uri())
    one_line_error(result, "vocab.json")


def test_help_groups_the_developer_knobs() -> None:
    out = run_cli("--help").stdout
    advanced = out[out.index("advanced (developer knobs)") :]
    for flag in (
        "--talker-backend",
        "--decoder-subprocess",
        "--max-frames",
        "--repetition-penalty",
    ):
        assert flag in advanced
    assert "--threads" not in advanced and "KZTTS_LOG_FORMAT" in out and "KZTTS_DEBUG" in out
    assert " --backend VALUE" not in advanced and " --backend VALUE" in out  # a user's setting


def free_uri() -> list[str]:
    return ["--uri", f"tcp://127.0.0.1:{free_port()}"]


def test_corrupt_model_fails_fast(tiny_model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    talker = broken / "talker.gguf"
    talker.write_bytes(talker.read_bytes()[: talker.stat().st_size // 2])
    result = run_cli("--model", str(broken), "--data-dir", str(tmp_path), *free_uri())
    one_line_error(result, "talker.gguf")


def test_unknown_default_voice_lists_the_voices(tiny_model: Path, tmp_path: Path) -> None:
    result = run_cli(
        "--model", str(tiny_model), "--data-dir", str(tmp_path), "--voice", "bob", *free_uri()
    )
    one_line_error(result, "vivian-fr")


def test_offline_repo_id_says_what_to_download(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = run_cli("--data-dir", str(tmp_path), *free_uri(), env=env)  # the default: a repo id
    one_line_error(result, f"cannot download {DEFAULT_MODEL}")
    assert str(tmp_path / "hf" / DEFAULT_MODEL.replace("/", "--")) in result.stderr


def wait_until_ready(proc: subprocess.Popen[str], uri: str) -> list[str]:
    """Polls describe until the model is loaded; returns the program descriptions seen."""
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "server did not get ready"
        info = asyncio.run(probe(uri, 5)) if _bound(uri) else None
        if info is not None:
            seen.append(info.tts[0].description or "")
            if ready_programs(info):
                return seen
        time.sleep(0.02)


def ready_then_stopped(cmd: list[str], uri: str, env: dict[str, str] | None = None) -> str:
    """Starts the server, waits until it is ready and stops it with SIGTERM, which it must
    survive cleanly (exit 0); returns its stderr."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until_ready(proc, uri)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr[-3000:]
    return stderr


def _bound(uri: str) -> bool:
    return not uri.startswith("unix://") or Path(uri[len("unix://") :]).exists()


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
    """A repo id whose checkpoint is already in the data dir: converted once, its source
    recorded; the second start uses the conversion alone (the checkpoint deleted, offline)."""
    data = tmp_path / "data"
    ckpt = tiny_model.parent / "ckpt"
    legacy = data / "hf" / DEFAULT_MODEL.replace("/", "--")
    shutil.copytree(ckpt, legacy)
    sock = tmp_path / "tts.sock"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KZTTS_QUANT": "q8_0"}
    for start in range(2):
        if start == 1:
            shutil.rmtree(legacy)
        proc = subprocess.Popen(
            [*SERVER, "--uri", f"unix://{sock}", "--data-dir", str(data), *FRAMES],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            wait_until_ready(proc, f"unix://{sock}")
            assert asyncio.run(synthesize(f"unix://{sock}", "Hello.")) == 6 * 1920
        finally:
            proc.send_signal(signal.SIGTERM)  # docker stop
            _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
    converted = list((data / "converted").iterdir())
    assert [c.name for c in converted] == [DEFAULT_MODEL.replace("/", "--") + "-q8_0"]
    source = json.loads((converted[0] / "source.json").read_text())
    assert source["repo_id"] == DEFAULT_MODEL and source["quant"] == "q8_0"


def test_a_checkpoint_of_a_kind_it_cannot_serve_is_refused_before_converting(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other"
    assert random_checkpoint([str(other), "--size", "tiny", "-q"]) == 0
    config = json.loads((other / "config.json").read_text())
    config["tts_model_type"] = "voice_conversion"  # a kind that does not exist (yet)
    (other / "config.json").write_text(json.dumps(config))
    result = run_cli("--model", str(other), "--data-dir", str(tmp_path / "d"), *free_uri())
    one_line_error(result, "a 'voice_conversion' checkpoint")
    assert not (tmp_path / "d" / "converted").exists() or not any(
        (tmp_path / "d" / "converted").iterdir()
    )


@pytest.mark.parametrize(
    "placement",
    [[], ["--stream-chunk", "0"], ["--decoder-subprocess"]],
    ids=["streaming", "one-pass", "subprocess"],
)
def test_sigterm_during_a_synthesis_stops_promptly(
    tiny_model: Path, tmp_path: Path, placement: list[str]
) -> None:
    """In every placement and mode, SIGTERM during a synthesis ends the process in < 2 s."""
    sock = tmp_path / "tts.sock"
    cmd = [*SERVER, "--uri", f"unix://{sock}", "--model", str(tiny_model), "--max-frames", "5000"]
    # A fixed seed: random weights say eos at a random frame; this one runs for seconds.
    proc = subprocess.Popen([*cmd, "--seed", "1", *placement], stderr=subprocess.PIPE, text=True)

    async def interrupt() -> float:
        async with AsyncClient.from_uri(f"unix://{sock}") as client:
            await client.write_event(Synthesize("A synthesis of some 400 seconds.").event())
            while (event := await client.read_event()) is not None:
                if event.type == "audio-start":
                    break
            await asyncio.sleep(0.5)  # well inside the synthesis (or its one-pass decode)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
            return time.monotonic() - start

    try:
        wait_until_ready(proc, f"unix://{sock}")
        assert asyncio.run(interrupt()) < 2.0  # docker stop waits 10 s; we want far less
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


def test_describe_is_answered_while_the_model_loads_then_it_is_ready(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A first start converts a checkpoint: the socket answers describe all along (not
    installed, with how far the loading is), then the service is ready and healthy (0);
    stopped, it is unhealthy (1)."""
    checkpoint = tiny_model.parent / "ckpt"
    uri = f"tcp://127.0.0.1:{free_port()}"
    cmd = [*SERVER, "--uri", uri, "--model", str(checkpoint), "--data-dir", str(tmp_path), *FRAMES]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        seen = wait_until_ready(proc, uri)
        health = [sys.executable, "-m", "wyoming_kazeia.health_check", "--uri", uri]
        ready = subprocess.run(health, capture_output=True, text=True, timeout=30, check=False)
        assert ready.returncode == 0 and ready.stdout.startswith("healthy: Qwen3-TTS")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    loading = [d for d in seen if "(loading: " in d]
    assert loading, f"describe never answered during the load: {seen}"
    assert any(word in " ".join(loading) for word in ("converting", "loading /", "resolving"))
    assert "warm-up synthesis" in stderr
    gone = subprocess.run(health, capture_output=True, text=True, timeout=30, check=False)
    assert gone.returncode == 1 and gone.stdout.startswith("unhealthy")


def test_health_check_says_loading_and_healthy_while_loading() -> None:
    """A server that answers while its model loads is alive (0): a first start longer than
    the image's start period is not restarted as unhealthy."""
    import threading

    from wyoming_kazeia.server import serve
    from wyoming_kazeia.service import TtsService

    uri = f"tcp://127.0.0.1:{free_port()}"
    service = TtsService(max_queue=1)
    service.set_loading("downloading Qwen/x: 12%")
    loop = asyncio.new_event_loop()
    started = threading.Event()
    task: asyncio.Task[None] | None = None

    async def main() -> None:
        nonlocal task
        listening = asyncio.Event()
        task = asyncio.create_task(serve(service, uri, 1024, None, listening))
        await listening.wait()
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        health = [sys.executable, "-m", "wyoming_kazeia.health_check", "--uri", uri]
        result = subprocess.run(health, capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 0
        assert result.stdout.startswith("loading:") and "12%" in result.stdout
    finally:  # the server ends with the test (it used to outlive it, cut off at exit)
        assert task is not None
        loop.call_soon_threadsafe(task.cancel)
        thread.join(30)
        assert not thread.is_alive()
        loop.close()


def test_logs_a_user_can_act_on(tiny_model: Path, tmp_path: Path) -> None:
    """The start banner, one INFO line per request, refusals at WARNING with their code, the
    client that leaves and SIGTERM; the text itself only with --debug."""
    uri = f"tcp://127.0.0.1:{free_port()}"
    cmd = [*SERVER, "--uri", uri, "--model", str(tiny_model), "--max-frames", "400", "--debug"]
    cmd += ["--seed", "1"]  # random weights say eos at a random frame; this seed runs long
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)

    async def requests() -> None:
        assert await synthesize(uri, "A secret sentence.") > 0
        async with AsyncClient.from_uri(uri) as client:  # refused
            await client.write_event(Synthesize("Hi.", SynthesizeVoice("nobody")).event())
            while await client.read_event() is not None:
                pass
        async with AsyncClient.from_uri(uri) as client:  # leaves during its synthesis
            await client.write_event(Synthesize("I will not wait for the end of this.").event())
            while (event := await client.read_event()) is not None:
                if event.type == "audio-chunk":
                    break

    try:
        wait_until_ready(proc, uri)
        asyncio.run(requests())
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    lines = stderr.splitlines()

    def line(*words: str) -> str:
        found = [x for x in lines if all(w in x for w in words)]
        assert found, f"no line with {words}:\n{stderr}"
        return found[0]

    banner = line("Kazeia TTS 0.1.0 ready", "Qwen3-TTS")
    assert "CustomVoice" in banner and str(tiny_model) in banner
    defaults = EngineSettings()
    banner = f"threads {defaults.threads} generator + {defaults.decoder_threads} decoder"
    assert "default voice vivian" in line(banner)
    assert "own kernels" in line("CPU:", "ggml CPU backend")
    line("placement: talker cpu, code predictor cpu, decoder cpu")
    # An f32 decoder on a CPU whose bf16 products run on AMX or AVX-512 BF16: one line names the
    # faster setting.
    hints = [x for x in lines if "decoder_precision bf16 would run the speech decoder" in x]
    assert len(hints) == (decoder_bf16_isa() in ("AMX", "AVX-512 BF16"))
    spoken = line("INFO", "one-shot request", "spoken")
    assert "voice vivian" in spoken and "language auto" in spoken and "18 characters" in spoken
    assert "WARNING" in line("refused (voice-not-found)")
    line("DEBUG", "'A secret sentence.'")  # the text, at --debug only
    line("left: its synthesis is cancelled")
    line("SIGTERM: stopping")


def test_many_idle_connections_under_a_file_limit_lock_no_one_out(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Under an open-file limit of 128 (prlimit), 200 idle connections: a new client is still
    answered (the idlest connection makes room), and the log stays a few lines."""
    uri = f"tcp://127.0.0.1:{free_port()}"
    cmd = ["prlimit", "--nofile=128:128", "--", *SERVER, "--uri", uri, "--model", str(tiny_model)]
    proc = subprocess.Popen([*cmd, "--max-connections", "64"], stderr=subprocess.PIPE, text=True)
    host, port = uri.removeprefix("tcp://").split(":")
    idle: list[socket.socket] = []
    try:
        wait_until_ready(proc, uri)
        for _ in range(200):
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(0.5)
        info = asyncio.run(probe(uri, 5))
        assert info is not None and ready_programs(info)
    finally:
        for s in idle:
            s.close()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr
    assert len(stderr.encode()) < 64 * 1024 and len(stderr.splitlines()) < 400


def test_idle_and_slow_drip_connections_are_closed(tiny_model: Path, tmp_path: Path) -> None:
    uri = f"tcp://127.0.0.1:{free_port()}"
    cmd = [*SERVER, "--uri", uri, "--model", str(tiny_model), "--idle-timeout", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    host, port = uri.removeprefix("tcp://").split(":")
    try:
        wait_until_ready(proc, uri)
        with (
            socket.create_connection((host, int(port))) as quiet,
            socket.create_connection((host, int(port))) as drip,
        ):
            start = time.monotonic()
            quiet.settimeout(5)
            assert quiet.recv(1) == b""  # closed by the server
            assert 0.9 < time.monotonic() - start < 3
            drip.settimeout(0.3)
            start, closed = time.monotonic(), False
            header = b'{"type": "describe"}'
            for byte in header:  # one byte every 0.3 s: an event that never completes in time
                try:
                    drip.sendall(bytes([byte]))
                    if drip.recv(1) == b"":
                        closed = True
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed = True
                    break
            assert closed and time.monotonic() - start < 3
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert "closing the idle connection" in stderr


def test_a_model_file_changed_under_the_server_never_crashes_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    """talker.gguf truncated in place during a synthesis (what `cp new.gguf talker.gguf`
    does): that request fails, the server lives; while the file is broken every request fails
    with a clear error; once a good file is back it is loaded again and requests succeed."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    talker = model / "talker.gguf"
    good = talker.read_bytes()
    uri = f"tcp://127.0.0.1:{free_port()}"
    cmd = [*SERVER, "--uri", uri, "--model", str(model), "--max-frames", "400", "--seed", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)

    async def truncated_during_a_synthesis() -> list[str]:
        types: list[str] = []
        async with AsyncClient.from_uri(uri) as client:
            await client.write_event(Synthesize("A long synthesis that will break.").event())
            while (event := await client.read_event()) is not None:
                types.append(event.type)
                if types.count("audio-chunk") == 1:
                    with open(talker, "r+b") as f:  # in place, as cp does
                        f.truncate(4096)
        return types

    async def request() -> list[str]:
        async with AsyncClient.from_uri(uri) as client:
            await client.write_event(Synthesize("Hello.").event())
            types = []
            while (event := await client.read_event()) is not None:
                types.append(event.type)
                if event.type == "error":
                    types.append(str(event.data["text"]))
                if event.type == "audio-stop":
                    break
            return types

    try:
        wait_until_ready(proc, uri)
        broken = asyncio.run(truncated_during_a_synthesis())
        assert proc.poll() is None, "the server died"
        assert broken[-1] == "error" and "audio-stop" not in broken
        still_broken = asyncio.run(request())
        assert "error" in still_broken and any("talker.gguf" in t for t in still_broken)
        talker.write_bytes(good)
        assert asyncio.run(request())[-1] == "audio-stop"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        print(stderr[-3000:])  # shown with a failure above: the server's last words
    assert proc.returncode == 0, stderr[-3000:]
    assert "changed on disk" in stderr and "Traceback" not in stderr


def test_a_model_in_the_hugging_face_cache_is_not_fetched_again(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The default repo id, already in the standard Hugging Face cache (HF_HOME): converted
    from there with the network off (HF_HUB_OFFLINE=1), its revision recorded."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / ("models--" + DEFAULT_MODEL.replace("/", "--"))
    shutil.copytree(tiny_model.parent / "ckpt", repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    uri = f"tcp://127.0.0.1:{free_port()}"
    data = tmp_path / "data"
    cmd = [*SERVER, "--uri", uri, "--data-dir", str(data), "--quant", "f32", *FRAMES]
    stderr = ready_then_stopped(cmd, uri, env)
    assert "downloading" not in stderr
    (converted,) = (data / "converted").iterdir()
    source = json.loads((converted / "source.json").read_text())
    assert source["repo_id"] == DEFAULT_MODEL and source["revision"] == revision


def test_the_service_is_ready_only_after_its_warm_up(tiny_model: Path) -> None:
    """The warm-up synthesis runs before `describe` says installed: no request shares the engine
    with it, and a SIGTERM right after the service is ready finds the warm-up ended."""
    uri = f"tcp://127.0.0.1:{free_port()}"
    stderr = ready_then_stopped([*SERVER, "--uri", uri, "--model", str(tiny_model)], uri)
    warmed, stopping = stderr.find("warm-up synthesis:"), stderr.find("SIGTERM: stopping")
    assert 0 <= warmed < stopping, stderr[-3000:]


async def leave_mid_answer(uri: str) -> None:
    """Home Assistant's client asks for five sentences, reads 20 audio chunks and leaves its
    `async with` (what a satellite's "stop" does)."""
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Synthesize(" ".join(["A sentence nobody hears out."] * 5)).event())
        chunks = 0
        while chunks < 20 and (event := await client.read_event()) is not None:
            chunks += event.type == "audio-chunk"


async def first_audio_s(uri: str) -> float:
    async with AsyncClient.from_uri(uri) as client:
        start = time.monotonic()
        await client.write_event(Synthesize("Hello there.").event())
        while (event := await asyncio.wait_for(client.read_event(), 10)) is not None:
            assert event.type != "error", event.data
            if event.type == "audio-chunk":
                return time.monotonic() - start
    raise AssertionError("no audio")


def serve_then_signal(
    tiny_model: Path, args: list[str], number: signal.Signals, meanwhile: Any = None
) -> str:
    """Starts the server, runs `meanwhile(uri)` once it is ready, then sends it signal `number`,
    which must end it cleanly (exit 0) within 2 s; returns its stderr."""
    uri = f"tcp://127.0.0.1:{free_port()}"
    cmd = [*SERVER, "--uri", uri, "--model", str(tiny_model), *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_ready(proc, uri)
        if meanwhile is not None:
            meanwhile(uri)
        start = time.monotonic()
        proc.send_signal(number)
        proc.wait(30)
        assert time.monotonic() - start < 2.0
    finally:
        proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    return stderr


@pytest.mark.parametrize("trial", range(5))
def test_after_a_client_leaves_mid_answer_the_next_is_served_and_sigterm_stops_it(
    tiny_model: Path, trial: int
) -> None:
    """Fresh starts of the real server: Home Assistant's client leaves mid-answer, the next
    client's first audio comes within 1 s, SIGTERM then ends the process within 2 s."""

    def leave_then_ask(uri: str) -> None:
        asyncio.run(leave_mid_answer(uri))
        assert asyncio.run(first_audio_s(uri)) < 1.0

    args = ["--max-frames", "60", "--seed", str(trial)]
    serve_then_signal(tiny_model, args, signal.SIGTERM, leave_then_ask)


def test_sighup_stops_the_server_cleanly_with_a_log_line(tiny_model: Path) -> None:
    assert "SIGHUP: stopping" in serve_then_signal(tiny_model, FRAMES, signal.SIGHUP)


def test_a_decoder_subprocess_never_outlives_a_killed_server(tiny_model: Path) -> None:
    """SIGKILL of the server while its kazeia-decoder child decodes: the child ends too."""
    uri = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [*SERVER, "--uri", uri, "--model", str(tiny_model), "--max-frames", "5000", "--seed",
         "1", "--decoder-subprocess"],
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip

    def children() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and "kazeia-decoder" in (entry / "cmdline").read_text():
                    found.append(int(entry.name))
        return found

    async def speak_then_kill() -> list[int]:
        async with AsyncClient.from_uri(uri) as client:
            await client.write_event(Synthesize("A long one, decoded in a child.").event())
            chunks = 0
            while chunks < 5 and (event := await client.read_event()) is not None:
                chunks += event.type == "audio-chunk"
            alive = children()
            proc.kill()
            return alive

    try:
        wait_until_ready(proc, uri)
        alive = asyncio.run(speak_then_kill())
        assert alive, "no kazeia-decoder child while decoding"
        deadline = time.monotonic() + 5
        while set(alive) & set(children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(alive) & set(children()), "the decoder child outlived the server"
    finally:
        proc.kill()
        proc.wait()


def test_clients_that_stop_reading_keep_no_place_in_the_queue(tiny_model: Path) -> None:
    """Two clients pipeline requests and then read nothing, never closing (a host that
    vanished without a word looks the same): after the idle timeout their connections are
    closed and their places freed, so a third client is served instead of `server-busy`."""
    uri = f"tcp://127.0.0.1:{free_port()}"
    port = int(uri.rsplit(":", 1)[1])
    args = ["--max-queue", "1", "--idle-timeout", "1", "--max-unsent-mb", "1"]
    args += ["--max-frames", "2000", "--seed", "1"]  # more audio than the socket buffers
    proc = subprocess.Popen(
        [*SERVER, "--uri", uri, "--model", str(tiny_model), *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    stalled = []
    try:
        wait_until_ready(proc, uri)
        for _ in range(2):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            request = json.dumps({"type": "synthesize", "data": {"text": "Nobody reads."}})
            sock.sendall((request + "\n").encode() * 5)
            stalled.append(sock)

        async def served_within(seconds: float) -> bool:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                with contextlib.suppress(AssertionError):
                    if await first_audio_s(uri) < 1.0:
                        return True
                await asyncio.sleep(0.2)
            return False

        assert asyncio.run(served_within(10)), "still refused while the stalled clients stay"
    finally:
        for sock in stalled:
            sock.close()
        proc.kill()
        proc.communicate()


def test_sigterm_does_not_wait_for_long_texts_being_split(tiny_model: Path) -> None:
    """Eight streams of 1 MB text each, split into sentences in worker threads: SIGTERM still
    ends the server within 2 s (the splitting threads are not waited for)."""

    socks: list[socket.socket] = []

    def send_megabytes(uri: str) -> None:
        port = int(uri.rsplit(":", 1)[1])
        start = json.dumps({"type": "synthesize-start"}).encode() + b"\n"
        data = json.dumps({"text": "Words here. " * 87000}).encode()
        header = json.dumps({"type": "synthesize-chunk", "data_length": len(data)}).encode()
        for _ in range(8):
            socks.append(socket.create_connection(("127.0.0.1", port)))
            socks[-1].sendall(start + header + b"\n" + data)
        time.sleep(0.5)  # read, and being split

    try:
        serve_then_signal(tiny_model, FRAMES, signal.SIGTERM, send_megabytes)
    finally:
        for sock in socks:
            sock.close()
