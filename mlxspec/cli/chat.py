"""`mlxspec chat`: a conversation, both models' caches kept between turns."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from ..options import Options
from .common import lenient_stdin, load
from .generate import read_prompt_cache
from .options import Models, PromptCacheOption, decoding_options, grammar_options, model_options


@decoding_options(temp=0.7, top_p=0.95, max_tokens=512)
@model_options
@grammar_options
def chat(
    *,
    models: Models,
    options: Options,
    show_drafts: Annotated[
        bool, typer.Option("--show-drafts", help="Colour each token by its fate (accepted, recovered, bonus).")
    ] = False,
    prompt_cache_file: PromptCacheOption = None,
):
    """Chat with a model, speculative decoding on, caches kept between turns.

    Example: mlxspec chat --pair qwen3-8b --system "Answer briefly."
    """
    from ..chat import Conversation
    from ..views.chat import ChatApp, banner

    try:  # line editing and history for input()
        import readline  # noqa: F401
    except ImportError:  # pragma: no cover
        pass
    lenient_stdin()
    cached = read_prompt_cache(prompt_cache_file, options)
    pair = load(models, speculative=options.speculative, note_bundled=False)  # the banner says it
    console = Console(highlight=False)
    conversation = Conversation(
        pair, options.system, options, cache_options=models.cache_options(), prompt_cache=cached
    )
    console.print(banner(pair, options), soft_wrap=not console.is_terminal)  # piped: lines whole
    if cached:
        console.print(Text(f"(started from {cached.path}: {cached.describe()})", style="dim"))
    raise typer.Exit(ChatApp(conversation, read=input, console=console, show_drafts=show_drafts).run())
