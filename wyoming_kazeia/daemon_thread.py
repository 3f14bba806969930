"""Blocking work awaited from the event loop in a daemon thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[[], T]) -> T:
    """fn() in a daemon thread of its own: blocking work (a download, a model load, a look at
    the library on a stuck disk) that must never keep the process from ending, as a thread
    of asyncio's executor would at the end of asyncio.run."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def work() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(), None)
        except BaseException as err:  # noqa: BLE001 - delivered to the awaiting task
            outcome = (None, err)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: no one waits
            loop.call_soon_threadsafe(_settle, future, *outcome)

    threading.Thread(target=work, name="kazeia-load", daemon=True).start()
    return await future


def _settle(future: asyncio.Future[Any], result: Any, err: BaseException | None) -> None:
    if future.done():
        return
    if err is not None:
        future.set_exception(err)
    else:
        future.set_result(result)
