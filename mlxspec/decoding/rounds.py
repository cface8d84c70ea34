"""One speculative round, for a chain and a tree alike: a proposal (drafter.Drafts: a tree;
a chain is the tree whose nodes each have one child, every one drawn) is made, the target
reads its pending ids and every node in one forward, the rule picks the accepted path and
the next id, and both sides keep that path's rows alone (Cursor.keep_path, the one
rollback).

    propose - the drafter grows the plan's chain or tree (drafters/), or prompt lookup's
              chain or trie is taken as it is
    verify  - a chain: the vectorised rule (verify.speculative_sample / greedy_sample) over
              its rows, queued with the forward, one host wait per round; a tree: the walk
              from the root (verify.walk_tree), a wait per node it reaches under sampling.
              The chain's rule is the walk over a chain whose every node is drawn
              (tests/unit/test_tree_rule.py): the fast path, not another rule
    keep    - the target and the drafter keep the accepted path's rows; a drafter that did
              not propose hears what was emitted

MLX is lazy: a chain's drafted ids are queued with `mx.async_eval` as they are made and the
verify graph is built while the device drafts; the host waits once, for the outcome, or
twice in a round timed apart (once for the drafts), never once per token.

Under a grammar (grammar.py) the drafts are drawn from masked rows and read by the matcher
as they are made (a wait per draft), a prompt-lookup chain is cut before the first id the
grammar forbids, the target's rows are masked by the matcher's state after each node's
path, and the matcher then keeps only what was emitted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from ..grammar import Matcher
from .carry import Carry
from .cursor import TOKEN, Cursor, common_prefix, path_rows
from .drafter import Drafter, Drafts
from .plan import Outcome, Plan
from .sampling import SamplingParams, constrain, pick, warp
from .tree import TokenTree, best_size
from .verify import greedy_sample, speculative_sample, walk_tree

__all__ = ["run_round", "verify"]


def point_mass_rows(ids: mx.array, width: int) -> mx.array:
    """q for proposals that are certain (prompt lookup): one-hot rows (n, width). The rule then
    accepts x with probability p(x) and recovers from p with x removed."""
    return (mx.arange(width)[None, :] == ids[:, None]).astype(mx.float32)


def verify(
    cursor: Cursor,
    drafted: mx.array,
    draft_probs: mx.array | None,
    params: SamplingParams,
    key: mx.array,
    *,
    grammar: Matcher | None = None,
    grammar_mark: int = 0,
) -> tuple[mx.array, mx.array]:
    """The target reads pending + drafted in one pass; returns (accepted count, next id).
    Under a grammar its rows are masked by the matcher's states from `grammar_mark` (the
    round's start) through each draft: (gamma + 1, vocab), computed while the pass runs."""
    gamma = drafted.shape[0]
    inputs = mx.concatenate([mx.array(cursor.pending, dtype=TOKEN), drafted])
    logits = cursor.forward(inputs)[-(gamma + 1) :]
    if grammar is not None:
        mx.async_eval(logits)
        logits = constrain(logits, grammar.trail(grammar_mark))
    if gamma == 0:
        return mx.array(0), pick(logits[-1], params, key)[0]
    if params.greedy:
        return greedy_sample(drafted, mx.argmax(logits, axis=-1))
    return speculative_sample(drafted, draft_probs, warp(logits, params), key)


