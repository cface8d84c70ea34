"""`--gamma auto` in a batch: whether its generations draft at all, from the batch's own
throughput.

Alone, a generation's controller weighs a round against a plain step from its own timings.
In a batch those timings describe the batch: a lane's drafts make every other lane's step
wait and its verify longer, which its own timings do not charge it. So while two or more
generations share the forwards, the batch itself is measured: windows of its aggregate
tokens per second (every lane's tokens over wall-clock time) with drafting on and with
every lane decoding plainly, kept per batch size, and the better regime runs, the other
tried again after a few windows, twice as many each time it loses again. A size not
measured yet starts in the regime the measured sizes imply: drafting's gain only falls as
the batch grows (every lane's drafts lengthen the one forward all lanes wait for), so plain
decoding that won at a smaller size wins here too, and drafting that won at a larger one;
else the nearest size's verdict, else drafting is measured first. Drafting on means each
lane's controller chooses as alone; plain means every `--gamma auto` lane decodes plainly
(a fixed gamma is the user's and is kept). vLLM sizes drafts by batch size for the same
reason; here the size is measured, not assumed. One generation alone never sees the gate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DRAFT, PLAIN = "draft", "plain"
WINDOW_TOKENS = 12  # per lane: a window is this many tokens of each generation, about
TRY_OTHER_EVERY = 5  # windows between tries of the regime that measured worse, at first
MOST_WINDOWS_BETWEEN_TRIES = 40
SMOOTHING = 0.5  # weight of a new window in a regime's rate


class BatchGate:
    """See the module's docstring. `clock`: seconds, monotonic."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.live = 0  # generations in the batch now
        self.regime = DRAFT
        self.rates: dict[tuple[int, str], float] = {}  # (batch size, regime) -> tokens/s
        self.windows = 0
        self.between_tries = TRY_OTHER_EVERY  # windows before the worse regime is tried again
        self._since_try = 0
        self._trying = False
        self._start: float | None = None
        self._tokens = 0

    @property
    def active(self) -> bool:
        return self.live > 1

    def drafting(self) -> bool:
        """Whether `--gamma auto` generations may draft now."""
        return not self.active or self.regime == DRAFT

    def steps_left(self) -> int:
        """Plain steps a lane may take before the gate may turn: the rest of its window, its
        share of it. A stretch that ends before is a pipeline bubble (its last step is read
        with nothing queued behind it) for nothing; one that runs on keeps a turn waiting."""
        return max(1, -(-(WINDOW_TOKENS * self.live - self._tokens) // max(self.live, 1)))

    def join(self) -> None:
        self._resize(self.live + 1)

    def leave(self) -> None:
        self._resize(max(self.live - 1, 0))

    def _resize(self, live: int) -> None:
        """A new batch size: a fresh window, in the regime expected to win at that size."""
        self.live, self._trying = live, False
        self.regime = self._best() or self.regime
        self._since_try = min(self._since_try, self.between_tries - 1)  # a window of it before a try
        self._begin()

    def count(self, tokens: int) -> None:
        """Tokens a lane emitted (a round's, or a plain step's)."""
        if not self.active:
            return
        now = self.clock()
        if self._start is None:  # the window opens at the first tokens after a change
            self._start = now
            return
        self._tokens += tokens
        if self._tokens < WINDOW_TOKENS * self.live or now <= self._start:
            return
        key = (self.live, self.regime)
        rate = self._tokens / (now - self._start)
        self.rates[key] = rate if key not in self.rates else (1 - SMOOTHING) * self.rates[key] + SMOOTHING * rate
        self.windows += 1
        self.regime = self._next()
        self._begin()

    def _next(self) -> str:
        best = self._best()
        if best is None:  # nothing to go by: measure drafting, then plain decoding
            return DRAFT if (self.live, DRAFT) not in self.rates else PLAIN
        other = PLAIN if best == DRAFT else DRAFT
        if self._trying:  # a try of the worse regime just ended: if it lost again, wait longer
            self._trying, self._since_try = False, 0
            won = self.regime == best
            self.between_tries = TRY_OTHER_EVERY if won else min(2 * self.between_tries, MOST_WINDOWS_BETWEEN_TRIES)
            return best
        self._since_try += 1
        if self._since_try >= self.between_tries:
            self._trying = True
            return other
        return best

    def _best(self) -> str | None:
        """The regime expected faster at this size: as measured here; else as the sizes
        measured imply (drafting's gain falls as the batch grows: see the module's
        docstring); else, where nothing is measured here, the nearest size's; else None."""
        here = self.rates.get((self.live, DRAFT)), self.rates.get((self.live, PLAIN))
        if None not in here:
            return DRAFT if here[0] >= here[1] else PLAIN
        won = {  # per size measured both ways: whether drafting was faster
            size: self.rates[size, DRAFT] >= self.rates[size, PLAIN]
            for size, regime in self.rates
            if regime == DRAFT and (size, PLAIN) in self.rates
        }
        if any(not drafted for size, drafted in won.items() if size < self.live):
            return PLAIN
        if any(drafted for size, drafted in won.items() if size > self.live):
            return DRAFT
        if won and here == (None, None):
            nearest = min(won, key=lambda size: abs(size - self.live))
            return DRAFT if won[nearest] else PLAIN
        return None

    def _begin(self) -> None:
        self._start, self._tokens = None, 0
