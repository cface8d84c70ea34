"""Standard and speculative decoding side by side, each on its own clock.

Both sides share one device, so running them at once would slow each by the other. Instead
the two generators take turns, and the one whose own compute time is behind goes next. A
side's clock is the seconds its rounds report, plus, when it is paused, the time to finish
the device work it left queued (standard decoding queues its next step before yielding, as
it does alone). Turns last a short slice of a side's own time rather than one round, so
that pipelining survives as it would running alone. Each clock then reads as if that side
ran alone, and the panels show what each method had produced after the same own time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx

from .events import Done, Prefill, Round, StatsCollector
from .generation import stream
from .pairs import Pair
from .theory import predicted_speedup_mean, run_shape

REJECTED = "rejected"


@dataclass
class Side:
    """One panel's state, a fold over that side's events."""

    method: str  # "standard" or "speculative"
    models: str
    gamma: int | str  # or "auto"
    segments: list[tuple[str, str]] = field(default_factory=list)  # (text, fate)
    tokens: list[int] = field(default_factory=list)
    stats: StatsCollector = field(default_factory=StatsCollector)
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
        return self.stats.draft_seconds / self.stats.drafted if self.stats.drafted else None

    @property
    def effective_gamma(self) -> float:
        """The draft length in force: the fixed one, or the mean the controller chose."""
        if isinstance(self.gamma, int):
            return self.gamma
        return self.stats.drafted / self.stats.rounds if self.stats.rounds else 0.0


def speedup(standard: Side, speculative: Side) -> float | None:
    if not standard.tokens_per_second or not speculative.tokens_per_second:
        return None
    return speculative.tokens_per_second / standard.tokens_per_second


def predicted_speedup(standard: Side, speculative: Side) -> float | None:
    """E[tau] / (gamma c + 1) from the measured acceptance and the measured cost ratio c
    (the draft's seconds per drafted token over the target's per standard token)."""
    stats = speculative.stats
    if stats.acceptance_rate is None or not standard.tokens_per_second or speculative.draft_step is None:
        return None
    fixed = speculative.gamma if isinstance(speculative.gamma, int) else None
    gamma, plain_share = run_shape(stats.drafted, stats.rounds, stats.plain_rounds, fixed)
    c = speculative.draft_step * standard.tokens_per_second
    return predicted_speedup_mean(stats.acceptance_rate, gamma, c, plain_share=plain_share)


def identical_so_far(standard: Side, speculative: Side) -> int | None:
    """None when the shorter output is a prefix of the longer, else the first differing index."""
    for i, (a, b) in enumerate(zip(standard.tokens, speculative.tokens)):
        if a != b:
            return i
    return None


SLICE = 0.05  # seconds of its own time a side runs before the other may take a turn


def race(pair: Pair, prompt, *, gamma, slice_seconds: float = SLICE, **options) -> Iterator[tuple[Side, Side]]:
    """Yields (standard, speculative) after every event of either side. Ctrl-C in either
    side stops both (KeyboardInterrupt, after the state is updated)."""
    target_label = pair.target.label
    drafts = ([pair.draft.label] if pair.draft else []) + (["n-gram"] if pair.ngram else [])
    standard = Side("standard", target_label, 0)
    speculative = Side("speculative", " + ".join([target_label, *drafts]), gamma)
    generators = {
        id(standard): stream(pair, prompt, gamma=0, **options),
        id(speculative): stream(pair, prompt, gamma=gamma, **options),
    }
    current = None
    try:
        while not (standard.done and speculative.done):
            side = _turn(current, standard, speculative, slice_seconds)
            if side is not current and current is not None and not current.done:
                start = time.perf_counter()
                mx.synchronize()  # what the paused side left queued is its own work
                current.settle_seconds += time.perf_counter() - start
            current = side
            event = next(generators[id(side)])
            side.apply(event)
            yield standard, speculative
            if isinstance(event, Done) and event.finish_reason == "interrupted":
                raise KeyboardInterrupt
    finally:
        for generator in generators.values():
            generator.close()


def _turn(current: Side | None, standard: Side, speculative: Side, slice_seconds: float) -> Side:
    """Keep the side that is running until it is a slice ahead; else the one behind."""
    active = [s for s in (standard, speculative) if not s.done]
    if len(active) == 1:
        return active[0]
    other = speculative if current is standard else standard
    if current is not None and not current.done and current.clock <= other.clock + slice_seconds:
        return current
    return min(active, key=lambda s: s.clock)
