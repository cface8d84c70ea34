"""The batch gate (drafting/batch_gate.py) on a hand-driven clock: alone it never says plain;
in a batch it measures windows of aggregate tokens/s per regime and runs the better one,
trying the other every few windows; a change of batch size starts a fresh window."""

from __future__ import annotations

import pytest

from mlxspec.drafting import Controller
from mlxspec.drafting.batch_gate import DRAFT, PLAIN, TRY_OTHER_EVERY, WINDOW_TOKENS, BatchGate
from mlxspec.drafting.controller import BATCH_STRETCH


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def window(gate: BatchGate, clock: Clock, *, seconds: float) -> None:
    """One window's tokens (every lane's), spread over `seconds`."""
    gate.count(1)  # opens the window
    steps = WINDOW_TOKENS * gate.live
    for _ in range(steps):
        clock.now += seconds / steps
        gate.count(1)


def test_one_generation_alone_is_never_gated():
    clock = Clock()
    gate = BatchGate(clock)
    gate.join()
    assert not gate.active and gate.drafting()
    for _ in range(50):
        clock.now += 1
        gate.count(3)
    assert gate.drafting() and gate.windows == 0


def test_the_faster_regime_runs_and_the_other_is_tried_again():
    clock = Clock()
    gate = BatchGate(clock)
    gate.join(), gate.join()
    assert gate.regime == DRAFT  # untried: drafting first
    window(gate, clock, seconds=2.0)  # 24 tokens in 2 s with drafts
    assert gate.regime == PLAIN and gate.rates[2, DRAFT] == pytest.approx(12.0)
    window(gate, clock, seconds=1.0)  # 24 in 1 s without: plain is faster
    assert gate.rates[2, PLAIN] == pytest.approx(24.0) and not gate.drafting()
    regimes = []
    for _ in range(8 * TRY_OTHER_EVERY):
        window(gate, clock, seconds=1.0 if gate.regime == PLAIN else 2.0)
        regimes.append(gate.regime)
    tries = [i for i, regime in enumerate(regimes) if regime == DRAFT]
    # tried again, after TRY_OTHER_EVERY windows at first, then twice as long each time it loses
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert len(tries) >= 2 and gaps == sorted(gaps) and gaps[-1] > gaps[0], regimes


def measured(*, drafting: float, plain: float) -> tuple[BatchGate, Clock]:
    """A gate over two lanes that has measured a window of each regime (seconds for it)."""
    clock = Clock()
    gate = BatchGate(clock)
    gate.join(), gate.join()
    window(gate, clock, seconds=drafting)
    window(gate, clock, seconds=plain)
    return gate, clock


def test_a_regime_that_wins_its_try_runs_and_the_wait_starts_over():
    gate, clock = measured(drafting=2.0, plain=1.0)  # 12 tok/s against 24
    while gate.regime == PLAIN:
        window(gate, clock, seconds=1.0)
    window(gate, clock, seconds=0.25)  # the try: drafting now 96 tok/s, its rate 54 smoothed
    assert gate.drafting() and gate.between_tries == TRY_OTHER_EVERY


def test_drafting_wins_when_it_is_faster_and_sizes_are_kept_apart():
    gate, clock = measured(drafting=1.0, plain=2.0)  # 24 tok/s against 12
    assert gate.drafting()
    gate.join()  # three: a size not measured yet, and a fresh window
    assert gate.live == 3 and (3, DRAFT) not in gate.rates
    gate.count(1)
    clock.now += 100  # a window left open across the change would have measured this pause
    gate.leave()
    assert gate.live == 2 and gate.drafting()
    window(gate, clock, seconds=1.0)
    assert gate.rates[2, DRAFT] == pytest.approx(24.0)


def test_a_size_not_measured_yet_starts_in_the_regime_the_others_imply():
    gate, clock = measured(drafting=2.0, plain=1.0)  # at two lanes plain decoding won
    gate.join(), gate.join()  # four: drafting's gain only falls as the batch grows
    assert gate.live == 4 and gate.regime == PLAIN
    regimes = []
    for _ in range(TRY_OTHER_EVERY + 1):
        window(gate, clock, seconds=1.0 if gate.regime == PLAIN else 0.5)
        regimes.append(gate.regime)
    # plain windows first, then drafting tried here all the same, and here it wins
    assert regimes[0] == PLAIN and DRAFT in regimes, regimes
    assert gate.rates[4, DRAFT] > gate.rates[4, PLAIN]
    gate.leave(), gate.leave(), gate.leave()
    gate.join()  # two again: measured both ways there, plain won
    assert gate.live == 2 and gate.regime == PLAIN
    gate.join()  # three: smaller than a size where drafting won, larger than one where it lost
    assert gate.live == 3 and gate.regime == PLAIN  # a loss below outweighs a win above


def test_drafting_that_won_in_a_larger_batch_starts_a_smaller_one():
    clock = Clock()
    gate = BatchGate(clock)
    for _ in range(4):
        gate.join()
    window(gate, clock, seconds=1.0)  # drafting measured first
    window(gate, clock, seconds=2.0)  # then plain: slower
    assert gate.drafting()
    gate.leave()
    window(gate, clock, seconds=1.0)
    gate.leave()
    assert gate.live == 2 and gate.regime == DRAFT and (2, PLAIN) not in gate.rates


def test_a_plain_stretch_in_a_batch_runs_to_the_end_of_the_gates_window():
    """While the gate says plain, each lane's stretch lasts until the gate may turn: a stretch
    cut shorter ends in a step read with nothing queued behind it, a pipeline bubble that
    made the plain regime of `--gamma auto` 7-8% slower than the same batch at γ 0 (four
    lanes of the smollm2 preset, 3 runs in turn). Where the batch drafts, a lane's own
    stretch stays short so that its controller decides again soon."""
    controller = Controller()
    gate = controller.batch
    gate.clock = clock = Clock()
    for _ in range(4):
        gate.join()
    window(gate, clock, seconds=2.0)  # drafting measured slow...
    window(gate, clock, seconds=1.0)  # ...plain fast: plain runs
    assert not gate.drafting() and controller.choose() == 0
    assert controller.plain_stretch() == WINDOW_TOKENS
    gate.count(1)  # the window opens
    for _ in range(4 * 5):  # five steps of every lane
        gate.count(1)
    assert controller.plain_stretch() == WINDOW_TOKENS - 5
    gate.regime = DRAFT  # a try of drafting: a lane's stretch is short again
    assert controller.plain_stretch() <= BATCH_STRETCH
