"""The draft-length controller on synthetic traces, against the cost model; the n-gram
matcher on hand-made sequences."""

from __future__ import annotations

import pytest

from mlxspec.decoding.plan import Outcome, Plan
from mlxspec.drafters.lookup import NGramIndex
from mlxspec.drafting import Controller, ControllerConfig
from mlxspec.drafting.probes import LONGEST
from mlxspec.drafting.theory import expected_tokens_per_round
from tests.support.controllers import drafted


def controller(**config) -> Controller:
    return Controller(ControllerConfig(**config))


def plain(c, seconds: float) -> None:
    c.observe_plain(seconds)


def feed(c, alpha_hits, rounds, gamma, draft_step, verify, slope=0.0):
    """Rounds where position i is accepted while i < hits (a deterministic trace)."""
    for r in range(rounds):
        accepted = min(alpha_hits(r), gamma)
        k = gamma + 1
        drafted(
            c,
            drafted=gamma,
            accepted=accepted,
            draft=gamma * draft_step,
            verify=verify * (1 + slope * (k - 1)),
            verified=k,
        )


def test_high_acceptance_and_cheap_draft_pick_a_long_draft():
    c = controller(max_gamma=8)
    for g in (3, 5, 7):  # rounds of several sizes, so the verify curve is fitted
        feed(c, lambda r: 100, 30, g, draft_step=0.001, verify=0.02)
    assert c.best() >= 7


def test_collapsing_acceptance_falls_back_to_plain_decoding():
    c = controller(max_gamma=8)
    feed(c, lambda r: 0, 80, 2, draft_step=0.008, verify=0.02)
    for _ in range(10):
        plain(c, 0.02)
    assert c.best() == 0


def test_it_probes_again_and_recovers():
    c = controller(max_gamma=6)
    c.probes.every = 8  # a short first stretch: the test is 200 steps
    feed(c, lambda r: 0, 60, 2, draft_step=0.006, verify=0.02)
    choices = []
    for _ in range(200):
        g = c.choose()
        choices.append(g)
        if g == 0:
            plain(c, 0.02)
        else:  # the text became predictable: every draft is accepted now
            drafted(c, drafted=g, accepted=g, draft=g * 0.006, verify=0.02 * (1 + 0.02 * g), verified=g + 1)
    assert 0 in choices[:20] and choices[-1] >= 3


def test_costly_draft_never_pays():
    c = controller(max_gamma=8)
    feed(c, lambda r: 100, 40, 3, draft_step=0.05, verify=0.02)
    feed(c, lambda r: 100, 40, 1, draft_step=0.05, verify=0.02)
    # a draft step 2.5x the target's: even perfect acceptance gives (g+1)/(2.5g+1) < 1
    assert c.best() == 0


def test_linear_verify_cost_is_learned():
    """A verify that grows linearly with tokens (4-bit matmul on some Macs) makes long drafts
    expensive: the chosen gamma matches the cost model's own optimum."""
    c = controller(max_gamma=8)
    for g in (1, 3, 6):
        feed(c, lambda r: 100 if r % 2 else 2, 40, g, draft_step=0.002, verify=0.02, slope=0.5)
    t1 = c.times.verify_time(1)
    assert t1 == pytest.approx(0.02, rel=0.05) and c.times.verify_time(5) == pytest.approx(0.02 * 3, rel=0.05)
    best_by_model = max(
        range(9),
        key=lambda g: (
            c.expected_tokens(g) / (c.times.draft_time(g) + c.times.verify_time(g + 1))
            if g
            else 1 / c.times.verify_time(1)
        ),
    )
    assert c.best() == best_by_model and c.best() < 6


def test_flat_verify_curve_and_the_closed_form():
    c = controller(max_gamma=8)
    feed(c, lambda r: 3 if r % 10 else 0, 200, 6, draft_step=0.002, verify=0.02)
    # equal per-position rates reproduce (1 - a^(g+1)) / (1 - a)
    c.acceptance.rates = [0.7] * 8
    assert c.expected_tokens(5) == pytest.approx(expected_tokens_per_round(0.7, 5))


def test_first_choice_before_any_timing():
    """Half the preset's length: the first round runs blind, and a dear draft costs little."""
    assert controller(max_gamma=8).choose() == 2
    assert controller(max_gamma=8, start_gamma=3).choose() == 1
    assert controller(max_gamma=1).choose() == 1


