"""One race panel's state, a fold over that side's events, and the figures the footer
shows (speedup so far, what the theory predicts, whether both outputs agree). Plain
Python: the race view reads it without MLX."""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import Done, Prefill, Round
from .stats import Stats
from .theory import cost_ratio, predicted_speedup_of

REJECTED = "rejected"


@dataclass
class Side:
    """One panel's state, a fold over that side's events."""

    method: str  # "standard" or "speculative"
    models: str
    gamma: int | str  # or "auto"
    segments: list[tuple[str, str]] = field(default_factory=list)  # (text, fate)
    tokens: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    done: Done | None = None
    last: Round | None = None  # the latest round: its gamma and who proposed
    settle_seconds: float = 0.0  # device work left queued when paused, finished on its clock

    def apply(self, event) -> None:
        if isinstance(event, Prefill):
            self.stats.add_prefill(event)
        elif isinstance(event, Round):
            self.last = event
            self.stats.add_round(event)
            # accepted drafts, then the thrown-away ones where they were cut, then the
            # recovered or bonus token
            for i, (piece, fate) in enumerate(zip(event.pieces, event.fates)):
                if i == event.accepted and event.discarded:
                    self.segments.append((event.discarded, REJECTED))
                if piece:
                    self.segments.append((piece, fate))
            self.tokens += event.emitted
        elif isinstance(event, Done):
            self.done = event
            if event.text:
                self.segments.append((event.text, self.segments[-1][1] if self.segments else "target"))

    @property
    def text(self) -> str:
        """What this side wrote (thrown-away drafts left out)."""
        return "".join(piece for piece, fate in self.segments if fate != REJECTED)

    @property
    def clock(self) -> float:
        """Own compute seconds so far: what the scheduler keeps level."""
        return self.stats.prefill_seconds + self.elapsed

    @property
    def elapsed(self) -> float:
        """Decoding seconds, prompt processing excluded."""
        return self.stats.decode_seconds + self.settle_seconds

    @property
    def tokens_per_second(self) -> float | None:
        return self.stats.tokens / self.elapsed if self.elapsed > 0 else None

    @property
    def draft_step(self) -> float | None:
        return self.stats.draft_step

    @property
    def effective_gamma(self) -> float:
        """The draft length in force: the fixed one, or the mean the controller chose."""
        if isinstance(self.gamma, int):
            return self.gamma
        return self.stats.mean_gamma or 0.0


def speedup(standard: Side, speculative: Side) -> float | None:
    if not standard.tokens_per_second or not speculative.tokens_per_second:
        return None
    return speculative.tokens_per_second / standard.tokens_per_second


def draft_cost(standard: Side, speculative: Side) -> float | None:
    """c: the draft's seconds per proposal over standard decoding's per token (None when
    prompt lookup drafts: it costs nothing worth a figure)."""
    return cost_ratio(speculative.draft_step, 1 / standard.tokens_per_second if standard.tokens_per_second else None)


def predicted_speedup(standard: Side, speculative: Side) -> float | None:
    """E[tau] / (gamma c + 1) from the measured acceptance and the measured cost ratio c."""
    c = draft_cost(standard, speculative)
    if c is None and speculative.stats.ngram_rounds and not speculative.stats.model_rounds:
        c = 0.0
    return predicted_speedup_of(speculative.stats, c=c) if c is not None else None


def identical_so_far(standard: Side, speculative: Side) -> int | None:
    """None when the shorter output is a prefix of the longer, else the first differing index."""
    for i, (a, b) in enumerate(zip(standard.tokens, speculative.tokens)):
        if a != b:
            return i
    return None
