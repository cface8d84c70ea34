"""The batch gate (drafting/batch_gate.py) on a hand-driven clock: alone it never says plain;
in a batch it measures windows of aggregate tokens/s per regime (plain decoding first) and
runs the better one, trying the other at a cost held to a share of the time, a losing try
cut short; a change of batch size starts a fresh window."""

from __future__ import annotations

import pytest

from mlxspec.drafting import Controller
from mlxspec.drafting.batch_gate import (
    DRAFT,
    PLAIN,
    PLAIN_RUN,
    TRY_DRAFT_EVERY,
    TRY_OTHER_EVERY,
    TRY_SHARE,
    WINDOW_TOKENS,
    BatchGate,
)
from mlxspec.drafting.controller import BATCH_STRETCH


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def window(gate: BatchGate, clock: Clock, *, seconds: float) -> int:
    """One window of the batch at a steady rate (a whole window's tokens, every lane's, in
    `seconds`), until the gate closes it (early, if it is losing); the tokens it took."""
    plain = not gate.drafting()  # the lanes' steps are plain ones (what a promise counts)
    if plain:
        gate.plain_step()
    gate.count(1)  # opens the window
    steps, windows, taken = WINDOW_TOKENS * gate.live, gate.windows, 0
    while gate.windows == windows and taken < 10 * steps:
        clock.now += seconds / steps
        if plain:
            gate.plain_step()
        gate.count(1)
        taken += 1
    return taken


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
    assert gate.regime == PLAIN  # untried: plain decoding first, the batch as it runs without drafts
    window(gate, clock, seconds=1.0)  # 24 tokens in 1 s
    assert gate.regime == DRAFT and gate.rates[2, PLAIN] == pytest.approx(24.0)
    window(gate, clock, seconds=1.2)  # with drafts: 20 tok/s, slower (not so slow that it is cut)
    assert gate.rates[2, DRAFT] == pytest.approx(20.0) and not gate.drafting()
    regimes = []
    for _ in range(8 * TRY_DRAFT_EVERY):
        window(gate, clock, seconds=1.0 if gate.regime == PLAIN else 1.2)
        regimes.append(gate.regime)
    tries = [i for i, regime in enumerate(regimes) if regime == DRAFT]
    # tried again, after TRY_DRAFT_EVERY windows at first, then twice as long each time it loses
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert len(tries) >= 2 and gaps == sorted(gaps) and gaps[-1] > gaps[0], regimes


def test_a_try_that_loses_by_far_waits_longer_and_ends_early():
    """Drafting at half plain decoding's rate: a window of it costs a window more, so tries
    come at most every 1 / TRY_SHARE windows; and a try ends once a third of it has run."""
    clock = Clock()
    gate = BatchGate(clock)
    gate.join(), gate.join()
    window(gate, clock, seconds=1.0)  # plain: 24 tok/s
    taken = window(gate, clock, seconds=2.0)  # drafting: 12 tok/s, cut short
    assert taken <= 2 * WINDOW_TOKENS / 3 + 1 and gate.rates[2, DRAFT] == pytest.approx(12.0)
    regimes, spent = [], {PLAIN: 0.0, DRAFT: 0.0}
    for _ in range(120):
        started, running = clock.now, gate.regime
        window(gate, clock, seconds=1.0 if running == PLAIN else 2.0)
        regimes.append(gate.regime)
        spent[running] += clock.now - started
    tries = [i for i, regime in enumerate(regimes) if regime == DRAFT]
    assert tries and tries[0] >= 0.9 / TRY_SHARE - 1, regimes  # the window that measured it counts
    # the tries cost drafting's time beyond plain decoding's for the same tokens: within the share
    assert spent[DRAFT] / 2 <= TRY_SHARE * (spent[PLAIN] + spent[DRAFT]), spent


def measured(*, drafting: float, plain: float) -> tuple[BatchGate, Clock]:
    """A gate over two lanes that has measured a window of each regime (seconds for it)."""
    clock = Clock()
    gate = BatchGate(clock)
    gate.join(), gate.join()
    window(gate, clock, seconds=plain)
    window(gate, clock, seconds=drafting)
    return gate, clock