def test_ngram_longest_match_and_followers():
    index = NGramIndex(max_n=3, min_n=1)
    index.extend([1, 2, 3, 4, 5, 9, 2, 3])
    assert index.match() == (2, 2)  # "2 3" ended at index 2 before
    assert index.propose(3) == [4, 5, 9]
    index.extend([4])
    assert index.match() == (3, 3) and index.propose(2) == [5, 9]


def test_ngram_no_match_and_minimum_length():
    index = NGramIndex(max_n=4, min_n=2)
    index.extend([1, 2, 3, 4])
    assert index.match() is None and index.propose(4) == []
    index.extend([7, 3])
    assert index.propose(4) == []  # only "3" repeats: shorter than min_n
    index.extend([4])
    assert index.propose(4) == [7, 3, 4]
    assert index.propose(4, min_match=3) == []


def test_ngram_prefers_the_latest_occurrence():
    index = NGramIndex(max_n=2, min_n=2)
    index.extend([5, 6, 1, 5, 6, 2, 5, 6])
    assert index.propose(1) == [2]


def test_failed_probes_back_off_and_a_paying_probe_resets():
    c = controller(max_gamma=6)
    feed(c, lambda r: 0, 40, 2, draft_step=0.006, verify=0.02)
    stretches = []
    for _ in range(1100):
        g = c.choose()
        if g == 0:
            plain(c, 0.02)
        else:
            stretches.append(c.probes.every)
            drafted(c, drafted=g, accepted=0, draft=g * 0.006, verify=0.021, verified=g + 1)  # the probe is rejected
    assert stretches[:4] == [32, 64, 128, 256] and c.probes.every == 512
    while c.choose() == 0:
        plain(c, 0.02)
    drafted(
        c, drafted=2, accepted=2, draft=0.012, verify=0.021, verified=3
    )  # this probe is accepted: the text turned predictable
    assert c.probes.every == 32 and c.choose() > 0


def test_plain_decoding_is_judged_by_its_own_step_time():
    """A pipelined plain step can be cheaper than a one-token verify: gamma 0 is scored on it."""
    c = controller(max_gamma=4)
    feed(c, lambda r: 1, 30, 2, draft_step=0.004, verify=0.02)
    feed(c, lambda r: 1, 30, 3, draft_step=0.004, verify=0.02)
    plain(c, 0.03)
    slow_plain = c.best()
    for _ in range(60):
        plain(c, 0.008)
    assert slow_plain > 0 and c.best() == 0


def test_draft_time_separates_the_fixed_cost_from_the_step():
    """D(gamma) = d0 + c gamma: a draft round's fixed cost (the wait, reading the last round's
    ids) must not be charged per proposal, or long drafts look too dear."""
    c = controller(max_gamma=8)
    for g in (2, 5, 3, 6):
        for _ in range(10):
            drafted(c, drafted=g, accepted=g, draft=0.004 + 0.001 * g, verify=0.02, verified=g + 1)
    assert c.times.draft_time(1) == pytest.approx(0.005) and c.times.draft_time(8) == pytest.approx(0.012)
    one_size = controller()
    drafted(one_size, drafted=4, accepted=4, draft=0.008, verify=0.02, verified=5)
    assert one_size.times.draft_time(2) == pytest.approx(0.004)  # proportional until a second size


def test_the_second_round_tries_another_size():
    c = controller(max_gamma=8, start_gamma=4)
    assert c.choose() == 2
    drafted(c, drafted=2, accepted=2, draft=0.002, verify=0.02, verified=3)
    assert c.choose() == 4
    rejected = controller(max_gamma=8, start_gamma=4)
    drafted(rejected, drafted=2, accepted=0, draft=0.002, verify=0.02, verified=3)
    assert rejected.choose() != 4


def test_one_lucky_round_does_not_jump_to_the_longest_draft():
    c = controller(max_gamma=8)
    drafted(c, drafted=4, accepted=4, draft=0.004, verify=0.010, verified=5)
    drafted(c, drafted=2, accepted=2, draft=0.002, verify=0.009, verified=3)
    assert c.acceptance.rates[0] < 1  # the prior counts as observations too
    assert c.best() <= 5  # at most one position beyond those tried


