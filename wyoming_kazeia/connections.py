"""The bound on a server's open connections (Connections): the idlest gives its place to a new
one; when every one is busy speaking, the new one is refused."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

_LOGGER = logging.getLogger(__name__)

# How long the connection bound waits for the idlest connection it closed to leave.
CLOSE_WAIT_S = 5.0


class Connection(Protocol):
    """What the bound needs of a connection's handler."""

    peer: str

    @property
    def busy(self) -> bool: ...

    @property
    def writer(self) -> asyncio.StreamWriter: ...


class Connections:
    """The open connections of a server, bounded: at the bound, a new connection takes the
    place of the one idle the longest (a client holding connections open cannot lock others
    out); when every connection is busy speaking, it is refused with `server-busy`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[Connection, float] = {}  # -> when it was last active
        self._left = asyncio.Event()  # set when a connection leaves

    async def room(self) -> None:
        """Returns when one more connection may be accepted: at the bound, once the idlest
        has been closed (its file released), or a connection has left; when every one is busy
        speaking, one more is let in to be refused."""
        while len(self._open) >= self.limit:
            idle = [h for h in self._open if not h.busy]
            if not idle:
                return  # accepted to be told server-busy
            oldest = min(idle, key=self._open.__getitem__)
            _LOGGER.info("connection limit (%d): closing the idlest, %s", self.limit, oldest.peer)
            self._left.clear()
            oldest.writer.close()
            # Its handler leaves once its reader sees the close; if it does not (a transport
            # that never finishes closing), the loop looks again rather than wait forever.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._left.wait(), CLOSE_WAIT_S)

    def enter(self, handler: Connection) -> bool:
        """Counts `handler` in (again: no change); False when the bound leaves no room."""
        if handler in self._open:
            return True
        if len(self._open) >= self.limit:
            return False
        self._open[handler] = time.monotonic()
        return True

    def touch(self, handler: Connection) -> None:
        if handler in self._open:
            self._open[handler] = time.monotonic()

    def leave(self, handler: Connection) -> None:
        if self._open.pop(handler, None) is not None:
            self._left.set()
