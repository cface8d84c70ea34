"""The target's own answers, and what it saw writing them, in one pass.

An answer's training data is what a teacher-forced read of prompt + answer gives: at each
position the hidden states at the taps and the target's distribution for the next id. The
forwards that write the answer compute exactly those, so they are kept as the answer is
written, instead of reading everything again afterwards. On a CPU, where every forward is
bound by compute, reading each prompt once instead of twice (and the answer not again)
halves the time an answer takes: prompts of ShareGPT's conversations are longer than their
answers.

Each prompt is read alone, in chunks of `pace.positions` ids (no more than MAX_LOGITS
floats of logits at once), into its own cache, and the features and distributions of its
last CONTEXT + 1 positions are kept (all training reads of a prompt). Its cache then joins
the batch being written (mlx-lm's left-padded batch caches: per-row positions and masks,
`merge` and `extend`); a row leaves it (`filter`) once it has read its last id, and the next
prompts join between steps, so the batch stays full while prompts remain, as mlx-lm's
BatchGenerator keeps it. Greedy for most answers, sampled at temperature 0.7 for the rest
(SAMPLED_SHARE), each answer from its own keys (one for each of its ids), so that an answer
does not depend on the others in its batch nor on when it joined.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import NamedTuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from .store import TOP_K

SAMPLED_SHARE = 0.3  # answers sampled at temperature 0.7, the rest greedy
SAMPLED_TEMPERATURE = 0.7
CONTEXT = 64  # prompt rows kept before an answer's first target (all training reads of them)
FLOAT16_LIMIT = 6e4
LEAST_ANSWER = 2  # ids an answer needs to be learnt from
MAX_LOGITS = 2**27  # floats of logits a prompt's forward may make (512 MB: 512 positions of Gemma 3's)


def top_of(logits: mx.array) -> tuple[mx.array, mx.array]:
    """The top K ids of each row of `logits` (…, vocab) and their true probabilities (not
    renormalised over the K: exp(logit - logsumexp)), unsorted."""
    top = mx.argpartition(-logits, TOP_K - 1, axis=-1)[..., :TOP_K]
    return top, mx.exp(mx.take_along_axis(logits, top, axis=-1) - mx.logsumexp(logits, axis=-1, keepdims=True))


def sorted_top(top: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top K sorted by probability, so column 0 is the target's argmax."""
    order = np.argsort(-probs.astype(np.float32), axis=-1)
    return np.take_along_axis(top, order, axis=-1), np.take_along_axis(probs, order, axis=-1)


def compact(features: np.ndarray) -> np.ndarray:
    """float16 where the values fit (Gemma's overflow it: kept in float32)."""
    return features.astype(np.float16) if np.abs(features).max() < FLOAT16_LIMIT else features


class Written(NamedTuple):
    """One prompt's answer and what the target saw: the arrays' rows from the prompt's last
    CONTEXT + 1 positions on (kept_from), one a position."""

    greedy: bool
    ids: list[int]  # the answer's ids, each read by the target
    features: np.ndarray
    top_ids: np.ndarray  # sorted by probability: column 0 the target's argmax
    top_probs: np.ndarray
    ended: bool  # with an end id or at the longest answer; False: cut by the clock


class _Answer:
    """One row: its prompt's kept rows, then each answer id as it is read."""

    def __init__(self, *, greedy: bool, keys: mx.array):
        self.greedy, self.keys = greedy, keys
        self.ids: list[int] = []  # the answer's ids read so far
        self.next_id: int | None = None  # drawn, not read yet
        self.features: list[np.ndarray] = []
        self.top: list[np.ndarray] = []
        self.probs: list[np.ndarray] = []
        self.written: Written | None = None  # once it has left the batch

    def keep(self, features: np.ndarray, top: np.ndarray, probs: np.ndarray) -> None:
        self.features.append(features)
        self.top.append(top)
        self.probs.append(probs)

    def finished(self, *, eos: set[int], max_tokens: int) -> bool:
        """Its last id has been read: an end id, or the longest answer."""
        return bool(self.ids) and (self.ids[-1] in eos or len(self.ids) >= max_tokens)

    def close(self, *, ended: bool) -> Written:
        """What was written, its rows made compact (float16, sorted) once and the row's own
        lists let go."""
        if self.written is None:
            top, probs = sorted_top(np.concatenate(self.top), np.concatenate(self.probs))
            features = compact(np.concatenate(self.features))
            self.written = Written(self.greedy, self.ids, features, top, probs, ended)
            self.features = self.top = self.probs = []
        return self.written