def test_plain_decoding_is_timed_before_it_is_judged():
    """A pipelined plain step can be much cheaper than a one-token verify, so while a draft is
    not clearly ahead of the verify-based guess, a short plain stretch times it; a clearly
    better draft is not interrupted."""
    close = controller(max_gamma=6)
    feed(close, lambda r: r % 2, 6, 2, draft_step=0.004, verify=0.02)
    feed(close, lambda r: r % 2, 6, 3, draft_step=0.004, verify=0.02)
    assert close.best() > 0 and close.choose() == 0 and close.plain_stretch() < 10
    clear = controller(max_gamma=6)
    feed(clear, lambda r: 100, 6, 2, draft_step=0.0005, verify=0.02)
    feed(clear, lambda r: 100, 6, 3, draft_step=0.0005, verify=0.02)
    assert clear.choose() > 0


def test_a_fully_accepted_probe_is_followed_by_another():
    c = controller(max_gamma=6)
    feed(c, lambda r: 0, 40, 2, draft_step=0.012, verify=0.02)
    for _ in range(200):  # long enough that the budget covers a probe of this dear draft
        plain(c, 0.02)
    g = c.choose()
    assert g == c.config.probe_gamma
    drafted(c, drafted=g, accepted=g, draft=g * 0.012, verify=0.021, verified=g + 1)  # all accepted
    assert c.best() == 0  # one probe does not outweigh the past on its own...
    assert c.choose() > 0  # ...so another follows at once, not after another stretch
    drafted(
        c, drafted=g, accepted=0, draft=g * 0.012, verify=0.021, verified=g + 1
    )  # that one fails: back to plain decoding
    assert c.choose() == 0


def feed_confidences(c, rounds, pattern, draft_step=0.004, verify=0.01, waiting=0.0):
    """Rounds drafting len(pattern) ids with these confidences, the target accepting up to
    the first one under 0.3; `waiting` > 0: the draft waited for each confidence, at this
    extra cost per forward, under a threshold of 0.2."""
    gamma = len(pattern)
    for r in range(rounds):
        size = gamma if r % 2 else gamma - 1  # two sizes, so the draft and verify lines are fitted
        confidences = pattern[:size]
        accepted = next((i for i, q in enumerate(confidences) if q < 0.3), size)
        if waiting:
            cut = next((i for i, q in enumerate(confidences) if q < 0.2), size)
            forwards = cut + (cut < size)
            seconds = forwards * (draft_step + waiting)
            drafted(
                c, drafted=cut, accepted=min(accepted, cut), draft=seconds, verify=verify, verified=cut + 1, waited=True
            )
            c.stop.observe(
                threshold=0.2,
                confidences=tuple(confidences[:cut]),
                accepted=min(accepted, cut),
                forwards=forwards,
                draft_seconds=seconds,
            )
        else:
            drafted(c, drafted=size, accepted=accepted, draft=size * draft_step, verify=verify, verified=size + 1)
            c.stop.observe(
                threshold=0.0,
                confidences=tuple(confidences),
                accepted=accepted,
                forwards=size,
                draft_seconds=size * draft_step,
            )


def test_learned_early_stop_turns_on_when_unsure_drafts_are_rejected():
    """A costly draft whose unsure proposals the target rejects: stopping at them saves draft
    steps that could not have paid."""
    c = controller(max_gamma=8)
    feed_confidences(c, 32, [0.9, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9])
    threshold = c.stop.next_threshold()
    assert 0.1 < threshold <= 0.9
    # every few rounds one drafts without a threshold, so the evidence stays complete
    assert 0.0 in [c.stop.next_threshold() for _ in range(8)]


def test_learned_early_stop_stays_off_when_unsure_drafts_are_still_accepted():
    """The bundled tiny draft is unsure (top probability ~0.15) yet right: stopping would
    throw accepted tokens away."""
    c = controller(max_gamma=8)
    feed_confidences(c, 32, [0.35, 0.32, 0.4, 0.31, 0.36, 0.33])
    assert c.stop.next_threshold() == 0.0


def test_learned_early_stop_turns_off_when_waiting_costs_more_than_it_saves():
    c = controller(max_gamma=8)
    feed_confidences(c, 32, [0.9, 0.9, 0.9, 0.1, 0.9, 0.9, 0.9])
    assert c.stop.next_threshold() > 0
    feed_confidences(c, 40, [0.9, 0.9, 0.9, 0.1, 0.9, 0.9, 0.9], waiting=0.008)  # a slow host round trip
    feed_confidences(c, 8, [0.9, 0.9, 0.9, 0.1, 0.9, 0.9, 0.9])  # open rounds: the threshold is chosen again
    assert c.stop.next_threshold() == 0.0


def test_learned_early_stop_needs_evidence():
    c = controller(max_gamma=8)
    feed_confidences(c, 8, [0.9, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9])
    assert c.stop.next_threshold() == 0.0


