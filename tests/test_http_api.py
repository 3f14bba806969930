"""The HTTP API (--http-uri) with real clients: the official OpenAI client (openai from PyPI)
and raw HTTP (aiohttp's client), against a real server on tiny random checkpoints. The audio is the
engine's own: the seed is fixed, so what comes over HTTP must equal the engine's samples."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import REFERENCE
from kazeia_dev.random_checkpoint import main as random_checkpoint
from test_server import FRAMES, HOP, engine_pcm, free_port

from wyoming_kazeia.convert import convert
from wyoming_kazeia.engine import Engine
from wyoming_kazeia.http_api import MAX_INPUT_CHARS, serve_http
from wyoming_kazeia.http_requests import MAX_JSON_BYTES
from wyoming_kazeia.model_voices import ModelVoices, VoiceModel
from wyoming_kazeia.server import build_info
from wyoming_kazeia.service import TtsService
from wyoming_kazeia.settings import EngineSettings
from wyoming_kazeia.voices import DEFAULT_SPEAKER
from wyoming_kazeia.voices.library import VoiceLibrary

SETTINGS = EngineSettings(max_frames=FRAMES, seed=11)
BASE = "tiny-base-0.6b"
REF_TEXT = json.loads((REFERENCE / BASE / "ref" / "manifest.json").read_text())["_notes"][
    "voice_texts"
]["ref_text"]
# A client that leaves mid-answer has its synthesis cancelled within this many seconds, and
# the next request's first audio comes within SERVED_WITHIN_S.
CANCELLED_WITHIN_S = 1.0
SERVED_WITHIN_S = 1.0


class HttpServer:
    """serve_http in a thread with its own event loop (as the server runs it beside Wyoming);
    `url` is its root, `service` the service it serves."""

    def __init__(self, service: TtsService, api_key: str | None = None, idle: float = 60) -> None:
        self.service = service
        self.url = f"http://127.0.0.1:{free_port()}"
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._task: asyncio.Task[None] | None = None

        async def main() -> None:
            started = asyncio.Event()
            uri = self.url.replace("http://", "tcp://")
            self._task = asyncio.create_task(serve_http(service, uri, api_key, idle, started))
            await asyncio.wait(
                [asyncio.ensure_future(started.wait()), self._task],
                return_when=asyncio.FIRST_COMPLETED,
            )
            ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),))
        self._thread.start()
        assert ready.wait(30), "the HTTP server did not start"

    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60)

    def stop(self) -> None:
        assert self._task is not None
        self.loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)
        self.service.shutdown()

    def __enter__(self) -> HttpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


def http(method: str, url: str, timeout: float = 60, **kwargs: Any) -> Reply:
    """One raw HTTP request (aiohttp's client), for what the OpenAI client does not send."""

    async def go() -> Reply:
        limit = aiohttp.ClientTimeout(total=timeout)
        async with aiohttp.ClientSession(timeout=limit) as s, s.request(method, url, **kwargs) as r:
            return Reply(r.status, dict(r.headers), await r.read())

    return asyncio.run(go())


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Engine:
    return Engine(tiny_model, SETTINGS)


@pytest.fixture
def server(engine: Engine) -> Iterator[HttpServer]:
    engine.apply_settings(SETTINGS)
    with HttpServer(TtsService(engine, max_queue=8)) as running:
        yield running


def wav_samples(data: bytes) -> np.ndarray:
    """The samples of a streamed WAV (its header says "length unknown")."""
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
    assert int.from_bytes(data[24:28], "little") == 24000
    return np.frombuffer(data[44:], np.int16)


def speak(server: HttpServer, **request: Any) -> bytes:
    """The audio of one request through the OpenAI client's streaming response."""
    params: dict[str, Any] = {"model": "kazeia", "voice": DEFAULT_SPEAKER, **request}
    client = server.client()
    with client.audio.speech.with_streaming_response.create(**params) as response:
        return b"".join(response.iter_bytes())


# -- speech -----------------------------------------------------------------------------------


def test_the_openai_client_gets_the_engines_audio_as_wav_and_pcm(
    server: HttpServer, engine: Engine
) -> None:
    text = "Hello there, this is a test."
    expected = engine_pcm(engine, text, DEFAULT_SPEAKER)
    assert len(expected) == FRAMES * HOP
    wav = speak(server, input=text, response_format="wav")
    assert np.array_equal(wav_samples(wav), expected)
    pcm = speak(server, input=text, response_format="pcm")
    assert np.array_equal(np.frombuffer(pcm, np.int16), expected)
    # A voice carries its speaker and language, as over Wyoming; the client's plain create()
    # (the whole body at once) gets the same audio.
    french = server.client().audio.speech.create(
        model="tts-1", voice="ryan-fr", input="Bonjour.", response_format="pcm"
    )
    assert np.array_equal(
        np.frombuffer(french.content, np.int16), engine_pcm(engine, "Bonjour.", "ryan", "french")
    )


def test_the_openai_client_streams_speech_before_the_answer_ends(server: HttpServer) -> None:
    server.service.update_settings(max_frames=300)
    t0 = time.monotonic()
    first, size = 0.0, 0
    client = server.client()
    with client.audio.speech.with_streaming_response.create(
        model="kazeia", voice="vivian", input="A long sentence to speak.", response_format="pcm"
    ) as response:
        assert response.headers["Transfer-Encoding"] == "chunked"
        for chunk in response.iter_bytes():
            if not first:
                first = time.monotonic() - t0
            size += len(chunk)
    total = time.monotonic() - t0
    assert size == 300 * HOP * 2
    assert first < total / 5, (first, total)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac"])
def test_compressed_formats_decode_to_the_spoken_audio(
    server: HttpServer, engine: Engine, fmt: str
) -> None:
    text = "Hello there."
    expected = engine_pcm(engine, text, DEFAULT_SPEAKER)
    data = speak(server, input=text, response_format=fmt)
    if fmt == "flac":
        # A streamed FLAC leaves its length unknown (0), as the format allows; libsndfile
        # cannot read such a file, so the test writes the length in before reading it.
        assert data[:4] == b"fLaC"
        info = int.from_bytes(data[18:26], "big")
        assert info & (2**36 - 1) == 0
        data = data[:18] + (info | len(expected)).to_bytes(8, "big") + data[26:]
    with sf.SoundFile(io.BytesIO(data)) as f:
        assert f.channels == 1 and f.format == {"mp3": "MP3", "opus": "OGG", "flac": "FLAC"}[fmt]
        blocks = list(f.blocks(4096, dtype="int16"))
        rate = f.samplerate
    decoded = np.concatenate(blocks)
    seconds = len(decoded) / rate
    # Lossy codecs add their encoder delay and frame padding; FLAC is exact.
    assert len(expected) / 24000 <= seconds < len(expected) / 24000 + 0.15, seconds
    if fmt == "flac":
        assert np.array_equal(decoded, expected)


def test_server_sent_events_carry_the_audio_in_openais_shape(
    server: HttpServer, engine: Engine
) -> None:
    request = {"model": "kazeia", "input": "Hello.", "voice": "vivian", "response_format": "pcm"}
    response = http(
        "POST",
        server.url + "/v1/audio/speech",
        json={**request, "stream_format": "sse"},
        timeout=60,
    )
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line]
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    assert np.array_equal(np.frombuffer(pcm, np.int16), engine_pcm(engine, "Hello.", "vivian"))


