"""`mlxspec generate PROMPT`: one completion streamed to stdout, statistics on stderr."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Annotated

import typer
from rich.text import Text

from ..errors import InvalidOption
from ..options import Options
from .common import err, lenient_stdin, load
from .options import Models, PromptCacheOption, decoding_options, grammar_options, model_options


@decoding_options
@model_options
@grammar_options
def generate(
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The prompt; '-' reads it from standard input.")],
    *,
    models: Models,
    options: Options,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (text, tokens, stats) instead of streaming.")
    ] = False,
    prompt_cache_file: PromptCacheOption = None,
):
    """Generate one completion, streaming it to stdout, with statistics on stderr.

    Example: mlxspec generate "Explain KV caches in two sentences." --pair qwen3-14b
    """
    from .. import generation
    from ..decoding.events import Done, Prefill, Round
    from ..drafting.verdict import judge
    from ..models.presets import shown_name
    from ..views.progress import reading, spinner_after
    from ..views.summary import plain_words, stats_line

    if prompt == "-":
        if models.shard:
            raise InvalidOption(
                "PROMPT - cannot be read under mlx.launch (it never closes the ranks' input): give the text"
            )
        lenient_stdin()
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise InvalidOption("the prompt is empty")
    cached = read_prompt_cache(prompt_cache_file, options)
    pair = load(models, speculative=options.speculative)
    session = generation.Session(pair, cache_options=models.cache_options())
    if cached:
        from ..prompt_cache import store as prompt_cache

        prompt_cache.restore(cached, session)
        prompt = prompt_cache.prompt_ids(cached, pair, prompt, think=options.think)
    if as_json:
        result = generation.generate(pair, prompt, options, session=session)
        out = {
            "target": shown_name(pair.target.name),
            "draft": shown_name(pair.draft.name) if pair.draft else None,
            "prompt_lookup": pair.ngram,
            **result.to_dict(),
        }
        if judged := judge(result.stats):  # the verdict the streamed run's lines say
            out["speedup"] = judged.to_dict()
        if calls := parsed_calls(pair, result.text):
            out["tool_calls"] = [call.to_openai() for call in calls]
        print(json.dumps(out, indent=2))
        if result.finish_reason == "interrupted":
            raise typer.Exit(130)
        return
    done, reused = None, None
    events = generation.stream(pair, prompt, options, session=session)
    with spinner_after(err, lambda: reading(None if cached else prompt_tokens(pair, prompt, options))):
        first = next(events)  # the prompt read: a spinner if that takes a while
    for event in itertools.chain([first], events):
        if isinstance(event, Prefill) and cached:
            reused = event.prompt_tokens - event.processed_tokens
        elif isinstance(event, Round):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Done):
            done = event
            sys.stdout.write(event.text)
    sys.stdout.write("\n")
    sys.stdout.flush()
    judged = judge(done.stats)
    lookup = pair.draft is None and pair.ngram
    if words := plain_words(done.stats, judged):  # what the figures below mean, said first (they stay last)
        err.print(Text(words, style="dim"), soft_wrap=not err.is_terminal)
    line = stats_line(done.stats, judged=judged, lookup=lookup, reused=reused, by_position=pair.own_head)
    err.print(line, soft_wrap=not err.is_terminal)
    if done.finish_reason == "interrupted":
        raise typer.Exit(130)


def prompt_tokens(pair, prompt: str, options: Options) -> int:
    """How many tokens the prompt is, as the stream will encode it (for the spinner's words)."""
    from ..generation import encode_prompt

    return len(encode_prompt(pair, prompt, raw=options.raw, system=options.system, think=options.think))


def read_prompt_cache(path: str | None, options: Options):
    """The --prompt-cache file's description, before any model loads; its system prompt is
    the one the prompt follows."""
    if path is None:
        return None
    from ..prompt_cache import store as prompt_cache

    cached = prompt_cache.read(path)
    if options.system is not None and options.system != cached.system:
        raise InvalidOption(f"{path} was made with {'another' if cached.system else 'no'} system prompt: drop --system")
    return cached


def parsed_calls(pair, text: str) -> list:
    """The tool calls in `text`, read as mlx-lm reads the model's format (none if it has none)."""
    from ..tool_calls import split_tool_calls, tool_format

    format = tool_format(pair.tokenizer)
    return split_tool_calls(text, format)[1] if format else []