def test_rounds_that_waited_for_confidences_are_timed_apart():
    c = controller(max_gamma=8)
    feed(c, lambda r: 100, 10, 2, draft_step=0.001, verify=0.01)
    feed(c, lambda r: 100, 10, 4, draft_step=0.001, verify=0.01)
    before = c.times.draft_time(4)
    for _ in range(20):
        drafted(
            c, drafted=4, accepted=4, draft=0.05, verify=0.01, verified=5, waited=True
        )  # a slow host wait at every step
    assert c.times.draft_time(4) == pytest.approx(before)


def test_stopping_before_the_first_proposal_still_costs_a_forward():
    """The draft computes a forward to learn its confidence in the first proposal: stopping
    there saves the later proposals, not that forward. With a round's drafting mostly fixed
    cost, stopping saves almost nothing."""
    c = controller(max_gamma=8)
    pattern = [0.1, 0.9, 0.9, 0.9, 0.9, 0.9]
    for r in range(32):
        size = len(pattern) - r % 2
        seconds = 0.05 + 0.0001 * size
        drafted(c, drafted=size, accepted=0, draft=seconds, verify=0.01, verified=size + 1)
        c.stop.observe(
            threshold=0.0, confidences=tuple(pattern[:size]), accepted=0, forwards=size, draft_seconds=seconds
        )
    assert c.stop.next_threshold() == 0.0


def test_an_observation_cut_short_by_ctrl_c_leaves_the_controller_usable():
    """A session's controller outlives a Ctrl-C. One that landed inside observe_round, after
    the round count and before the first acceptance rate, made the next choose() raise
    IndexError (found by the session walk). Every landing point in a session's first two
    observations: choosing and observing go on without an error afterwards."""
    from tests.conftest import ctrl_c_at

    landings = 0
    for at in range(1, 200):
        c = Controller(ControllerConfig())
        with ctrl_c_at(at) as landed:
            try:
                drafted(c, drafted=2, accepted=2, draft=0.002, verify=0.015)
                drafted(c, drafted=4, accepted=1, draft=0.004, verify=0.02)
            except KeyboardInterrupt:
                pass
        if not landed:
            break
        landings += 1
        for _ in range(3):
            gamma = c.choose()
            assert 0 <= gamma <= c.config.max_gamma
            drafted(c, drafted=max(gamma, 1), accepted=1, draft=0.003, verify=0.02)
    assert landings > 10


def test_while_plain_wins_a_lookup_match_beside_a_draft_model_is_still_tried():
    """Beside a draft model the controller judges the model's drafts, not prompt lookup's
    (free to propose): while plain decoding wins, a match is verified, and plain stretches
    stay short enough to look for one. With lookup alone the controller judged lookup
    itself: its verdict stands. Lookup rounds beside a model teach the verify's cost only."""
    from mlxspec.drafters.lookup import PromptLookup
    from mlxspec.drafting import Policy
    from mlxspec.drafting.policy import LOOKUP_STRETCH
    from mlxspec.options import AUTO

    def losing_controller():
        c = Controller(ControllerConfig(start_gamma=4))
        for _ in range(12):
            drafted(c, drafted=2, accepted=0, draft=0.010, verify=0.02)
            c.observe_plain(0.005)
        assert c.choose() == 0
        return c

    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7]  # ends with a match: 8, 9, 10 followed 5, 6, 7
    beside = Policy(gamma=AUTO, stop=0.0, controller=losing_controller(), lookup=PromptLookup(prompt, min_match=3))
    plan = beside.plan(remaining=50)
    assert plan.proposal == (8, 9, 10, 5) and not plan.draft
    beside.lookup.hear([99])  # no match any more: a short plain stretch
    assert 0 < beside.plan(remaining=50).plain <= LOOKUP_STRETCH
    rates = list(beside.controller.acceptance.rates)
    beside.observe_round(
        Outcome(
            plan=plan,
            drafted=plan.proposal,
            accepted=0,
            next_id=1,
            emitted=(1,),
            verified=5,
            seconds=0.02,
            draft_seconds=None,
            verify_seconds=0.02,
        )
    )
    assert beside.controller.acceptance.rates == rates  # the model's rates: untouched

    alone = Policy(gamma=AUTO, stop=0.0, controller=losing_controller(), lookup=PromptLookup(prompt), draft_model=False)
    assert alone.plan(remaining=50).plain > LOOKUP_STRETCH


