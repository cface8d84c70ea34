"""One race panel's state, a fold over that side's events, and the figures the footer
shows (speedup so far, what the theory predicts, whether both outputs agree). Plain
Python: the race view reads it without MLX."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..decoding.events import Done, Prefill, Round
from ..drafting.theory import cost_ratio, predicted_speedup_of
from ..drafting.verdict import verdict as decide
from ..stats import Stats, repeated_tokens

REJECTED = "rejected"


@dataclass
class Side:
    """One panel's state, a fold over that side's events."""

    method: str  # "standard" or "speculative"
    models: str
    gamma: int | str  # or "auto"
    by_position: bool = False  # the summary gives acceptance by draft position (a model's own MTP head)
    segments: list[tuple[str, str]] = field(default_factory=list)  # (text, fate)
    tokens: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    done: Done | None = None
    last: Round | None = None  # the latest round: its gamma and who proposed
    settle_seconds: float = 0.0  # device work left queued when paused, finished on its clock
    samples: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) per round, for the noise

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
            self.stats.repeated = repeated_tokens(self.tokens)
            self.samples.append((len(event.emitted), event.seconds))
        elif isinstance(event, Done):
            self.done = event
            if event.text:
                self.segments.append((event.text, self.segments[-1][1] if self.segments else "target"))

    def settle(self, seconds: float) -> None:
        """Device work this side left queued, finished when it was paused: its own time,
        charged to its latest round."""
        self.settle_seconds += seconds
        if self.samples:
            tokens, spent = self.samples[-1]
            self.samples[-1] = (tokens, spent + seconds)

    @property
    def decoded_plainly(self) -> bool:
        """No draft was accepted: every token came from a target step, as in standard decoding."""
        return bool(self.gamma) and self.stats.rounds > 0 and self.stats.accepted == 0

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


# The race's noise, measured from the run itself. Every standard step does the same work, so
# the spread of its speed is the machine's own wobble: its steps cut into consecutive blocks
# (batch means, so that slow spells lasting several steps count as such), a speed per block,
# the standard error of their mean. The speculative side shares the machine in alternating
# slices of about the same total time, so it is taken to wobble as much; its rounds cannot
# measure it themselves (their work differs with what is accepted). The speedup, a ratio of
# the two, carries both errors: sqrt(2) times one.
NOISE_BLOCKS = 8  # at most; fewer for a short run, one step per block at least
MIN_NOISE_BLOCKS = 4  # below this the spread is not worth a figure
NOISE_SIGMAS = 2.0  # the band: two standard errors (about 95% for a normal error)


def relative_error(side: Side) -> float | None:
    """The standard error of log(tokens per second) over the run, from its block speeds."""
    samples = side.samples
    blocks = min(NOISE_BLOCKS, len(samples))
    if blocks < MIN_NOISE_BLOCKS:
        return None
    rates = []
    for b in range(blocks):
        chunk = samples[b * len(samples) // blocks : (b + 1) * len(samples) // blocks]
        tokens, seconds = sum(t for t, _ in chunk), sum(s for _, s in chunk)
        if tokens <= 0 or seconds <= 0:
            return None
        rates.append(math.log(tokens / seconds))
    return statistics.stdev(rates) / math.sqrt(blocks)


def speedup_noise(standard: Side, speculative: Side) -> float | None:
    """Half-width of the speedup's noise band: NOISE_SIGMAS standard errors of the ratio,
    from standard decoding's block speeds; None when it ran too few steps to measure it."""
    now, error = speedup(standard, speculative), relative_error(standard)
    if now is None or error is None:
        return None
    return now * NOISE_SIGMAS * math.sqrt(2) * error


def verdict(standard: Side, speculative: Side) -> str | None:
    """What the speedup means: "plain" (no draft accepted: nothing to credit; drafts that
    all failed and measurably cost time are "slower"), "noise" (within the run's own noise,
    or too short to tell), "faster" or "slower"; None before both sides have a speed."""
    now, noise = speedup(standard, speculative), speedup_noise(standard, speculative)
    return decide(now, band=noise, accepted=not speculative.decoded_plainly)


def draft_cost(standard: Side, speculative: Side) -> float | None:
    """c: the draft's seconds per proposal over standard decoding's per token (None when
    prompt lookup drafts: it costs nothing worth a figure)."""
    return cost_ratio(speculative.draft_step, 1 / standard.tokens_per_second if standard.tokens_per_second else None)


def predicted_speedup(standard: Side, speculative: Side) -> float | None:
    """E[tau] / (gamma c + 1) from the measured acceptance and the measured cost ratio c."""
    c = draft_cost(standard, speculative)
    if c is None and speculative.stats.lookup_rounds and not speculative.stats.model_rounds:
        c = 0.0
    return predicted_speedup_of(speculative.stats, c=c) if c is not None else None


def identical_so_far(standard: Side, speculative: Side) -> int | None:
    """None when the shorter output is a prefix of the longer, else the first differing index."""
    for i, (a, b) in enumerate(zip(standard.tokens, speculative.tokens)):
        if a != b:
            return i
    return None
