"""A separate draft model as the drafter: a cursor over its own cache that reads the ids the
target emits and proposes the next ones, one forward per id."""

from __future__ import annotations

import mlx.core as mx

from ..cursor import TOKEN, Cursor
from ..grammar import Matcher
from ..sampling import SamplingParams, constrain
from .base import Drafts
from .sampling import confidence_of, pick


class ModelDrafter(Cursor):
    kind = "model"

    def begin(self, count: int):
        # the draft reads its pending ids and up to `count` drafts
        return self.cache.mark(reads=len(self.pending) + count), list(self.pending)

    def propose(
        self,
        *,
        count: int,
        params: SamplingParams,
        key: mx.array,
        stop_below: float = 0.0,
        read_confidences: bool = False,
        grammar: Matcher | None = None,
    ) -> Drafts:
        """Up to `count` ids. It reads its pending ids first and each draft but the last after.

        Confidence is the draft's top probability for the id it proposes next. `stop_below` > 0
        stops early when it falls below: those are the proposals most often rejected. Deciding
        needs the value on the host, one wait per draft step. The rule stays exact: when to
        stop depends on the draft alone, never on the target.

        Under a `grammar` each step is drawn from the logits masked by the matcher's state,
        which then reads the id drawn (one wait per step; the mask is computed while the
        forward runs); drafting stops where the grammar allows nothing the draft can say."""
        keys = mx.random.split(key, count)
        inputs = mx.array(self.pending, dtype=TOKEN)
        self.pending, self.heard = [], 0
        ids, rows, confidences = [], [], []
        stopped = False
        for i in range(count):
            logits = self.forward(inputs)[-1]
            allowed = None
            if grammar is not None:
                mx.async_eval(logits)  # the device runs the forward while the host computes the mask
                allowed = grammar.allowed()
            logits = constrain(logits, allowed)
            token, probs = pick(logits, params, keys[i])
            if stop_below > 0 or read_confidences:
                confidence = confidence_of(logits, probs)
                if stop_below > 0 and confidence.item() < stop_below:
                    stopped = True
                    break
                confidences.append(confidence)
            if grammar is not None and not grammar_reads(grammar, allowed, token, logits):
                stopped = True  # nothing allowed within the draft's vocabulary
                confidences = confidences[: len(ids)]
                break
            mx.async_eval(token)
            ids.append(token)
            rows.append(probs)
            inputs = token[None]
        return stack_drafts(ids, rows, confidences, params=params, stopped=stopped, read_confidences=read_confidences)

    def settle(self, state, *, drafted: list[int], accepted: int, next_id: int, read_all: bool) -> None:
        mark, pending = state
        n = len(drafted)
        # it read its pending ids and its drafts but the last (all, if it stopped early)
        read = n if read_all else max(n - 1, 0)
        self.tokens += pending + drafted[:read]
        kept = min(accepted, read)
        again = self.rewind(len(self.tokens) - (read - kept), mark)
        self.pending = again + drafted[kept:accepted] + [next_id]

    def undo(self, state) -> None:
        mark, pending = state
        self.abandon(mark, pending)


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
