"""One-line summaries of a generation's statistics."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from ..decoding.events import Stats
from ..drafting import verdict as verdicts
from ..drafting.verdict import Judged

SEPARATOR = " · "


def counted(n: int, noun: str) -> str:
    """'1 token', '2 tokens': a count with its noun, singular for one."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def alpha_part(stats: Stats) -> str:
    """'α 0.72', or 'α –' when too few drafts were tested for the rate to mean anything."""
    alpha = stats.shown_acceptance_rate
    return "α –" if alpha is None else f"α {alpha:.2f}"


class PartsLine:
    """Parts joined by a separator (" · ") that wrap only between parts: on a narrow terminal
    a part moves to the next line whole; printed with soft_wrap (a pipe, a file) it is one
    line. Parts are text or styled `Text`."""

    def __init__(self, parts: list[str | Text], style: str = "dim", separator: str = SEPARATOR):
        self.parts = [part if isinstance(part, Text) else Text(part) for part in parts]
        self.style = style
        self.separator = separator

    @property
    def plain(self) -> str:
        return self.separator.join(part.plain for part in self.parts)

    def __str__(self) -> str:
        return self.plain

    def lines(self, width: int) -> list[Text]:
        """The parts packed into lines of at most `width` cells (a longer part alone on one)."""
        lines, line = [], None
        for part in self.parts:
            if line is not None and cell_len(line.plain + self.separator + part.plain) > width:
                lines.append(line)
                line = None
            line = part.copy() if line is None else Text.assemble(line, self.separator, part)
        return lines + ([line] if line is not None else [])

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = [Text(self.separator).join(self.parts)] if options.no_wrap else self.lines(options.max_width)
        text = Text("\n").join(lines)
        text.style = self.style
        # a part wider than the line still wraps (inside itself): better than cut
        yield text


def position_part(stats: Stats) -> str | None:
    """'by position 0.81 0.62 0.40': acceptance at each draft position (a head chained on its
    own outputs: whether chaining pays), or None before two positions were tested."""
    rates = stats.per_position_acceptance
    if sum(1 for r in rates if r is not None) < 2:
        return None
    return "by position " + " ".join("–" if r is None else f"{r:.2f}" for r in rates)


def stats_line(
    stats: Stats,
    *,
    judged: Judged | None = None,
    reused: int | None = None,
    lookup: bool = False,
    by_position: bool = False,
) -> PartsLine:
    """e.g. `64 tokens · 41.3 tok/s · α 0.72 · τ 3.10 · γ 4 · prefill 0.05 s (12 tokens)`.
    `judged`: the run's speedup and verdict (drafting/verdict.judge), its figure shown measured
    or marked as an estimate, and flagged on an answer prompt lookup copied from itself;
    `reused`: prompt tokens the caches already held;
    `lookup`: the pair drafts by prompt lookup alone (no draft model); `by_position`: show
    acceptance by draft position (a model's own MTP head)."""
    parts = [counted(stats.tokens, "token")]
    if stats.tokens_per_second:
        parts.append(f"{stats.tokens_per_second:.1f} tok/s")
    if stats.gamma:
        parts.append(alpha_part(stats))
    if stats.gamma and stats.tokens_per_round:
        parts.append(f"τ {stats.tokens_per_round:.2f}")
    if by_position and stats.gamma and (positions := position_part(stats)):
        parts.append(positions)
    if judged:
        parts.append(speedup_part(judged) + (" on a repeating answer" if stats.lookup_on_repetition else ""))
    if stats.gamma == "auto":
        # the mean is over the drafting rounds: the plain steps, a part of their own, are not in it
        parts.append(
            f"γ auto (mean {stats.mean_gamma:.1f} when drafting)" if stats.mean_gamma is not None else "γ auto"
        )
        if stats.plain_rounds:
            parts.append(counted(stats.plain_rounds, "plain step"))
    else:
        parts.append(f"γ {stats.gamma}" if stats.gamma else "no draft")
    if stats.tree_rounds:
        parts.append(f"trees of {stats.nodes_per_tree:.1f} nodes ({counted(stats.tree_rounds, 'round')})")
    elif stats.chains_only:
        parts.append(f"chains ({stats.chains_only})")
    if lookup and stats.gamma:
        parts.append(f"drafting by prompt lookup ({counted(stats.lookup_rounds, 'round')})")
    elif stats.ngram_rounds:
        parts.append(counted(stats.ngram_rounds, "n-gram round"))
    if stats.history_rounds:
        parts.append(f"{counted(stats.history_rounds, 'round')} from history")
    if stats.early_stops:
        parts.append(counted(stats.early_stops, "early stop"))
    if stats.transfers_per_token:
        parts.append(f"{stats.transfers_per_token:.2f} transfers/token")
    read = counted(stats.prompt_tokens, "token")
    read = f"{stats.prompt_tokens - reused} new of {read}" if reused is not None else read
    parts.append(f"prefill {stats.prefill_seconds:.2f} s ({read})")
    if stats.finish_reason not in (None, "eos", "length", "stop"):
        parts.append(stats.finish_reason)
    return PartsLine(parts)


