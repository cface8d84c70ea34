"""What probing has cost beyond plain decoding, against what it may cost (`--gamma auto`).

A probe drafts while plain decoding wins, to learn whether drafting pays again. Each is
charged what it cost beyond plain decoding of the ids it emitted: its seconds (the draft's
catching up on the ids it did not propose included) less one plain step per emitted id; a
probe that paid is a credit. Every emitted id, however decoded, earns `fraction` of a plain
step, and a session starts with `head_start` ids' worth. A probe runs only when the balance
covers what it is expected to cost, so over a run probing costs at most `fraction` of the
time plain decoding would have taken (plus the head start and the misestimate of the last
probe), and a probe that costs k plain steps beyond what it emits waits about k / fraction
plain ids. The first round of a session runs before anything is known and is not charged:
it is paid once, whatever the budget, and what it measured decides the rest. The balance
is in plain steps; a round charged before a plain step is timed waits, in seconds and ids,
until one is (judged meanwhile at a guess).

Pure accounting of measured values: what to do with the balance is the schedule's decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FRACTION = 0.05  # of plain decoding's time that probing may cost
SAVED_UP = 1024  # ids whose allowance may be saved up: old savings never pay for a burst of probes
HEAD_START = 32  # ids whose allowance a session starts with: a first probe may follow the first stretch


@dataclass
class ProbeBudget:
    fraction: float = FRACTION
    saved_up: int = SAVED_UP
    head_start: int = HEAD_START
    balance: float = field(init=False)  # plain steps probing may still cost (negative: over budget)
    unsettled_seconds: float = 0.0  # rounds charged before a plain step was timed
    unsettled_ids: int = 0

    def __post_init__(self) -> None:
        self.balance = self.fraction * self.head_start

    def earn(self, ids: int) -> None:
        """`ids` emitted, however decoded: each earns `fraction` of a plain step."""
        self.balance = min(self.balance + self.fraction * ids, self.fraction * self.saved_up)

    def charge(self, *, seconds: float, ids: int) -> None:
        """A probe: its seconds (catching up included) and the ids it emitted."""
        self.unsettled_seconds += seconds
        self.unsettled_ids += ids

    def settle(self, plain_step: float) -> None:
        """Convert the charged rounds into plain steps, now that a plain step is timed."""
        seconds, ids = self.unsettled_seconds, self.unsettled_ids
        self.unsettled_seconds, self.unsettled_ids = 0.0, 0
        self.balance -= seconds / plain_step - ids

    def balance_at(self, plain_step: float) -> float:
        """The balance, unsettled charges judged at `plain_step` (measured or guessed)."""
        return self.balance - (self.unsettled_seconds / plain_step - self.unsettled_ids)

    def affords(self, steps: float, *, plain_step: float) -> bool:
        return self.balance_at(plain_step) >= steps

    def ids_until(self, steps: float, *, growth: float, plain_step: float) -> int | None:
        """Plain ids to decode before the balance covers a cost of `steps` that grows by
        `growth` plain steps per id decoded meanwhile (the draft's catching up); None: never,
        when it grows at least as fast as the allowance."""
        short = steps - self.balance_at(plain_step)
        if short <= 0:
            return 0
        if growth >= self.fraction:
            return None
        return math.ceil(short / (self.fraction - growth))
