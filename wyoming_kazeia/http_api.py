"""The HTTP API beside Wyoming (--http-uri): the same service, queue, voices and settings, in the
same event loop, for the clients that speak OpenAI's speech API, and the web page.

    POST /v1/audio/speech    OpenAI's speech API: model, input, voice, response_format, speed,
                             instructions, stream_format; the audio streams as it is synthesized
    GET  /v1/audio/voices    the voices as `describe` lists them (and the default one)
    GET  /v1/models          the one model ("kazeia"; any `model` name is taken)
    GET  /health             the health check's answer
    GET  /                   the web page (wyoming_kazeia/web), and its /api/ (http_voices.py)

A request's audio is admitted to the service's queue as a Wyoming request is (`admit`: a full
queue or a model still loading is a 503 with Retry-After), its unread audio bounded the same
way, and a client that leaves mid-answer cancels it (its handler is cancelled and closes its
answer). The response starts with the first audio: an error found before it is an HTTP error
in OpenAI's shape ({"error": {"message", "type", "param", "code"}}); a failure after it cuts the
connection without the response's end, so that no client takes a partial answer for a whole.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import re
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlparse

from aiohttp import web

from . import audio_encoding
from .answers import AudioStream, Silence
from .errors import (
    EngineError,
    KazeiaError,
    RequestError,
    SettingsError,
    quoted,
)
from .health_check import verdict
from .http_requests import (
    IDLE_TIMEOUT,
    MAX_UPLOAD_BYTES,
    error_response,
    field,
    read_json,
)
from .pacing import Prebuffer
from .sentences import StreamSentences
from .server import build_info
from .service import TtsService
from .speakable import Pause

_LOGGER = logging.getLogger(__name__)

# OpenAI's bound on `input`: a client written for its API never sends more.
MAX_INPUT_CHARS = 4096
# Every wait for the engine's next audio has this deadline: past it the engine is stuck and the
# answer fails (a long queue ahead is bounded by max_queue answers of bounded length).
AUDIO_WAIT_S = 600.0
# How long a stop waits for the requests in flight (their syntheses are cancelled at once).
SHUTDOWN_S = 1.0
MODEL_ID = "kazeia"


@dataclasses.dataclass
class HttpApi:
    """The handlers of one server, over one service."""

    service: TtsService
    api_key: str | None = None
    idle_timeout: float | None = 60.0  # a client that reads nothing for this long is gone
    formats: dict[str, Any] = dataclasses.field(default_factory=audio_encoding.formats)

    # -- middleware ------------------------------------------------------------------------

    @web.middleware
    async def errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every refusal in OpenAI's error shape; a failure nobody foresaw is a 500, logged
        with its traceback, and the server goes on."""
        try:
            return await handler(request)
        except KazeiaError as err:
            status = error_response(err).status
            log = _LOGGER.warning if status < 500 or status == 503 else _LOGGER.error
            log("%s %s from %s refused (%d): %s", request.method, request.path, request.remote,
                status, err)  # fmt: skip
            return error_response(err)
        except web.HTTPException as err:  # aiohttp's own: no route, a method not allowed
            if err.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
            return error_response(
                RequestError(
                    f"{request.method} {quoted(request.path)}: {err.reason}",
                    err.status,
                    code.get(err.status, "bad_request"),
                )
            )
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as err:  # noqa: BLE001 - one request failed; the server goes on
            _LOGGER.exception("%s %s from %s failed", request.method, request.path, request.remote)
            return error_response(EngineError(f"the request failed: {err}"))

    @web.middleware
    async def same_origin(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A request that changes something (POST, PUT, PATCH, DELETE) from a page of another
        site is refused: a browser names the page's site in `Origin`, and another site may send
        a form (an upload, say) without asking. Home Assistant's ingress proxy, which sends
        X-Ingress-Path (a header no other site's page can add), is let through."""
        origin = request.headers.get("Origin")
        if (
            origin
            and request.method not in ("GET", "HEAD", "OPTIONS")
            and "X-Ingress-Path" not in request.headers
            and urlparse(origin).netloc.lower()
            not in {request.host.lower(), request.headers.get("X-Forwarded-Host", "").lower()}
        ):
            raise RequestError(
                f"{request.method} from the page of another site ({quoted(origin)}) is refused",
                403,
                "cross_origin",
            )
        return await handler(request)

    @web.middleware
    async def auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """With an API key, every request but the page's files and /health carries it as
        `Authorization: Bearer KEY`."""
        if self.api_key and not _is_open(request.path):
            given = request.headers.get("Authorization", "")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.api_key.encode()
            ):
                raise RequestError(
                    "a valid API key is required: send 'Authorization: Bearer KEY'",
                    401,
                    "invalid_api_key",
                )
        return await handler(request)

    # -- OpenAI's endpoints ----------------------------------------------------------------

    async def speech(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        text = field(body, "input", str, "")
        name = field(body, "voice", str) or None
        fmt = field(body, "response_format", str, "mp3").lower()
        speed = field(body, "speed", (int, float), 1.0)
        instructions = (field(body, "instructions", str, "") or "").strip()
        stream_format = field(body, "stream_format", str, "audio")
        field(body, "model", str)
        if not text.strip():
            raise RequestError("'input' is empty: give the text to speak", param="input")
        if len(text) > MAX_INPUT_CHARS:
            raise RequestError(
                f"'input' is {len(text)} characters long: at most {MAX_INPUT_CHARS}",
                param="input",
                code="input_too_long",
            )
        if fmt not in self.formats:
            raise RequestError(
                f"response_format {quoted(fmt)} is not supported here; use "
                + ", ".join(self.formats),
                param="response_format",
                code="unsupported_format",
            )
        if speed != 1:
            raise RequestError(
                f"speed {quoted(speed)} is not supported: the model speaks at its own pace; "
                "send 1.0 or leave it out",
                param="speed",
                code="unsupported_speed",
            )
        if stream_format not in ("audio", "sse"):
            raise RequestError(
                f"stream_format {quoted(stream_format)}: use audio or sse", param="stream_format"
            )
        content_type, make_encoder = self.formats[fmt]
        answer = self.service.admit(f"http {request.remote}")
        audio: AudioStream | None = None
        start = time.monotonic()
        try:
            await self.service.refresh_voices()
            choice = self.service.resolve_voice(name)
            if instructions:
                if choice.stored is not None or not self.service.engine.follows_instructions:
                    raise RequestError(
                        f"voice {quoted(name or self.service.default_voice)} does not follow "
                        "instructions: only the built-in speakers of a CustomVoice 1.7B model "
                        "do; leave 'instructions' out",
                        param="instructions",
                        code="unsupported_instructions",
                    )
                choice = dataclasses.replace(choice, instruct=instructions)
            split = StreamSentences(self.service.settings.speakable_text)
            sentences: list[str | Pause] = [*split.add(text), *split.finish()]
            if not sentences:
                raise RequestError(
                    "'input' has nothing to speak once read as a person would (Markdown, links "
                    "and tags are not read out)",
                    param="input",
                )
            audio = self.service.queue(sentences, choice, answer)
            first = await self._next(audio)  # the response starts with the first audio
            ttfa = time.monotonic() - start
            held, complete = await self._hold(request, audio, first, sentences)
            sse = stream_format == "sse"
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream" if sse else content_type,
                    "Cache-Control": "no-store",
                    "X-First-Audio-Seconds": f"{ttfa:.3f}",
                    "X-Sample-Rate": str(self.service.sample_rate),
                }
            )
            response.enable_chunked_encoding()
            await response.prepare(request)
            encoder = make_encoder(self.service.sample_rate)
            write = self._sse_writer(response) if sse else response.write
            try:
                for pcm in held:
                    await self._write(write, encoder.encode(pcm))
                more = None if complete else await self._next(audio)
                while more is not None:
                    await self._write(write, encoder.encode(more))
                    more = await self._next(audio)
                await self._write(write, encoder.finish())
                if sse:
                    await response.write(_sse({"type": "speech.audio.done"}))
            except Exception as err:  # noqa: BLE001 - the answer has begun
                # The connection ends without the response's end: no client takes the audio
                # so far for a whole answer.
                if not isinstance(err, (KazeiaError, ConnectionError, asyncio.TimeoutError)):
                    _LOGGER.exception("synthesis failed")
                _LOGGER.warning(
                    "speech for %s cut short: %s",
                    request.remote,
                    "it read nothing for the idle timeout"
                    if isinstance(err, asyncio.TimeoutError)
                    else str(err) or type(err).__name__,
                )
                _reset(request)
                return response
            await response.write_eof()
        except asyncio.CancelledError:  # the client left (aiohttp cancels its handler)
            _LOGGER.info("http client %s left: its synthesis is cancelled", request.remote)
            raise
        finally:
            if audio is not None:  # what a failure or a gone client left unspoken
                audio.cancel()
            answer.close()
        _LOGGER.info(
            "http request from %s: voice %s (%s), language %s, %d characters, %s: spoken "
            "(first audio %.2f s, %.2f s in all)",
            request.remote,
            quoted(name) if name else self.service.default_voice,
            choice.stored or choice.speaker,
            choice.language,
            len(text),
            fmt,
            ttfa,
            time.monotonic() - start,
        )
        return response

    async def _hold(
        self,
        request: web.Request,
        audio: AudioStream,
        first: bytes | None,
        sentences: list[str | Pause],
    ) -> tuple[list[bytes], bool]:
        """The audio to send first, and whether it is the whole answer's: the first chunk, or,
        where the prebuffer setting is on, as much as a player needs at hand to play the rest
        without a gap (pacing.Prebuffer)."""
        if first is None:
            return [], True
        held = [first]
        if not self.service.settings.prebuffer:
            return held, False
        hold = Prebuffer.of_text(self.service.rates, sentences)
        bytes_per_second = 2 * self.service.sample_rate
        pcm: bytes | None = first
        while pcm is not None:
            now = time.monotonic()
            hold.add(len(pcm) / bytes_per_second, now, isinstance(pcm, Silence))
            if hold.ready(now):
                break
            if request.transport is None or request.transport.is_closing():
                raise ConnectionError("the client left")
            pcm = await self._next(audio)
            if pcm is not None:
                held.append(pcm)
        hold.release(time.monotonic())
        if summary := hold.summary(time.monotonic()):
            _LOGGER.info("first audio for %s %s", request.remote, summary)
        return held, pcm is None

    async def _next(self, audio: AudioStream) -> bytes | None:
        """The next audio of a stream, None at its end (waited for within AUDIO_WAIT_S)."""
        try:
            return await asyncio.wait_for(audio.__anext__(), AUDIO_WAIT_S)
        except StopAsyncIteration:
            return None
        except asyncio.TimeoutError:
            raise EngineError(f"no audio from the engine within {AUDIO_WAIT_S:.0f} s") from None

    async def _write(self, write: Callable[[bytes], Awaitable[None]], data: bytes) -> None:
        """Writes within the idle timeout: a client that reads nothing for that long is gone."""
        if data:
            await asyncio.wait_for(write(data), self.idle_timeout)

    @staticmethod
    def _sse_writer(response: web.StreamResponse) -> Callable[[bytes], Awaitable[None]]:
        async def write(data: bytes) -> None:
            delta = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            await response.write(_sse(delta))

        return write

    async def voices(self, request: web.Request) -> web.Response:
        await self.service.refresh_voices()
        (program,) = build_info(self.service).tts
        voices = [
            {"id": v.name, "name": v.name, "description": v.description, "languages": v.languages}
            for v in program.voices
        ]
        return web.json_response({"voices": voices, "default": self.service.default_voice})

    async def models(self, request: web.Request) -> web.Response:
        model = {
            "id": MODEL_ID,
            "object": "model",
            "created": 0,
            "owned_by": "kazeia",
            "description": self.service.model_name or "Qwen3-TTS 12 Hz",
        }
        return web.json_response({"object": "list", "data": [model]})

    async def health(self, request: web.Request) -> web.Response:
        """The health check's line; 200 while loading too (a slow first start is not a dead
        service)."""
        await self.service.refresh_voices()
        line = verdict(build_info(self.service))
        status, _, detail = line.partition(": ")
        return web.json_response({"status": status, "detail": detail, "ready": self.service.ready})

    # -- the web page ----------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.Response:
        """index.html; behind Home Assistant's ingress its path prefix is the page's base, so
        that its relative URLs reach this server."""
        html = _web_file("index.html").decode()
        prefix = request.headers.get("X-Ingress-Path", "")
        if prefix and _INGRESS_PATH.fullmatch(prefix):
            html = html.replace("<head>", f'<head>\n<base href="{prefix.rstrip("/")}/">', 1)
        return web.Response(text=html, content_type="text/html", headers=_NO_CACHE)

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _ASSETS:
            raise RequestError(f"no file {quoted(name)}", 404, "not_found")
        return web.Response(body=_web_file(name), content_type=_ASSETS[name], headers=_NO_CACHE)