def test_instructions_style_a_speaker_of_a_model_that_follows_them(
    tmp_path_factory: pytest.TempPathFactory, server: HttpServer
) -> None:
    # The 0.6B CustomVoice model takes no instruction: refused, saying which voices do.
    with pytest.raises(openai.BadRequestError) as refused:
        speak(server, input="Hello.", instructions="Speak cheerfully.")
    assert refused.value.code == "unsupported_instructions"
    assert "CustomVoice 1.7B" in refused.value.message

    root = tmp_path_factory.mktemp("tiny-1.7b")
    assert random_checkpoint([str(root / "ckpt"), "--size", "tiny-1.7b", "--seed", "3", "-q"]) == 0
    model = root / "model"
    convert(root / "ckpt", model, "f32")
    engine = Engine(model, SETTINGS)
    with HttpServer(TtsService(engine)) as styled:
        speaker = engine.speakers[0]
        styled_pcm = speak(
            styled, voice=speaker, input="Hello.", instructions="Speak cheerfully.",
            response_format="pcm",
        )  # fmt: skip
        plain_pcm = speak(styled, voice=speaker, input="Hello.", response_format="pcm")
    prompt = engine.instruction_prompt("Speak cheerfully.", speaker=speaker)
    expected = np.concatenate(list(engine.synthesize("Hello.", language="auto", voice=prompt)))
    assert np.array_equal(np.frombuffer(styled_pcm, np.int16), expected)
    assert not np.array_equal(np.frombuffer(plain_pcm, np.int16), expected)


