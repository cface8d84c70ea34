"""Speculative and standard decoding as generators of events, over token ids.

State lives in `Cursor`s (a model, its cache, the ids the cache holds and the ids it has
yet to read), never in the model objects, so two decoders can share one target (race) and
a chat keeps its caches between turns. The round is three module-level steps:

    draft   - the draft proposes up to gamma ids one at a time, keeping its rows q
    verify  - the target reads its pending ids plus all drafts in one forward pass;
              the rule (verify.py) picks how many drafts to keep and the next id
    rewind  - both caches forget what was rejected (caches.py)

MLX is lazy: drafted ids are queued with `mx.async_eval` as they are made, the verify
graph is built while the device drafts, and the host waits twice per round, once for the
drafts (to time them apart) and once for the outcome, never once per token.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx
from mlx_lm.generate import generation_stream

from .caches import CacheOptions, Mark, ModelCache
from .controller import Controller
from .events import Prefill, Round
from .ngram import NGramIndex
from .sampling import SamplingParams, sample, warp
from .verify import greedy_sample, speculative_sample

PREFILL_STEP = 512
# Prompt ends remembered per cursor, for caches that cannot trim back: the last one serves
# the next turn of a chat and a retried prompt, the one before it an undone turn.
CHECKPOINTS = 2
_TOKEN = mx.uint32


@dataclass(frozen=True)
class Checkpoint:
    """A state to come back to and the ids the cache held when it was taken."""

    ids: tuple[int, ...]
    mark: Mark


class Cursor:
    """A model, its cache, the ids in that cache and the ids it has not read yet.

    `width` is the logit width the engine works in (the target's); `table` is the number of
    ids this model can embed. A draft with a narrower table than the ids it is shown (Qwen
    pads large models' embeddings wider) reads a placeholder for those ids: its view of the
    text is slightly wrong, which costs acceptance but never exactness.

    Invariant: the cache holds exactly `tokens`, and restoring a checkpoint gives a cache
    holding exactly its `ids`. So a checkpoint is restored only when its ids are a prefix of
    both the ids the cache holds and the new history (the layers it has no snapshot of are
    trimmed back, so they must hold those ids too): one the cache was trimmed below and then
    refilled with other ids describes another text, and is passed over, never restored.
    """

    def __init__(self, model, name: str, table: int, width: int, *, cache_options: CacheOptions = CacheOptions()):
        self.model = model
        self.name = name
        self.table = table
        self.width = width
        self.cache_options = cache_options
        self.reset()

    def reset(self) -> None:
        self.cache: ModelCache = self.cache_options.make(self.model, self.name)
        self.tokens: list[int] = []
        self.pending: list[int] = []
        # Where recent prefills ended, newest last, for caches that cannot trim back
        # (wrapped windows, recurrent state): the next prompt usually extends one (chat).
        self.checkpoints: list[Checkpoint] = []

    @property
    def history(self) -> list[int]:
        return self.tokens + self.pending

    def forward(self, ids: mx.array) -> mx.array:
        """Feed ids (n,) to the model; returns logits (n, width)."""
        if self.table < self.width:
            ids = mx.where(ids < self.table, ids, 0)
        logits = self.model(ids[None], cache=self.cache.layers)[0]
        self.cache.length += ids.shape[0]
        return _to_width(logits, self.width)

    def sync(self, ids: list[int]) -> int:
        """Make history == ids, keeping what the cache already holds of them, and leave at
        least the last id pending. Returns how many ids were reused from the cache."""
        with self.atomic(ids):
            common = 0
            limit = min(len(self.tokens), len(ids) - 1)
            while common < limit and self.tokens[common] == ids[common]:
                common += 1
            if common < len(self.tokens):
                if self.cache.trim_to(common):
                    del self.tokens[common:]
                elif (checkpoint := self._checkpoint_within(ids[:common])) is not None:
                    self.cache.restore(checkpoint.mark)
                    del self.tokens[len(checkpoint.ids) :]
                else:  # a state that cannot be trimmed: read everything again
                    self.reset()
            self.pending = list(ids[len(self.tokens) :])
        return len(self.tokens)

    def _checkpoint_within(self, prefix: list[int]) -> Checkpoint | None:
        """The longest checkpoint whose ids start `prefix` (ids the cache holds)."""
        fits = [c for c in self.checkpoints if len(c.ids) <= len(prefix) and tuple(prefix[: len(c.ids)]) == c.ids]
        return max(fits, key=lambda c: len(c.ids), default=None)

    def prefill(self, step: int = PREFILL_STEP) -> None:
        """Read all pending ids but the last, in chunks, and remember where a prompt ended."""
        self.catch_up(step)
        if self.cache.needs_snapshots:
            ids = tuple(self.tokens)
            others = [c for c in self.checkpoints if c.ids != ids]
            self.checkpoints = (others + [Checkpoint(ids, self.cache.mark())])[-CHECKPOINTS:]

    def catch_up(self, step: int = PREFILL_STEP) -> None:
        """Read all pending ids but the last, in chunks."""
        with self.atomic(self.history):
            while len(self.pending) > 1:
                chunk = self.pending[: min(step, len(self.pending) - 1)]
                self.forward(mx.array(chunk, dtype=_TOKEN))
                mx.eval(self.cache.state)
                self.tokens += chunk
                del self.pending[: len(chunk)]
                mx.clear_cache()

    @contextmanager
    def atomic(self, history: list[int]):
        """On any exception inside (Ctrl-C above all), drop the cache and make `history` the
        ids to read next time: the cursor stays truthful about what its cache holds."""
        try:
            yield
        except BaseException:
            self.invalidate(list(history))
            raise

    def rewind(self, keep: int, mark) -> list[int]:
        """Keep the first `keep` ids; returns ids that must be read again (put them back in
        front of pending) when the cache had to go back to `mark`."""
        refeed = self.cache.rewind(keep, mark)
        if refeed:
            again = self.tokens[mark.length : keep]
            del self.tokens[mark.length :]
            return again
        del self.tokens[keep:]
        return []

    def invalidate(self, history: list[int]) -> None:
        """Drop the cache; the next prefill reads `history` again."""
        self.reset()
        self.pending = history

    def abandon(self, mark, pending: list[int]) -> None:
        """Undo a round that did not finish (an interrupt): back to `mark` and `pending`."""
        history = self.tokens[: mark.length] + pending
        try:
            self.cache.restore(mark)
            del self.tokens[mark.length :]
            self.pending = pending
        except BaseException:
            self.invalidate(history)


def _to_width(logits: mx.array, width: int) -> mx.array:
    """Cut or pad (with -inf: probability zero) the last axis to `width` ids."""
    have = logits.shape[-1]
    if have > width:
        return logits[..., :width]
    if have < width:
        pad = mx.full((*logits.shape[:-1], width - have), -mx.inf, dtype=logits.dtype)
        return mx.concatenate([logits, pad], axis=-1)
    return logits


def _pick(logits: mx.array, params: SamplingParams, key: mx.array) -> tuple[mx.array, mx.array | None]:
    """One id from the last row of logits, and the distribution it was drawn from."""
    if params.greedy:
        return mx.argmax(logits, axis=-1), None
    probs = warp(logits, params)
    return sample(probs, key), probs


def draft(
    cursor: Cursor, gamma: int, params: SamplingParams, key: mx.array, min_p: float = 0.0, confident: bool = False
) -> tuple[mx.array, mx.array | None, bool, mx.array | None]:
    """The draft proposes up to `gamma` ids. Returns drafted (n,), their rows q (n, V) (None
    when greedy), whether the draft read all of them (normally it reads its pending ids and
    every draft but the last), and, if `confident`, its confidence in each (n,), left on the
    device to be read with the round's outcome.

    Confidence is the draft's top probability for the id it proposes next. `min_p` > 0 stops
    early when it falls below: those are the proposals most often rejected. Deciding needs
    the value on the host, one wait per draft step, so it is off by default. The rule stays
    exact: when to stop depends on the draft alone, never on the target."""
    keys = mx.random.split(key, gamma)
    inputs = mx.array(cursor.pending, dtype=_TOKEN)
    cursor.pending = []
    ids, rows, confidences = [], [], []
    stopped = False
    for i in range(gamma):
        logits = cursor.forward(inputs)[-1]
        token, probs = _pick(logits, params, keys[i])
        if min_p > 0 or confident:
            confidence = (probs if probs is not None else mx.softmax(logits.astype(mx.float32))).max()
            if min_p > 0 and confidence.item() < min_p:
                stopped = True
                break
            confidences.append(confidence)
        mx.async_eval(token)
        ids.append(token)
        rows.append(probs)
        inputs = token[None]
    drafted, rows = _stack(ids, rows, params)
    return drafted, rows, stopped, (mx.stack(confidences) if confident and confidences else None)


def _stack(ids: list, rows: list, params: SamplingParams) -> tuple[mx.array, mx.array | None]:
    if not ids:
        return mx.array([], dtype=_TOKEN), None
    return mx.stack(ids).astype(_TOKEN), (None if params.greedy else mx.stack(rows))


def point_mass_rows(ids: mx.array, width: int) -> mx.array:
    """q for proposals that are certain (prompt lookup): one-hot rows (n, width). The rule then
    accepts x with probability p(x) and recovers from p with x removed."""
    return (mx.arange(width)[None, :] == ids[:, None]).astype(mx.float32)


def verify(
    cursor: Cursor, drafted: mx.array, draft_probs: mx.array | None, params: SamplingParams, key: mx.array
) -> tuple[mx.array, mx.array]:
    """The target reads pending + drafted in one pass; returns (accepted count, next id)."""
    gamma = drafted.shape[0]
    inputs = mx.concatenate([mx.array(cursor.pending, dtype=_TOKEN), drafted])
    logits = cursor.forward(inputs)[-(gamma + 1) :]
    if gamma == 0:
        return mx.array(0), _pick(logits[-1], params, key)[0]
    if params.greedy:
        return greedy_sample(drafted, mx.argmax(logits, axis=-1))
    return speculative_sample(drafted, draft_probs, warp(logits, params), key)


@dataclass
class RoundOutcome:
    drafted: list[int]
    accepted: int
    next_id: int
    draft_seconds: float
    verify_seconds: float
    source: str = "model"  # what proposed: "model", "ngram", or "target" (nothing drafted)
    early_stop: bool = False
    verified: int = 1  # ids the target read in its pass
    confidences: list[float] | None = None  # the draft's, per proposal (when asked for)


def speculative_round(
    target: Cursor,
    drafter: Cursor | None,
    gamma: int,
    params: SamplingParams,
    key: mx.array,
    *,
    proposal: list[int] | None = None,
    min_p: float = 0.0,
    confident: bool = False,
) -> RoundOutcome:
    """One propose-verify-rewind round. The draft model proposes up to `gamma` ids, unless a
    `proposal` (prompt lookup) is given: then those ids are verified as point masses and the
    draft model only hears what was emitted. On any exception both cursors are left as
    before the round."""
    t0 = time.perf_counter()
    draft_key, rule_key = mx.random.split(key)
    use_model = proposal is None and drafter is not None and gamma > 0
    target_mark, target_pending = target.cache.mark(), list(target.pending)
    if use_model:
        draft_mark, draft_pending = drafter.cache.mark(), list(drafter.pending)
    try:
        read_all, confidences = False, None
        if use_model:
            drafted, draft_probs, read_all, confidences = draft(drafter, gamma, params, draft_key, min_p, confident)
        else:
            drafted = mx.array(proposal or [], dtype=_TOKEN)
            draft_probs = None if params.greedy or not proposal else point_mass_rows(drafted, target.width)
        n = drafted.shape[0]
        # The verify graph is built while the device still drafts; waiting for the drafts
        # before queueing it times the two apart at no cost in overlap (queued together,
        # MLX signals completion once, for the whole graph).
        accepted, next_id = verify(target, drafted, draft_probs, params, rule_key)
        outcome = mx.concatenate([drafted, accepted.astype(_TOKEN)[None], next_id.astype(_TOKEN)[None]])
        mx.eval(drafted, *([confidences] if confidences is not None else []))
        t1 = time.perf_counter()
        values = outcome.tolist()
        t2 = time.perf_counter()
        confidences = confidences.tolist() if confidences is not None else None
        drafted_ids, accepted, next_id = values[:n], values[n], values[n + 1]

        target.tokens += target_pending + drafted_ids
        target.pending = target.rewind(len(target.tokens) - (n - accepted), target_mark) + [next_id]
        if use_model:
            # the draft read its pending ids and its drafts but the last (all, if it stopped early)
            read = n if read_all else max(n - 1, 0)
            drafter.tokens += draft_pending + drafted_ids[:read]
            kept = min(accepted, read)
            again = drafter.rewind(len(drafter.tokens) - (read - kept), draft_mark)
            drafter.pending = again + drafted_ids[kept:accepted] + [next_id]
        elif drafter is not None:
            drafter.pending += drafted_ids[:accepted] + [next_id]
    except BaseException:
        target.abandon(target_mark, target_pending)
        if use_model:
            drafter.abandon(draft_mark, draft_pending)
        raise
    source = "model" if use_model and n else "ngram" if n else "target"
    early = use_model and read_all
    return RoundOutcome(drafted_ids, accepted, next_id, t1 - t0, t2 - t1, source, early, len(target_pending) + n, confidences)


def _emit(emitted: list[int], eos_ids: frozenset[int]) -> tuple[list[int], bool]:
    """Cut after the first end-of-sequence id."""
    for i, token in enumerate(emitted):
        if token in eos_ids:
            return emitted[: i + 1], True
    return emitted, False


def prefill(target: Cursor, drafter: Cursor | None, prompt: list[int]) -> Prefill:
    t0 = time.perf_counter()
    reused = target.sync(prompt)
    target.prefill()
    if drafter is not None:
        drafter.sync(prompt)
        drafter.prefill()
    return Prefill(len(prompt), len(prompt) - reused, time.perf_counter() - t0)


def decode(
    target: Cursor,
    drafter: Cursor | None,
    prompt: list[int],
    *,
    gamma: int | str,
    params: SamplingParams,
    max_tokens: int,
    eos_ids: frozenset[int],
    key: mx.array,
    ngram: NGramIndex | None = None,
    min_p: float = 0.0,
    controller: Controller | None = None,
    ngram_min_match: int | None = None,
) -> Iterator[Prefill | Round]:
    """Yields a Prefill, then one Round per round; returns the finish reason
    ("eos" or "length").

    gamma: the draft length, 0 for standard decoding, or "auto" (the controller picks each
    round's, plain decoding included). Proposals come from the draft model and/or `ngram`
    (prompt lookup over the prompt and output; with a draft model too, only matches of
    `ngram_min_match` ids or more, 3 by default, are used). `min_p`: the draft's early stop
    (see `draft`), or "auto": the controller learns the threshold from the draft's
    confidences and what the target accepted (0, off, while stopping would not pay).

    Standard decoding leaves the next step queued when it yields (pipelining); speculative
    rounds end synchronised. A consumer that runs other device work between rounds (race)
    waits for the queue first (`mx.synchronize()`) and counts that time to this generator."""
    plain = gamma == 0 or (drafter is None and ngram is None)
    # mlx-lm's generation stream: on Metal, work queued here overlaps the host's.
    with mx.stream(generation_stream):
        yield prefill(target, None if plain else drafter, prompt)
        if plain:
            return (yield from _standard(target, params, max_tokens, eos_ids, key))
        if (gamma == "auto" or min_p == "auto") and controller is None:
            controller = Controller()
        return (
            yield from _speculative(
                target, drafter, gamma, params, max_tokens, eos_ids, key, ngram, min_p, controller,
                ngram_min_match if ngram_min_match is not None else (3 if drafter is not None else None),
            )
        )


_CATCH_UP_AFTER = 4  # pending ids worth a forward of their own


def _speculative(target, drafter, gamma, params, max_tokens, eos_ids, key, ngram, min_p, controller, min_match) -> Iterator[Round]:
    produced, index = 0, 0
    behind = False  # the draft heard ids it did not draft (a plain stretch, prompt lookup)
    learning = min_p == "auto"  # the early-stop threshold is the controller's
    while produced < max_tokens:
        key, round_key = mx.random.split(key)
        remaining = max_tokens - produced
        g = min(controller.choose() if gamma == "auto" else gamma, remaining - 1)
        if gamma == "auto" and g == 0 and remaining > 1:
            # plain decoding wins for now: a pipelined stretch, as fast as standard decoding,
            # until the controller wants to probe again
            stretch = min(controller.plain_stretch(), remaining)
            segment = _standard(target, params, stretch, eos_ids, round_key)
            while True:
                try:
                    event = next(segment)
                except StopIteration as end:
                    finished = end.value
                    break
                controller.observe(0, 0, 0.0, event.seconds, 1, 1)
                _heard(drafter, ngram, event.emitted)
                behind = True
                produced += 1
                yield dataclasses.replace(event, index=index, source="target")
                index += 1
            if finished == "eos":
                return "eos"
            continue
        t0 = time.perf_counter()
        proposal = None
        if ngram is not None and g > 0:
            proposal = ngram.propose(g, min_match) or None
        if proposal is None and drafter is None:
            proposal = []  # prompt lookup found nothing: a plain target step
        drafting = proposal is None and g > 0
        caught_up = 0.0
        if drafting and behind and len(drafter.pending) > _CATCH_UP_AFTER:
            # the draft has many ids to read: read them apart, so that the controller times
            # this round's drafting, not the catching up
            t_catch = time.perf_counter()
            drafter.catch_up()
            caught_up = time.perf_counter() - t_catch
        threshold = min_p
        if learning:
            threshold = controller.stop_threshold() if drafting else 0.0
        outcome = speculative_round(
            target, drafter, g, params, round_key, proposal=proposal, min_p=threshold, confident=learning
        )
        behind = (behind and not drafting) or outcome.source == "ngram"
        emitted, ended = _emit(outcome.drafted[: outcome.accepted] + [outcome.next_id], eos_ids)
        if ngram is not None:
            ngram.extend(emitted)
        seconds = time.perf_counter() - t0
        if controller:
            # a learned threshold's rounds wait at each draft step: their drafting is timed apart
            waited = learning and drafting and threshold > 0
            if outcome.drafted:
                controller.observe(
                    len(outcome.drafted), outcome.accepted, outcome.draft_seconds, outcome.verify_seconds,
                    outcome.verified, len(emitted), seconds - caught_up, waited=waited,
                )
            else:
                controller.observe_empty(outcome.verified, outcome.verify_seconds)
            if learning and drafting:
                controller.observe_confidences(
                    threshold, outcome.confidences or [], outcome.accepted,
                    len(outcome.drafted) + outcome.early_stop, outcome.draft_seconds,
                )
        produced += len(emitted)
        yield Round(
            index=index,
            gamma=g,
            drafted=tuple(outcome.drafted),
            accepted=outcome.accepted,
            emitted=tuple(emitted),
            draft_seconds=outcome.draft_seconds,
            verify_seconds=outcome.verify_seconds,
            seconds=seconds,
            source=outcome.source,
            early_stop=outcome.early_stop,
        )
        index += 1
        if ended:
            return "eos"
    return "length"


def _heard(drafter: Cursor | None, ngram: NGramIndex | None, ids) -> None:
    """Ids emitted without the draft's help: the draft reads them with its next proposal."""
    if drafter is not None:
        drafter.pending += list(ids)
    if ngram is not None:
        ngram.extend(ids)


def _standard(
    target: Cursor,
    params: SamplingParams,
    max_tokens: int,
    eos_ids: frozenset[int],
    key: mx.array,
) -> Iterator[Round]:
    """The target alone, through the same sampling code. Pipelined as mlx-lm's generate_step
    is: the step for token t+1 is queued before token t is read, so the host's graph
    building overlaps the device's work and the baseline is as fast as plain mlx-lm."""

    def step(inputs: mx.array, step_key: mx.array) -> mx.array:
        return _pick(target.forward(inputs)[-1], params, step_key)[0].astype(_TOKEN)

    def next_key():
        nonlocal key
        key, sub = mx.random.split(key)
        return sub

    history = target.history  # plus each id read back: what the cache holds or will read
    with target.atomic(history):
        fed = list(target.pending)
        target.pending = []
        y = step(mx.array(fed, dtype=_TOKEN), next_key())
        mx.async_eval(y)
        target.tokens += fed
    produced = 0
    while True:
        t0 = time.perf_counter()
        queued = produced + 1 < max_tokens
        with target.atomic(history):
            if queued:
                following = step(y[None], next_key())
                mx.async_eval(following)
            token = y.item()
            history.append(token)
            produced += 1
            if queued:
                target.tokens.append(token)
            else:
                target.pending = [token]
        ended = token in eos_ids
        yield Round(
            index=produced - 1,
            gamma=0,
            drafted=(),
            accepted=0,
            emitted=(token,),
            draft_seconds=0.0,
            verify_seconds=time.perf_counter() - t0,
            seconds=time.perf_counter() - t0,
        )
        if ended:
            return "eos"
        if not queued:
            return "length"
        y = following
