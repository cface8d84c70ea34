"""Listen, load the pair on the worker thread, read the kept histories, run uvicorn. Ctrl-C or
SIGTERM stops the generation under way at its next round, answers the requests still being
read or tokenized with "shutting down", ends the open streams, saves the history (when kept),
and exits (130 for Ctrl-C, as every command; SIGTERM's own status for SIGTERM)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator

import uvicorn

from ..drafters.history import DEFAULT_NAMESPACE
from ..errors import DamagedHistory, InvalidOption
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
    max_batch: int | None = None,
    cache_options=None,
    history: HistorySettings = HistorySettings(),
    limits: Limits = Limits(),
    log: Callable[[str], None],
) -> None:
    sock = listen(host, port)
    worker = Worker(
        load,
        cache_sessions=cache_sessions,
        cache_options=cache_options,
        history=history,
        max_batch=max_batch,
        log=log,
    )
    try:
        pair = worker.start()
        keys = namespaces(worker.history, api_keys)
        # read now (the worker waits for its first job): /health counts a restarted server's history
        worker.history.preload(list(keys.values()) or [DEFAULT_NAMESPACE])
        offload = Offload()
        app = create_app(worker=worker, pair=pair, defaults=defaults, api_keys=keys, limits=limits, offload=offload)
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

        _Server(config, on_exit=on_exit, on_stopped=worker.close).run(sockets=[sock])
    finally:
        worker.close()
        sock.close()


def namespaces(history, api_keys: tuple[str, ...]) -> dict[str, str]:
    """Each API key's history namespace (a keyed digest, the secret kept with the history)."""
    try:
        return {key: history.namespace_of(key) for key in api_keys}
    except (OSError, DamagedHistory) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InvalidOption(f"cannot keep the history (--history-keep): {reason}") from None


class _Server(uvicorn.Server):
    """uvicorn's Server, stopping the generations first when a signal asks it to exit (its
    graceful shutdown waits for open connections, and a stream ends with its generation),
    and running `on_stopped` (the worker's close, which saves the history) once it has
    stopped serving but before the signal that stopped it is raised again: uvicorn 0.55
    re-raises a captured SIGTERM as it leaves `capture_signals` (uvicorn/server.py), and
    its default action ends the process before any `finally` of ours runs."""

    def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[], None], on_stopped: Callable[[], None]):
        super().__init__(config)
        self._on_exit, self._on_stopped = on_exit, on_stopped

    def handle_exit(self, sig, frame) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._on_stopped()