# -- client mistakes and the service's states -------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "code", "param"),
    [
        ({"voice": "alloy"}, "voice_not_found", "voice"),
        ({"input": ""}, "invalid_request", "input"),
        ({"input": "   "}, "invalid_request", "input"),
        ({"input": "x" * (MAX_INPUT_CHARS + 1)}, "input_too_long", "input"),
        ({"response_format": "aac"}, "unsupported_format", "response_format"),
        ({"response_format": "ogg"}, "unsupported_format", "response_format"),
        ({"speed": 1.5}, "unsupported_speed", "speed"),
    ],
)
def test_client_mistakes_are_openai_shaped_400s_and_the_server_goes_on(
    server: HttpServer, request_fields: dict[str, Any], code: str, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        speak(server, **{"input": "Hello.", **request_fields})
    assert refused.value.status_code == 400
    assert refused.value.code == code and refused.value.param == param
    assert refused.value.type == "invalid_request_error" and refused.value.message
    if code == "voice_not_found":  # the valid voices are named
        assert "valid voices: aiden, " in refused.value.message
    assert len(speak(server, input="Hello.", response_format="pcm")) == FRAMES * HOP * 2


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_request"),
        (b"[1, 2]", 400, "invalid_request"),
        (b'{"input": 5}', 400, "invalid_request"),
        (b'{"input": "\\ud800"}', 400, "invalid_request"),
        (b'{"input": "' + b"x" * MAX_JSON_BYTES + b'"}', 413, "request_too_large"),
    ],
)
def test_malformed_bodies_are_refused_in_openais_shape(
    server: HttpServer, body: bytes, status: int, code: str
) -> None:
    response = http(
        "POST",
        server.url + "/v1/audio/speech",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_that_is_not_declared_json_is_refused(server: HttpServer, content_type: str) -> None:
    """Another site's page can send these without asking the browser; JSON it cannot."""
    response = http(
        "POST",
        server.url + "/v1/audio/speech",
        data=b'{"input": "Hello.", "response_format": "pcm"}',
        headers={"Content-Type": content_type},
        timeout=30,
    )
    assert response.status == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert server.service.status.served == 0  # nothing was spoken


def test_a_change_from_another_sites_page_is_refused(server: HttpServer) -> None:
    body = b'{"input": "Hello.", "response_format": "pcm"}'
    json_type = {"Content-Type": "application/json"}
    url = server.url + "/v1/audio/speech"
    foreign = http("POST", url, data=body, headers={**json_type, "Origin": "http://evil.example"})
    assert foreign.status == 403 and foreign.json()["error"]["code"] == "cross_origin"
    own = urllib.parse.urlparse(server.url).netloc
    same = http("POST", url, data=body, headers={**json_type, "Origin": f"http://{own}"})
    assert same.status == 200 and len(same.body) == FRAMES * HOP * 2
    # Home Assistant's ingress proxy forwards the page's own origin, Home Assistant's.
    ingress = {**json_type, "Origin": "http://homeassistant.local:8123", "X-Ingress-Path": "/x"}
    assert http("POST", url, data=body, headers=ingress).status == 200
    # Reading is not a change: the page of another site learns nothing it can read (no CORS).
    assert (
        http("GET", server.url + "/health", headers={"Origin": "http://evil.example"}).status == 200
    )


def test_input_with_nothing_to_speak_is_a_400(server: HttpServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        speak(server, input="---\n<br>\n***")
    assert refused.value.param == "input" and "nothing to speak" in refused.value.message


def test_a_body_in_pieces_is_read_whole_and_one_that_stalls_is_refused(engine: Engine) -> None:
    """A body may come in several TCP segments; one that stops coming is refused after the
    idle timeout (408), and the server goes on."""
    engine.apply_settings(SETTINGS)
    body = json.dumps({"input": "Hello.", "voice": "vivian", "response_format": "pcm"}).encode()
    with HttpServer(TtsService(engine), idle=1.0) as server:
        host, port = server.url[len("http://") :].split(":")
        answers = []
        for stall in (False, True):
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(
                    f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                    .encode() + body[:10]
                )  # fmt: skip
                time.sleep(0.3)
                if not stall:
                    sock.sendall(body[10:])
                t0, answer, waited = time.monotonic(), b"", 0.0
                while chunk := sock.recv(65536):
                    answer += chunk
                    if b"request_timeout" in answer and not waited:
                        waited = time.monotonic() - t0
                        break
                answers.append((answer, waited))
        (whole, _), (stalled, waited) = answers
        assert whole.startswith(b"HTTP/1.1 200") and len(whole) > FRAMES * HOP * 2
        assert stalled.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in stalled
        assert 0.5 < waited < 3.0
        assert len(speak(server, input="Hi.", response_format="pcm")) == FRAMES * HOP * 2


def test_unknown_paths_and_methods_are_openai_shaped(server: HttpServer) -> None:
    missing = http("GET", server.url + "/v1/audio/nothing", timeout=10)
    assert missing.status == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = http("GET", server.url + "/v1/audio/speech", timeout=10)
    assert wrong.status == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


def test_a_loading_model_and_a_full_queue_are_503s_with_retry_after(engine: Engine) -> None:
    with HttpServer(TtsService(max_queue=8)) as loading:
        loading.service.set_loading("downloading Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice 35%")
        health = http("GET", loading.url + "/health", timeout=10).json()
        assert health["status"] == "loading" and "downloading" in health["detail"]
        with pytest.raises(openai.InternalServerError) as refused:
            speak(loading, input="Hello.")
        assert refused.value.status_code == 503 and refused.value.code == "model_loading"
        assert refused.value.response.headers["Retry-After"] == "10"

    engine.apply_settings(SETTINGS.replace(max_frames=2000))  # ~160 s of audio
    with HttpServer(TtsService(engine, max_queue=0)) as busy:  # one request at a time
        first = busy.client()  # kept: a client collected closes its connections
        with first.audio.speech.with_streaming_response.create(
            model="kazeia", voice="vivian", input="A long one.", response_format="pcm"
        ) as running:
            chunks = running.iter_bytes()  # kept: a generator collected closes the response
            next(chunks)  # it has started
            with pytest.raises(openai.InternalServerError) as refused:
                speak(busy, input="Hello.")
        assert refused.value.status_code == 503 and refused.value.code == "server_busy"
        assert refused.value.response.headers["Retry-After"] == "1"
    engine.apply_settings(SETTINGS)


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_client_that_leaves_mid_stream_frees_the_service_at_once(
    server: HttpServer, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="wyoming_kazeia.service")
    server.service.update_settings(max_frames=1000)  # ~80 s of audio: never read to its end
    request = json.dumps({"input": "A long answer.", "voice": "vivian", "response_format": "pcm"})
    host, port = server.url[len("http://") :].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(request)}\r\n\r\n{request}".encode()
        )
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        while len(head) < 50_000:  # some audio, then gone
            head += sock.recv(65536)
        if how == "reset":
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
        left = time.monotonic()
    deadline = left + CANCELLED_WITHIN_S
    while server.service.status.state != "idle" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.service.status.state == "idle", "the synthesis went on after its client left"
    assert server.service.status.served == 0  # cancelled, not completed
    cancelled = [r for r in caplog.records if r.getMessage().endswith(" cancelled")]
    assert cancelled and cancelled[0].getMessage().startswith("synthesis for http"), caplog.text
    server.service.update_settings(max_frames=FRAMES)
    t0, client = time.monotonic(), server.client()
    with client.audio.speech.with_streaming_response.create(
        model="kazeia", voice="vivian", input="Next.", response_format="pcm"
    ) as response:
        chunks = response.iter_bytes()
        next(chunks)
        assert time.monotonic() - t0 < SERVED_WITHIN_S


