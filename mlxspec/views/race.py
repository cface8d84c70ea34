"""The race screen: two panels (side by side, or stacked on narrow terminals), live figures,
and a footer with the speedup, what the theory predicts, and whether the outputs agree.
A pure function of the two sides' state and the screen size."""

from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..decoding.plan import NGRAM, TARGET
from ..drafting.verdict import doubtful
from ..measure import sides as model
from .summary import SEPARATOR, PartsLine, alpha_part, counted, position_part, repetition_words
from .tokens import fate_text, legend

NARROW = 100  # columns below which the panels stack


def _figures(side: model.Side) -> str:
    return SEPARATOR.join(_figure_parts(side))


def _figure_parts(side: model.Side) -> list[str]:
    parts = [counted(side.stats.tokens, "token"), f"{side.elapsed:.2f} s"]
    if side.tokens_per_second:
        parts.append(f"{side.tokens_per_second:.1f} tok/s")
    if side.gamma:
        parts.append(counted(side.stats.rounds, "round"))
        parts.append(alpha_part(side.stats))
        if side.stats.tokens_per_round:
            parts.append(f"τ {side.stats.tokens_per_round:.2f}")
        parts.append(gamma_label(side.gamma, side.last))
    return parts


def gamma_label(gamma, last) -> str:
    """γ 4, or for auto the length in force now: γ auto→3, γ auto→0 (plain); n-gram marked."""
    if gamma != "auto":
        label = f"γ {gamma}"
    elif last is None:
        label = "γ auto"
    elif last.source == TARGET:
        label = "γ auto→0 (plain)"
    else:
        label = f"γ auto→{last.gamma}"
    if last is not None and last.source == NGRAM:
        label += " n-gram"
    return label


def short_models(models: str, room: int) -> str:
    """'target + draft + n-gram' in `room` cells: the drafters' names stay whole; a long
    target (a path) keeps its last part, and a last part too long for the room keeps its
    head up to a separator (SmolLM2-135M-…), never the middle of a word."""
    if cell_len(models) <= room:
        return models
    target, *drafters = models.split(" + ")
    joined = "".join(f" + {d}" for d in drafters)
    left = room - cell_len(joined)
    name = target.rstrip("/").rsplit("/", 1)[-1]
    if name != target and cell_len(name) + 2 <= left:
        return f"…/{name}{joined}"
    if cell_len(name) <= left:
        return f"{name}{joined}"
    return f"{_head(name, left - 1)}…{joined}"


SEPARATORS = "-._:"  # where a model name may be cut: Qwen3-14B-…, SmolLM2-135M-…


def _head(name: str, room: int) -> str:
    """The longest start of `name` within `room` cells that ends at a separator (kept)."""
    cuts = [i + 1 for i, char in enumerate(name) if char in SEPARATORS and cell_len(name[: i + 1]) <= room]
    return name[: cuts[-1]] if cuts else ""


def _body(side: model.Side, show_rejected: bool, prompt: str) -> Text:
    """The prompt (dim), then what this side wrote, coloured by fate."""
    return Text.assemble(Text(prompt, style="dim"), fate_text(side.segments, show_rejected=show_rejected))


def _panel(side: model.Side, width: int, height: int | None, show_rejected: bool, prompt: str = "") -> Panel:
    inner = max(width - 4, 10)
    body = _body(side, show_rejected, prompt)
    # the figures go in the bottom border while they fit there, else below the text (wrapped
    # between figures), so that none is cut
    figures = PartsLine(_figure_parts(side))
    below = [] if cell_len(figures.plain) <= width - 6 else figures.lines(inner)
    if height is not None:  # keep the newest lines that fit
        measure = Console(width=inner, file=io.StringIO())
        lines = body.wrap(measure, inner)
        lines = lines[-max(height - 2 - len(below), 1) :]
        body = Text("\n").join(lines)
    if below:
        figure_lines = Text("\n").join(below)
        figure_lines.stylize("dim")
        body = Text.assemble(body, "\n" if body.plain else "", figure_lines)
    title = Text.assemble(
        (side.method.capitalize(), "bold"), f" · {short_models(side.models, width - 6 - len(side.method) - 3)}"
    )
    return Panel(
        body,
        title=title,
        title_align="left",
        subtitle=None if below else Text(figures.plain, style="dim"),
        subtitle_align="left",
        height=height,
        width=width,
    )


PLAIN = "decoded plainly: no draft paid here; same speed as standard"


def speedup_text(standard: model.Side, speculative: model.Side) -> Text:
    """The headline figure, never louder than the run allows: plain decoding said as such,
    a speedup inside the run's noise said to be, with the noise band beside it."""
    now, verdict = model.speedup(standard, speculative), model.verdict(standard, speculative)
    if verdict is None:
        return Text.assemble(("speedup ", "bold"), "–")
    if verdict == "plain":
        return Text(PLAIN, style="yellow")
    noise = model.speedup_noise(standard, speculative)
    band = f" ±{noise:.2f}" if noise is not None else ""
    if verdict == "noise":
        return Text.assemble(
            ("speedup ", "bold"),
            (f"{now:.2f}x{band}", "bold yellow"),
            (": within noise" if noise is not None else ": too few rounds to tell from noise", "yellow"),
        )
    text = Text.assemble(
        ("speedup ", "bold"), (f"{now:.2f}x{band}", "bold green" if verdict == "faster" else "bold red")
    )
    if verdict == "faster" and speculative.stats.lookup_on_repetition:
        text.append(": mostly prompt lookup on a repeating answer", style="yellow")
    return text