def kept_from(prompt: list[int]) -> int:
    """The prompt's first row kept: CONTEXT rows before its last, whose distribution is the
    answer's first target (training reads no earlier row: trainer.window)."""
    return max(0, len(prompt) - 1 - CONTEXT)


def answered(made: list[Written | None]) -> int:
    """How many of the prompts, from the first, were answered: up to the first the clock left
    unread or cut before its answer was long enough to learn from (prompts are read in order, so those are the
    last): a resumed run answers those again."""
    return next((k for k, m in enumerate(made) if m is None or (not m.ended and len(m.ids) < LEAST_ANSWER)), len(made))


def _draw(logits: mx.array, rows: list[_Answer]) -> mx.array:
    """The next id of each row: its argmax, or a draw at SAMPLED_TEMPERATURE with the row's
    key for its place in its answer (the ids it has read), whatever batch it is in."""
    greedy = mx.argmax(logits, axis=-1)
    if all(r.greedy for r in rows):
        return greedy
    keys = mx.stack([r.keys[min(len(r.ids), len(r.keys) - 1)] for r in rows])
    drawn = mx.stack([mx.random.categorical(row / SAMPLED_TEMPERATURE, key=key) for row, key in zip(logits, keys)])
    return mx.where(mx.array([r.greedy for r in rows]), greedy, drawn)


