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

from .. import sides as model
from .bench import doubtful
from .summary import SEPARATOR, PartsLine
from .tokens import fate_text, legend

NARROW = 100  # columns below which the panels stack


def _figures(side: model.Side) -> str:
    return SEPARATOR.join(_figure_parts(side))


def _figure_parts(side: model.Side) -> list[str]:
    parts = [f"{side.stats.tokens} tokens", f"{side.elapsed:.2f} s"]
    if side.tokens_per_second:
        parts.append(f"{side.tokens_per_second:.1f} tok/s")
    if side.gamma:
        parts.append(f"{side.stats.rounds} rounds")
        if side.stats.acceptance_rate is not None:
            parts.append(f"α {side.stats.acceptance_rate:.2f}")
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
    elif last.source == "target":
        label = "γ auto→0 (plain)"
    else:
        label = f"γ auto→{last.gamma}"
    if last is not None and last.source == "ngram":
        label += " n-gram"
    return label


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
    title = Text.assemble((side.method.capitalize(), "bold"), f" · {side.models}")
    return Panel(
        body,
        title=title,
        title_align="left",
        subtitle=None if below else Text(figures.plain, style="dim"),
        subtitle_align="left",
        height=height,
        width=width,
    )


def footer(standard: model.Side, speculative: model.Side, *, temp: float, show_rejected: bool) -> Group:
    lines = [legend(show_rejected)]
    now = model.speedup(standard, speculative)
    predicted = model.predicted_speedup(standard, speculative)
    parts = [
        Text.assemble(
            ("speedup ", "bold"), (f"{now:.2f}x" if now else "–", "bold green" if now and now >= 1 else "bold red")
        )
    ]
    if predicted:
        c = model.draft_cost(standard, speculative)
        cost = f", c {c:.2f}" if c is not None else ", prompt lookup: c 0"
        parts.append(
            Text(
                f"predicted {predicted:.2f}x (E[τ]/(γc+1), α {speculative.stats.acceptance_rate:.2f}{cost}, γ "
                f"{speculative.effective_gamma:.3g})",
                style="dim",
            )
        )
    if temp == 0:
        differs = model.identical_so_far(standard, speculative)
        parts.append(
            Text("identical so far ✓", style="green")
            if differs is None
            else Text(f"outputs differ at token {differs} ✗", style="bold red")
        )
    lines.append(PartsLine(parts, style=""))
    return Group(*lines)


def summary(standard: model.Side, speculative: model.Side, *, temp: float) -> Text:
    """The closing line: speedup, acceptance, time saved; a slowdown said plainly."""
    now = model.speedup(standard, speculative)
    if now is None:
        return Text("No tokens were generated.", style="dim")
    tokens = min(standard.stats.tokens, speculative.stats.tokens)
    saved = tokens / standard.tokens_per_second - tokens / speculative.tokens_per_second
    alpha = speculative.stats.acceptance_rate
    detail = f"α {alpha:.2f}, τ {speculative.stats.tokens_per_round:.2f} tokens per round" if alpha is not None else ""
    if now >= 1:
        text = Text.assemble(
            ("Speculative decoding was ", ""),
            (f"{now:.2f}x faster", "bold green"),
            f" ({detail}): {saved:.2f} s saved over {tokens} tokens.",
        )
    else:
        c = model.draft_cost(standard, speculative)
        why = (
            f" The draft costs {c:.2f} of a target step per token; speculation pays when that is small and α "
            f"high (see `mlxspec bench`)."
            if c
            else ""
        )
        text = Text.assemble(
            ("Speculative decoding was ", ""), (f"slower here: {now:.2f}x", "bold red"), f" ({detail}).{why}"
        )
    predicted = model.predicted_speedup(standard, speculative)
    if predicted and doubtful(now / predicted):
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
    foot = footer(standard, speculative, temp=temp, show_rejected=show_rejected)
    parts = [foot]
    if done:
        parts.append(summary(standard, speculative, temp=temp))
    reserved = _lines(Group(*parts), width)
    stacked = width < NARROW
    if stacked:
        panel_height = None if height is None else max((height - reserved) // 2, 4)
        panels = [
            _panel(standard, width, panel_height, show_rejected, prompt),
            _panel(speculative, width, panel_height, show_rejected, prompt),
        ]
        return Group(*panels, *parts)
    half = width // 2
    panel_height = None if height is None else max(height - reserved, 4)
    if panel_height is None:  # equal heights, as tall as the longer text
        panel_height = max(
            _body_lines(standard, half, show_rejected, prompt),
            _body_lines(speculative, width - half, show_rejected, prompt),
        )
        panel_height += 2
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
        "predicted_speedup": model.predicted_speedup(standard, speculative),
        "draft_cost": model.draft_cost(standard, speculative),
        "identical": model.identical_so_far(standard, speculative) is None if temp == 0 else None,
    }