def verdict_text(standard: model.Side, speculative: model.Side, *, done: bool) -> Text:
    """At temperature 0: identical so far (live), identical or different (the final frame)."""
    differs = model.identical_so_far(standard, speculative)
    if differs is not None:
        return Text(f"outputs differ at token {differs} ✗", style="bold red")
    if not done:
        return Text("identical so far ✓", style="green")
    same_length = len(standard.tokens) == len(speculative.tokens)
    return Text("outputs identical ✓" if same_length else "identical where both ran ✓", style="green")


def footer(
    standard: model.Side, speculative: model.Side, *, temp: float, show_rejected: bool, done: bool = False
) -> Group:
    lines = [legend(show_rejected)]
    parts = [speedup_text(standard, speculative)]
    predicted = model.predicted_speedup(standard, speculative)
    alpha = speculative.stats.shown_acceptance_rate
    if predicted and alpha is not None:  # a prediction from two or three tries says nothing
        c = model.draft_cost(standard, speculative)
        cost = f", c {c:.2f}" if c is not None else ", prompt lookup: c 0"
        parts.append(
            Text(
                f"predicted {predicted:.2f}x (E[τ]/(γc+1), α {alpha:.2f}{cost}, γ {speculative.effective_gamma:.3g})",
                style="dim",
            )
        )
    if temp == 0:
        parts.append(verdict_text(standard, speculative, done=done))
    lines.append(PartsLine(parts, style=""))
    return Group(*lines)


def why_plain(standard: model.Side, speculative: model.Side) -> str | None:
    """One sentence when `--gamma auto` decoded plainly for most of the race: what it measured."""
    stats = speculative.stats
    if speculative.gamma != "auto" or not stats.rounds or stats.plain_rounds * 2 < stats.rounds:
        return None
    c, alpha = model.draft_cost(standard, speculative), stats.shown_acceptance_rate
    measured = []
    if c is not None:
        measured.append(f"a draft step costs {c:.2f} of a target step")
    if alpha is not None:
        measured.append(f"α {alpha:.2f}")
    elif stats.tested:
        measured.append(f"{stats.accepted} of {counted(stats.tested, 'tested draft')} accepted")
    found = " and ".join(measured) if measured else "what its first rounds measured"
    return (
        f" γ auto decoded plainly for {stats.plain_rounds} of {counted(stats.rounds, 'round')}: {found}, so drafting "
        f"did not pay here (a fixed -g N drafts regardless)."
    )


def looping(speculative: model.Side) -> str:
    """Why a speedup from prompt lookup on a looping answer is not one to expect elsewhere."""
    return f" {repetition_words(speculative.stats)}."


def summary(standard: model.Side, speculative: model.Side, *, temp: float) -> Text:
    """The closing line: the speedup as the run supports it (plain, within noise, faster,
    slower), acceptance, time saved; why auto decoded plainly."""
    now, verdict = model.speedup(standard, speculative), model.verdict(standard, speculative)
    if now is None:
        return Text("No tokens were generated.", style="dim")
    tokens = min(standard.stats.tokens, speculative.stats.tokens)
    saved = tokens / standard.tokens_per_second - tokens / speculative.tokens_per_second
    stats = speculative.stats
    detail = f"{alpha_part(stats)}, τ {stats.tokens_per_round:.2f} tokens per round" if stats.tokens_per_round else ""
    if detail and speculative.by_position and (positions := position_part(stats)):
        detail += f", {positions}"
    noise = model.speedup_noise(standard, speculative)
    band = f"±{noise:.2f}" if noise is not None else ""
    measured = f"noise {band}; " if band else ""
    reason = why_plain(standard, speculative)
    c = model.draft_cost(standard, speculative)
    if verdict == "plain":
        text = Text.assemble(
            ("Speculative decoding ", ""), (PLAIN, "bold yellow"), f" ({now:.2f}x, {counted(stats.rounds, 'round')})."
        )
    elif verdict == "noise":
        why = (
            f"noise {band}: two standard errors of standard decoding's speed over this run"
            if band
            else "too few steps to measure the run's noise"
        )
        text = Text.assemble(
            ("Speculative decoding ran at ", ""),
            (f"{now:.2f}x standard's speed: within noise", "bold yellow"),
            f" ({detail}; {why}). More tokens (-m) or `mlxspec bench` measure it properly.",
        )
    elif verdict == "faster":
        text = Text.assemble(
            ("Speculative decoding was ", ""),
            (f"{now:.2f}x faster", "bold green"),
            f" ({measured}{detail}): {saved:.2f} s saved over {counted(tokens, 'token')}.",
        )
    else:
        why = (
            f" The draft costs {c:.2f} of a target step per token; speculation pays when that is small and α "
            f"high (see `mlxspec bench`)."
            if c and not reason  # auto's own line below says it
            else ""
        )
        text = Text.assemble(
            ("Speculative decoding was ", ""),
            (f"slower here: {now:.2f}x", "bold red"),
            f" ({measured}{detail}).{why}",
        )
    if reason:
        text.append(reason, style="yellow")
    if verdict in ("faster", "noise") and speculative.stats.lookup_on_repetition:
        text.append(looping(speculative), style="yellow")
    predicted = model.predicted_speedup(standard, speculative)
    if verdict in ("faster", "slower") and predicted and doubtful(now / predicted):
        text.append(
            f" The theory predicted {predicted:.2f}x: a gap this wide means the timings are noise (a short run, a "
            "busy machine); more tokens (-m) or `mlxspec bench` measure it properly.",
            style="yellow",
        )
    if temp == 0:
        differs = model.identical_so_far(standard, speculative)
        text.append(
            " Outputs identical." if differs is None else f" Outputs differ at token {differs}!",
            style="green" if differs is None else "bold red",
        )
    return text