# A path of this server (never "//host": a base elsewhere).
_INGRESS_PATH = re.compile(r"/(?!/)[A-Za-z0-9_\-./]*")
_ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
_NO_CACHE = {"Cache-Control": "no-cache"}
# Paths open without the API key: the page's files (they hold no data) and the health check.
_OPEN = {"/", "/index.html", "/health", *(f"/{name}" for name in _ASSETS)}


def _loopback(host: str) -> bool:
    """Whether an address to listen on is the loopback's only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_open(path: str) -> bool:
    return path in _OPEN


def _web_file(name: str) -> bytes:
    return (resources.files("wyoming_kazeia") / "web" / name).read_bytes()


def _reset(request: web.Request) -> None:
    """Ends the request's connection at once, by a reset: what the kernel still holds for a
    client that stopped reading is dropped, not sent to it for minutes."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


def build_app(
    service: TtsService, api_key: str | None = None, idle_timeout: float | None = 60.0
) -> web.Application:
    """The aiohttp application of the API and the page."""
    from .http_voices import VoicePage

    api = HttpApi(service, api_key, idle_timeout)
    app = web.Application(
        middlewares=[api.errors, api.same_origin, api.auth], client_max_size=MAX_UPLOAD_BYTES
    )
    app[IDLE_TIMEOUT] = idle_timeout or 0.0
    app.router.add_post("/v1/audio/speech", api.speech)
    app.router.add_get("/v1/audio/voices", api.voices)
    app.router.add_get("/v1/models", api.models)
    app.router.add_get("/health", api.health)
    app.router.add_get("/", api.page)
    app.router.add_get("/index.html", api.page)
    app.router.add_get("/{name:[a-z]+\\.(?:js|css)}", api.asset)
    VoicePage(service).add_routes(app.router)
    return app