def speedup_part(judged: Judged) -> str:
    """'1.31x vs its plain steps' (measured in the run) or '≈1.56x est.' (estimated from τ and c)."""
    return f"{judged.speedup:.2f}x vs its plain steps" if judged.measured else f"≈{judged.speedup:.2f}x est."


def how_judged(stats: Stats, judged: Judged) -> str:
    """Where the speedup comes from, in words."""
    if judged.measured:
        return (
            f"measured against the {stats.plain_rounds} of {counted(stats.rounds, 'step')} that were the target's "
            "alone in this run (plain steps: standard decoding inside the run)"
        )
    return (
        "estimated from this run's tokens per pass of the target and its draft cost, not measured against standard "
        "decoding (mlxspec race measures it)"
    )


def repetition_words(stats: Stats) -> str:
    """Why a speedup from prompt lookup on a looping answer is not one to expect elsewhere."""
    return (
        f"{stats.lookup_accepted} of {counted(stats.accepted, 'accepted draft')} came from prompt lookup, copying an "
        f"answer that repeats itself ({stats.repeated_share:.0%} of its tokens repeat what it already wrote): on text "
        "that moves on, expect less"
    )


VERDICT_WORDS = {
    verdicts.PLAIN: "stood aside (no draft accepted)",
    verdicts.FASTER: "helped",
    verdicts.NOISE: "made little difference here",
    verdicts.SLOWER: "did not pay here",
}


def plain_words(stats: Stats, judged: Judged | None) -> str | None:
    """One sentence without symbols after a run: whether drafting paid, by the one rule of
    drafting/verdict.py (`judged`, judge's), or why it cannot tell; None for standard decoding
    (nothing drafted to judge)."""
    if not stats.gamma:
        return None
    aside = ""
    if stats.plain_rounds and not (judged is not None and judged.measured):  # how_judged says it
        aside = f"; {stats.plain_rounds} of {counted(stats.rounds, 'step')} were the target's alone"
        aside += " (auto found drafting did not pay there)"
    looping = f". {repetition_words(stats)}" if stats.lookup_on_repetition else ""
    if judged is not None and judged.verdict == verdicts.PLAIN:
        return (
            f"Speculative decoding stood aside: no draft was accepted, every token a step of the target alone; "
            f"{judged.speedup:.2f}x its speed, {how_judged(stats, judged)}."
        )
    if judged is None:
        if stats.shown_acceptance_rate is None:
            return (
                f"Speculative decoding: too few drafts were tested to tell whether it helped ({stats.tested}); a "
                f"longer run (-m N) tells{aside}."
            )
        return f"Speculative decoding: {measured_words(stats)}{aside}{looping}."
    advice = "; --no-draft runs the target alone" if judged.verdict == verdicts.SLOWER else ""
    return (
        f"Speculative decoding {VERDICT_WORDS[judged.verdict]}: about {judged.speedup:.2f}x the speed of the target "
        f"alone, {how_judged(stats, judged)}; {measured_words(stats)}{aside}{advice}{looping}."
    )


def measured_words(stats: Stats) -> str:
    """Acceptance and tokens per pass in words: a share where enough drafts were tested for
    one (as α is shown), else the counts."""
    passes = f"{stats.tokens_per_round:.1f} tokens per pass of the target"
    if stats.shown_acceptance_rate is not None:
        return f"{stats.shown_acceptance_rate:.0%} of the drafts the target checked were accepted, {passes}"
    return f"{stats.accepted} of the {counted(stats.tested, 'draft')} the target checked accepted, {passes}"