def test_a_client_that_stops_reading_is_cut_off_without_the_responses_end(
    engine: Engine,
) -> None:
    """Past the unread-audio bound (or the idle timeout of a write), an answer that has begun
    ends by the connection's end, never by the chunked end a complete answer has."""
    engine.apply_settings(SETTINGS.replace(max_frames=2000))
    service = TtsService(engine, max_unsent_bytes=256 << 10)
    request = json.dumps({"input": "A long answer.", "voice": "vivian", "response_format": "pcm"})
    with HttpServer(service, idle=1.0) as server:
        host, port = server.url[len("http://") :].split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(request)}\r\n\r\n{request}".encode()
            )
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200")
            time.sleep(4.0)  # reads nothing: the server gives up on it
            t0 = time.monotonic()
            with contextlib.suppress(ConnectionError):
                while chunk := sock.recv(1 << 20):
                    answer += chunk
            assert time.monotonic() - t0 < 5.0, "the connection stayed open"
        assert not answer.endswith(b"0\r\n\r\n")
        assert service.status.state == "idle" and service.status.served == 0
        service.update_settings(max_frames=FRAMES)
        assert len(speak(server, input="Hi.", response_format="pcm")) == FRAMES * HOP * 2


# -- security ---------------------------------------------------------------------------------


