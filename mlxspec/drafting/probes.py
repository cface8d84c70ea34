"""When to try drafting again while plain decoding wins: after a stretch of plain tokens,
32 at first, doubling after each probe that changes nothing (up to 512), back to 32 when a
probe pays. A probe whose proposals were all accepted is followed by another at once: the
text may have turned predictable, and one short round cannot outweigh the past alone.
Either way a probe waits, too, until the budget (budget.py) covers what it is expected to
cost: where a round costs many plain steps, probes are spaced so that they cost at most a
set share of the time.
"""

from __future__ import annotations

from dataclasses import dataclass

SHORTEST, LONGEST = 32, 512
TIMING_STRETCH = 6  # plain tokens that time a pipelined step (the first one starts the pipeline)


@dataclass
class ProbeSchedule:
    every: int = SHORTEST  # plain tokens between probes
    since: int = 0  # plain tokens since the last drafting round
    probing: bool = False  # the round in flight is a probe
    again: bool = False  # the last probe was fully accepted: probe again now

    def due(self) -> bool:
        return self.since >= self.every or self.again

    def start(self) -> None:
        self.again, self.probing = False, True

    def stretch(self, *, plain_timed: bool, affordable_in: int | None = 0) -> int:
        """Plain tokens to decode before the next probe (before plain decoding has been
        timed, just enough to time it). `affordable_in`: plain tokens before the budget covers
        a probe (None: not foreseeable; the question is asked again after the longest stretch)."""
        if not plain_timed:
            return TIMING_STRETCH
        until_due = 0 if self.again else self.every - self.since
        return min(max(until_due, LONGEST if affordable_in is None else affordable_in, 1), LONGEST)

    def observe_plain(self, tokens: int = 1) -> None:
        self.since += tokens

    def observe_round(self, *, all_accepted: bool, drafting_wins: bool) -> None:
        """A drafting round; `drafting_wins`: the controller now prefers drafting."""
        if self.probing:  # the probe's verdict sets the next stretch
            self.probing = False
            self.again = all_accepted
            paid = drafting_wins or self.again
            self.every = SHORTEST if paid else min(self.every * 2, LONGEST)
        else:
            self.again = False
        self.since = 0

    def observe_empty(self) -> None:
        """A round that proposed nothing: a probe that changed nothing."""
        if self.probing:
            self.probing = False
            self.every = min(self.every * 2, LONGEST)
            self.since = 0
