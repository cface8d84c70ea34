"""One speculative round, in three module-level steps that take their state explicitly:

    draft   - the drafter (drafters/) proposes up to gamma ids one at a time, keeping its rows q
    verify  - the target reads its pending ids and all drafts in one forward pass; the rule
              (verify.py) picks how many drafts to keep and the next id
    rewind  - both caches forget what was rejected (caches.py, through the cursors)

MLX is lazy: drafted ids are queued with `mx.async_eval` as they are made and the verify
graph is built while the device drafts; the host waits once, for the outcome, or twice in a
round timed apart (once for the drafts), never once per token.

Under a grammar (grammar.py) the drafts are drawn from masked rows and read by the matcher
as they are made (a wait per draft), a prompt-lookup proposal is cut before the first id the
grammar forbids, the target is verified with the masks of the drafted prefix, and the
matcher then keeps only what was emitted.
"""

from __future__ import annotations

import time

import mlx.core as mx

from ..grammar import Matcher
from .carry import Carry
from .cursor import TOKEN, Cursor, common_prefix
from .drafter import Drafter, Drafts, TreeDrafter, TreeDrafts
from .plan import Outcome, Plan
from .sampling import SamplingParams, constrain, pick, warp
from .tree import TokenTree, best_size
from .verify import greedy_sample, speculative_sample, walk_tree