def run_round(target: Cursor, drafter: Drafter | None, plan: Plan, carry: Carry) -> Outcome:
    """One propose-verify-keep round over the plan's proposal, a chain or a tree. The
    drafter proposes when the plan says so (`plan.draft`); else prompt lookup's proposal is
    verified as point masses, and the drafter only hears what was emitted. On any exception
    both sides (and the grammar) are left as before the round."""
    params, key, eos_ids, grammar = carry.params, carry.key, carry.eos_ids, carry.grammar
    grows = plan.draft > 0 and drafter is not None
    caught_up = drafter.catch_up_if_behind() if grows else 0.0
    start = time.perf_counter()
    draft_key, rule_key = mx.random.split(key)
    if grows:
        nodes = plan.tree or plan.draft  # at most
    else:
        nodes = len(plan.proposal_tree) if plan.proposal_tree is not None else len(plan.proposal)
    target_mark, target_pending = target.cache.mark(reads=len(target.pending) + nodes), list(target.pending)
    draft_state = drafter.begin(plan) if grows else None
    grammar_mark = grammar.depth if grammar is not None else 0
    try:
        if grows:
            drafts = drafter.propose(plan, carry=carry.keyed(draft_key), state=draft_state)
        else:
            drafts = _lookup_drafts(plan, target.width, params, grammar)
        grown = grows and drafts is not None
        drafts = _NOTHING if drafts is None else drafts
        rule = _verify_chain if drafts.is_chain else _verify_tree  # the chain's fast path, or the walk
        verified = rule(target, drafts, plan, carry, rule_key, grammar_mark=grammar_mark, start=start)
        drafts, path, next_id = verified.drafts, verified.path, verified.next_id
        path_ids = verified.drafted[: len(path)] if drafts.is_chain else list(drafts.tree.path_ids(path))
        target.pending = target.keep_path(
            block=len(target_pending) + len(drafts),
            kept=path_rows(len(target_pending), path),
            ids=target_pending + path_ids,
            mark=target_mark,
        ) + [next_id]
        if grown:
            drafter.settle(draft_state, drafts=drafts, path=path, path_ids=path_ids, next_id=next_id)
        elif grows:
            drafter.undo(draft_state)
        elif drafter is not None:
            drafter.hear(path_ids + [next_id])
        emitted = _cut_at_eos(path_ids + [next_id], eos_ids)
        if grammar is not None:
            grammar.settle(grammar_mark, emitted)
    except BaseException:
        target.abandon(target_mark, target_pending)
        if grows:
            drafter.undo(draft_state)
        if grammar is not None:
            grammar.rollback_to(grammar_mark)
        raise
    seconds = time.perf_counter() - start
    return _outcome(
        plan,
        verified,
        path_ids,
        emitted,
        pending=len(target_pending),
        grown=grown,
        seconds=seconds,
        caught_up=caught_up,
    )


@dataclass
class Verified:
    """What the rule made of a proposal: the accepted path (node numbers), the next id, and
    the seconds spent drafting and verifying."""

    drafts: Drafts  # as verified (a tree sized down to what pays)
    path: list[int]
    next_id: int
    draft_seconds: float
    verify_seconds: float
    drafted: list[int] = field(default_factory=list)  # a chain's ids, read back with the outcome
    confidences: tuple[float, ...] | None = None


def _outcome(
    plan: Plan,
    verified: Verified,
    path_ids: list[int],
    emitted: list[int],
    *,
    pending: int,
    grown: bool,
    seconds: float,
    caught_up: float,
) -> Outcome:
    """The round as it happened; a tree's adds its shape and what its first choices did."""
    drafts, path = verified.drafts, verified.path
    common = {
        "plan": plan,
        "accepted": len(path),
        "next_id": verified.next_id,
        "emitted": tuple(emitted),
        "verified": pending + len(drafts),
        "seconds": seconds,
        "catch_up_seconds": caught_up,
    }
    if drafts.is_chain:
        return Outcome(
            **common,
            drafted=tuple(verified.drafted),
            draft_seconds=verified.draft_seconds if plan.timed else None,
            verify_seconds=verified.verify_seconds if plan.timed else None,
            early_stop=grown and drafts.read_all,
            confidences=verified.confidences,
        )
    tree = drafts.tree
    stop = path[-1] if path else 0
    tried = tree.children[stop][:1]  # the first child the walk tried where it stopped
    first = tree.first_choices if grown else ()
    return Outcome(
        **common,
        drafted=tuple(path_ids + tree.path_ids(list(tried))),
        draft_seconds=verified.draft_seconds,
        verify_seconds=verified.verify_seconds,
        nodes=len(tree),
        branches=_branches(tree, path),
        reach_predicted=tuple(drafts.reach()) if drafts.values else (),
        first_choices=len(first),
        levels=drafts.levels if grown else 0,
        first_choices_accepted=common_prefix(path, list(first)),  # the chain's leading ids the walk took
    )


