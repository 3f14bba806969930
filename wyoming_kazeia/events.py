"""Reading Wyoming events off a connection with bounds on what a client can make the server
buffer, and checking their fields before wyoming's parsers take them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from wyoming.event import Event

from .errors import ProtocolError, quoted

# Limits of one incoming event. A TTS request carries text only; these bound what a broken or
# hostile client can make the server buffer. The header limit is the stream reader's.
MAX_HEADER_BYTES = 64 * 1024
MAX_DATA_BYTES = 1024 * 1024
MAX_PAYLOAD_BYTES = 1024 * 1024


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event, None at the end of the stream; ProtocolError for malformed input."""
    try:
        line = await reader.readline()
    except ValueError:  # asyncio's LimitOverrunError, as readline raises it
        raise ProtocolError(f"event header longer than {MAX_HEADER_BYTES} bytes") from None
    except ConnectionError:
        return None
    if not line.endswith(b"\n"):  # end of stream, possibly inside a header
        return None
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than JSON allows
        raise ProtocolError("malformed event header: not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("malformed event header: not a JSON object with a 'type'")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise ProtocolError("malformed event: 'data' is not an object")
    _check_unicode(header)
    data_length = _length(header, "data_length", MAX_DATA_BYTES)
    payload_length = _length(header, "payload_length", MAX_PAYLOAD_BYTES)
    try:
        if data_length:
            try:
                extra = json.loads(await reader.readexactly(data_length))
            except (ValueError, RecursionError):
                raise ProtocolError("malformed event data: not JSON") from None
            if not isinstance(extra, dict):
                raise ProtocolError("malformed event data: not a JSON object")
            _check_unicode(extra)
            data.update(extra)
        payload = await reader.readexactly(payload_length) if payload_length else None
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return Event(type=header["type"], data=data, payload=payload)


def _length(header: dict[str, Any], key: str, limit: int) -> int:
    value = header.get(key) or 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"malformed event header: bad {key} {quoted(value)}")
    if value > limit:
        raise ProtocolError(f"event {key} {quoted(value)} exceeds the limit of {limit} bytes")
    return value


def _check_fields(event: Event) -> None:
    """ProtocolError unless a request's fields have their JSON types: wyoming's parsers take
    whatever they are given, and a number or a list where a string belongs would fail later,
    in the engine, or be taken silently."""
    data = event.data
    if event.type in ("synthesize", "synthesize-chunk") and not isinstance(data.get("text"), str):
        raise ProtocolError(f"malformed {event.type} event: 'text' must be a string")
    voice = data.get("voice")
    if voice is None:
        return
    if not isinstance(voice, dict):
        raise ProtocolError(f"malformed {event.type} event: 'voice' must be an object")
    for key in ("name", "speaker", "language"):
        if voice.get(key) is not None and not isinstance(voice[key], str):
            raise ProtocolError(f"malformed {event.type} event: voice '{key}' must be a string")


def _check_unicode(value: Any) -> None:
    """ProtocolError for a JSON value holding text that is not valid Unicode: JSON's \\uD800
    escapes decode to lone surrogates, which no encoder or tokenizer takes (nor wyoming's
    writer, for an echo)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ProtocolError(
                    f"malformed event: text that is not valid Unicode (a lone surrogate in "
                    f"{quoted(item[max(0, err.start - 20) : err.start + 20])})"
                ) from None


def parse_event(kind: Any, event: Event) -> Any:
    """`kind.from_event(event)` (a wyoming message class) once its fields have their JSON types;
    ProtocolError otherwise."""
    _check_fields(event)
    try:
        return kind.from_event(event)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ProtocolError(f"malformed {event.type} event: {quoted(err)}") from None
