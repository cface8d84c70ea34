"""`mlxspec serve`: an OpenAI-compatible server (chat and text completions, streaming or not)
with speculative decoding, for agents and apps."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.text import Text

from ..errors import InvalidOption
from ..options import Options
from .common import err, load
from .options import Models, decoding_options, model_options


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
    api_key: Annotated[
        Optional[str],
        typer.Option(
            "--api-key",
            metavar="KEY",
            envvar="MLXSPEC_API_KEY",
            help="Require `Authorization: Bearer KEY` on every request.",
            show_default=False,
        ),
    ] = None,
    cache_sessions: Annotated[
        int,
        typer.Option(
            "--cache-sessions",
            metavar="N",
            help="Conversations whose KV caches are kept between requests (least recently used dropped first).",
        ),
    ] = 4,
):
    """Serve the pair over the OpenAI API: /v1/chat/completions, /v1/completions, /v1/models.

    The options set each request's defaults; a request's own fields (temperature, top_p,
    max_tokens, seed, stop, and mlxspec's gamma) override them.

    Example: mlxspec serve --pair qwen3-14b --port 8080
    """
    from ..server import run

    if cache_sessions < 0:
        raise InvalidOption(f"--cache-sessions must be >= 0, got {cache_sessions}")
    if not 0 <= port < 65536:
        raise InvalidOption(f"--port must be from 0 to 65535, got {port}")
    if models.no_draft:
        options = options.replace(gamma=0)
    if not run.is_loopback(host):
        guard = "requests need the API key" if api_key else "no --api-key: anyone who can reach it can use it"
        err.print(Text(f"warning: listening on {host}: other machines can reach this server ({guard})", style="yellow"))
    run.serve(
        # a request may ask for speculative decoding whatever the default: the draft loads unless --no-draft
        lambda: load(models),
        defaults=options,
        host=host,
        port=port,
        api_key=api_key or None,
        cache_sessions=cache_sessions,
        cache_options=models.cache_options(),
        log=lambda line: err.print(Text(line, style="dim"), soft_wrap=True),
    )
