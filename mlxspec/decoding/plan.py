"""What the round loop and a drafting policy say to each other: a policy hands the loop a
`Plan` for the next round, the loop runs it and hands back an `Outcome`. Plain values only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .tree import LevelPrice, TokenTree

# who proposed a round's ids: the draft model, prompt lookup (the current prompt and answer),
# the history index (earlier prompts and answers), or nobody ("target")
MODEL, NGRAM, HISTORY, TARGET = "model", "ngram", "history", "target"


@dataclass(frozen=True)
class Plan:
    """One of: the draft model proposes `draft` ids; or `proposal` (prompt lookup) is
    verified as it is; or `plain` steps of standard decoding; or, with all empty, the target
    reads its pending ids and emits one id (a round that proposes nothing)."""

    draft: int = 0  # ids the draft model proposes, at most
    proposal: tuple[int, ...] = ()  # ids found by prompt lookup
    proposal_tree: TokenTree | None = None  # or the continuations it found, as a trie
    lookup_source: str = NGRAM  # where lookup found them (NGRAM or HISTORY)
    plain: int = 0  # pipelined plain decoding steps instead of a round
    stop_below: float = 0.0  # the draft stops when its confidence in its next id is lower
    read_confidences: bool = False  # bring the draft's confidences back with the outcome
    timed: bool = True  # wait for the drafts apart, to time drafting and verifying apart
    tree: int = 0  # the draft model proposes a tree of at most this many nodes, `draft` levels deep
    width: int = 0  # in a tree, children drawn per node and nodes expanded per level
    # `--tree auto`: seconds of a round verifying k nodes (k = 0 .. tree), and the drafter's
    # confidence correction per depth; the round keeps the k that pays best (tree.best_size)
    tree_costs: tuple[float, ...] = ()
    tree_calibration: tuple[float, ...] = ()
    # and a level is grown only while its frontier may add the tokens its drafting and its
    # nodes' verify cost: deep levels of little promise are not drafted (None: every level)
    tree_price: LevelPrice | None = None

    @property
    def gamma(self) -> int:
        """The round's draft length (a trie's depth)."""
        return self.draft or len(self.proposal) or (self.proposal_tree.depth if self.proposal_tree else 0)

    @property
    def drafter_rows(self) -> int:
        """Rows the drafter may read in the round past its pending ids: a chain's drafts, or
        every row a tree's levels may hold."""
        return self.tree + self.width * self.draft if self.tree else self.draft


@dataclass(frozen=True)
class Outcome:
    """A round, as it happened."""

    plan: Plan
    drafted: tuple[int, ...]  # ids proposed (by the draft model or prompt lookup)
    accepted: int  # leading drafted ids the rule accepted
    next_id: int  # the recovered or bonus id (the target's own id if nothing was drafted)
    emitted: tuple[int, ...]  # accepted ids and the next id, cut after an end-of-sequence id
    verified: int  # ids the target read in its pass (its pending ids and the drafts)
    seconds: float  # the whole round, the draft's catching up excluded
    draft_seconds: float | None  # None when the round was not timed apart
    verify_seconds: float | None
    early_stop: bool = False  # the draft stopped short of the plan, unsure of its next id
    confidences: tuple[float, ...] | None = None  # the draft's, per proposal (when asked for)
    catch_up_seconds: float = 0.0  # the draft reading heard ids before the round (not in `seconds`)
    nodes: int = 0  # a tree's nodes verified (0: a chain, whose nodes are its drafts)
    reach_predicted: tuple[float, ...] = ()  # a tree's summed confidence per depth (drafting/tree_budget.py)
    branches: tuple[tuple[int, ...], ...] = ()  # a tree's paths not taken, each from the path's fork
    # a drafter's tree: its first choices' chain (Tree.first_choices), and how many of them
    # the walk accepted, leading: what a chain of them would have shown in this round
    first_choices: int = 0
    first_choices_accepted: int = 0
    levels: int = 0  # a drafter's tree: the levels it grew, one forward each

    @property
    def source(self) -> str:
        if not self.drafted:
            return TARGET
        return MODEL if self.plan.draft else self.plan.lookup_source

    @property
    def forwards(self) -> int:
        """The draft model's forward passes: one per proposal, one more when it stopped early."""
        return len(self.drafted) + self.early_stop if self.plan.draft else 0


class Planner(Protocol):
    """What the round loop asks of a drafting policy (drafting/policy.py): the next round's
    plan, `remaining` ids before max tokens, and how each went."""

    def plan(self, *, remaining: int) -> Plan: ...
    def observe_prefill(self) -> None: ...
    def observe_round(self, outcome: Outcome) -> None: ...
    def observe_plain(self, token: int, seconds: float) -> None: ...
