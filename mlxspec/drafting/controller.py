"""`--gamma auto`: each round's draft length from what the run has measured.

The controller picks the gamma that maximises expected emitted tokens per second,

    E[tau](gamma) / (D(gamma) + T(gamma + 1) + overhead),   E[tau] = 1 + sum_k prod_{i<=k} a_i,

against 1 / plain_step for gamma = 0 (plain decoding), with the costs of `timing` and the
per-position acceptance rates a_i below (recent rounds weighted more).

Early on: each of the draft's position rates starts from the prior as three
pseudo-observations (a lookup's beside it, as one), so one lucky round does not send gamma
to the maximum, nor a few unlucky ones (common under sampling) gamma to 0. The first round
drafts half the preset's length: it runs blind, so a draft dearer than expected costs
little. A draft whose weights outweigh its target's (`draft_weight` above 1: no length can
pay) is not run blind at all: plain decoding is timed first, and the draft is priced from
its weights (timing.py) like any probe. When the first round's first proposal was accepted
and what it cost says a round of the preset's length pays even against the cheapest plain
step plausible, the second round drafts that length, so both cost lines are fitted; gamma
grows at most one position beyond those tried (an untried position borrows the last
measured rate).
A pipelined plain step can be much cheaper than a one-token verify, so plain decoding is not
judged before it is timed: while no draft length is clearly ahead of the verify-based
guess, a short plain stretch times it. While plain decoding wins, `probes` says when to
draft again; now and then a length one beyond the best is tried, to learn that position.

Probing has a budget (`budget`): probes, and the blind first round, are charged what they
cost beyond plain decoding, the draft's catching up included, and a probe runs only when the
budget covers what the cost model says it costs were all its drafts rejected (the rates'
prior would price an always-rejected draft's probe as if it emitted half as much again).
Where a round costs many plain steps (a backend that is slow on multi-token calls) probes
become rare and the first round, run blind, is the only dear one; a draft dearer than its
target is never drafted at all. Where rounds are cheap the budget seldom binds.

Everything here is learnt across a session's generations (chat's turns); a pure function of
its observations: no clocks, no MLX. In a batch of generations (`batch`: batch_gate.py, the
one clock) the batch's own throughput also says whether to draft at all, and the costs are
kept per batch size (a forward's rows change what its steps cost).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ..decoding.plan import Outcome
from .batch_gate import BatchGate
from .budget import ProbeBudget
from .early_stop import StopLearner
from .probes import ProbeSchedule
from .theory import expected_tokens_by_position
from .timing import PLAIN_DOUBT, RoundTimes
from .tree_budget import TreeCalibration

LEARN_NEXT_EVERY = 16  # rounds between tries of one position beyond the best
BATCH_STRETCH = 4  # plain steps at most between plans in a batch that drafts: a lane's own turn


@dataclass(frozen=True)
class ControllerConfig:
    max_gamma: int = 8
    start_gamma: int = 4  # before anything is timed (a preset's recommendation)
    decay: float = 0.92  # weight of the past per observation
    prior_acceptance: float = 0.6
    # the prior counts as this many rounds: under sampling a draft is accepted about as often
    # as a coin lands heads, and a few early rejections in a row are common where drafting pays
    prior_weight: float = 3.0
    prior_slope: float = 0.05  # verify cost growth per extra token, until two sizes are seen
    probe_gamma: int = 2
    probe_weight: float = 0.5  # a probe is fresh evidence after a stretch without drafting
    probe_budget: float = 0.05  # of plain decoding's time that probes may cost
    # the draft's weights over the target's (a draft model's; None: unknown). Above 1 a draft
    # step costs more than a target step: no length can pay, so no round is drafted blind
    draft_weight: float | None = None


@dataclass
class AcceptanceModel:
    """Per draft position, the rate at which it is accepted given the earlier ones were."""

    prior: float
    decay: float
    prior_weight: float = 1.0  # pseudo-observations the prior counts as (ControllerConfig's)
    rates: list[float] = field(default_factory=list)
    # observations per position; a dict, not a second list beside `rates`, so that an
    # interrupt between two appends cannot leave them out of step
    _seen: dict[int, int] = field(default_factory=dict)

    def observe(self, *, drafted: int, accepted: int, fresh_weight: float | None = None) -> None:
        """`fresh_weight`: how much this round counts at least (a probe after a stretch)."""
        keep = self.decay if fresh_weight is None else 1 - fresh_weight
        for i in range(min(accepted + 1, drafted)):  # positions tested: up to the first rejection
            while len(self.rates) <= i:
                self.rates.append(self.prior)
            # a running mean (the prior counting `prior_weight` times) until the decay takes over
            self._seen[i] = seen = self._seen.get(i, 0) + 1
            weight = max(1 / (seen + self.prior_weight), 1 - keep)
            self.rates[i] += weight * ((i < accepted) - self.rates[i])

    def at(self, gamma: int) -> list[float]:
        """The first `gamma` positions' rates; an untried position borrows the last one's."""
        rates, last = [], self.prior
        for i in range(gamma):
            last = self.rates[i] if i < len(self.rates) else last
            rates.append(last)
        return rates


class Controller:
    """What a session has learnt of its pair (costs, acceptance, probes, the early stop),
    and the draft length it implies."""

    def __init__(self, config: ControllerConfig | None = None):
        self.config = config or ControllerConfig()
        # a lighter draft's costs are not guessed: its first round runs blind and costs little
        self.times = RoundTimes(
            decay=self.config.decay,
            prior_slope=self.config.prior_slope,
            draft_weight=self.config.draft_weight if self._dear_draft() else None,
        )
        self.acceptance = AcceptanceModel(
            prior=self.config.prior_acceptance, decay=self.config.decay, prior_weight=self.config.prior_weight
        )
        # prompt lookup's and the history's own rates, beside a draft model: their matches are
        # often far surer than the model, and would be cut to the model's length otherwise
        self.lookup_acceptance = AcceptanceModel(prior=self.config.prior_acceptance, decay=self.config.decay)
        self.probes = ProbeSchedule()
        self.budget = ProbeBudget(fraction=self.config.probe_budget)
        # the cost model per batch size: a forward of eight rows is not one of one, and a lone
        # request after a burst of eight was priced from the burst's steps until they decayed
        self._times_by_size = {1: self.times}
        self.stop = StopLearner(self.times)
        self.tree_calibration = TreeCalibration()  # a tree drafter's confidence against its acceptance
        self.batch = BatchGate()  # the batch the generations it chooses for share, if any
        self.rounds = 0  # drafting rounds observed
        self.unheard = 0  # ids emitted since the draft model last proposed: it catches up on them

    def fit_batch(self) -> None:
        """The batch's size changed (a generation joined or left): its own cost model from now
        on, first copied from the nearest size timed (the smaller on a tie), then timed at its own."""
        size = max(self.batch.live, 1)
        if size not in self._times_by_size:
            nearest = min(self._times_by_size, key=lambda known: (abs(known - size), known))
            self._times_by_size[size] = copy.deepcopy(self._times_by_size[nearest])
        self.times = self.stop.times = self._times_by_size[size]

    # --- observations ---------------------------------------------------------------
    def observe_prefill(self) -> None:
        """A generation's prompt, read by the draft too (a session's next turn)."""
        self.unheard = 0

    def observe_plain(self, seconds: float) -> None:
        """One plain, pipelined decoding step."""
        self.times.observe_plain(seconds)
        if self.batch.live > 1:  # an attribute, not a call: alone, the calls made before
            self.batch.plain_step()
        self.batch.count(1)
        self.budget.earn(1)
        self.budget.settle(self.times.plain_step)
        self.unheard += 1
        self.probes.observe_plain(1)

    def observe_verify(self, outcome: Outcome) -> None:
        """A round whose proposals did not come from the draft this controller models (prompt
        lookup beside it): the verify's time, the lookup's own rates, and ids the draft will
        catch up on."""
        self._observe_verified(outcome, proposed_by_draft=False)
        if outcome.drafted:
            self.lookup_acceptance.observe(drafted=len(outcome.drafted), accepted=outcome.accepted)

    def _observe_verified(self, outcome: Outcome, *, proposed_by_draft: bool) -> None:
        """What every round tells: the verify's time, and the ids it emitted (they earn the
        budget; the draft catches up on them unless it proposed in this round)."""
        if outcome.verify_seconds is not None:
            self.times.observe_verify(outcome.verified, outcome.verify_seconds)
        self.batch.count(len(outcome.emitted))
        self.budget.earn(len(outcome.emitted))
        self.unheard = 0 if proposed_by_draft else self.unheard + len(outcome.emitted)

    def observe_round(self, outcome: Outcome, *, waited: bool = False) -> None:
        """A round that drafted, or one that proposed nothing. `waited`: the draft waited for
        its confidence at every step (a learned threshold was on), so its drafting time is
        kept out of the draft line."""
        proposing = bool(
            outcome.plan.draft or outcome.plan.proposal or outcome.plan.proposal_tree
        )  # the draft read what it had not seen
        if proposing and outcome.catch_up_seconds > 0:
            self.times.observe_catch_up(self.unheard, outcome.catch_up_seconds)
        # the first round too where a draft model ran it blind; a lookup's costs no drafting
        # (charged, a server's first request left no budget for a key's own history to draft)
        if self.probes.probing or (self.rounds == 0 and outcome.plan.draft):
            self.budget.charge(seconds=outcome.seconds + outcome.catch_up_seconds, ids=len(outcome.emitted))
        self._observe_verified(outcome, proposed_by_draft=proposing)
        if not outcome.drafted:
            self.probes.observe_empty()
            return
        # the rates of a chain: a drafter's tree tells what its first choices, a chain, would
        # have shown (the tree only adds nodes where they pay; tree_calibration models those)
        drafted, accepted = len(outcome.drafted), outcome.accepted
        if outcome.first_choices:
            drafted, accepted = outcome.first_choices, outcome.first_choices_accepted
        probing = self.probes.probing
        self.acceptance.observe(
            drafted=drafted, accepted=accepted, fresh_weight=self.config.probe_weight if probing else None
        )
        self.rounds += 1  # after the rates: a Ctrl-C in between leaves no round without one
        if outcome.draft_seconds is not None:
            if not waited:  # a drafter's tree costs its levels, one forward each (a lookup trie: none)
                self.times.observe_draft(outcome.levels or drafted, outcome.draft_seconds)
            self.times.observe_overhead(outcome.seconds - outcome.draft_seconds - outcome.verify_seconds)
        self.probes.observe_round(all_accepted=accepted == drafted, drafting_wins=probing and self.best() > 0)

    # --- the model ------------------------------------------------------------------
    def expected_tokens(self, gamma: int) -> float:
        return expected_tokens_by_position(self.acceptance.at(gamma))

    def throughput(self, gamma: int) -> float | None:
        """Expected emitted tokens per second at this gamma; None before it can be told."""
        if gamma == 0:
            step = self.times.plain_time()
            return 1.0 / step if step else None
        time = self.times.round_time(gamma)
        return self.expected_tokens(gamma) / time if time else None

    def best(self) -> int:
        reach = min(len(self.acceptance.rates) + 1, self.config.max_gamma)
        scores = {g: self.throughput(g) for g in range(reach + 1)}
        if any(v is None for v in scores.values()):
            return self._first_size()  # nothing timed yet
        return max(scores, key=lambda g: (scores[g], -g))

    def lookup_length(self) -> int:
        """How deep a lookup proposal beside the draft model may go: the length that
        maximises its expected tokens per second of verifying (it costs no drafting), from
        the lookup's own rates; the preset's length until a verify is timed."""
        # one position beyond those tried, and the preset's length from the start: a lookup
        # proposal costs no drafting, so trying a position costs only its verify
        tried = len(self.lookup_acceptance.rates)
        reach = min(max(tried + 1, self.config.start_gamma), self.config.max_gamma)
        scores = {}
        for gamma in range(1, reach + 1):
            verify = self.times.verify_time(gamma + 1)
            if verify is None:
                return min(self.config.start_gamma, self.config.max_gamma)
            scores[gamma] = expected_tokens_by_position(self.lookup_acceptance.at(gamma)) / (
                verify + self.times.overhead
            )
        return max(scores, key=lambda g: (scores[g], -g))

    def _plain_untimed_may_win(self, best: int) -> bool:
        guess, drafting = self.times.verify_time(1), self.throughput(best)
        return self.times.plain_step is None and None not in (guess, drafting) and drafting < PLAIN_DOUBT / guess

    # --- what a probe costs ---------------------------------------------------------------
    def _plain_step_for_budget(self) -> float | None:
        """Measured; until then the cheapest a pipelined step may be (the verify-based guess
        over PLAIN_DOUBT), which makes drafting look as dear as it may be."""
        guess = self.times.verify_time(1)
        return self.times.plain_step or (guess / PLAIN_DOUBT if guess else None)

    def probe_cost(self, gamma: int, *, unheard: int | None = None, worst: bool = False) -> float | None:
        """Plain steps a round of `gamma` is expected to cost beyond plain decoding of the ids
        it emits, the draft's catching up on `unheard` ids (default: those now) included;
        `worst`: if every draft is rejected (it emits one id). None before anything is timed."""
        step, round_time = self._plain_step_for_budget(), self.times.round_time(gamma)
        if step is None or round_time is None:
            return None
        catch_up = self.times.catch_up_time(self.unheard if unheard is None else unheard)
        return (catch_up + round_time) / step - (1.0 if worst else self.expected_tokens(gamma))

    # A probe is budgeted at its worst: the rates' prior (0.6, as three rounds) would price a
    # draft that is always rejected as if it emitted half as much again, and buy it more probes.
    def affords(self, gamma: int) -> bool:
        """The budget covers a probe of `gamma` now, were all its drafts rejected."""
        cost, step = self.probe_cost(gamma, worst=True), self._plain_step_for_budget()
        return cost is None or self.budget.affords(cost, plain_step=step)

    def _affordable_in(self, gamma: int) -> int | None:
        """Plain ids to decode before the budget covers a probe of `gamma` (at its worst),
        whose catching up grows with them; None: never foreseeably."""
        cost, step = self.probe_cost(gamma, worst=True), self._plain_step_for_budget()
        if cost is None:
            return 0
        growth = self.probe_cost(gamma, unheard=self.unheard + 1, worst=True) - cost
        return self.budget.ids_until(cost, growth=growth, plain_step=step)

    # --- the decision -----------------------------------------------------------------
    def _probe_size(self) -> int:
        return min(self.config.probe_gamma, self.config.max_gamma)

    def _first_size(self) -> int:
        return min(max(self.config.start_gamma // 2, 1), self.config.max_gamma)

    def _second_size(self) -> int | None:
        """The preset's length, for the second round, so that both cost lines are fitted
        early: when the first round's leading draft was accepted and what it cost says such
        a round pays even against the cheapest plain step plausible; else None (plain
        decoding is timed first)."""
        second = min(self.config.start_gamma, self.config.max_gamma)
        if self.rounds != 1 or self.times.draft_fitted or second == self._first_size():
            return None
        accepted = bool(self.acceptance.rates) and self.acceptance.rates[0] > 0.5
        cost = self.probe_cost(second)
        return second if accepted and cost is not None and cost <= 0 else None

    def _dear_draft(self) -> bool:
        """The draft's weights say a step of it costs more than a target step."""
        return self.config.draft_weight is not None and self.config.draft_weight > 1

    def choose(self) -> int:
        """The next round's draft length; 0: a plain stretch (`plain_stretch` long)."""
        config = self.config
        if not self.batch.drafting():
            return 0  # the batch decodes faster without drafts for now
        if self.rounds == 0 and self.times.plain_step is None and self._dear_draft():
            return 0  # not blind: plain decoding is timed, then the draft is priced from its weights
        second = self._second_size()
        if second is not None:
            return second
        best = self.best()
        if best > 0 and self._plain_untimed_may_win(best):
            return 0  # a short plain stretch times it
        if best == 0:
            if self.probes.due() and self.affords(self._probe_size()):
                self.probes.start()
                return self._probe_size()
            return 0
        if best < config.max_gamma and self.rounds % LEARN_NEXT_EVERY == LEARN_NEXT_EVERY - 1:
            return best + 1  # learn the next position's rate
        return best

    def plain_stretch(self) -> int:
        stretch = self.probes.stretch(
            plain_timed=self.times.plain_step is not None, affordable_in=self._affordable_in(self._probe_size())
        )
        if not self.batch.active:
            return stretch
        if not self.batch.drafting():  # the gate's plain window: no plan can draft before it ends
            return self.batch.steps_left()
        return min(stretch, BATCH_STRETCH)
