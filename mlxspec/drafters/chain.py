"""The step loop every model-backed drafter runs to propose a chain, written once: a draft
model (model.py) and the heads (eagle3.py, mtp.py) differ only in what one step reads and
in how their ids and rows map to the target's.

Each step draws an id from the drafter's logits (`pick`: argmax, or a draw from the warped
row, which is the q the rule compares), queued with `mx.async_eval` so that the device
drafts while the host builds the next step. Where the drafter's confidence is read (an
early stop below `stop_below`, or the confidences brought back for learning it) each step
waits for it; under a grammar each step's row is masked by the matcher's state, which
reads the id drawn (a wait per step, the mask computed while the forward runs), and the
chain stops where the grammar allows nothing the drafter can say. When to stop depends on
the drafter alone, never on the target: the rule stays exact.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from ..decoding.carry import Carry
from ..decoding.cursor import TOKEN
from ..decoding.drafter import Drafts
from ..decoding.sampling import SamplingParams, confidence_of, constrain, pick
from ..grammar import Matcher


def propose_chain(
    step: Callable[[int], mx.array],
    feed: Callable[[mx.array], None],
    *,
    count: int,
    carry: Carry,
    stop_below: float = 0.0,
    read_confidences: bool = False,
    to_target: mx.array | None = None,
    target_ids=slice(None),
    target_row: Callable[[mx.array | None], mx.array | None] = lambda probs: probs,
) -> Drafts:
    """Up to `count` ids. `step(i)` runs the drafter's i-th forward and returns its last row
    of logits, (its vocab,); `feed(id)` gives it the id drawn, for the next step to read.
    A drafter over part of the target's vocabulary maps its ids to the target's
    (`to_target`, on the device; `target_ids`, the same on the host, where the grammar's
    mask is read) and its rows onto the target's ids (`target_row`)."""
    params, grammar = carry.params, carry.grammar
    keys = mx.random.split(carry.key, count)
    ids, rows, confidences = [], [], []
    stopped = False
    for i in range(count):
        logits = step(i)
        allowed = None
        if grammar is not None:
            mx.async_eval(logits)  # the device runs the forward while the host computes the mask
            allowed = grammar.allowed()
            logits = constrain(logits, allowed[target_ids])
        choice, probs = pick(logits, params, keys[i])
        if stop_below > 0 or read_confidences:
            confidence = confidence_of(logits, probs)
            if stop_below > 0 and confidence.item() < stop_below:
                stopped = True
                break
            confidences.append(confidence)
        token = choice if to_target is None else to_target[choice]
        if grammar is not None and not grammar_reads(grammar, allowed, token, logits):
            stopped = True  # nothing allowed within the drafter's vocabulary
            confidences = confidences[: len(ids)]
            break
        mx.async_eval(token)
        ids.append(token)
        rows.append(target_row(probs))
        if i + 1 < count:
            feed(token)
    return stack_drafts(ids, rows, confidences, params=params, stopped=stopped, read_confidences=read_confidences)


def grammar_reads(grammar: Matcher, allowed, token: mx.array, logits: mx.array) -> bool:
    """The matcher reads a drafted id; False (and nothing read) when the grammar allows
    nothing the drafter's masked `logits` cover: its row would be 0/0, and an id drawn from
    it is no sample of q (the rule would accept it whatever p says)."""
    covered = mx.isfinite(logits).any()
    mx.eval(token, covered)
    value = token.item()
    if not covered.item() or not allowed[value]:
        return False
    grammar.consume(value)
    return True


def stack_drafts(ids, rows, confidences, *, params: SamplingParams, stopped: bool, read_confidences: bool) -> Drafts:
    if not ids:
        return Drafts(mx.array([], dtype=TOKEN), None, stopped, None)
    return Drafts(
        mx.stack(ids).astype(TOKEN),
        None if params.greedy else mx.stack(rows),
        stopped,
        mx.stack(confidences) if read_confidences and confidences else None,
    )