_NOTHING = Drafts.of_tree(TokenTree.chain(()))  # a drafter that grew no tree: the target reads its pending ids


def _lookup_drafts(plan: Plan, width: int, params: SamplingParams, grammar: Matcher | None) -> Drafts:
    """Prompt lookup's proposal: its trie, or its chain (cut before the first id the grammar
    forbids) as point masses."""
    if plan.proposal_tree is not None:
        return Drafts.of_tree(plan.proposal_tree)
    proposal = list(plan.proposal)
    if grammar is not None:
        proposal = proposal[: grammar.walk(proposal)]
    ids = mx.array(proposal, dtype=TOKEN)
    return Drafts(ids, None if params.greedy or not proposal else point_mass_rows(ids, width))


def _verify_chain(
    target: Cursor, drafts: Drafts, plan: Plan, carry: Carry, key: mx.array, *, grammar_mark: int, start: float
) -> Verified:
    """The fast path: the vectorised rule over the chain's rows, queued with the forward;
    the host waits once for the drafts and the outcome together (twice when timed apart)."""
    n = len(drafts)
    accepted, next_id = verify(
        target, drafts.ids, drafts.rows, carry.params, key, grammar=carry.grammar, grammar_mark=grammar_mark
    )
    outcome = mx.concatenate([drafts.ids, accepted.astype(TOKEN)[None], next_id.astype(TOKEN)[None]])
    if plan.timed:
        # waiting for the drafts before the outcome times the two apart; queued together,
        # MLX signals completion once, for the whole graph
        mx.eval(drafts.ids, *([drafts.confidences] if drafts.confidences is not None else []))
    drafted_at = time.perf_counter()
    values = outcome.tolist()
    done_at = time.perf_counter()
    confidences = tuple(drafts.confidences.tolist()) if drafts.confidences is not None else None
    return Verified(
        drafts=drafts,
        path=list(range(1, values[n] + 1)),
        next_id=values[n + 1],
        draft_seconds=drafted_at - start,
        verify_seconds=done_at - drafted_at,
        drafted=values[:n],
        confidences=confidences,
    )


def _verify_tree(
    target: Cursor, drafts: Drafts, plan: Plan, carry: Carry, key: mx.array, *, grammar_mark: int, start: float
) -> Verified:
    """The walk: the target reads the tree in one forward (each node at its depth, seeing
    its ancestors), sized first to what pays under `--tree auto` (tree.best_size)."""
    drafted_at = time.perf_counter()
    if plan.tree_costs and drafts.values:
        drafts = drafts.best(
            best_size(
                drafts.values_ranked(),
                drafts.depths_ranked(),
                calibration=plan.tree_calibration,
                costs=plan.tree_costs,
                drafting=drafted_at - start,
            )
        )
    tree, grammar = drafts.tree, carry.grammar
    logits = target.forward_tree(drafts.ids, tree)
    if grammar is not None:  # each node's row masked by the grammar's state after its path
        mx.async_eval(logits)
        logits = constrain(logits, grammar.tree_masks(tree))
    path, next_id = walk_tree(tree, logits, carry.params, key, drawn=drafts.drawn())
    verify_seconds = time.perf_counter() - drafted_at
    return Verified(drafts, path, next_id, draft_seconds=drafted_at - start, verify_seconds=verify_seconds)


def _branches(tree: TokenTree, path: list[int]) -> tuple[tuple[int, ...], ...]:
    """The paths not taken, each from where it leaves the accepted path: every leaf off the
    path, as ids from the fork on (race shows them with --show-rejected)."""
    on_path = {0, *path}
    leaves = [n for n in range(1, len(tree) + 1) if not tree.children[n]]
    out = []
    for leaf in leaves:
        nodes = tree.ancestors(leaf)
        off = [n for n in nodes if n not in on_path]
        if off:
            out.append(tuple(tree.path_ids(off)))
    return tuple(out)


def _cut_at_eos(ids: list[int], eos_ids: frozenset[int]) -> list[int]:
    for i, token in enumerate(ids):
        if token in eos_ids:
            return ids[: i + 1]
    return ids
