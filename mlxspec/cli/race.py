"""`mlxspec race`: standard and speculative decoding side by side, live."""

from __future__ import annotations

import io
import json
import time
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..errors import InvalidOption
from ..options import Options
from .common import err, load, writable, write_text
from .options import Models, decoding_options, model_options

DEFAULT_CHAT_PROMPT = "Explain how a hash map works, with a short example in Python."
# For code models (the bundled toy pair among them): a stub the toy continues plausibly for a
# few lines at temperature 0 (it repeats itself after that).
DEFAULT_CODE_PROMPT = (
    'def copy_file(source, target):\n    """Copy the file source to target."""\n    with open(source, "rb") as src:'
)
REFRESH = 1 / 15  # seconds between frames


@decoding_options(max_tokens=200, exclude=("gamma",))
@model_options
def race(
    prompt_arg: Annotated[
        Optional[str],
        typer.Argument(
            metavar="PROMPT",
            help="The prompt (or --prompt). Default: a short explanation request, or a code stub for code models.",
            show_default=False,
        ),
    ] = None,
    *,
    models: Models,
    options: Options,
    gamma: Annotated[
        Optional[str],
        typer.Option(
            "--gamma",
            "-g",
            metavar="N|auto",
            help=(
                "Draft tokens per round. Default: the pair's recommended length (a preset's gamma, else 4), so that "
                "the race shows drafting; 'auto' chooses each round's from what the run measures, plain decoding "
                "included."
            ),
            show_default=False,
        ),
    ] = None,
    prompt_opt: Annotated[
        Optional[str], typer.Option("--prompt", metavar="TEXT", help="The prompt.", show_default=False)
    ] = None,
    show_rejected: Annotated[
        bool, typer.Option("--show-rejected", help="Show thrown-away draft tokens, struck through.")
    ] = False,
    svg: Annotated[
        Optional[str], typer.Option("--svg", metavar="FILE", help="Save the final screen as SVG.", show_default=False)
    ] = None,
    html: Annotated[
        Optional[str], typer.Option("--html", metavar="FILE", help="Save the final screen as HTML.", show_default=False)
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the race's outcome (both texts, statistics, speedup) as one JSON object."),
    ] = False,
):
    """Standard vs speculative decoding, side by side, live: same prompt, same target.

    Example: mlxspec race "What is the difference between a list and a tuple in Python?" --pair smollm2
    """
    from ..measure import race as racing
    from ..views import race as view
    from ..views.progress import reading, spinner_after
    from .generate import prompt_tokens

    if gamma is not None:
        options = options.replace(gamma=gamma)
    if models.no_draft or options.gamma == 0:
        raise InvalidOption(
            "race compares standard decoding against speculative decoding: give it a draft (or --draft ngram) "
            "and --gamma >= 1 or auto"
        )
    outputs = {kind: writable(path, kind.upper()) for kind, path in (("svg", svg), ("html", html))}
    pair = load(models)
    if pair.draft is None and not pair.ngram:
        raise InvalidOption("race needs a draft model (or --draft ngram)")
    if gamma is None:  # measured: auto decodes plainly through a short race on the bundled pair
        options = options.replace(gamma=pair.gamma_hint)
    prompt = (
        prompt_opt or prompt_arg or (DEFAULT_CHAT_PROMPT if pair.templated and not options.raw else DEFAULT_CODE_PROMPT)
    )
    temp = options.sampling.temp
    # shown before the completions: a raw prompt is continued as it is, a chat message answered below it
    shown_prompt = prompt + "\n\n" if pair.templated and not options.raw else prompt
    console = Console()
    live = console.is_terminal and not as_json
    state, interrupted = None, False

    def screen(state, done: bool):
        # live, one line short of the terminal (a frame of exactly its height scrolls by a
        # line); the final screen as tall as the texts, left in the scrollback whole
        return view.render(
            *state,
            width=console.width,
            height=None if done else console.height - 1,
            temp=temp,
            show_rejected=show_rejected,
            done=done,
            prompt=shown_prompt,
        )

    states = racing.race(pair, prompt, options, cache_options=models.cache_options())
    try:
        # the warm-up and the first prompt read come before the first state: a spinner if long
        with spinner_after(err, lambda: reading(prompt_tokens(pair, prompt, options), warming_up=True)):
            state = next(states, None)
        if live and state is not None:
            from rich.live import Live

            with Live(screen(state, False), console=console, auto_refresh=False, transient=True) as frame:
                shown = time.monotonic()
                for latest in states:
                    state = latest
                    if time.monotonic() - shown > REFRESH:
                        frame.update(screen(state, False), refresh=True)
                        shown = time.monotonic()
        else:
            for latest in states:
                state = latest
    except KeyboardInterrupt:
        interrupted = True
    if state is None:
        raise typer.Exit(130 if interrupted else 1)
    if as_json:
        print(json.dumps(view.as_dict(*state, temp=temp), indent=2))
    elif live:
        console.print(screen(state, True))
    else:
        print(view.plain_summary(*state, temp=temp, prompt=prompt))
    for kind, path in outputs.items():
        if path:
            record = Console(
                record=True, width=max(console.width, 120) if console.is_terminal else 140, file=io.StringIO()
            )
            record.print(
                view.render(
                    *state,
                    width=record.width,
                    height=None,
                    temp=temp,
                    show_rejected=show_rejected,
                    done=True,
                    prompt=shown_prompt,
                )
            )
            text = record.export_svg(title="mlxspec race") if kind == "svg" else record.export_html()
            write_text(path, text, kind.upper())
    if interrupted:
        raise typer.Exit(130)