def test_an_api_key_guards_the_api_but_not_the_page_or_the_health(engine: Engine) -> None:
    engine.apply_settings(SETTINGS)
    with HttpServer(TtsService(engine), api_key="s3cret") as guarded:
        for key in ("none", "s3cret-not"):
            with pytest.raises(openai.AuthenticationError) as refused:
                guarded.client(key).models.list()
            assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        assert http("GET", guarded.url + "/api/info", timeout=10).status == 401
        client = guarded.client("s3cret")
        assert [m.id for m in client.models.list()] == ["kazeia"]
        pcm = client.audio.speech.create(
            model="kazeia", voice="vivian", input="Hi.", response_format="pcm"
        ).content
        assert len(pcm) == FRAMES * HOP * 2
        assert http("GET", guarded.url + "/health", timeout=10).status == 200
        page = http("GET", guarded.url + "/", timeout=10)
        assert page.status == 200 and "<title>Kazeia TTS</title>" in page.text


# -- voices, models, health, page -------------------------------------------------------------


def test_voices_models_and_health_say_what_describe_says(server: HttpServer) -> None:
    listed = http("GET", server.url + "/v1/audio/voices", timeout=10).json()
    (program,) = build_info(server.service).tts
    assert [v["id"] for v in listed["voices"]] == [v.name for v in program.voices]
    assert listed["default"] == DEFAULT_SPEAKER
    vivian_fr = next(v for v in listed["voices"] if v["id"] == "vivian-fr")
    assert vivian_fr["languages"] == ["fr"] and vivian_fr["description"].endswith("(French)")
    models = server.client().models.list()
    assert [m.id for m in models] == ["kazeia"]
    health = http("GET", server.url + "/health", timeout=10).json()
    assert health["status"] == "healthy" and health["ready"] is True
    assert f"({len(program.voices)} voices)" in health["detail"]


