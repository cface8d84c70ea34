"""uvicorn's h11 protocol with a header-read timeout and a connection limit, which uvicorn
0.54 lacks: its keep-alive timer only starts after a first response, and `limit_concurrency`
answers 503 only once a request's headers are in, so a socket that never finishes its
headers is held forever and enough of them exhaust the open-file limit.

Here a connection has `header_timeout` seconds from connecting (or, kept alive, from its
next request's first byte) to its last header. At the limit, a new connection closes the
oldest one still waiting for headers (a request being served is never cut); with none
waiting, the new one is closed. A connection lingering over a refused body (below) is already
answered: it is closed before any that waits. So slow or idle sockets cannot crowd out /health or a
client that sends its request at once.

One burst of accepts can run ahead of the reads: a client that connected in the middle of
a flood may have its whole request waiting, unread, in its socket while hundreds of newer
connections arrive. Such a connection is not one to turn away, so before closing the oldest,
the gate looks (without reading) at what it holds, and passes over one whose request head is
complete.

A client that stops reading what it is sent (its socket full, the server's writes paused)
is cut off after the idle timeout.

A request answered before its body's end (413 for its size, 408 for a stall, 401, 404 or
anything else answered unread) has its connection closed: kept alive, uvicorn would read the
rest of the body for as long as the client sends it. Nor is it cut off: closing a socket
with unread bytes makes the kernel reset the connection, and the reset can reach the client
before it has read the answer. So the connection lingers, as nginx's `lingering_close` does:
its write side is shut once the answer is out, what still arrives is read and dropped, and
it closes when the client does, after LINGER_IDLE seconds without a byte, or after
LINGER_MOST seconds in all. A connection closed with bytes still unread (a pipelined request
behind a refused one) lingers the same way.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import Limits

LOOK_AT_MOST = 64  # the oldest waiting connections looked at for one to close
LINGER_IDLE = 2.0  # seconds without a byte of a refused body before its connection closes
LINGER_MOST = 30.0  # seconds a refused body is read and dropped at most


class Gate:
    """What the connections share: the limits, the open ones, those waiting for headers (oldest first)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.open: set[GuardedH11] = set()
        self.waiting: dict[GuardedH11, None] = {}  # insertion order: oldest first
        self.lingering: dict[GuardedH11, None] = {}  # answered, their bodies dropped: oldest first
        self.turned_away = 0  # connections closed for the limit (evicted or refused)

    def admit(self, connection: GuardedH11) -> bool:
        if len(self.open) >= self.limits.max_connections:
            # one already answered goes first: only the rest of a refused body is lost
            evicted = next(iter(self.lingering), None)
            if evicted is None:
                candidates = itertools.islice(self.waiting, LOOK_AT_MOST)
                evicted = next((c for c in candidates if not c.request_arrived()), None)
            if evicted is None:
                self.turned_away += 1
                return False
            self.drop(evicted)
            evicted.close()
            self.turned_away += 1
        self.open.add(connection)
        return True

    def drop(self, connection: GuardedH11) -> None:
        self.open.discard(connection)
        self.waiting.pop(connection, None)
        self.lingering.pop(connection, None)


def protocol(gate: Gate):
    """What uvicorn's `http` setting takes: a factory of connections."""
    return functools.partial(GuardedH11, gate=gate)


class GuardedH11(H11Protocol):
    def __init__(self, *args, gate: Gate, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate
        self.header_timer: asyncio.TimerHandle | None = None
        self.write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.transport = Lingering(
            transport,
            bytes_unread=self._bytes_unread,
            on_linger=lambda: self.gate.lingering.setdefault(self, None),
        )
        if not self.gate.admit(self):
            transport.close()
            return
        self._await_headers(start_timer=True)

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            self.transport.dropped()
            return
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # part of a request line or headers
            self._await_headers(start_timer=True)
        else:
            self._headers_read()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.SEND_BODY:
            # answered before its body's end (401, 404, ...): not kept alive to read the rest
            self._unset_keepalive_if_required()
            self.transport.close()
            return
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            # kept alive: uvicorn's keep-alive timer covers silence, ours starts with a first byte
            self._await_headers(start_timer=False)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.write_timer is None:
            self.write_timer = self.loop.call_later(self.gate.limits.idle_timeout, self.transport.abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._writes_flowing()

    def connection_lost(self, exc) -> None:
        self.transport.cut()
        self._writes_flowing()
        self._headers_read()
        self.gate.drop(self)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        # a body still arriving would hold the graceful shutdown for as long as its client likes
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
            self.close()
            return
        super().shutdown()

    def close(self) -> None:
        self._headers_read()
        self.transport.cut()

    def _bytes_unread(self) -> bool:
        """Whether the client has sent, or is still sending, bytes not read: closing now would
        reset the connection."""
        if self.conn.their_state is h11.SEND_BODY or self.conn.trailing_data[0]:
            return True
        return bool(unread_bytes(self.transport))

    def request_arrived(self) -> bool:
        """Whether a whole request head is here, in h11's buffer and the socket's unread bytes."""
        held = bytes(self.conn.trailing_data[0])
        return b"\r\n\r\n" in held or b"\r\n\r\n" in held[-3:] + unread_bytes(self.transport)

    def _await_headers(self, *, start_timer: bool) -> None:
        self.gate.waiting.setdefault(self, None)
        if start_timer and self.header_timer is None:
            self.header_timer = self.loop.call_later(self.gate.limits.header_timeout, self.close)

    def _writes_flowing(self) -> None:
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def _headers_read(self) -> None:
        self.gate.waiting.pop(self, None)
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None


class Lingering:
    """A connection's transport whose `close`, while the client has sent bytes the server has
    not read (the rest of a body it answered, a pipelined request), shuts the write side and
    lingers (see the module's text); `cut` closes at once. Everything else is the
    transport's own."""

    def __init__(self, transport, *, bytes_unread, on_linger=lambda: None):
        self._transport = transport
        self._bytes_unread = bytes_unread
        self._on_linger = on_linger
        self.lingering = False
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.is_closing() or not self._bytes_unread() or not self._transport.can_write_eof():
            self.cut()
            return
        self.lingering = True
        self._transport.write_eof()  # after the answer still buffered
        self._transport.resume_reading()  # uvicorn pauses reads while a body piles up
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + LINGER_MOST
        self._timer = loop.call_later(LINGER_IDLE, self._expire)
        self._on_linger()

    def dropped(self) -> None:
        """Some of the refused body arrived: the idle clock starts again."""
        self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(min(loop.time() + LINGER_IDLE, self._deadline), self._expire)

    def cut(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.lingering = False
        if not self._transport.is_closing():
            self._transport.close()

    def _expire(self) -> None:
        self._timer = None
        self.cut()


PEEK_BYTES = 16384  # a head longer than this is treated as still arriving


def unread_bytes(transport) -> bytes:
    """The bytes waiting in a connection's socket, peeked at, not taken (asyncio's socket
    wrapper has no recv, so a duplicate of its descriptor peeks)."""
    wrapped = transport.get_extra_info("socket")
    if wrapped is None or transport.is_closing():
        return b""
    try:
        with socket.socket(fileno=os.dup(wrapped.fileno())) as sock:
            return sock.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing there (EAGAIN), or the peer is gone
        return b""