def _read_prompt(model, taps, prompt: list[int], *, pace, vocab_size: int) -> tuple[list, tuple, mx.array]:
    """The prompt read into its own cache, a chunk of `pace.positions` ids a forward: (the
    cache, the kept rows (features, top ids, top probs) of its last CONTEXT + 1 positions, the
    last position's logits), all evaluated: a batch of prompts holds no chunk's logits."""
    cache = make_prompt_cache(model)
    first_kept = kept_from(prompt)
    kept, start = [], 0
    while start < len(prompt):
        began = time.perf_counter()
        chunk = prompt[start : start + max(1, min(pace.positions, MAX_LOGITS // vocab_size))]
        logits = model(mx.array(chunk, dtype=mx.uint32)[None], cache=cache)[0].astype(mx.float32)
        features = taps.take()[0].astype(mx.float32)
        last = logits[-1]
        lo = max(0, first_kept - start)  # the chunk's first kept row
        if lo < len(chunk):
            top, probs = top_of(logits[lo:])
            mx.eval(features, top, probs, last, [layer.state for layer in cache])
            kept.append((np.array(features[lo:]), np.array(top).astype(np.int32), np.array(probs.astype(mx.float16))))
        else:
            mx.eval(last, [layer.state for layer in cache])
        del logits, features
        pace.observe(len(chunk), time.perf_counter() - began)
        start += len(chunk)
    return cache, tuple(np.concatenate(part) for part in zip(*kept)), last


def write_answers(
    model,
    taps,
    prompts: list[list[int]],
    *,
    max_tokens: int,
    eos: list[int],
    seed: int,
    batch: int,
    pace,
    vocab_size: int,
    until: float = math.inf,
) -> list[Written | None]:
    """The target's answers to `prompts`, up to `batch` written together, with what it saw
    (`Written`); None for a prompt the clock left unread (`until`, perf_counter seconds).
    An answer cut by the clock keeps the ids read so far.
    A row that ends leaves the batch and the next prompts join it between steps (each read
    alone first), so the batch stays full while prompts remain."""
    rng = np.random.default_rng(seed)
    greedy = [bool(g) for g in rng.random(len(prompts)) >= SAMPLED_SHARE]
    keys = mx.random.split(mx.random.key(seed), len(prompts))
    rows: dict[int, _Answer] = {}  # by prompt index: those read so far
    waiting = deque(range(len(prompts)))
    writing = _Batch()
    ends = set(eos)
    while time.perf_counter() < until:
        joining = []
        while len(writing.live) + len(joining) < batch and waiting and time.perf_counter() < until:
            i = waiting.popleft()
            rows[i] = _Answer(greedy=greedy[i], keys=mx.random.split(keys[i], max_tokens))
            joining.append((i, *_read_prompt(model, taps, prompts[i], pace=pace, vocab_size=vocab_size)))
            rows[i].keep(*joining[-1][2])
        if joining:
            writing.join(joining, rows)
            joining.clear()  # the prompts' own caches: the batch holds them now
        if not writing.live:
            break
        writing.step(model, taps, rows)
        done = [i for i in writing.live if rows[i].finished(eos=ends, max_tokens=max_tokens)]
        writing.leave(done)
        for i in done:
            rows[i].close(ended=True)
    return [rows[i].close(ended=False) if i in rows else None for i in range(len(prompts))]


class _Batch:
    """The rows being written: their prompts' caches merged into one left-padded batch cache
    (mlx-lm's), the ids they read next, and their prompt indices in the batch's order."""

    def __init__(self):
        self.cache: list | None = None
        self.next_ids: mx.array | None = None
        self.live: list[int] = []

    def join(self, joining: list[tuple], rows: dict) -> None:
        """Rows whose prompts were read alone (index, their cache, kept rows, last logits)
        joined to the batch, their first ids drawn."""
        merged = [layer[0].merge(list(layer)) for layer in zip(*(cache for _, cache, _, _ in joining))]
        first = _draw(mx.stack([logits for *_, logits in joining]), [rows[i] for i, *_ in joining])
        if self.cache is None:
            self.cache, self.next_ids = merged, first
        else:
            for layer, more in zip(self.cache, merged):
                layer.extend(more)
            self.next_ids = mx.concatenate([self.next_ids, first])
        self.live += [i for i, *_ in joining]
        mx.eval(self.next_ids, [layer.state for layer in self.cache])  # the rows' own caches can go

    def step(self, model, taps, rows: dict) -> None:
        """Each row reads its next id, keeping the features and distribution there, and draws
        the one after."""
        live = [rows[i] for i in self.live]
        for row, next_id in zip(live, self.next_ids.tolist()):
            row.next_id = next_id
        inputs = mx.array([[row.next_id] for row in live], dtype=mx.uint32)
        logits = model(inputs, cache=self.cache)[:, -1].astype(mx.float32)
        features = taps.take()[:, -1].astype(mx.float32)
        top, probs = top_of(logits)
        for row in live:
            row.ids.append(row.next_id)
        self.next_ids = _draw(logits, live)
        mx.eval(features, top, probs, self.next_ids)
        seen = (np.array(features), np.array(top).astype(np.int32), np.array(probs.astype(mx.float16)))
        for position, row in enumerate(live):
            row.keep(*(part[position : position + 1] for part in seen))

    def leave(self, done: list[int]) -> None:
        """The rows that have read their last id leave the batch."""
        if not done:
            return
        going = [p for p, i in enumerate(self.live) if i not in done]
        self.live = [self.live[p] for p in going]
        if not going:
            self.cache = self.next_ids = None
            return
        kept = mx.array(going, dtype=mx.int32)
        for layer in self.cache:
            layer.filter(kept)
        self.next_ids = self.next_ids[kept]
