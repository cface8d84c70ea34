"""What a round costs on this machine, measured as the run goes: the draft's time for a
round of gamma proposals, D(gamma) = d0 + c gamma (c the draft step; d0 the round's fixed
cost: the wait for the drafts, reading the ids the last round emitted); the target's verify
time as a function of the ids it reads, T(k) = a + b k; the rest of a round (bookkeeping,
rewinds); the seconds of a plain, pipelined decoding step (the median of the latest); and
the draft's catching up on ids
emitted without it (plain steps, prompt lookup), C(n) = e + r n, which a probe after a plain
stretch pays on top of its round (until it is timed, guessed from the draft's step). The
lines are fitted by least squares with older rounds weighted down, as the rounds vary in
length. Given the draft's weights over the target's (`draft_weight`: the controller gives
it for a draft that outweighs its target), a plain step timed stands in for the lines not
timed yet: a verify as a plain step PLAIN_DOUBT dearer, a draft step as that verify times
the weights' ratio (decoding reads every weight once a step).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

PLAIN_DOUBT = 1.5  # a pipelined step may be up to this much faster than a one-token verify
# plain steps whose median is the plain step: on a loaded machine a step another process
# preempted takes many times the others, and a mean of them made drafting look cheap (a
# useless draft drafted 15.6 rounds in 256 ids there, against 4 on a quiet machine)
PLAIN_WINDOW = 15
# a pipelined step timed at more than this many one-token verifies was timed in a slow spell
# (pipelined, it costs less than one): forgotten, so that it is timed again. Else, while
# drafting seemed to win against it, it was never timed again: a useless draft drafted all
# of a generation, 106 rounds of one rejected id, on this loaded machine
STALE_PLAIN = 2.0


def proportional(mean_x: float, mean_y: float, x: float) -> float:
    """Through the origin and the one size seen: charges the fixed part per token, which
    errs towards shorter drafts."""
    return mean_y * x / mean_x if mean_x > 0 else mean_y


def relative_slope(slope: float, mean_x: float, mean_y: float, x: float) -> float:
    """T(x) through the one size seen, growing by `slope` of itself per extra token."""
    return mean_y / (1 + slope * (mean_x - 1)) * (1 + slope * (x - 1))


@dataclass
class LineFit:
    """y = a + b x by least squares, each older observation weighted down by `decay`. Until
    two sizes are seen (or when the fit says something unphysical: a negative intercept),
    `at` extends the mean observation with `fallback(mean_x, mean_y, x)`."""

    decay: float
    fallback: Callable[[float, float, float], float]
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # w, wx, wy, wxx, wxy

    def add(self, x: float, y: float) -> None:
        self._sums = [self.decay * s for s in self._sums]
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            self._sums[i] += v

    @property
    def fitted(self) -> bool:
        """Two sizes or more seen: the line is measured, not guessed."""
        w, wx, _, wxx, _ = self._sums
        return w > 0 and wxx / w - (wx / w) ** 2 > 1e-6

    def mean(self) -> tuple[float, float] | None:
        w, wx, wy = self._sums[:3]
        return (wx / w, wy / w) if w > 0 else None

    def at(self, x: float) -> float | None:
        w, wx, wy, wxx, wxy = self._sums
        if w <= 0:
            return None
        mean_x, mean_y = wx / w, wy / w
        spread = wxx / w - mean_x**2
        if spread > 1e-6:
            slope = max((wxy / w - mean_x * mean_y) / spread, 0.0)
            intercept = mean_y - slope * mean_x
            if intercept >= 0:
                return intercept + slope * x
        return self.fallback(mean_x, mean_y, x)


def running_mean(old: float | None, new: float, seen: int, decay: float) -> float:
    """A plain mean over the first observations, then a decaying one."""
    if old is None:
        return new
    return old + max(1 / seen, 1 - decay) * (new - old)


@dataclass
class RoundTimes:
    """The measured cost model of this run's rounds."""

    decay: float = 0.92
    prior_slope: float = 0.05  # T(k) = a (1 + prior_slope (k - 1)) until two sizes are seen
    draft_weight: float | None = None  # the draft's weights over the target's (None: unknown)
    plain_step: float | None = None
    overhead: float = 0.0
    most_verified: int = 0  # the most ids a timed verify read: the curve is known up to here
    _plains: deque = field(default_factory=lambda: deque(maxlen=PLAIN_WINDOW), repr=False)
    _rounds: int = 0
    _draft: LineFit = field(init=False, repr=False)
    _verify: LineFit = field(init=False, repr=False)
    _catch_up: LineFit = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._draft = LineFit(self.decay, proportional)
        self._verify = LineFit(self.decay, partial(relative_slope, self.prior_slope))
        self._catch_up = LineFit(self.decay, partial(relative_slope, self.prior_slope))

    def observe_plain(self, seconds: float) -> None:
        self._plains.append(seconds)
        self.plain_step = statistics.median(self._plains)

    def observe_draft(self, proposals: int, seconds: float) -> None:
        self._draft.add(proposals, seconds)

    def observe_verify(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self._verify.add(tokens, seconds)
            self.most_verified = max(self.most_verified, tokens)
        one = self._verify.at(1)
        if self.plain_step is not None and one is not None and self.plain_step > STALE_PLAIN * one:
            self.plain_step = None
            self._plains.clear()

    def observe_catch_up(self, ids: int, seconds: float) -> None:
        """The draft read `ids` it had not proposed in a forward of its own, before a round."""
        if ids > 0 and seconds > 0:
            self._catch_up.add(ids, seconds)

    def observe_overhead(self, seconds: float) -> None:
        self._rounds += 1
        self.overhead = running_mean(self.overhead, max(seconds, 0.0), self._rounds, self.decay)

    @property
    def draft_fitted(self) -> bool:
        return self._draft.fitted

    def draft_time(self, gamma: float) -> float | None:
        measured = self._draft.at(gamma)
        if measured is not None or self.draft_weight is None:
            return measured
        verify = self.verify_time(1)
        return None if verify is None else self.draft_weight * gamma * verify

    def verify_time(self, tokens: float) -> float | None:
        measured = self._verify.at(tokens)
        if measured is not None or self.draft_weight is None or self.plain_step is None:
            return measured
        return relative_slope(self.prior_slope, 1, PLAIN_DOUBT * self.plain_step, tokens)

    def draft_step(self) -> float | None:
        """One more proposal's seconds (c): the draft line's slope, or its mean per proposal
        until two sizes are seen."""
        one, two = self.draft_time(1), self.draft_time(2)
        return None if one is None or two is None else (two - one if self.draft_fitted else one)

    def catch_up_time(self, ids: float) -> float:
        """Seconds the draft takes to read `ids` it did not propose: the measured line (through
        one size seen, growing by `prior_slope` of itself per id); until one is timed, a draft
        step grown the same way (0 before the draft is timed)."""
        if ids <= 0:
            return 0.0
        measured = self._catch_up.at(ids)
        if measured is not None:
            return measured
        step = self.draft_step()
        return relative_slope(self.prior_slope, 1, step, ids) if step else 0.0

    def round_time(self, gamma: int) -> float | None:
        verify, draft = self.verify_time(gamma + 1), self.draft_time(gamma)
        if verify is None or draft is None:
            return None
        return draft + verify + self.overhead

    def plain_time(self) -> float | None:
        """A plain step's seconds: measured, or guessed from a one-token verify."""
        return self.plain_step if self.plain_step is not None else self.verify_time(1)