def test_the_page_is_served_with_relative_urls_and_under_an_ingress_path(
    server: HttpServer,
) -> None:
    page = http("GET", server.url + "/", timeout=10)
    assert page.headers["Content-Type"].startswith("text/html")
    assert "<base" not in page.text
    assert 'src="app.js"' in page.text and 'href="style.css"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from outside
    ingress = http(
        "GET",
        server.url + "/",
        headers={"X-Ingress-Path": "/api/hassio_ingress/Ab-9_x"},
        timeout=10,
    )
    assert '<base href="/api/hassio_ingress/Ab-9_x/">' in ingress.text
    for hostile_path in ('/x"><script>', "//evil.example", "//evil.example/x"):
        hostile = http(
            "GET", server.url + "/", headers={"X-Ingress-Path": hostile_path}, timeout=10
        )
        assert "<base" not in hostile.text, hostile_path
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        asset = http("GET", f"{server.url}/{name}", timeout=10)
        assert asset.status == 200 and asset.headers["Content-Type"].startswith(kind)
        assert "http://" not in asset.text and "https://" not in asset.text


# -- the voice library through the page's API -------------------------------------------------


def cloning_server(model: Path, base_model: Path, data: Path) -> HttpServer:
    """A CustomVoice model with a Base voice model for cloned voices, and a voice library."""
    engine = Engine(model, SETTINGS)
    voice_model = VoiceModel(
        str(base_model), ModelVoices.of_folder(base_model), lambda: Engine(base_model, SETTINGS)
    )
    service = TtsService(engine, library=VoiceLibrary(data), voice_model=voice_model)
    return HttpServer(service)


def upload(url: str, recording: Path, **fields: str) -> Reply:
    form = {"name": "grandma", "text": REF_TEXT, "language": "en", "consent": "true", **fields}
    with recording.open("rb") as audio:
        data = aiohttp.FormData(form)
        data.add_field("audio", audio.read(), filename="grandma.wav", content_type="audio/wav")
        return http("POST", url + "/api/voices", data=data, timeout=120)


def voice_ids(server: HttpServer) -> list[str]:
    return [
        v["id"] for v in http("GET", server.url + "/v1/audio/voices", timeout=10).json()["voices"]
    ]