__all__ = ["run_round", "run_tree_round", "verify"]


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
    """One propose-verify-rewind round. The drafter proposes when the plan says so; a
    prompt-lookup proposal is verified as point masses, and the drafter only hears what was
    emitted. On any exception both sides (and the grammar) are left as before the round."""
    params, key, eos_ids, grammar = carry.params, carry.key, carry.eos_ids, carry.grammar
    use_model = plan.draft > 0 and drafter is not None
    caught_up = drafter.catch_up_if_behind() if use_model else 0.0
    start = time.perf_counter()
    draft_key, rule_key = mx.random.split(key)
    verify_reads = len(target.pending) + (plan.draft if use_model else len(plan.proposal))
    target_mark, target_pending = target.cache.mark(reads=verify_reads), list(target.pending)
    draft_state = drafter.begin(plan.draft) if use_model else None
    grammar_mark = grammar.depth if grammar is not None else 0
    try:
        if use_model:
            drafts = drafter.propose(
                count=plan.draft,
                carry=carry.keyed(draft_key),
                stop_below=plan.stop_below,
                read_confidences=plan.read_confidences,
            )
            draft_probs = drafts.rows
        else:
            proposal = list(plan.proposal)
            if grammar is not None:  # cut before the first id the grammar forbids
                proposal = proposal[: grammar.walk(proposal)]
            drafts = Drafts(mx.array(proposal, dtype=TOKEN), None, False, None)
            draft_probs = None if params.greedy or not proposal else point_mass_rows(drafts.ids, target.width)
        n = drafts.ids.shape[0]
        accepted, next_id = verify(
            target, drafts.ids, draft_probs, params, rule_key, grammar=grammar, grammar_mark=grammar_mark
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
        drafted_ids, accepted, next_id = values[:n], values[n], values[n + 1]

        target.tokens += target_pending + drafted_ids
        target.pending = target.rewind(len(target.tokens) - (n - accepted), target_mark) + [next_id]
        if use_model:
            drafter.settle(
                draft_state, drafted=drafted_ids, accepted=accepted, next_id=next_id, read_all=drafts.read_all
            )
        elif drafter is not None:
            drafter.hear(drafted_ids[:accepted] + [next_id])
        emitted = _cut_at_eos(drafted_ids[:accepted] + [next_id], eos_ids)
        if grammar is not None:
            grammar.settle(grammar_mark, emitted)
    except BaseException:
        target.abandon(target_mark, target_pending)
        if use_model:
            drafter.undo(draft_state)
        if grammar is not None:
            grammar.rollback_to(grammar_mark)
        raise
    return Outcome(
        plan=plan,
        drafted=tuple(drafted_ids),
        accepted=accepted,
        next_id=next_id,
        emitted=tuple(emitted),
        verified=len(target_pending) + n,
        seconds=time.perf_counter() - start,
        draft_seconds=drafted_at - start if plan.timed else None,
        verify_seconds=done_at - drafted_at if plan.timed else None,
        early_stop=use_model and drafts.read_all,
        confidences=confidences,
        catch_up_seconds=caught_up,
    )


def run_tree_round(target: Cursor, drafter: TreeDrafter | None, plan: Plan, carry: Carry) -> Outcome:
    """One round over a tree: the drafter grows a tree of at most `plan.tree` nodes (or
    prompt lookup's trie is taken as it is), the target reads it in one forward (each node
    at its depth, seeing its ancestors), the rule walks it from the root (verify.py), and
    both sides keep the accepted path alone; a drafter that did not propose hears what was
    emitted. On any exception both sides are left as before the round."""
    params, key, eos_ids, grammar = carry.params, carry.key, carry.eos_ids, carry.grammar
    grows = plan.proposal_tree is None
    caught_up = drafter.catch_up_if_behind() if grows else 0.0
    start = time.perf_counter()
    draft_key, key = mx.random.split(key)
    nodes = plan.tree if grows else len(plan.proposal_tree)
    target_mark, target_pending = target.cache.mark(reads=len(target.pending) + nodes), list(target.pending)
    grammar_mark = grammar.depth if grammar is not None else 0
    # the drafter reads its pending ids, then every row its levels may hold
    draft_state = drafter.begin_tree(plan.tree + plan.width * plan.draft) if grows else None
    try:
        if grows:
            drafts = drafter.propose_tree(
                depth=plan.draft,
                budget=plan.tree,
                width=plan.width,
                carry=carry.keyed(draft_key),
                state=draft_state,
                price=plan.tree_price,
            )
        else:
            drafts = TreeDrafts(tree=plan.proposal_tree)
        drafted_at = time.perf_counter()
        if drafts is not None and plan.tree_costs:
            drafts = drafts.best(
                best_size(
                    drafts.values_ranked(),
                    drafts.depths_ranked(),
                    calibration=plan.tree_calibration,
                    costs=plan.tree_costs,
                    drafting=drafted_at - start,
                )
            )
        tree = drafts.tree if drafts is not None else TokenTree.chain(())
        logits = target.forward_tree(mx.array(tree.ids, dtype=TOKEN), tree)
        if grammar is not None:  # each node's row masked by the grammar's state after its path
            mx.async_eval(logits)
            logits = constrain(logits, grammar.tree_masks(tree))
        spine = drafts.spine if drafts is not None else ()
        drawn = {tree.parents[n - 1]: (n, drafts.spine_rows[i]) for i, n in enumerate(spine)}
        path, next_id = walk_tree(tree, logits, params, key, drawn=drawn)
        done_at = time.perf_counter()
        path_ids = tree.path_ids(path)
        target.keep_tree_path(tree, path, path_ids, pending=target_pending)
        target.pending = [next_id]
        if grows and drafts is not None:
            drafter.settle_tree(draft_state, drafts=drafts, path=path, next_id=next_id)
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
    stop = path[-1] if path else 0
    tried = tree.children[stop][:1]  # the first child the walk tried where it stopped
    first = tree.first_choices if grows else ()
    return Outcome(
        plan=plan,
        drafted=tuple(path_ids + tree.path_ids(list(tried))),
        accepted=len(path),
        next_id=next_id,
        emitted=tuple(emitted),
        verified=len(target_pending) + len(tree),
        seconds=time.perf_counter() - start,
        draft_seconds=drafted_at - start,
        verify_seconds=done_at - drafted_at,
        catch_up_seconds=caught_up,
        nodes=len(tree),
        branches=_branches(tree, path),
        reach_predicted=tuple(drafts.reach()) if drafts is not None and drafts.values else (),
        first_choices=len(first),
        levels=drafts.levels if grows and drafts is not None else 0,
        first_choices_accepted=common_prefix(path, list(first)),  # the chain's leading ids the walk took
    )


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
