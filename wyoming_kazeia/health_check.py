"""Is the service up? A describe -> info round trip (the rhasspy images' Docker healthcheck).

    python -m wyoming_kazeia.health_check [--uri tcp://127.0.0.1:10200] [--timeout 5]

Exit status 0 when the service answers with an installed TTS program (its model is loaded),
1 when it answers but is not ready yet (first start: downloading, converting, loading), 2 when
it does not answer within the timeout. One line on stdout says which.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from wyoming.client import AsyncClient
from wyoming.info import Describe, Info

DEFAULT_URI = "tcp://127.0.0.1:10200"


async def _describe(uri: str) -> Info | None:
    async with AsyncClient.from_uri(uri) as client:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_kazeia.health_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--uri", default=DEFAULT_URI, help=f"the service (default {DEFAULT_URI})")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    args = parser.parse_args(argv)
    info, why = asyncio.run(_probe(args.uri, args.timeout))
    if info is None:
        print(f"unhealthy: {args.uri}: {why or 'no info'}")
        return 2
    ready = [tts for tts in info.tts if tts.installed]
    if not ready:
        what = info.tts[0].description if info.tts else "no TTS program"
        print(f"not ready: {what}")
        return 1
    print(f"healthy: {ready[0].description} ({len(ready[0].voices)} voices)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
