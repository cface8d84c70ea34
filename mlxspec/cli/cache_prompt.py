"""`mlxspec cache-prompt`: read the start of a prompt once and save both models' caches."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..errors import InvalidOption
from ..options import Options
from .common import ConsoleReporter, err, load, writable
from .options import DECODING_OPTIONS, Models, decoding_options, model_options

_KEPT = ("raw", "system")


@decoding_options(exclude=tuple(name for name in DECODING_OPTIONS if name not in _KEPT))
@model_options
def cache_prompt(
    text: Annotated[
        Optional[str],
        typer.Argument(
            metavar="TEXT",
            help="What prompts will start with (a document, instructions); '-' reads standard input. May be "
            "empty with --system.",
            show_default=False,
        ),
    ] = None,
    *,
    models: Models,
    options: Options,
    out: Annotated[
        str, typer.Option("--out", "-o", metavar="FILE.safetensors", help="Where to write the cache (.safetensors).")
    ],
):
    """Read the start of a prompt (a system prompt, a document) into both models' caches and
    save them: generate and chat with --prompt-cache FILE then read only what follows.

    Example: mlxspec cache-prompt --system "$(cat rules.txt)" -o rules.safetensors --pair qwen3-8b
    """
    from .. import generation
    from ..prompt_cache import store as prompt_cache

    if not out.endswith(".safetensors"):  # MLX would write OUT.safetensors beside the name given
        raise InvalidOption(f"--out {out}: a prompt cache is a .safetensors file: give a name ending in .safetensors")
    if text == "-":
        text = sys.stdin.read()
    text = text or ""
    if not text and not options.system:
        raise InvalidOption("give the text prompts start with, or a --system prompt")
    path = writable(out, "the prompt cache")
    pair = load(models)
    session = generation.Session(pair, cache_options=models.cache_options())
    reporter = ConsoleReporter()
    saved = prompt_cache.save(
        path,
        session,
        text,
        system=options.system,
        raw=options.raw,
        progress=lambda done, total: reporter.progress("Reading the text", done, total),
    )
    size = path.stat().st_size / 2**20
    err.print(
        Text(f"cached {saved.describe()} in {path} ({size:.1f} MiB): --prompt-cache {path}", style="dim"),
        soft_wrap=not err.is_terminal,
    )