def test_a_regime_that_wins_its_try_runs_and_the_wait_starts_over():
    gate, clock = measured(drafting=2.0, plain=1.0)  # 12 tok/s against 24
    while gate.regime == PLAIN:
        window(gate, clock, seconds=1.0)
    window(gate, clock, seconds=2.0)  # a try that loses again: the wait doubles
    assert not gate.drafting() and gate.between_tries == 2 * TRY_OTHER_EVERY
    while gate.regime == PLAIN:
        window(gate, clock, seconds=1.0)
    window(gate, clock, seconds=0.25)  # the next try: drafting now 96 tok/s, its rate 54 smoothed
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
    for _ in range(TRY_DRAFT_EVERY + 1):
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
    window(gate, clock, seconds=2.0)  # plain measured first
    window(gate, clock, seconds=1.0)  # then drafting: faster
    assert gate.drafting()
    gate.leave()
    window(gate, clock, seconds=1.0)
    gate.leave()
    assert gate.live == 2 and gate.regime == DRAFT and (2, PLAIN) not in gate.rates


def test_a_plain_stretch_in_a_batch_runs_until_the_gate_may_turn():
    """While the gate says plain, each lane's stretch lasts until the gate may turn (PLAIN_RUN
    windows at most): a stretch cut shorter ends in a step read with nothing queued behind
    it, a pipeline bubble. Stretches of a few steps made the plain regime of `--gamma auto`
    7-8% slower than the same batch at γ 0 (four lanes of the smollm2 preset, 3 runs in
    turn), stretches a window long 5%. A try of drafting falling due ends the stretch at its
    window; where the batch drafts, a lane's own stretch stays short so that its controller
    decides again soon."""
    controller = Controller()
    gate = controller.batch
    gate.clock = clock = Clock()
    for _ in range(4):
        gate.join()
    window(gate, clock, seconds=1.0)  # plain measured fast...
    assert gate.drafting()  # ...and drafting is measured next
    window(gate, clock, seconds=2.0)  # ...drafting slow: plain runs
    assert not gate.drafting() and controller.choose() == 0
    counts = 4 * WINDOW_TOKENS + 1  # a window's counts: every lane's tokens, and the one opening it

    def per_lane(total: int) -> int:
        return -(-total // 4)

    assert controller.plain_stretch() == per_lane(PLAIN_RUN * counts)
    gate.plain_step(), gate.count(1)  # the window opens
    for _ in range(4 * 5):  # five steps of every lane
        gate.plain_step(), gate.count(1)
    assert controller.plain_stretch() == per_lane(counts - 1 - 4 * 5 + (PLAIN_RUN - 1) * counts)
    while gate._wait(PLAIN, DRAFT) - gate._since_try > 2:  # plain windows until a try is one off
        window(gate, clock, seconds=1.0)
    assert not gate.drafting() and controller.plain_stretch() == per_lane(2 * counts)
    window(gate, clock, seconds=1.0)
    assert not gate.drafting() and controller.plain_stretch() == per_lane(counts)  # the try follows
    window(gate, clock, seconds=1.0)
    assert gate.drafting()  # a try of drafting: a lane's stretch is short again
    assert controller.plain_stretch() <= BATCH_STRETCH


def steps(gate: BatchGate, clock: Clock, *, count: int, rate: float) -> None:
    """`count` plain steps of every lane, the batch at `rate` tokens/s."""
    for _ in range(count * gate.live):
        clock.now += 1 / rate
        gate.plain_step()
        gate.count(1)


def test_drafting_is_not_measured_from_plain_steps_promised_before_a_turn():
    """Lanes run the plain stretches the gate promised them whatever it turns to meanwhile:
    a slow plain window that makes drafting look better, or a lane leaving for a size not
    measured yet, turns it before they end. Drafting's window opens after them, so it
    measures drafts, not their plain steps (which would sink drafting where it pays)."""
    controller = Controller()
    gate = controller.batch
    gate.clock = clock = Clock()
    for _ in range(4):
        gate.join()
    window(gate, clock, seconds=1.0)  # plain: 48 tokens/s
    window(gate, clock, seconds=1.2)  # drafting: 40 tokens/s
    drafting = gate.rates[4, DRAFT]
    stretch = controller.plain_stretch()  # every lane's
    assert stretch > WINDOW_TOKENS
    steps(gate, clock, count=WINDOW_TOKENS + 1, rate=20.0)  # the machine slows: a window at 20
    assert gate.regime == DRAFT  # plain's rate fell below drafting's...
    rest = stretch - WINDOW_TOKENS - 1
    assert not gate.drafting() and controller.plain_stretch() == rest  # ...but the stretches run on
    steps(gate, clock, count=rest, rate=20.0)
    assert gate.rates[4, DRAFT] == drafting  # no window of drafting was made of plain steps
    assert gate.drafting()  # and every lane starts drafting together
    window(gate, clock, seconds=1.0)  # drafting now, at 48 tokens/s: measured
    assert gate.rates[4, DRAFT] > drafting

    gate.rates[4, PLAIN], gate.rates[4, DRAFT] = 48.0, 44.0  # plain wins at four, not clearly
    gate.regime, gate._trying = PLAIN, False  # the lanes are promised a long stretch
    stretch = controller.plain_stretch()
    assert stretch > WINDOW_TOKENS
    gate.leave()  # a size not measured: plain first, then drafting
    assert gate.regime == PLAIN and (3, PLAIN) not in gate.rates
    window(gate, clock, seconds=1.0)
    assert gate.regime == DRAFT and (3, DRAFT) not in gate.rates and not gate.drafting()
    steps(gate, clock, count=stretch - WINDOW_TOKENS, rate=20.0)  # the three lanes' stretches run out
    assert (3, DRAFT) not in gate.rates and gate.drafting()
    window(gate, clock, seconds=1.0)
    assert (3, DRAFT) in gate.rates


def test_a_promise_counts_the_auto_lanes_plain_steps_not_every_lanes_tokens():
    """A lane at a fixed gamma emits several tokens a round beside the auto lanes' plain steps,
    and a lane joins mid-stretch: the promise still ends with the auto lanes' stretches (it
    counts their plain steps, kept per lane across the join), so no drafting window is made
    of their plain steps and they start drafting together, the joiner with them."""
    controller = Controller()
    gate = controller.batch
    gate.clock = clock = Clock()
    for _ in range(4):
        gate.join()
    gate.join(auto=False)
    gate.rates[5, PLAIN], gate.rates[5, DRAFT] = 50.0, 44.0  # plain wins here
    gate.rates[6, PLAIN], gate.rates[6, DRAFT] = 40.0, 44.0  # drafting wins one lane up
    gate.regime = PLAIN
    stretch = controller.plain_stretch()  # every auto lane's
    assert stretch > 2 * WINDOW_TOKENS
    for step in range(stretch):
        if step == WINDOW_TOKENS:
            gate.join()  # drafting wins at six: the gate turns at once...
            assert gate.regime == DRAFT and not gate.drafting()  # ...but the stretches run on
            assert controller.plain_stretch() == stretch - step  # and the joiner's as long
        for _ in range(gate.governed):
            clock.now += 1 / 40
            gate.plain_step(), gate.count(1)
        clock.now += 1 / 40
        gate.count(3)  # the fixed lane's round
    assert gate.rates[6, DRAFT] == 44.0  # nothing measured as drafting that was plain
    assert gate.drafting()


def test_no_window_measures_while_a_prompt_is_read():
    """A joiner's prompt, read in chunks between the others' steps, stalls them whatever the
    regime: a window that held it would charge drafting (or plain decoding) with it. Windows
    wait for the reading to end and start afresh."""
    clock = Clock()
    gate = BatchGate(clock)
    for _ in range(4):
        gate.join()
    window(gate, clock, seconds=1.0)  # plain: 48 tokens/s
    assert gate.regime == DRAFT
    gate.reading(1)
    for _ in range(3 * WINDOW_TOKENS * 4):  # drafting beside the reading, stalled: 12 tokens/s
        clock.now += 1 / 12
        gate.count(1)
    assert (4, DRAFT) not in gate.rates and gate.windows == 1
    gate.reading(-1)
    window(gate, clock, seconds=0.8)  # drafting, once the prompt is read: 60 tokens/s
    assert gate.rates[4, DRAFT] == pytest.approx(60.0, rel=0.05)


def test_a_batch_without_an_auto_lane_is_not_measured():
    """Lanes at a fixed gamma decode as they were told whatever the regime says: windows of
    theirs alone would credit the regime with their rate (lanes at a fixed γ would make
    drafting look as fast or as slow as they are whatever it says), so the gate keeps no
    rate until an auto lane is among them."""
    clock = Clock()
    gate = BatchGate(clock)
    gate.join(auto=False), gate.join(auto=False)
    assert gate.active and not gate.measuring
    for _ in range(3):
        window(gate, clock, seconds=1.0)
    assert gate.rates == {} and gate.windows == 0
    gate.join()  # an auto lane: three at once, measured
    window(gate, clock, seconds=2.0)
    assert list(gate.rates) == [(3, PLAIN)]
    gate.leave()  # back to the fixed lanes alone
    window(gate, clock, seconds=1.0)
    assert list(gate.rates) == [(3, PLAIN)] and gate.windows == 1


def test_a_clear_verdict_at_the_nearest_size_holds_until_this_size_is_measured():
    """Drafting lost plainly at four lanes (half the rate): a lane leaves, and three run
    plain decoding without a window of drafts (one of those spread the lanes' ends apart);
    at a size next to a close verdict, plain decoding is measured, then drafting."""
    clock = Clock()
    gate = BatchGate(clock)
    for _ in range(4):
        gate.join()
    window(gate, clock, seconds=1.0)  # plain
    window(gate, clock, seconds=2.0)  # drafting at half the rate: clear
    gate.leave()
    regimes = []
    for _ in range(TRY_DRAFT_EVERY - 2):  # the window after drafting's counts: it carries over the leave
        window(gate, clock, seconds=1.0)
        regimes.append(gate.regime)
    assert gate.live == 3 and set(regimes) == {PLAIN}, regimes
    close = BatchGate(clock)
    for _ in range(4):
        close.join()
    window(close, clock, seconds=1.0)  # plain
    window(close, clock, seconds=1.05)  # drafting 5% slower: close
    close.leave()
    assert close.regime == PLAIN
    window(close, clock, seconds=1.0)  # three: plain measured first...
    assert close.regime == DRAFT  # ...then drafting, against it


def test_drafting_must_win_by_a_margin_and_one_lucky_window_does_not_keep_it():
    """A tie is the batch without drafts; and after a lucky window of drafts (a run of easy
    ids), one window at below plain decoding's rate ends drafting: its rate is never above
    its latest window's (smoothed alone, 28.2 tok/s would have kept it against 24)."""
    gate, clock = measured(drafting=0.97, plain=1.0)  # drafting 3% faster: within the margin
    assert not gate.drafting()
    while gate.regime == PLAIN:  # until drafting is tried again
        window(gate, clock, seconds=1.0)
    window(gate, clock, seconds=0.5)  # a lucky window: 48 tok/s
    assert gate.drafting()
    window(gate, clock, seconds=1.2)  # then 20 tok/s: plain decoding again
    assert gate.rates[2, DRAFT] == pytest.approx(20.0) and not gate.drafting()


def test_joins_and_leaves_neither_hold_drafting_off_nor_sink_it():
    """Drafting 1.3x as fast, its first window unlucky, the batch going from four to five
    and back every few windows, and every first window after a change stalled by a joiner's
    prompt: the windows since the last try carry over each change (reset at every one,
    drafting was never tried again), and a stalled first window is neither cut nor held to
    drafting's latest-window rule, so drafting runs most of the time."""
    clock = Clock()
    gate = BatchGate(clock)
    for _ in range(4):
        gate.join()
    window(gate, clock, seconds=1.0)  # plain
    window(gate, clock, seconds=1.1)  # drafting, unlucky: slower
    regimes = []
    for change in range(40):
        gate.join() if change % 2 == 0 else gate.leave()
        for i in range(6):
            seconds = 1.0 if gate.regime == PLAIN else 1 / 1.3
            window(gate, clock, seconds=seconds + (0.3 if i == 0 else 0.0))
            regimes.append(gate.regime)
    assert regimes[-100:].count(DRAFT) > 80, regimes[-100:]


def test_a_try_at_a_size_not_measured_is_priced_at_the_nearest_larger_one():
    """Drafting lost by half at eight lanes: a lane leaves (a burst's tail), and at seven no
    try of drafting falls due before the wait eight's loss affords (not after the tries'
    floor of ten windows); a try of plain decoding is priced at a smaller batch."""
    clock = Clock()
    gate = BatchGate(clock)
    for _ in range(8):
        gate.join()
    window(gate, clock, seconds=1.0)  # plain
    window(gate, clock, seconds=2.0)  # drafting at half the rate
    for _ in range(3):
        window(gate, clock, seconds=1.0)
    gate.leave()
    regimes = []
    for _ in range(int(0.9 / TRY_SHARE) - 5):
        window(gate, clock, seconds=1.0 if gate.regime == PLAIN else 2.0)
        regimes.append(gate.regime)
    assert gate.live == 7 and set(regimes) == {PLAIN}, regimes
    assert gate._priced_at(DRAFT) == 8 and gate._priced_at(PLAIN) is None
