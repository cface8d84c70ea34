"""One speculative round, in three module-level steps that take their state explicitly:

    draft   - the draft proposes up to gamma ids one at a time, keeping its rows q
    verify  - the target reads its pending ids and all drafts in one forward pass; the rule
              (verify.py) picks how many drafts to keep and the next id
    rewind  - both caches forget what was rejected (caches.py, through the cursors)

MLX is lazy: drafted ids are queued with `mx.async_eval` as they are made and the verify
graph is built while the device drafts; the host waits once, for the outcome, or twice in a
round timed apart (once for the drafts), never once per token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx

from .cursor import TOKEN, Cursor
from .drafting import Outcome, Plan
from .sampling import SamplingParams, sample, warp
from .verify import greedy_sample, speculative_sample


def pick(logits: mx.array, params: SamplingParams, key: mx.array) -> tuple[mx.array, mx.array | None]:
    """One id from the last row of logits, and the distribution it was drawn from."""
    if params.greedy:
        return mx.argmax(logits, axis=-1), None
    probs = warp(logits, params)
    return sample(probs, key), probs


@dataclass
class Drafts:
    ids: mx.array  # (n,) the proposals
    rows: mx.array | None  # (n, vocab) q: the rows they were sampled from (None when greedy)
    read_all: bool  # the draft read all of them (it stopped early), not all but the last
    confidences: mx.array | None  # (n,) its top probability at each, left on the device


def draft(
    cursor: Cursor,
    *,
    count: int,
    params: SamplingParams,
    key: mx.array,
    stop_below: float = 0.0,
    read_confidences: bool = False,
) -> Drafts:
    """The draft proposes up to `count` ids. It reads its pending ids first and each draft
    but the last after.

    Confidence is the draft's top probability for the id it proposes next. `stop_below` > 0
    stops early when it falls below: those are the proposals most often rejected. Deciding
    needs the value on the host, one wait per draft step. The rule stays exact: when to stop
    depends on the draft alone, never on the target."""
    keys = mx.random.split(key, count)
    inputs = mx.array(cursor.pending, dtype=TOKEN)
    cursor.pending, cursor.heard = [], 0
    ids, rows, confidences = [], [], []
    stopped = False
    for i in range(count):
        logits = cursor.forward(inputs)[-1]
        token, probs = pick(logits, params, keys[i])
        if stop_below > 0 or read_confidences:
            confidence = (probs if probs is not None else mx.softmax(logits.astype(mx.float32))).max()
            if stop_below > 0 and confidence.item() < stop_below:
                stopped = True
                break
            confidences.append(confidence)
        mx.async_eval(token)
        ids.append(token)
        rows.append(probs)
        inputs = token[None]
    if not ids:
        return Drafts(mx.array([], dtype=TOKEN), None, stopped, None)
    return Drafts(
        mx.stack(ids).astype(TOKEN),
        None if params.greedy else mx.stack(rows),
        stopped,
        mx.stack(confidences) if read_confidences and confidences else None,
    )


def point_mass_rows(ids: mx.array, width: int) -> mx.array:
    """q for proposals that are certain (prompt lookup): one-hot rows (n, width). The rule then
    accepts x with probability p(x) and recovers from p with x removed."""
    return (mx.arange(width)[None, :] == ids[:, None]).astype(mx.float32)


def verify(
    cursor: Cursor, drafted: mx.array, draft_probs: mx.array | None, params: SamplingParams, key: mx.array
) -> tuple[mx.array, mx.array]:
    """The target reads pending + drafted in one pass; returns (accepted count, next id)."""
    gamma = drafted.shape[0]
    inputs = mx.concatenate([mx.array(cursor.pending, dtype=TOKEN), drafted])
    logits = cursor.forward(inputs)[-(gamma + 1) :]
    if gamma == 0:
        return mx.array(0), pick(logits[-1], params, key)[0]
    if params.greedy:
        return greedy_sample(drafted, mx.argmax(logits, axis=-1))
    return speculative_sample(drafted, draft_probs, warp(logits, params), key)


def run_round(
    target: Cursor,
    drafter: Cursor | None,
    plan: Plan,
    *,
    params: SamplingParams,
    key: mx.array,
    eos_ids: frozenset[int],
) -> Outcome:
    """One propose-verify-rewind round. The draft model proposes when the plan says so;
    a prompt-lookup proposal is verified as point masses, and the draft model only hears
    what was emitted. On any exception both cursors are left as before the round."""
    use_model = plan.draft > 0 and drafter is not None
    caught_up = drafter.catch_up_if_behind() if use_model else 0.0
    start = time.perf_counter()
    draft_key, rule_key = mx.random.split(key)
    verify_reads = len(target.pending) + (plan.draft if use_model else len(plan.proposal))
    target_mark, target_pending = target.cache.mark(reads=verify_reads), list(target.pending)
    if use_model:
        draft_mark, draft_pending = drafter.cache.mark(reads=len(drafter.pending) + plan.draft), list(drafter.pending)
    try:
        if use_model:
            drafts = draft(
                drafter,
                count=plan.draft,
                params=params,
                key=draft_key,
                stop_below=plan.stop_below,
                read_confidences=plan.read_confidences,
            )
            draft_probs = drafts.rows
        else:
            drafts = Drafts(mx.array(plan.proposal, dtype=TOKEN), None, False, None)
            draft_probs = None if params.greedy or not plan.proposal else point_mass_rows(drafts.ids, target.width)
        n = drafts.ids.shape[0]
        accepted, next_id = verify(target, drafts.ids, draft_probs, params, rule_key)
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
            # the draft read its pending ids and its drafts but the last (all, if it stopped early)
            read = n if drafts.read_all else max(n - 1, 0)
            drafter.tokens += draft_pending + drafted_ids[:read]
            kept = min(accepted, read)
            again = drafter.rewind(len(drafter.tokens) - (read - kept), draft_mark)
            drafter.pending = again + drafted_ids[kept:accepted] + [next_id]
        elif drafter is not None:
            drafter.hear(drafted_ids[:accepted] + [next_id])
    except BaseException:
        target.abandon(target_mark, target_pending)
        if use_model:
            drafter.abandon(draft_mark, draft_pending)
        raise
    emitted = _cut_at_eos(drafted_ids[:accepted] + [next_id], eos_ids)
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


def _cut_at_eos(ids: list[int], eos_ids: frozenset[int]) -> list[int]:
    for i, token in enumerate(ids):
        if token in eos_ids:
            return ids[: i + 1]
    return ids