def test_an_uploaded_recording_becomes_a_voice_to_rename_choose_and_delete(
    tiny_model: Path, tiny_base_model: Path, reference_recording: Path, tmp_path: Path
) -> None:
    with cloning_server(tiny_model, tiny_base_model, tmp_path / "data") as server:
        added = upload(server.url, reference_recording)
        assert added.status == 201, added.text
        assert added.json()["summary"].startswith("cloned from a 1.2 s recording")
        assert "grandma" in voice_ids(server) and "grandma-fr" in voice_ids(server)
        pcm = speak(server, voice="grandma", input="Hello.", response_format="pcm")
        assert len(pcm) == FRAMES * HOP * 2
        # The command line's library sees it as its own.
        listed = subprocess.run(
            [sys.executable, "-m", "wyoming_kazeia.voices", "--data-dir", str(tmp_path / "data"),
             "list"], capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert listed.stdout.startswith("grandma\tclone\tenglish")

        renamed = http(
            "PATCH", server.url + "/api/voices/grandma", json={"name": "nana"}, timeout=30
        )
        assert renamed.status == 200, renamed.text
        assert "nana" in voice_ids(server) and "grandma" not in voice_ids(server)
        chosen = http("PUT", server.url + "/api/default-voice", json={"voice": "nana"}, timeout=30)
        assert chosen.json() == {"default_voice": "nana"}
        assert http("GET", server.url + "/v1/audio/voices", timeout=10).json()["default"] == "nana"
        pcm = (
            server.client()
            .audio.speech.create(model="kazeia", voice="", input="Hello.", response_format="pcm")
            .content
        )  # no voice: the default one, the clone
        assert len(pcm) == FRAMES * HOP * 2
        info = http("GET", server.url + "/api/info", timeout=10).json()
        assert info["can_clone"] and [v["name"] for v in info["library"]] == ["nana"]

        removed = http("DELETE", server.url + "/api/voices/nana", timeout=30)
        assert removed.status == 200
        assert (
            "nana" not in voice_ids(server) and not (tmp_path / "data" / "voices" / "nana").exists()
        )
        assert server.service.default_voice == DEFAULT_SPEAKER


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({"consent": ""}, 400, "agreed"),
        ({"name": "Grandma!"}, 400, "invalid voice name"),
        ({"text": "مرحبا"}, 400, "a script the models do not speak"),
        ({"language": "xx"}, 400, "unknown language 'xx'"),
    ],
)
def test_a_bad_upload_is_refused_clearly_and_nothing_is_stored(
    tiny_model: Path, tiny_base_model: Path, reference_recording: Path, tmp_path: Path,
    fields: dict[str, str], status: int, says: str,
) -> None:  # fmt: skip
    with cloning_server(tiny_model, tiny_base_model, tmp_path / "data") as server:
        refused = upload(server.url, reference_recording, **fields)
        assert refused.status == status and says in refused.json()["error"]["message"]
        silent = tmp_path / "silent.wav"
        sf.write(silent, np.zeros(48000, np.float32), 24000)
        refused = upload(server.url, silent)
        assert refused.status == 400 and "is silent" in refused.json()["error"]["message"]
        not_form = http("POST", server.url + "/api/voices", data=b"x", timeout=10)
        assert not_form.status == 415
        stored = tmp_path / "data" / "voices"
        assert not stored.exists() or not list(stored.iterdir())


# -- the server's command line ----------------------------------------------------------------


def test_the_server_serves_http_beside_wyoming_and_stops_on_sigterm(
    tiny_model: Path, tmp_path: Path
) -> None:
    http_uri = f"tcp://127.0.0.1:{free_port()}"
    url = "http://" + http_uri[len("tcp://") :]
    cmd = [
        sys.executable, "-m", "wyoming_kazeia", "--model", str(tiny_model), "--data-dir",
        str(tmp_path), "--uri", f"tcp://127.0.0.1:{free_port()}", "--http-uri", http_uri,
        "--max-frames", "6", "--seed", "1",
    ]  # fmt: skip
    env = {**os.environ, "KZTTS_HTTP_API_KEY": "k"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                if http("GET", url + "/health", timeout=5).json()["status"] == "healthy":
                    break
            time.sleep(0.05)
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        pcm = client.audio.speech.create(
            model="kazeia", voice="vivian", input="Hi.", response_format="pcm"
        ).content
        assert len(pcm) == 6 * HOP * 2
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert f"HTTP API and web page on {url}/ (API key required)" in stderr
    assert "http request from 127.0.0.1: voice 'vivian'" in stderr


@pytest.mark.parametrize(
    ("http_uri", "message"),
    [
        ("http://127.0.0.1:8200", "invalid --http-uri 'http://127.0.0.1:8200'"),
        ("tcp://127.0.0.1", "invalid --http-uri 'tcp://127.0.0.1'"),
        ("busy", "cannot listen on --http-uri tcp://127.0.0.1:"),
    ],
)
def test_a_bad_or_busy_http_uri_is_one_line_before_any_model_work(
    tmp_path: Path, http_uri: str, message: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if http_uri == "busy":
            http_uri = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run(
            [sys.executable, "-m", "wyoming_kazeia", "--data-dir", str(tmp_path),
             "--uri", f"tcp://127.0.0.1:{free_port()}", "--http-uri", http_uri],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr and "download" not in result.stderr
