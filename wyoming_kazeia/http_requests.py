"""What every HTTP handler shares: OpenAI's error shape for the KazeiaError family, and a
request's body read within its bounds (size, idle timeout, JSON types)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

from .errors import (
    EngineError,
    InputError,
    KazeiaError,
    NotReadyError,
    ProtocolError,
    RequestError,
    ServiceBusyError,
    SettingsError,
    SlowClientError,
    SsmlError,
    VoiceError,
    quoted,
)

T = TypeVar("T")

MAX_JSON_BYTES = 64 * 1024  # a speech request, a rename: text fields only
MAX_UPLOAD_BYTES = 16 << 20  # a voice's recording: 20 s of 48 kHz stereo float WAV fits

# Each error of the family -> (HTTP status, OpenAI error type, code); the first class of an
# error's MRO found here decides. RequestError carries its own status and code.
ERRORS: dict[type[Exception], tuple[int, str, str]] = {
    VoiceError: (400, "invalid_request_error", "voice_not_found"),
    SsmlError: (400, "invalid_request_error", "invalid_input"),
    InputError: (400, "invalid_request_error", "invalid_input"),
    ProtocolError: (400, "invalid_request_error", "bad_request"),
    SettingsError: (400, "invalid_request_error", "invalid_setting"),
    ServiceBusyError: (503, "server_error", "server_busy"),
    NotReadyError: (503, "server_error", "model_loading"),
    SlowClientError: (408, "invalid_request_error", "client_too_slow"),
    EngineError: (500, "server_error", "synthesis_failed"),
    KazeiaError: (500, "server_error", "server_error"),
}
# Seconds a client is told to wait (Retry-After) before it asks again.
RETRY_AFTER = {ServiceBusyError: 1, NotReadyError: 10}


def error_response(err: Exception) -> web.Response:
    """`err` as OpenAI shapes an error, with its HTTP status (and Retry-After for a 503)."""
    if isinstance(err, RequestError):
        status, kind, code, param = err.status, "invalid_request_error", err.code, err.param
    else:
        status, kind, code = next(
            (ERRORS[k] for k in type(err).__mro__ if k in ERRORS),
            (500, "server_error", "server_error"),
        )
        param = "voice" if isinstance(err, VoiceError) else None
    if status >= 500 and status != 503:
        kind = "server_error"
    headers = {}
    retry = next((s for k, s in RETRY_AFTER.items() if isinstance(err, k)), None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    body = {"error": {"message": str(err), "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


IDLE_TIMEOUT = web.AppKey("idle_timeout", float)  # the server's --idle-timeout (0: none)


async def within_idle_timeout(request: web.Request, reading: Awaitable[T]) -> T:
    """`reading` (of the request's body), given at most the idle timeout: a client that sends
    its body slower than that is refused (408), never waited for forever."""
    timeout = request.app[IDLE_TIMEOUT] or None
    try:
        return await asyncio.wait_for(reading, timeout)
    except asyncio.TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {timeout:.0f} s", 408, "request_timeout"
        ) from None


async def read_json(request: web.Request, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The request's JSON object, read within `limit` bytes and the idle timeout;
    RequestError otherwise."""
    if request.content_length is not None and request.content_length > limit:
        raise RequestError(f"the request body exceeds {limit} bytes", 413, "request_too_large")
    # application/json only: a browser sends another site's form or text/plain body without
    # asking, but JSON only after a CORS preflight, which this server does not allow.
    if request.content_type != "application/json":
        raise RequestError(
            f"the request body must be application/json, not {quoted(request.content_type)}",
            415,
            "unsupported_media_type",
        )

    async def read() -> bytes:
        data = bytearray()
        while len(data) <= limit and (chunk := await request.content.read(limit + 1 - len(data))):
            data += chunk
        return bytes(data)

    raw = await within_idle_timeout(request, read())
    if len(raw) > limit:
        raise RequestError(f"the request body exceeds {limit} bytes", 413, "request_too_large")
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("not an object")
        # Text that is not valid Unicode (JSON's \\ud800: a lone surrogate) fails here.
        json.dumps(body, ensure_ascii=False).encode()
    except (ValueError, RecursionError, UnicodeError) as err:
        raise RequestError(f"the request body is not a JSON object: {err}") from None
    return body


def field(
    body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None
) -> Any:
    """`body[name]` checked for its JSON type (`default` when absent or null)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        what = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RequestError(f"'{name}' must be a {what}, not {quoted(value)}", param=name)
    return value