# --- the probe budget: a synthetic machine, and the controller's choices on it ------------------


def run_on_machine(
    c,
    *,
    ids: int,
    plain_step: float,
    draft,
    verify,
    accepted,
    catch_up=lambda unheard: 0.0,
    preempted=lambda n: False,
) -> tuple[float, int]:
    """Decodes `ids` ids as the controller chooses, on a machine where a plain step costs
    `plain_step`, drafting gamma ids `draft(gamma)`, verifying k ids `verify(k)`, the draft's
    catching up on n ids it did not propose `catch_up(n)` (a forward of its own past 4 ids, as
    the model drafter does), and the round numbered r accepts `accepted(r, gamma)` drafts; the
    step or round numbered n (in the order they run) waits nine plain steps more when
    `preempted(n)` (another process had the core). Returns the seconds spent and the ids
    emitted in plain steps."""
    seconds, emitted, plain_ids, rounds, unheard, timed = 0.0, 0, 0, 0, 0, 0
    while emitted < ids:
        gamma = min(c.choose(), ids - emitted - 1)
        if gamma == 0:
            for _ in range(min(c.plain_stretch(), ids - emitted)):
                step = plain_step + (9 * plain_step if preempted(timed) else 0.0)
                c.observe_plain(step)
                seconds, emitted, plain_ids, unheard = seconds + step, emitted + 1, plain_ids + 1, unheard + 1
                timed += 1
            continue
        hits = min(accepted(rounds, gamma), gamma)
        caught_up = catch_up(unheard) if unheard > 4 else 0.0
        drafting, verifying = draft(gamma), verify(gamma + 1) + (9 * plain_step if preempted(timed) else 0.0)
        timed += 1
        drafted(c, drafted=gamma, accepted=hits, draft=drafting, verify=verifying, catch_up=caught_up)
        seconds += drafting + verifying + caught_up
        emitted, rounds, unheard = emitted + hits + 1, rounds + 1, 0
    return seconds, plain_ids


def often_fully_accepted(r: int, gamma: int) -> int:
    """About 0.6 acceptance per position: a two-draft probe is fully accepted one time in three."""
    return (2, 1, 0, 2, 3, 1, 0, 2, 1)[r % 9]


STEP = 0.01  # a plain step's seconds on the synthetic machine


@pytest.mark.parametrize("ids", [256, 20_000])
def test_probes_cost_at_most_five_percent_when_a_round_costs_ten_plain_steps(ids):
    """MLX's CUDA backend rebuilt attention plans every round: a round cost ~10 plain steps and
    `--gamma auto` kept probing (0.72-0.81x of standard decoding), as a fully accepted probe
    is followed by another at once. The budget keeps exploring within 5% of the time, over a
    short generation and a long session."""
    c = controller(max_gamma=8)
    seconds, plain_ids = run_on_machine(
        c,
        ids=ids,
        plain_step=STEP,
        draft=lambda g: (4 + 0.5 * g) * STEP,
        verify=lambda k: (5 + 0.1 * k) * STEP,
        accepted=often_fully_accepted,
    )
    assert seconds <= 1.05 * ids * STEP
    assert plain_ids >= 0.9 * ids


def test_a_catching_up_that_grows_faster_than_the_budget_stops_the_probes():
    """A draft dearer than its target reads the ids it did not propose at 0.15 of a plain step
    each: after a plain stretch of n ids a probe costs 0.15 n steps more, so no spacing keeps
    it within 5%, and probing stops."""
    c = controller(max_gamma=8)
    seconds, _ = run_on_machine(
        c,
        ids=20_000,
        plain_step=STEP,
        draft=lambda g: 3 * g * STEP,
        verify=lambda k: (1.5 + 0.1 * k) * STEP,
        accepted=often_fully_accepted,
        catch_up=lambda n: (2 + 0.15 * n) * STEP,
    )
    assert seconds <= 1.05 * 20_000 * STEP