def check_http_uri(uri: str) -> None:
    """SettingsError unless `uri` is tcp://HOST:PORT or unix://PATH."""
    try:
        parsed = urlparse(uri)
        port = parsed.port if parsed.scheme == "tcp" else None
    except ValueError as err:
        raise SettingsError(f"invalid --http-uri {uri!r}: {err}") from None
    if parsed.scheme == "tcp" and parsed.hostname and port is not None:
        return
    if parsed.scheme == "unix" and parsed.netloc + parsed.path:
        return
    raise SettingsError(f"invalid --http-uri {uri!r}: use tcp://HOST:PORT or unix://PATH")


async def serve_http(
    service: TtsService,
    uri: str,
    api_key: str | None = None,
    idle_timeout: float | None = 60.0,
    ready: asyncio.Event | None = None,
) -> None:
    """Serves the HTTP API and the page at `uri` until cancelled; `ready` is set once the
    socket listens. SettingsError when it cannot listen there."""
    check_http_uri(uri)
    app = build_app(service, api_key, idle_timeout)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that leaves cancels its handler, and its answer
        access_log=None,
        keepalive_timeout=idle_timeout or 75.0,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    parsed = urlparse(uri)
    site: web.BaseSite
    if parsed.scheme == "tcp":
        site = web.TCPSite(runner, parsed.hostname, parsed.port)
    else:
        site = web.UnixSite(runner, parsed.netloc + parsed.path)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        raise SettingsError(f"cannot listen on --http-uri {uri}: {err.strerror or err}") from None
    where = f"http://{parsed.netloc}/" if parsed.scheme == "tcp" else uri
    _LOGGER.info("HTTP API and web page on %s%s", where, " (API key required)" if api_key else "")
    if parsed.scheme == "tcp" and not api_key and not _loopback(parsed.hostname or ""):
        _LOGGER.warning(
            "the HTTP API on %s takes requests from the network with no API key: anyone who "
            "reaches it can synthesize and change your voices (--http-api-key)",
            where,
        )
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
