"""Listen, load the pair on the worker thread, run uvicorn. Ctrl-C or SIGTERM stops the
generation under way at its next round, answers the requests still being read or tokenized
with "shutting down", ends the open streams, and exits (130 for Ctrl-C, as every command)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from ..errors import InvalidOption
from ..options import Options
from ..tool_calls import tool_line
from .app import create_app, model_id
from .limits import BACKLOG, Limits
from .offload import Offload
from .protocol import Gate, protocol
from .worker import HistorySettings, Worker

LOOPBACK = ("127.0.0.1", "localhost", "::1")
GRACE_SECONDS = 10  # for open connections to end once the generations are stopped


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything loads so that a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as e:
        raise InvalidOption(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve(
    load: Callable[[], object],
    *,
    defaults: Options,
    host: str,
    port: int,
    api_keys: tuple[str, ...],
    cache_sessions: int,
    cache_options=None,
    history: HistorySettings = HistorySettings(),
    limits: Limits = Limits(),
    log: Callable[[str], None],
) -> None:
    sock = listen(host, port)
    worker = Worker(load, cache_sessions=cache_sessions, cache_options=cache_options, history=history, log=log)
    try:
        pair = worker.start()
        offload = Offload()
        app = create_app(worker=worker, pair=pair, defaults=defaults, api_keys=api_keys, limits=limits, offload=offload)
        shown = f"[{host}]" if ":" in host else host
        log(f"serving {pair.description} as {model_id(pair)!r} at http://{shown}:{sock.getsockname()[1]}/v1")
        log(tool_line(pair.tokenizer))
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info",
            lifespan="off",
            http=protocol(Gate(limits)),
            backlog=BACKLOG,  # asyncio listens again with this, and accepts this many at a time
            timeout_keep_alive=limits.idle_timeout,
            timeout_graceful_shutdown=GRACE_SECONDS,
        )

        def on_exit() -> None:
            worker.cancel_all()
            offload.close()

        _Server(config, on_exit=on_exit).run(sockets=[sock])
    finally:
        worker.close()
        sock.close()


class _Server(uvicorn.Server):
    """uvicorn's Server, stopping the generations first when a signal asks it to exit (its
    graceful shutdown waits for open connections, and a stream ends with its generation)."""

    def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[], None]):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)