def test_the_budget_spaces_probes_by_what_they_cost():
    """A probe that costs k plain steps beyond the id it emits waits about k / 0.05 plain ids;
    cheap probes are spaced by the schedule alone (every 32 to 512 ids)."""
    runs = {}
    for name, verify in (("cheap", 1.5), ("dear", 40)):
        c = controller(max_gamma=8)
        seconds, _ = run_on_machine(
            c,
            ids=20_000,
            plain_step=STEP,
            draft=lambda g: 0.2 * g * STEP,
            verify=lambda k, v=verify: v * STEP,
            accepted=lambda r, g: 0,
        )
        runs[name] = c.rounds, seconds
    (cheap_rounds, _), (dear_rounds, dear_seconds) = runs["cheap"], runs["dear"]
    excess = 40 + 0.4 - 1  # plain steps a probe of 2 costs beyond its one id
    opening = (40 + 0.8 - 1) * STEP  # the first round (4 drafts), run blind, is not charged
    assert dear_rounds <= 20_000 * 0.05 / excess + 2  # the opening, and the last probe's overshoot
    assert dear_seconds - opening <= 1.05 * 20_000 * STEP
    assert cheap_rounds >= 20_000 // LONGEST  # no fewer than the schedule's own, at its longest spacing


def test_where_drafting_pays_the_budget_does_not_hold_it_back():
    """A round costing about 3 plain steps (a flat verify curve, a cheap draft) with drafts that
    are always accepted: the controller drafts long, much faster than plain decoding."""
    c = controller(max_gamma=8)
    seconds, plain_ids = run_on_machine(
        c,
        ids=5_000,
        plain_step=STEP,
        draft=lambda g: 0.1 * g * STEP,
        verify=lambda k: (2.5 + 0.02 * k) * STEP,
        accepted=lambda r, g: g,
    )
    assert seconds < 0.5 * 5_000 * STEP and plain_ids < 0.05 * 5_000


def test_an_opening_round_that_costs_many_plain_steps_is_not_followed_by_another_size():
    """Before anything is timed the first round runs blind. When it cost far more than the
    ids it emitted could take (a draft dearer than its target: 10 ms a proposal against a
    4 ms verify), the second size is not tried: plain decoding is timed, and then no probe is
    in sight (the draft would take ~3 plain steps to read one forward's worth of ids, and
    more per id the longer the plain stretch: more than the budget earns)."""
    c = controller(max_gamma=8, start_gamma=4)
    drafted(c, drafted=4, accepted=4, draft=0.040, verify=0.004, verified=5)
    assert c.choose() == 0 and c.plain_stretch() < 10
    for _ in range(c.plain_stretch()):
        plain(c, 0.003)
    assert c.choose() == 0 and c.plain_stretch() == LONGEST


def test_beside_a_draft_model_a_lookup_that_keeps_being_right_proposes_past_the_model_s_length():
    """SuffixDecoding's point: a match that keeps being accepted is worth a long proposal,
    whatever the model beside it is worth. Beside a draft model whose controller drafts one
    id, lookup rounds that were accepted whole let lookup propose as deep as its own rates
    and the verify's cost say pays; rounds it lost keep it short. A fixed --gamma stays the
    longest path."""
    from mlxspec.drafters.lookup import PromptLookup
    from mlxspec.drafting import Policy
    from mlxspec.options import AUTO

    def model_drafting_one():
        c = Controller(ControllerConfig(start_gamma=4, max_gamma=8))
        for _ in range(24):  # one id pays, a second does not: its draft is dear and rarely right
            drafted(c, drafted=1, accepted=1, draft=0.004, verify=0.020)
            drafted(c, drafted=2, accepted=1, draft=0.008, verify=0.0202)
        assert c.choose() == 1
        return c

    prompt = list(range(10, 30)) * 2 + list(range(10, 14))  # the text repeats: lookup finds 14, 15, ...

    def lookup_round(policy, *, right: bool):
        plan = policy.plan(remaining=100)
        assert plan.proposal and not plan.draft
        n = len(plan.proposal)
        policy.observe_round(
            Outcome(
                plan=plan,
                drafted=plan.proposal,
                accepted=n if right else 0,
                next_id=0,
                emitted=(*plan.proposal, 0) if right else (0,),
                verified=n + 1,
                seconds=0.021,
                draft_seconds=None,
                verify_seconds=0.020 + 0.0002 * n,  # a flat verify: depth is cheap
            )
        )
        return n

    sure = Policy(gamma=AUTO, stop=0.0, controller=model_drafting_one(), lookup=PromptLookup(prompt, min_match=3))
    lengths = []
    for _ in range(12):
        lengths.append(lookup_round(sure, right=True))
        sure.lookup = PromptLookup(prompt, min_match=3)  # the same match again next round
    assert lengths[-1] == 8 and lengths[-1] > lengths[0] >= 1, lengths
    assert sure.controller.choose() == 1  # the model's own length is untouched

    unsure = Policy(gamma=AUTO, stop=0.0, controller=model_drafting_one(), lookup=PromptLookup(prompt, min_match=3))
    for _ in range(12):
        last = lookup_round(unsure, right=False)
        unsure.lookup = PromptLookup(prompt, min_match=3)
    assert last == 1

    fixed = Policy(gamma=2, stop=0.0, controller=sure.controller, lookup=PromptLookup(prompt, min_match=3))
    assert len(fixed.plan(remaining=100).proposal) == 2


