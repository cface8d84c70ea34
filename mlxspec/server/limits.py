"""What one client may cost the server: a body's size, the time to send headers or to pause
mid-body, and how many connections are open at once. Bodies are read here, chunk by chunk,
so that an oversized one is refused before it is held in memory."""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass

from ..text import ascii_digits
from .schema import RequestError

MB = 1 << 20
MOST_CONNECTIONS = 1000
# The listening queue, and so the most connections one burst of accepts opens before the
# gate closes the excess (asyncio accepts up to the backlog at a time; uvicorn's default,
# 2048, let one burst past the open-file limit).
BACKLOG = 128
# files besides the connections: the listening socket, the model's files, logs, one burst
RESERVED_FILES = BACKLOG + 64


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 * MB
    header_timeout: float = 10.0  # from connecting (or a keep-alive request's first byte) to its last header
    idle_timeout: float = 30.0  # between requests on a kept-alive connection, and any pause mid-body
    max_connections: int = MOST_CONNECTIONS


def open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_open_file_limit(wanted: int = 4096) -> None:
    """Lift the soft open-file limit toward the hard one (macOS starts shells at 256, which
    leaves a server room for few connections); where that is refused, keep what there is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # macOS may cap below its reported hard limit
            pass


def default_max_connections() -> int:
    """Half the open-file limit, and never more than it leaves beside the reserve (the
    model's files, one burst of accepts), at most 1000."""
    limit = open_file_limit()
    return max(1, min(MOST_CONNECTIONS, limit // 2, limit - RESERVED_FILES))


def most_connections_allowed() -> int:
    return max(1, open_file_limit() - RESERVED_FILES)


async def read_body(request, limits: Limits) -> bytes:
    """The whole body, refused (413) as soon as it is known to be over the limit, and (408)
    when the client pauses longer than the idle timeout."""
    declared = request.headers.get("content-length", "")
    if ascii_digits(declared) and int(declared) > limits.max_body_bytes:
        raise too_large(limits)
    chunks, size = [], 0
    stream = aiter(request.stream())
    while True:
        try:
            async with asyncio.timeout(limits.idle_timeout):
                chunk = await anext(stream)
        except StopAsyncIteration:
            return b"".join(chunks)
        except TimeoutError:
            raise RequestError(
                f"the request body stalled for {limits.idle_timeout:g} s", status=408, code="request_timeout"
            ) from None
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise too_large(limits)
        chunks.append(chunk)


def too_large(limits: Limits) -> RequestError:
    return RequestError(
        f"the request body is over this server's limit of {limits.max_body_bytes} bytes (--max-body-mb)",
        status=413,
        code="request_too_large",
    )
