"""`--gamma auto` in a batch: whether its generations draft at all, from the batch's own
throughput.

Alone, a generation's controller weighs a round against a plain step from its own timings.
In a batch those timings describe the batch: a lane's drafts make every other lane's step
wait and its verify longer, which its own timings do not charge it. So while two or more
generations share the forwards, the batch itself is measured: windows of its aggregate
tokens per second (every lane's tokens, a γ 0 lane's and a fixed gamma's too: drafting
makes them wait as well) with drafting on and with every `--gamma auto` lane decoding
plainly, kept per batch size, and the better regime runs.

The worse regime is tried again now and then, at a cost held to a share of the time: the
wait is the longest of a least count of windows (ten before drafting), what keeps the tries
within TRY_SHARE (a window of a regime that ran at half the rate costs a window more), and
a count that doubles each time a try loses again; windows count across joins and leaves.
A window of drafting ends early once a third of it runs well below plain decoding's rate:
a try that is losing plainly says so soon. A size not measured yet starts in the regime the
measured sizes imply: drafting's gain only falls as the batch grows (every lane's drafts
lengthen the one forward all lanes wait for), so plain decoding that won at a smaller size
wins here too, and drafting that won at a larger one; and drafting that lost clearly one
size up (a lane just left) loses here; else plain decoding, the batch as it would run
without drafts, is measured first, and drafting right after, against it. (Drafting first
cost a burst of four smollm2 chat requests 8%: its windows ran at two thirds of plain
decoding's rate, and the burst ends within a few windows.) Drafting must win by a margin,
and its rate is never above its latest window's: a tie, or one lucky window, is the batch
without drafts.

Drafting on means each lane's controller chooses as alone; plain means every `--gamma auto`
lane decodes plainly (a fixed gamma is the user's and is kept). A batch with no `--gamma
auto` lane has nothing to decide and is not measured: its rates would credit the regime
with what fixed lanes did whatever it said. vLLM sizes drafts by batch size for the same
reason; here the size is measured, not assumed. One generation alone never sees the gate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DRAFT, PLAIN = "draft", "plain"
WINDOW_TOKENS = 12  # per lane: a window is this many tokens of each generation, about
TRY_OTHER_EVERY = 5  # windows between tries of the regime that measured worse, at least
# and of drafting: a try's cost is not all in its window (a head catches up on what plain
# decoding emitted; the batch's pipeline restarts after it): four smollm2 lanes lost 0.2 s
# a try of drafting, where its window's rate said half that
TRY_DRAFT_EVERY = 10
MOST_WINDOWS_BETWEEN_TRIES = 50
# of the batch's time that tries of the worse regime may cost: at 5%, eight smollm2 lanes
# tried drafting every burst or two and ran 5-10% behind the same batch at γ 0 (a try's
# drafts also spread the lanes apart, whose last then run in a smaller batch)
TRY_SHARE = 0.02
CUT_AFTER = 1 / 3  # a window of drafting may end once this share of it has run...
CUT_BELOW = 0.8  # ...at below this share of plain decoding's rate at the batch's size
# drafting must measure this much faster to run: windows of a second or so swing by about
# as much, and a tie is the batch without drafts (which never costs a head's catching up)
DRAFT_MARGIN = 1.05
# drafting that lost by this much one size up loses here too, until measured here: a lane
# leaving eight smollm2 lanes where drafting lost plainly (0.73) measured drafting again at
# seven, and that window's drafts spread the lanes' ends apart by a second. (A clear win one
# size down is no such sign: two lanes that drafted 15% faster led four into drafting that
# ran at 0.8 of plain decoding's rate.)
CLEAR = 1.15
SMOOTHING = 0.5  # weight of a new window in a regime's rate
# windows a lane's plain stretch may span: each stretch costs a pipeline bubble, and one that
# runs on keeps a lane left alone (the others done) from drafting until it ends
PLAIN_RUN = 4


class BatchGate:
    """See the module's docstring. `clock`: seconds, monotonic."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.live = 0  # generations in the batch now
        self.governed = 0  # those of them with --gamma auto: the ones the regime decides for
        self.regime = DRAFT
        self.rates: dict[tuple[int, str], float] = {}  # (batch size, regime) -> tokens/s
        self.windows = 0
        self.between_tries = TRY_OTHER_EVERY  # windows before the worse regime is tried again
        self._since_try = 0
        self._trying = False
        self._settling = True
        self._start: float | None = None
        self._tokens = 0
        self._readers = 0  # generations reading their prompts now
        self._plain = 0  # plain steps of --gamma auto lanes since the gate began
        self._plain_until = 0  # ...up to which their stretches were promised (steps_left)

    @property
    def active(self) -> bool:
        return self.live > 1

    @property
    def measuring(self) -> bool:
        return self.active and self.governed > 0

    def drafting(self) -> bool:
        """Whether `--gamma auto` generations may draft now: not before the plain stretches
        promised them end (`steps_left`), so that they start drafting together."""
        return not self.active or (self.regime == DRAFT and not self._promised())

    def _promised(self) -> bool:
        """A promised stretch has a step left for every auto lane (lanes ask for theirs one
        after another within a step, so the last step or so of one is not waited for)."""
        return self._plain_until - self._plain >= max(self.governed, 1)

    def plain_step(self) -> None:
        """A `--gamma auto` lane took a plain step."""
        self._plain += 1

    def steps_left(self) -> int:
        """Plain steps a lane may take before the gate may turn: the rest of its window (its
        share of it), and the whole windows after it that stay plain whatever they measure
        (no try of drafting falls due), PLAIN_RUN windows at most. Each stretch ends in a
        pipeline bubble (its last step is read with nothing queued behind it): stretches a
        window long left four smollm2 lanes at --gamma auto, plain throughout, 5% behind the
        same batch at γ 0, and stretches as long as the burst even. A turn the promise did
        not foresee (a slow plain window, a join or leave) waits for the stretches: no lane
        drafts and no window of drafting opens before they end (it would measure their plain
        steps, and lanes drafting early would run unmeasured and apart)."""
        governed = max(self.governed, 1)
        if self.regime == DRAFT:  # turned before the stretches promised ended: until they do
            return max(1, -(-(self._plain_until - self._plain) // governed))
        # counts until the gate may turn: the open window's rest and whole windows after it,
        # each a count more than its tokens (its first count opens it)
        window = WINDOW_TOKENS * self.live + 1
        need = window - 1 - self._tokens + (self._start is None) + window * self._plain_windows_ahead()
        steps = max(1, -(-need // max(self.live, 1)))
        self._plain_until = max(self._plain_until, self._plain + steps * governed)
        return steps

    def _plain_windows_ahead(self) -> int:
        """Whole windows after the open one that will be plain as things stand."""
        if self.regime != PLAIN or self._trying or not self.measuring or self._best() != PLAIN:
            return 0  # a plain window that measures plain first, or tries it, is followed by drafting
        return max(0, min(self._wait(PLAIN, DRAFT) - self._since_try - 1, PLAIN_RUN - 1))

    def reading(self, change: int) -> None:
        """A generation starts (1) or ends (-1) reading its prompt. While any does, its
        chunks stall the others' steps, whatever the regime: windows wait for the reading
        to end, then start afresh. (A first window that held long code prompts measured
        drafting at half its rate for four Gemma lanes, which then decoded plainly.)"""
        self._readers = max(self._readers + change, 0)
        self._begin()

    def join(self, *, auto: bool = True) -> None:
        """A generation joins; `auto`: it runs --gamma auto (the regime decides for it)."""
        self._resize(self.live + 1, self.governed + auto)

    def leave(self, *, auto: bool = True) -> None:
        self._resize(max(self.live - 1, 0), max(self.governed - auto, 0))

    def _resize(self, live: int, governed: int) -> None:
        """A new batch: a fresh window, in the regime expected to win at its size."""
        # the promise, per auto lane the same steps left (a joiner decodes plainly until
        # they end too); alone, a lane's stretch holds nobody back
        left = max(self._plain_until - self._plain, 0)
        self._plain_until = self._plain + (left * governed // max(self.governed, 1) if live > 1 else 0)
        self.live, self.governed, self._trying = live, governed, False
        self.regime = self._best() or PLAIN
        # windows since the last try carry over: reset at every join or leave, a batch whose size
        # changes every few windows would never try drafting again
        self._settling = True  # its first window holds a joiner's prompt reading (see count)
        self._begin()

    def count(self, tokens: int) -> None:
        """Tokens a lane emitted (a round's, or a plain step's)."""
        if not self.measuring:
            return
        now = self.clock()
        if self._readers or (self.regime == DRAFT and self._promised()):
            # a prompt is being read (see `reading`), or lanes still run the plain stretches
            # promised them (a join or leave, or a slow plain window, turned the gate early):
            # a window opens after them
            self._start = None
            return
        if self._start is None:  # the window opens at the first tokens after a change
            self._start = now
            return
        self._tokens += tokens
        if now <= self._start or (self._tokens < WINDOW_TOKENS * self.live and not self._losing(now)):
            return
        settling, self._settling = self._settling, False
        key = (self.live, self.regime)
        rate = self._tokens / (now - self._start)
        smoothed = rate if key not in self.rates else (1 - SMOOTHING) * self.rates[key] + SMOOTHING * rate
        # drafting's rate is never above its latest window: a window of drafts swings with the
        # text (a run of easy ids), and one lucky window kept four smollm2 lanes drafting
        # for two windows more at two thirds of plain decoding's rate
        # (not the first window after a join or leave: a joiner's prompt, read in chunks while
        # the others wait, stalls it whatever the regime)
        self.rates[key] = min(smoothed, rate) if self.regime == DRAFT and not settling else smoothed
        self.windows += 1
        self.regime = self._next()
        self._begin()

    def _losing(self, now: float) -> bool:
        """The open window drafts and has run a third of its tokens well below plain
        decoding's rate at this size. (Plain windows run whole: the first after drafting
        pays for the pipeline's restart, and would be cut for it; so does the first window
        after a join or leave, which a joiner's prompt reading stalls.)"""
        other = self.rates.get((self.live, PLAIN))
        return (
            self.regime == DRAFT
            and not self._settling
            and other is not None
            and self._tokens >= CUT_AFTER * WINDOW_TOKENS * self.live
            and self._tokens / (now - self._start) < CUT_BELOW * other
        )

    def _next(self) -> str:
        best = self._best()
        if best is None:  # nothing to go by: plain decoding measured, then drafting against it
            return PLAIN if (self.live, PLAIN) not in self.rates else DRAFT
        other = PLAIN if best == DRAFT else DRAFT
        if self._trying:  # a try of the worse regime just ended: if it lost again, wait longer
            self._trying, self._since_try = False, 0
            won = self.regime == best
            self.between_tries = TRY_OTHER_EVERY if won else min(2 * self.between_tries, MOST_WINDOWS_BETWEEN_TRIES)
            return best
        self._since_try += 1
        if self._since_try >= self._wait(best, other):
            self._trying = True
            return other
        return best

    def _wait(self, best: str, other: str) -> int:
        """Windows of the better regime between tries of the other."""
        least = TRY_DRAFT_EVERY if other == DRAFT else TRY_OTHER_EVERY
        return max(self.between_tries, least, self._affordable_gap(best, other))

    def _affordable_gap(self, best: str, other: str) -> int:
        """Windows of the better regime between tries that keep their cost within TRY_SHARE:
        a window of the other takes best/other times as long, so a try costs that less one
        window more (at most: a losing window ends early). At a size not measured both
        ways, the nearest that is, on the side where a try costs no less: a larger batch
        for a try of drafting (its loss only grows with the batch), a smaller one for a try
        of plain decoding. (Priced at the tries' floor instead, bursts of eight smollm2 lanes
        where drafting had lost by half tried it at seven as soon as the first lane left, in
        the bursts' tails.)"""
        size = self._priced_at(other)
        if size is None:  # nothing measured both ways on that side
            return 0
        rate_best, rate_other = self.rates[size, best], self.rates[size, other]
        loss = rate_best / rate_other - 1 if rate_other > 0 else MOST_WINDOWS_BETWEEN_TRIES * TRY_SHARE
        return min(MOST_WINDOWS_BETWEEN_TRIES, -int(-loss // TRY_SHARE))

    def _priced_at(self, other: str) -> int | None:
        """The batch size a try of `other` here is priced at (see `_affordable_gap`)."""
        both = sorted(size for size, regime in self.rates if regime == DRAFT and (size, PLAIN) in self.rates)
        if self.live in both:
            return self.live
        side = [s for s in both if s > self.live] if other == DRAFT else [s for s in reversed(both) if s < self.live]
        return side[0] if side else None

    def _best(self) -> str | None:
        """The regime expected faster at this size: as measured here; else as the sizes
        measured imply (drafting's gain falls as the batch grows: see the module's
        docstring); else, where this size is not measured both ways, plain decoding if
        drafting lost clearly one size up (CLEAR); else None."""
        here = self.rates.get((self.live, DRAFT)), self.rates.get((self.live, PLAIN))
        if None not in here:
            return DRAFT if here[0] >= DRAFT_MARGIN * here[1] else PLAIN
        won = {  # per size measured both ways: whether drafting was faster
            size: self.rates[size, DRAFT] >= DRAFT_MARGIN * self.rates[size, PLAIN]
            for size, regime in self.rates
            if regime == DRAFT and (size, PLAIN) in self.rates
        }
        if any(not drafted for size, drafted in won.items() if size < self.live):
            return PLAIN
        if any(drafted for size, drafted in won.items() if size > self.live):
            return DRAFT
        above = self.live + 1  # a lane just left a batch where drafting lost clearly
        if above in won and self.rates[above, DRAFT] * CLEAR <= self.rates[above, PLAIN]:
            return PLAIN
        return None

    def _begin(self) -> None:
        self._start, self._tokens = None, 0
