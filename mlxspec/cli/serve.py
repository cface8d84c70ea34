"""`mlxspec serve`: an OpenAI-compatible server (chat and text completions, streaming or not)
with speculative decoding, for agents and apps."""

from __future__ import annotations

import math
import os
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..errors import InvalidOption
from ..options import Options
from .common import err, load
from .options import Models, decoding_options, model_options

MOST_MAX_BATCH = 256  # a batch's rows each hold a whole context: past this, memory, not speed

# what the history index takes (drafters/history/index.py): its ring has a marker before each
# document, so a prompt needs two slots, and its chain links are uint32 distances
FEWEST_HISTORY_TOKENS, MOST_HISTORY_TOKENS = 2, 1 << 31


# a completion has no chat template and a chat request brings its own messages: --raw and
# --system mean nothing here
@decoding_options(max_tokens=512, exclude=("raw", "system"))
@model_options
def serve(
    *,
    models: Models,
    options: Options,
    host: Annotated[
        str,
        typer.Option(
            "--host", metavar="ADDRESS", help="Address to listen on; anything but loopback lets other machines in."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="N", help="Port to listen on.")] = 8080,
    api_keys: Annotated[
        Optional[list[str]],
        typer.Option(
            "--api-key",
            metavar="KEY",
            envvar="MLXSPEC_API_KEY",
            help=(
                "Require `Authorization: Bearer KEY` on every request (repeatable: any of the keys; each key's "
                "requests draft from their own history only)."
            ),
            show_default=False,
        ),
    ] = None,
    history_tokens: Annotated[
        int,
        typer.Option(
            "--history-tokens",
            metavar="N",
            help="Ids of earlier prompts and answers kept per API key for drafting, 2 to 2^31 (about 44 bytes each).",
        ),
    ] = 1 << 20,
    history_keep: Annotated[
        bool,
        typer.Option(
            "--history-keep",
            help="Keep the history on disk under mlxspec's cache, so that a restarted server drafts from it.",
        ),
    ] = False,
    cache_sessions: Annotated[
        int,
        typer.Option(
            "--cache-sessions",
            metavar="N",
            help="Conversations whose KV caches are kept between requests (least recently used dropped first).",
        ),
    ] = 4,
    max_batch: Annotated[
        Optional[int],
        typer.Option(
            "--max-batch",
            metavar="N",
            help="Generations at once, their forwards shared, each answer exactly what it is alone (1: one at a "
            "time). Default: what a quarter of the memory holds the KV caches of, at most 8.",
            show_default=False,
        ),
    ] = None,
    max_body_mb: Annotated[
        float, typer.Option("--max-body-mb", metavar="MB", help="Largest request body; a larger one gets a 413.")
    ] = 8,
    header_timeout: Annotated[
        float,
        typer.Option("--header-timeout", metavar="SECONDS", help="Time a connection has to send a request's headers."),
    ] = 10,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            metavar="SECONDS",
            help="Idle time before a kept-alive connection is closed, and the longest pause within a body.",
        ),
    ] = 30,
    max_connections: Annotated[
        Optional[int],
        typer.Option(
            "--max-connections",
            metavar="N",
            help="Open connections at most; past it the oldest still sending headers is closed. "
            "Default: half the open-file limit, at most 1000.",
            show_default=False,
        ),
    ] = None,
):
    """Serve the pair over the OpenAI API: /v1/chat/completions, /v1/completions, /v1/responses,
    /v1/models; and Anthropic's /v1/messages.

    The options set each request's defaults; a request's own fields (temperature, top_p,
    max_tokens, seed, stop, and mlxspec's gamma) override them.

    Example: mlxspec serve --pair qwen3-14b --port 8080
    """
    from ..server import run
    from ..server.worker import HistorySettings

    limits = server_limits(
        max_body_mb=max_body_mb,
        header_timeout=header_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections,
    )
    if not host:
        raise InvalidOption("--host is empty: give an address (127.0.0.1 for this machine alone, 0.0.0.0 for all)")
    if api_keys is not None and any(not key.strip() for key in api_keys):
        raise InvalidOption("--api-key is empty, which would turn authentication off: give a key, or leave it out")
    if not api_keys and os.environ.get("MLXSPEC_API_KEY") == "":  # click reads an empty variable as unset
        raise InvalidOption("MLXSPEC_API_KEY is set but empty, which would turn authentication off: give a key")
    if not FEWEST_HISTORY_TOKENS <= history_tokens <= MOST_HISTORY_TOKENS:
        raise InvalidOption(
            f"--history-tokens must be from {FEWEST_HISTORY_TOKENS} to {MOST_HISTORY_TOKENS}, got {history_tokens}"
        )
    if cache_sessions < 0:
        raise InvalidOption(f"--cache-sessions must be >= 0, got {cache_sessions}")
    if max_batch is not None and not 1 <= max_batch <= MOST_MAX_BATCH:
        raise InvalidOption(f"--max-batch must be from 1 to {MOST_MAX_BATCH}, got {max_batch}")
    if not 0 <= port < 65536:
        raise InvalidOption(f"--port must be from 0 to 65535, got {port}")
    if not run.is_loopback(host):
        guard = "requests need an API key" if api_keys else "no --api-key: anyone who can reach it can use it"
        err.print(Text(f"warning: listening on {host}: other machines can reach this server ({guard})", style="yellow"))
    run.serve(
        # a request may ask for speculative decoding whatever the default: the draft loads unless --no-draft
        lambda: load(models),
        defaults=options,
        host=host,
        port=port,
        api_keys=tuple(api_keys or ()),
        cache_sessions=cache_sessions,
        max_batch=max_batch,
        cache_options=models.cache_options(),
        history=HistorySettings(tokens=history_tokens, keep=history_keep),
        limits=limits,
        log=lambda line: err.print(Text(line, style="dim"), soft_wrap=True),
    )


def server_limits(*, max_body_mb: float, header_timeout: float, idle_timeout: float, max_connections: int | None):
    from ..server.limits import MB, Limits, default_max_connections, most_connections_allowed, raise_open_file_limit

    for name, value in (
        ("--max-body-mb", max_body_mb),
        ("--header-timeout", header_timeout),
        ("--idle-timeout", idle_timeout),
    ):
        if not 0 < value < math.inf:  # NaN refused too; infinity would be no limit at all
            raise InvalidOption(f"{name} must be > 0 and finite, got {value}")
    raise_open_file_limit()
    most = most_connections_allowed()
    if max_connections is not None and not 1 <= max_connections <= most:
        raise InvalidOption(
            f"--max-connections must be from 1 to {most} (what the open-file limit leaves room for), "
            f"got {max_connections}"
        )
    return Limits(
        max_body_bytes=max(1, int(max_body_mb * MB)),
        header_timeout=header_timeout,
        idle_timeout=idle_timeout,
        max_connections=max_connections or default_max_connections(),
    )
