"""Serving the TTS service over Wyoming: the advertised program and the listening loop."""

from __future__ import annotations

import asyncio
import logging
import sys
from functools import partial
from urllib.parse import urlparse

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncServer, AsyncTcpServer

from . import __version__
from .handler import MAX_HEADER_BYTES, KazeiaEventHandler
from .service import TtsService

_LOGGER = logging.getLogger(__name__)

ATTRIBUTION = Attribution(
    name="Qwen team, Alibaba Cloud", url="https://github.com/QwenLM/Qwen3-TTS"
)


def build_info(service: TtsService) -> Info:
    """What `describe` answers: one TTS program with one voice per speaker and language.

    While the model loads, the program is there but not installed, with no voices, and its
    description says how far the loading is: Home Assistant adds a service only once it has an
    installed program, and a user sees why it is not ready yet."""
    model = service.model_name or "Qwen3-TTS 12 Hz"
    if not service.ready:
        return Info(
            tts=[
                TtsProgram(
                    name="kazeia",
                    description=f"{model} on Kazeia (loading: {service.loading})",
                    attribution=ATTRIBUTION,
                    installed=False,
                    version=__version__,
                    voices=[],
                    supports_synthesize_streaming=True,
                )
            ]
        )
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
    return Info(
        tts=[
            TtsProgram(
                name="kazeia",
                description=f"{model} on Kazeia's native ggml engine (local, streaming)",
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
    zeroconf_name: str | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Serves until cancelled (or, for stdio://, until the input ends). The socket is bound
    before `ready` is set, whether or not the service has its model yet."""
    handler = partial(KazeiaEventHandler, _InfoCache(service), service, samples_per_chunk)
    if urlparse(uri).scheme == "stdio":
        await _serve_stdio(handler, ready)
        return
    server = AsyncServer.from_uri(uri)
    if zeroconf_name is not None:
        await _register_zeroconf(server, zeroconf_name)
    # asyncio's default stream limit (64 KiB) is the handler's MAX_HEADER_BYTES.
    await server.start(handler)
    _LOGGER.info("listening on %s", uri)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


class _InfoCache:
    """`describe`'s answer, rebuilt only when the service says it changed."""

    def __init__(self, service: TtsService) -> None:
        self._service = service
        self._revision = -1
        self._info: Info | None = None

    def __call__(self) -> Info:
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


async def _register_zeroconf(server: AsyncServer, name: str) -> None:
    if not isinstance(server, AsyncTcpServer):
        raise ValueError("--zeroconf needs a tcp:// URI")
    from wyoming.zeroconf import HomeAssistantZeroconf

    zeroconf = HomeAssistantZeroconf(name=name, port=server.port)
    await zeroconf.register_server()
    _LOGGER.info("zeroconf: announced as %s on port %d", name, server.port)
