"""Is the service up? A describe -> info round trip (the rhasspy images' Docker healthcheck).

    python -m wyoming_kazeia.health_check [--uri URI] [--timeout 5]

The URI defaults to the server's own setting, KZTTS_URI (a tcp:// host of 0.0.0.0 or :: is
probed on the loopback), else tcp://127.0.0.1:10200: in the image one variable moves both.

Exit status 0 when the service answers: its model loaded ("healthy: ..."), or still loading
("loading: ..." a first start downloading and converting it: its program's description says
so, see `loading_description`), so that a slow first start is never taken for a dead service
and restarted; 1 when it does not answer within the timeout (Docker's unhealthy; its 2 is
reserved). One line on stdout says which.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from urllib.parse import urlparse

from wyoming.client import AsyncClient
from wyoming.info import Describe, Info, TtsProgram

from .errors import KazeiaError, SettingsError

DEFAULT_URI = "tcp://127.0.0.1:10200"
# How a program's description says that its model is not loaded yet (the server writes it,
# the health check and the tests read it).
LOADING_MARK = " (loading: "


def loading_description(model: str, loading: str) -> str:
    """The description of a program whose model is not ready: what the loading is doing."""
    return f"{model} on Kazeia{LOADING_MARK}{loading})"


def is_loading(program: TtsProgram) -> bool:
    return LOADING_MARK in (program.description or "")


def ready_programs(info: Info) -> list[TtsProgram]:
    """The programs of `info` that are installed with their model loaded."""
    return [tts for tts in info.tts if tts.installed and not is_loading(tts)]


async def _describe(uri: str) -> Info | None:
    try:
        reaching = AsyncClient.from_uri(uri)
    except ValueError as err:  # a scheme it cannot reach, a tcp:// URI without a port
        raise SettingsError(f"invalid --uri ({err}): use tcp://HOST:PORT or unix://PATH") from None
    async with reaching as client:
        await client.write_event(Describe().event())
        while (event := await client.read_event()) is not None:
            if Info.is_type(event.type):
                return Info.from_event(event)
    return None


async def probe(uri: str, timeout: float) -> Info | None:
    """The service's info, or None when it does not answer within `timeout` seconds."""
    info, _ = await _probe(uri, timeout)
    return info


async def _probe(uri: str, timeout: float) -> tuple[Info | None, str]:
    """(info, "") or (None, why there is none)."""
    try:
        return await asyncio.wait_for(_describe(uri), timeout), ""
    except asyncio.TimeoutError:
        return None, f"no answer within {timeout:g} s"
    except OSError as err:
        return None, err.strerror or str(err)


def server_uri() -> str:
    """Where the server listens by its KZTTS_URI, as a client reaches it."""
    uri = os.environ.get("KZTTS_URI") or DEFAULT_URI
    parsed = urlparse(uri)
    if parsed.scheme != "tcp":
        return uri
    port = parsed.port or urlparse(DEFAULT_URI).port
    if parsed.hostname in (None, "", "0.0.0.0"):
        return f"tcp://127.0.0.1:{port}"
    if parsed.hostname == "::":  # an IPv6-only socket
        return f"tcp://[::1]:{port}"
    return uri


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_kazeia.health_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--uri", default=server_uri(), help=f"the service (default: KZTTS_URI, else {DEFAULT_URI})"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    args = parser.parse_args(argv)
    try:
        info, why = asyncio.run(_probe(args.uri, args.timeout))
    except KazeiaError as err:  # one line on stdout, as for every other answer
        print(f"unhealthy: {args.uri}: {err}")
        return 1
    if info is None:
        print(f"unhealthy: {args.uri}: {why or 'no info'}")
        return 1
    print(verdict(info))
    return 0


def verdict(info: Info) -> str:
    """The health check's line for a service that answered: "healthy: ..." once its model is
    loaded, else "loading: ..." (what the start is doing)."""
    ready = ready_programs(info)
    if not ready:
        what = info.tts[0].description if info.tts else "no TTS program"
        return f"loading: {what}"
    return f"healthy: {ready[0].description} ({len(ready[0].voices)} voices)"


if __name__ == "__main__":
    sys.exit(main())
