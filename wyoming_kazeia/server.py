"""Serving the TTS service over Wyoming: the advertised program and the listening loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import urlparse

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncServer, AsyncTcpServer

from . import __version__
from .connections import Connections
from .events import MAX_HEADER_BYTES
from .handler import KazeiaEventHandler
from .health_check import loading_description
from .service import TtsService
from .voices import DEFAULT_SPEAKER, LANGUAGE_CODES, language_code_of

_LOGGER = logging.getLogger(__name__)

ATTRIBUTION = Attribution(
    name="Qwen team, Alibaba Cloud", url="https://github.com/QwenLM/Qwen3-TTS"
)


def build_info(service: TtsService) -> Info:
    """What `describe` answers: one TTS program with one voice per speaker and language.

    While the model loads (a first start downloads and converts it: minutes), the program is
    already installed, with one voice, the configured default (in its language, or in every
    one), and its description says how far the loading is (`loading_description`); a model
    without that voice (a Base model's) drops it once loaded: Home Assistant adds a service only
    when it has an installed program and makes its TTS entity only when there is a voice, once,
    at setup; later it rebuilds the voices from its describe poll. So a service added during a
    first start gets its entity at once and the model's voices at the first poll after ready,
    and a synthesis until then is refused with `model-loading`."""
    model = service.model_name or "Qwen3-TTS 12 Hz"
    if not service.ready:
        voice = (service.default_voice or DEFAULT_SPEAKER).strip().lower()
        code = language_code_of(voice)
        waiting = TtsVoice(
            name=voice,
            description=f"{voice.replace('_', ' ').title()} (the model is loading)",
            attribution=ATTRIBUTION,
            installed=True,
            version=None,
            languages=[code] if code else list(LANGUAGE_CODES.values()),
        )
        return _info(loading_description(model, service.loading), [waiting])
    voices = [
        TtsVoice(
            name=voice.name,
            description=voice.description,
            attribution=ATTRIBUTION,
            installed=True,
            version=None,
            languages=list(voice.codes),
        )
        for voice in service.voices.voices
    ]
    return _info(f"{model} on Kazeia's native ggml engine (local, streaming)", voices)


def _info(description: str, voices: list[TtsVoice]) -> Info:
    return Info(
        tts=[
            TtsProgram(
                name="kazeia",
                description=description,
                attribution=ATTRIBUTION,
                installed=True,
                version=__version__,
                voices=voices,
                supports_synthesize_streaming=True,
            )
        ]
    )


async def serve(
    service: TtsService,
    uri: str,
    samples_per_chunk: int = 1024,
    announce: Callable[[int], Awaitable[None]] | None = None,
    ready: asyncio.Event | None = None,
    max_connections: int = 64,
    idle_timeout: float | None = 60.0,
) -> None:
    """Serves until cancelled (or, for stdio://, until the input ends). The socket is bound
    before `ready` is set, whether or not the service has its model yet. `announce(port)`
    (the zeroconf announcement) is awaited once the socket accepts connections, so that a
    client that discovers the service can describe it at once. At most `max_connections` are
    open at once; one idle for `idle_timeout` seconds is closed."""
    handler = partial(KazeiaEventHandler, _InfoCache(service), service, samples_per_chunk)
    if urlparse(uri).scheme == "stdio":
        await _serve_stdio(handler, ready)
        return
    handler = partial(handler, connections=Connections(max_connections), idle_timeout=idle_timeout)
    server = AsyncServer.from_uri(uri)
    connections = Connections(_affordable(max_connections))
    handler = partial(handler, connections=connections)
    if isinstance(server, AsyncTcpServer):
        server = _TcpServer(server.host, server.port, connections)
    # asyncio's default stream limit (64 KiB) is the handler's MAX_HEADER_BYTES.
    await server.start(handler)
    _LOGGER.info("listening on %s", uri)
    if announce is not None and isinstance(server, AsyncTcpServer):
        try:
            await announce(server.port)
        except OSError as err:  # no multicast route, say: the service serves all the same
            _LOGGER.warning("the announcement failed (%s): add the service by hand", err)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def _same(protocol: asyncio.StreamReaderProtocol) -> asyncio.StreamReaderProtocol:
    return protocol


def _affordable(limit: int) -> int:
    """`limit`, lowered to what the open-file limit leaves for connections (the engine, its
    subprocess and the accept loop keep a reserve)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        in_use = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return limit
    if soft == resource.RLIM_INFINITY:
        return limit
    affordable = max(1, soft - in_use - _FILE_RESERVE)
    if affordable < limit:
        _LOGGER.warning(
            "the open-file limit (%d, %d in use) allows %d connections, not %d",
            soft,
            in_use,
            affordable,
            limit,
        )
    return min(limit, affordable)


_FILE_RESERVE = 32  # files kept for the engine (decoder subprocess, temp files) and accepting


class _TcpServer(AsyncTcpServer):
    """wyoming's TCP server with an accept loop of its own: one connection at a time, each
    only when the connection bound (`Connections`) has made room for it, so that a burst of
    connections waits in the kernel's queue instead of exhausting the process's files (the
    stock loop accepts up to 100 at once and logs an error each time a file is lacking)."""

    def __init__(self, host: str, port: int, connections: Connections) -> None:
        super().__init__(host, port)
        self.connections = connections
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    async def start(self, handler_factory: Any) -> None:
        self._listener = socket.create_server((self.host, self.port), backlog=1024)
        self._listener.setblocking(False)
        self._accepting = asyncio.create_task(self._accept(handler_factory), name="kazeia accept")

    async def _accept(self, handler_factory: Any) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        lacking = 0.0  # when files were last found lacking (logged once a minute at most)
        while True:
            await self.connections.room()
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError as err:  # EMFILE, ENFILE, ENOBUFS: wait for files to come back
                if time.monotonic() - lacking > 60:
                    _LOGGER.warning("cannot accept a connection now: %s", err)
                lacking = time.monotonic()
                await asyncio.sleep(0.1)
                continue
            reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(partial(_same, protocol), conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            handler = handler_factory(reader, writer)
            self.connections.enter(handler)  # counted now: the next room() sees it
            task = asyncio.create_task(handler.run(), name="wyoming event handler")
            self._handlers[task] = handler
            task.add_done_callback(lambda done: self._handlers.pop(done, None))

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        await super().stop()
        # Each handler is cancelled (it may be in the middle of an event: splitting a long
        # text) and cancels what it runs.
        for task in self._handlers:
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)


class _InfoCache:
    """`describe`'s answer, rebuilt only when the service says it changed."""

    def __init__(self, service: TtsService) -> None:
        self._service = service
        self._revision = -1
        self._info: Info | None = None

    async def __call__(self) -> Info:
        await self._service.refresh_voices()  # voices added to the library meanwhile
        if self._info is None or self._revision != self._service.revision:
            self._revision = self._service.revision
            self._info = build_info(self._service)
        return self._info


async def _serve_stdio(handler: partial[KazeiaEventHandler], ready: asyncio.Event | None) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    if ready is not None:
        ready.set()
    # Requests piped in and then end-of-input: every answer is still written.
    await handler(reader, writer, finish_on_eof=True).run()


async def announce_zeroconf(name: str, port: int) -> None:
    """Announces the service over mDNS as Home Assistant's zeroconf discovery looks for it
    (_wyoming._tcp), on this host's address toward the multicast group."""
    from wyoming.zeroconf import HomeAssistantZeroconf

    zeroconf = HomeAssistantZeroconf(name=name, port=port)
    await zeroconf.register_server()
    _LOGGER.info("zeroconf: announced as %s on port %d", name, port)
