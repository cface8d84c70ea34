"""`mlxspec generate PROMPT`: one completion streamed to stdout, statistics on stderr."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ..errors import InvalidOption
from ..options import Options
from .common import err, load
from .options import Models, decoding_options, model_options


@decoding_options
@model_options
def generate(
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The prompt; '-' reads it from standard input.")],
    *,
    models: Models,
    options: Options,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (text, tokens, stats) instead of streaming.")
    ] = False,
):
    """Generate one completion, streaming it to stdout, with statistics on stderr.

    Example: mlxspec generate "Explain KV caches in two sentences." --pair qwen3-14b
    """
    from .. import generation
    from ..events import Done, Round
    from ..views.summary import stats_line

    if prompt == "-":
        if models.shard:
            raise InvalidOption(
                "PROMPT - cannot be read under mlx.launch (it never closes the ranks' input): give the text"
            )
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise InvalidOption("the prompt is empty")
    if models.no_draft:
        options = options.replace(gamma=0)
    pair = load(models, speculative=options.speculative)
    session = generation.Session(pair, cache_options=models.cache_options())
    if as_json:
        result = generation.generate(pair, prompt, options, session=session)
        out = {
            "target": pair.target.name,
            "draft": pair.draft.name if pair.draft else None,
            "prompt_lookup": pair.ngram,
            **result.to_dict(),
        }
        print(json.dumps(out, indent=2))
        if result.finish_reason == "interrupted":
            raise typer.Exit(130)
        return
    done = None
    for event in generation.stream(pair, prompt, options, session=session):
        if isinstance(event, Round):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Done):
            done = event
            sys.stdout.write(event.text)
    sys.stdout.write("\n")
    sys.stdout.flush()
    err.print(stats_line(done.stats), soft_wrap=not err.is_terminal)
    if done.finish_reason == "interrupted":
        raise typer.Exit(130)