@pytest.mark.parametrize("prior_weight, drafts", [(1.0, False), (ControllerConfig().prior_weight, True)])
def test_a_few_early_rejections_under_sampling_do_not_turn_drafting_off(prior_weight, drafts):
    """Gemma 3 270M with its head at temperature 0.7 on this CPU: a plain step 245 ms, a round
    of one draft 290 ms, so one draft pays from α 0.19, and the head's is about 0.37. Three
    rejections in a row open one generation in four; when the prior counted once they sent
    the rate to 0.15 and the controller to plain decoding, where probes come seldom (198 of
    640 ids plain on the bench suite). Counted as three rounds, it keeps drafting."""
    c = controller(max_gamma=8, prior_weight=prior_weight)
    for _ in range(10):
        plain(c, 0.245)
    for gamma in (1, 2, 1):
        drafted(c, drafted=gamma, accepted=0, draft=0.005 + 0.006 * gamma, verify=0.27 + 0.013 * gamma)
    assert (c.choose() > 0) == drafts


def test_a_tree_round_teaches_the_rates_its_first_choices_would_have_shown_as_a_chain():
    """A drafter's tree accepted three ids, but only the first through the drafter's first
    choices: the controller models a chain, so it learns what a chain of those choices (a
    tree's first children) would have shown, one of three; and the draft line is timed by
    the levels the tree grew."""
    tree_fed, chain_fed = Controller(), Controller()
    ids = (1, 2, 3)
    chain = Outcome(
        plan=Plan(draft=3),
        drafted=ids,
        accepted=1,
        next_id=0,
        emitted=(1, 0),
        verified=4,
        seconds=0.3,
        draft_seconds=0.03,
        verify_seconds=0.25,
    )
    chain_fed.observe_round(chain)
    tree = Outcome(
        plan=Plan(draft=5, tree=32, width=3),
        drafted=ids,
        accepted=3,
        next_id=0,
        emitted=ids + (0,),
        verified=9,
        seconds=0.3,
        draft_seconds=0.03,
        verify_seconds=0.25,
        nodes=8,
        first_choices=3,
        first_choices_accepted=1,
        levels=3,
    )
    tree_fed.observe_round(tree)
    assert tree_fed.acceptance.rates == chain_fed.acceptance.rates
    assert tree_fed.acceptance.rates[0] > tree_fed.acceptance.rates[1]  # the second choice was wrong
    assert tree_fed.times.draft_time(3) == pytest.approx(chain_fed.times.draft_time(3))  # 3 levels, not 5


def useless_draft_round(r: int, gamma: int) -> int:
    """A draft that knows nothing: its first round has one lucky id (as on a code prompt), then
    every draft is rejected."""
    return 1 if r == 0 else 0


# the bundled target with a useless draft of the bundled draft's size (never_slower's first
# bar), as this CPU timed them: a pipelined plain step 3 ms, a round of 2 about 2.3 plain steps
USELESS_STEP = 0.003


def useless_draft_costs(c, ids: int, **machine) -> tuple[float, int]:
    return run_on_machine(
        c,
        ids=ids,
        plain_step=USELESS_STEP,
        draft=lambda g: 0.0005 + 0.00125 * g,
        verify=lambda k: 0.0033 * (1 + 0.18 * (k - 1)),
        accepted=useless_draft_round,
        catch_up=lambda n: 0.0012 + 0.00003 * n,
        **machine,
    )


def test_a_useless_draft_stops_costing_within_two_rounds():
    """A generation of 256 ids with a draft that is always rejected: the blind first round and
    one probe, at most, whose cost stays within 2% of plain decoding. When probes were budgeted
    at what the rates expected them to emit (the prior, 0.6 counted as three rounds, said half
    as much again) and the blind first round was free, two more probes fitted: 3.3% (either
    change alone keeps them out)."""
    c = controller(max_gamma=8)
    seconds, _ = useless_draft_costs(c, 256)
    assert c.rounds <= 2
    assert seconds - 256 * USELESS_STEP <= 0.02 * 256 * USELESS_STEP


