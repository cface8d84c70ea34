"""One thread for a request's CPU-heavy steps (chat templating, tokenizing), so that the event
loop keeps answering /health and every other client meanwhile (the tokenizers release the
GIL as they go).

A daemon thread of its own rather than asyncio's or anyio's pools: those are joined when the
process exits, so a shutdown would wait for a long tokenization to end. `close` answers every
waiting request with "shutting down" at once; a tokenization under way is abandoned.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

from .schema import RequestError


def shutting_down() -> RequestError:
    return RequestError("the server is shutting down", status=503, kind="server_error")


class Offload:
    def __init__(self):
        self._calls: queue.Queue = queue.Queue()
        self._waiting: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()
        self._closed = False
        threading.Thread(target=self._run, name="mlxspec-tokenize", daemon=True).start()

    async def run(self, fn: Callable, /, *args, **kwargs):
        """`fn(*args, **kwargs)` on the thread; its result, or what it raised."""
        if self._closed:
            raise shutting_down()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        entry = (loop, future)
        self._waiting.add(entry)
        self._calls.put((fn, args, kwargs, loop, future))
        try:
            return await future
        finally:
            self._waiting.discard(entry)

    def close(self) -> None:
        """From any thread (a signal handler included): every waiting call gets 'shutting down'."""
        self._closed = True
        for loop, future in list(self._waiting):
            _settle(loop, future, error=shutting_down())

    def _run(self) -> None:
        while True:
            fn, args, kwargs, loop, future = self._calls.get()
            if future.done() or self._closed:  # its client left, or the server is stopping
                continue
            try:
                _settle(loop, future, value=fn(*args, **kwargs))
            except Exception as e:
                _settle(loop, future, error=e)


def _settle(loop, future, *, value=None, error: BaseException | None = None) -> None:
    def settle():
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass
