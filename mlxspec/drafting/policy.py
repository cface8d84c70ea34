"""A generation's drafting policy: plans each round (how many ids to draft, from the draft
model or prompt lookup, where to stop) and observes how it went. The draft length is fixed
or the controller's (`--gamma auto`); the early stop never, below a set confidence, or
learned (`--draft-min-p auto`). Every choice is a function of the past only, so the output
stays exactly the target's whatever is chosen."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ..decoding.plan import Outcome, Plan
from ..decoding.tree import LevelPrice, TokenTree
from ..options import AUTO, Auto
from .controller import Controller
from .shape import CHAINS, TreeShape

TIME_EVERY = 4  # rounds of one length between rounds timed apart (each costs a host wait)
LOOKUP_STRETCH = 4  # plain tokens between prompt-lookup tries while plain decoding wins
TREE_WIDTH = 3  # children per node, and nodes expanded per level, in a drafter's tree
TREE_AUTO_MAX = 32  # the most nodes `--tree auto` verifies in a round
TREE_LOOKUP_NODES = 16  # the most nodes of a lookup trie under `--tree auto` (its own budget is its match)


class Lookup(Protocol):
    """What the policy asks of prompt lookup (drafters/lookup.py; drafters/history/ adds
    the session's history), a lookup and not a drafter: a `chain` of ids that followed a
    match, or (where the round reads trees: drafting/shape.py) a `trie` of every
    continuation it found, at most `max_nodes` (a chain where it keeps one); it `hear`s
    every id emitted and says where its latest proposal came from (`source`: NGRAM or
    HISTORY)."""

    source: str

    def chain(self, gamma: int) -> tuple[int, ...]: ...
    def trie(self, max_nodes: int) -> TokenTree | None: ...
    def hear(self, ids) -> None: ...


class Policy:
    def __init__(
        self,
        *,
        gamma: int | Auto,
        stop: float | Auto,
        controller: Controller,
        lookup: Lookup | None = None,
        draft_model: bool = True,
        shape: TreeShape = CHAINS,
        tree_width: int = TREE_WIDTH,
    ):
        self.gamma, self.stop = gamma, stop
        self.controller = controller
        self.lookup = lookup
        self.draft_model = draft_model
        self.shape, self.tree, self.tree_width = shape, shape.tree, tree_width
        self._last_gamma, self._untimed = None, 0
        self._learning = stop is AUTO and draft_model

    def plan(self, *, remaining: int) -> Plan:
        """The next round, `remaining` ids before max tokens."""
        gamma = min(self.controller.choose() if self.gamma is AUTO else self.gamma, remaining - 1)
        if self.gamma is AUTO and gamma == 0 and remaining > 1:
            # the draft model loses for now, but a prompt-lookup match beside it costs no
            # drafting (alone, lookup is what the controller judged, and it said no); in a
            # batch that decodes faster without drafts, its verify would make every lane wait
            beside = self.lookup is not None and self.draft_model and self.controller.batch.drafting()
            found = self._lookup(self._lookup_depth(0, remaining=remaining)) if beside else None
            if found is not None:
                return dataclasses.replace(found, timed=self._timed(found.gamma))
            # a pipelined stretch, as fast as standard decoding, until the controller wants
            # to probe again (timed: its length has changed); with lookup on, short enough
            # that a match the text makes is tried soon
            self._last_gamma = 0
            stretch = self.controller.plain_stretch()
            return Plan(plain=min(stretch, LOOKUP_STRETCH if beside else stretch, remaining))
        beside_auto = self.draft_model and self.gamma is AUTO  # a fixed --gamma is the longest path
        depth = self._lookup_depth(gamma, remaining=remaining) if beside_auto else gamma
        found = self._lookup(depth)
        if found is not None:
            return dataclasses.replace(found, timed=self._timed(depth))
        timed = self._timed(gamma)
        if not self.draft_model or gamma == 0:
            return Plan(timed=timed)  # the target reads and emits one id
        if self.tree:
            return self._tree_plan(gamma, remaining=remaining)
        stop_below = (
            self.stop
            if not isinstance(self.stop, Auto)
            else (self.controller.stop.next_threshold() if self._learning else 0.0)
        )
        return Plan(draft=gamma, stop_below=stop_below, read_confidences=self._learning, timed=timed or stop_below > 0)

    def _lookup(self, gamma: int) -> Plan | None:
        """Prompt lookup's proposal for a round of `gamma` (None: it found nothing): where the
        target reads trees and the lookup proposes tries, every continuation it found, as a
        trie of at most the tree's nodes; else a chain of `gamma` ids."""
        if self.lookup is None or gamma <= 0:
            return None
        if self.shape.reads_trees:
            found = self.lookup.trie(max(gamma, TREE_LOOKUP_NODES if isinstance(self.tree, Auto) else self.tree))
            if found is not None and found.depth > gamma:  # no deeper than the round may go (max tokens)
                found = found.subtree([n for n in range(1, len(found) + 1) if found.depths[n] <= gamma])
            if found is not None and not found.is_chain:
                return Plan(proposal_tree=found, lookup_source=self._lookup_source())
            proposal = found.ids[:gamma] if found is not None else ()
        else:
            proposal = self.lookup.chain(gamma)
        return Plan(proposal=tuple(proposal), lookup_source=self._lookup_source()) if proposal else None

    def _lookup_depth(self, gamma: int, *, remaining: int) -> int:
        """How deep a lookup proposal beside the draft model may go: as deep as its own rates
        say pays, never shallower than the model's round (alone, the controller's gamma is
        the lookup's own)."""
        return min(max(gamma, self.controller.lookup_length()), remaining - 1)

    def _lookup_source(self) -> str:
        """Where the lookup's latest proposal came from (the history index names it)."""
        return self.lookup.source

    def _tree_plan(self, depth: int, *, remaining: int) -> Plan:
        """A tree `depth` levels deep: a fixed size, or (auto) up to TREE_AUTO_MAX nodes sized
        each round from this machine's verify costs and the drafter's calibrated confidence,
        and (--gamma auto, greedy) up to shape.TREE_EXTRA_DEPTH levels deeper than the controller's chain
        (a tree raises each depth's acceptance: TreeShape.extra_depth), each level grown only
        while it pays."""
        if not isinstance(self.tree, Auto):
            return Plan(draft=depth, tree=self.tree, width=self.tree_width)
        controller, times = self.controller, self.controller.times
        if not times.most_verified:
            # Before any verify is timed, a chain; then a tree of at most twice the ids a timed
            # verify read. A tree sized on the prior's gently sloping curve is the dearest guess
            # where a verify of k ids costs about k steps (a 4-bit target on MLX's CPU backend,
            # CUDA's multi-token calls): there the blind first round read about nine nodes, for
            # ten plain steps, and the second as many again.
            return Plan(draft=depth)
        nodes = min(TREE_AUTO_MAX, 2 * times.most_verified)
        deeper = max(1, min(depth + self.shape.extra_depth, controller.config.max_gamma, remaining - 1))
        costs = tuple((times.verify_time(1 + k) or 0.0) + times.overhead for k in range(TREE_AUTO_MAX + 1))
        calibration = tuple(controller.tree_calibration.factors(deeper))
        return Plan(
            draft=deeper,
            tree=nodes,
            width=self.tree_width,
            tree_costs=costs if costs[0] > 0 else (),
            tree_calibration=calibration,
            tree_price=self._level_price(depth, calibration=calibration),
        )

    def _level_price(self, depth: int, *, calibration: tuple[float, ...]) -> LevelPrice | None:
        """What a tree's level must earn (LevelPrice), in tokens at the rate a round of
        `depth` is expected to emit them: its drafting (a draft step) and each node's verify
        (the verify curve's slope). None before the costs are timed: every level is read."""
        times = self.controller.times
        level, whole = times.draft_step(), times.round_time(depth)
        one, two = times.verify_time(1), times.verify_time(2)
        if level is None or whole is None or one is None or two is None or level <= 0 or whole <= 0:
            return None  # a line fitted on too few rounds may slope down: no price rather than a negative one
        rate = self.controller.expected_tokens(depth) / whole  # tokens a second
        return LevelPrice(level=level * rate, node=max(two - one, 0.0) * rate, calibration=calibration)

    def _timed(self, gamma: int) -> bool:
        """Time a round apart when the length changes, and every few rounds of one length:
        the split of a round into drafting and verifying costs a second host wait."""
        changed = gamma != self._last_gamma
        self._last_gamma = gamma
        self._untimed = 0 if changed or self._untimed + 1 >= TIME_EVERY else self._untimed + 1
        return self._untimed == 0

    def observe_round(self, outcome: Outcome) -> None:
        if self.lookup:
            self.lookup.hear(outcome.emitted)
        if outcome.reach_predicted:
            self.controller.tree_calibration.observe(predicted=outcome.reach_predicted, reached=outcome.accepted)
        plan = outcome.plan
        if (plan.proposal or plan.proposal_tree) and self.draft_model:
            # beside a draft model, a lookup round tells the verify's cost, not the model's rates
            self.controller.observe_verify(outcome)
        else:
            self.controller.observe_round(outcome, waited=self._learning and plan.stop_below > 0)
        if self._learning and plan.draft:
            self.controller.stop.observe(
                threshold=plan.stop_below,
                confidences=outcome.confidences or (),
                accepted=outcome.accepted,
                forwards=outcome.forwards,
                draft_seconds=outcome.draft_seconds,
            )

    def observe_prefill(self) -> None:
        """Both models read the prompt: the draft has nothing left to catch up on."""
        self.controller.observe_prefill()

    def observe_plain(self, token: int, seconds: float) -> None:
        if self.lookup:
            self.lookup.hear([token])
        self.controller.observe_plain(seconds)