def render(
    standard: model.Side,
    speculative: model.Side,
    *,
    width: int,
    height: int | None,
    temp: float,
    show_rejected: bool = False,
    done: bool = False,
    prompt: str = "",
) -> RenderableType:
    """The whole screen. `height` None: panels as tall as their text (final screen, export).
    `prompt`: shown dim at the start of each panel, the completions following it."""
    foot = footer(standard, speculative, temp=temp, show_rejected=show_rejected, done=done)
    parts = [foot]
    if done:
        parts.append(summary(standard, speculative, temp=temp))
    reserved = _lines(Group(*parts), width)
    stacked = width < NARROW
    widths = (width, width) if stacked else (width // 2, width - width // 2)
    # as tall as the longer text (both panels alike), and no taller than the screen allows:
    # a few lines of text take a few lines of the terminal
    natural = 2 + max(
        _body_lines(standard, widths[0], show_rejected, prompt),
        _body_lines(speculative, widths[1], show_rejected, prompt),
    )
    panel_height = natural
    if height is not None:
        room = (height - reserved) // 2 if stacked else height - reserved
        panel_height = min(natural, max(room, 4))
    if stacked:
        panels = [
            _panel(standard, width, panel_height, show_rejected, prompt),
            _panel(speculative, width, panel_height, show_rejected, prompt),
        ]
        return Group(*panels, *parts)
    half = widths[0]
    grid = Table.grid(expand=True)
    grid.add_column(ratio=1)
    grid.add_column(ratio=1)
    grid.add_row(
        _panel(standard, half, panel_height, show_rejected, prompt),
        _panel(speculative, width - half, panel_height, show_rejected, prompt),
    )
    return Group(grid, *parts)


def _body_lines(side: model.Side, width: int, show_rejected: bool, prompt: str = "") -> int:
    """Rows of a panel's body at this panel width: its text, and the figures when they do not
    fit the border."""
    inner = max(width - 4, 10)
    measure = Console(width=inner, file=io.StringIO())
    lines = len(_body(side, show_rejected, prompt).wrap(measure, inner))
    figures = PartsLine(_figure_parts(side))
    return lines + (0 if cell_len(figures.plain) <= width - 6 else len(figures.lines(inner)))


def _lines(renderable, width: int) -> int:
    """Rows a renderable takes at this width (footers wrap on narrow terminals)."""
    measure = Console(width=width, file=io.StringIO())
    return len(measure.render_lines(renderable, measure.options, pad=False))


def plain_summary(standard: model.Side, speculative: model.Side, *, temp: float, prompt: str = "") -> str:
    """For a pipe: the prompt, each side's figures and text, then the summary; no colours."""
    lines = ["prompt:", prompt, ""] if prompt else []
    for side in (standard, speculative):
        lines += [f"{side.method} ({side.models}): {_figures(side)}", side.text, ""]
    lines.append(summary(standard, speculative, temp=temp).plain)
    return "\n".join(lines)


def as_dict(standard: model.Side, speculative: model.Side, *, temp: float) -> dict:
    """The race's outcome, for --json."""
    return {
        "standard": {
            "models": standard.models,
            "text": standard.text,
            "tokens": standard.tokens,
            "seconds": standard.elapsed,
            "stats": standard.stats.to_dict(),
        },
        "speculative": {
            "models": speculative.models,
            "text": speculative.text,
            "tokens": speculative.tokens,
            "seconds": speculative.elapsed,
            "stats": speculative.stats.to_dict(),
        },
        "speedup": model.speedup(standard, speculative),
        "speedup_noise": model.speedup_noise(standard, speculative),  # half-width, two standard errors
        "verdict": model.verdict(standard, speculative),  # plain, noise, faster, slower
        # most accepted drafts from prompt lookup, on an answer that mostly repeats itself
        "lookup_on_repetition": speculative.stats.lookup_on_repetition,
        "predicted_speedup": model.predicted_speedup(standard, speculative),
        "draft_cost": model.draft_cost(standard, speculative),
        "identical": model.identical_so_far(standard, speculative) is None if temp == 0 else None,
    }