@pytest.mark.parametrize("every", [8, 12, 20])
def test_a_loaded_machine_does_not_talk_the_controller_into_drafting(every):
    """The same draft where one step or round in `every` waits nine plain steps more (the
    machine shared). A decaying mean of the plain steps swung with each wait: now a round of
    one draft looked cheaper than a plain step, now a probe cheap, and a generation drafted
    10, 6 and 41 rounds (15.6 on average on never_slower's first bar, loaded). The
    median of the latest steps is not moved by them: the blind round and one probe."""
    c = controller(max_gamma=8)
    useless_draft_costs(c, 256, preempted=lambda n: n % every == every - 1)
    assert c.rounds <= 2


@pytest.mark.parametrize("ids", [256, 20_000])
def test_a_draft_whose_weights_outweigh_its_target_s_is_never_drafted_blind(ids):
    """The bundled pair the other way round (draft 6.0x the target's weights), as this CPU timed
    it: a plain step 1.35 ms, a round of 2 some 14 ms (10 plain steps; 10-25 measured). Run
    blind, the first round cost up to a tenth of a 256-id generation (0.84-0.91x of standard
    decoding). Priced from the weights, no round is drafted at all; a draft a sixth of its
    target's still opens blind."""
    c = controller(max_gamma=8, draft_weight=6.0)
    seconds, plain_ids = run_on_machine(
        c,
        ids=ids,
        plain_step=0.00135,
        draft=lambda g: 0.003 + 0.0045 * g,
        verify=lambda k: 0.0018 * (1 + 0.05 * (k - 1)),
        accepted=often_fully_accepted,
        catch_up=lambda n: 0.003 + 0.0003 * n,
    )
    assert c.rounds == 0 and plain_ids == ids
    assert controller(max_gamma=8, draft_weight=0.17).choose() == 2


def test_a_plain_step_timed_in_a_slow_spell_is_timed_again():
    """The same draft where the six steps that first time plain decoding each wait nine plain
    steps more: drafting one id, rejected, looked cheaper than such a step, and as a drafting
    run never times plain decoding again, it drafted to the end of the generation (106
    rounds of one id measured on this loaded machine). A pipelined step timed at more than
    two one-token verifies is forgotten and timed again: one round drafted against it, then
    the probes' own."""
    c = controller(max_gamma=8)
    useless_draft_costs(c, 256, preempted=lambda n: 1 <= n <= 6)
    assert c.rounds <= 5


def test_a_batch_that_decodes_faster_without_drafts_turns_off_lookup_beside_a_model_too():
    """In a batch whose gate says plain (drafting/batch_gate.py), a lookup match beside the
    draft model is not verified either: its round would make every other lane wait."""
    from mlxspec.drafters.lookup import PromptLookup
    from mlxspec.drafting import Policy
    from mlxspec.drafting.batch_gate import PLAIN
    from mlxspec.options import AUTO

    c = Controller(ControllerConfig(start_gamma=4))
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7]  # ends with a match
    beside = Policy(gamma=AUTO, stop=0.0, controller=c, lookup=PromptLookup(prompt, min_match=3))
    c.batch.join(), c.batch.join()
    c.batch.regime = PLAIN
    plan = beside.plan(remaining=50)
    assert plan.plain and not plan.proposal and not plan.draft
    c.batch.leave()  # alone again: the gate is silent, the match is tried
    assert (
        Policy(gamma=AUTO, stop=0.0, controller=c, lookup=PromptLookup(prompt, min_match=3)).plan(remaining=50).proposal
    )


def test_each_batch_size_keeps_its_own_costs():
    """Issue 40: a server's one controller priced a lone request after a burst of eight from
    the burst's steps (a forward of eight rows) until they decayed. Costs are kept per batch
    size; a size first seen starts from the nearest size timed."""
    controller = Controller(ControllerConfig())
    for _ in range(5):
        controller.observe_plain(0.010)
    for _ in range(4):
        controller.batch.join()
    controller.fit_batch()
    assert controller.times.plain_step == 0.010  # copied from the lone size, the nearest timed
    for _ in range(15):
        controller.observe_plain(0.030)
    assert controller.times.plain_step == 0.030 and controller.stop.times is controller.times
    controller.batch.leave()
    controller.fit_batch()  # three: nearest timed is four
    assert controller.times.plain_step == 0.030
    for _ in range(2):
        controller.batch.leave()
    controller.fit_batch()
    assert controller.batch.live == 1 and controller.times.plain_step == 0.010
    assert controller.stop.times is controller.times
