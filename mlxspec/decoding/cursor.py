"""A model, its cache, the ids that cache holds and the ids it has yet to read.

State lives here, never in the model objects, so two decoders can share one target (race)
and a chat keeps its caches between turns. Every change of the cache goes with a change of
the ids it is said to hold, and an exception at any point (Ctrl-C above all) leaves the
cursor truthful: the cache is dropped and the ids it held become ids to read again.

A round reads its proposal (`forward`, or `forward_tree` for a tree) and keeps the accepted
path's rows with `keep_path`, the one rollback for chains and trees.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache

from . import tree_attention
from .caches import CacheOptions, CacheRollbackError, KeptRotatingKVCache, Mark, ModelCache
from .features import FeatureStore
from .packed import Lane, PackedCache, columns_of, each_array
from .tree import Tree

PREFILL_STEP = 512
# Prompt ends remembered per cursor, for caches that cannot trim back: the last one serves
# the next turn of a chat and a retried prompt, the one before it an undone turn.
CHECKPOINTS = 2
TOKEN = mx.uint32
CATCH_UP_AFTER = 4  # pending ids worth a forward of their own before a round


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

    def __init__(
        self,
        model,
        name: str,
        table: int,
        width: int,
        *,
        cache_options: CacheOptions = CacheOptions(),
        taps=None,
    ):
        """`taps` (capture.Taps on `model`): keep the tapped layers' hidden states of every
        position read, for a drafter that reads them (`features`)."""
        self.model = model
        self.name = name
        self.table = table
        self.width = width
        self.cache_options = cache_options
        self.taps = taps
        self.features: FeatureStore | None = None
        # standard decoding turns it off: it drafts nothing, so it keeps no features (a later
        # drafting call on the same cache finds them missing and has them read again)
        self.keep_features = True
        self.reset()

    def reset(self) -> None:
        if isinstance(getattr(self, "cache", None), Lane):  # in a batch: its lane, emptied
            self.cache.trim_to(0)
        else:
            # built before anything changes: a Ctrl-C while building leaves all as it was
            cache = self.cache_options.make(self.model, self.name)
            self.cache: ModelCache | Lane = cache
        if self.taps is not None:
            self.features = FeatureStore()
        self.tokens: list[int] = []
        self.pending: list[int] = []
        self.heard = 0  # pending ids it did not draft itself (a plain stretch, prompt lookup)
        # Where recent prefills ended, newest last, for caches that cannot trim back
        # (wrapped windows, recurrent state): the next prompt usually extends one (chat).
        self.checkpoints: list[Checkpoint] = []

    @property
    def history(self) -> list[int]:
        return self.tokens + self.pending

    def hear(self, ids) -> None:
        """Ids emitted without this model's help: it reads them with its next proposal."""
        self.pending += list(ids)
        self.heard += len(ids)

    def catch_up_if_behind(self) -> float:
        """Before drafting: when many heard ids wait, read them in a forward of their own, so
        that the round times its drafting, not the catching up. Returns the seconds spent."""
        if not self.heard or len(self.pending) <= CATCH_UP_AFTER:
            return 0.0
        start = time.perf_counter()
        self.catch_up()
        return time.perf_counter() - start

    def forward(self, ids: mx.array) -> mx.array:
        """Feed ids (n,) to the model; returns logits (n, width)."""
        if self.table < self.width:
            ids = mx.where(ids < self.table, ids, 0)
        start = self.cache.length
        if isinstance(self.cache, Lane):  # read with the batch's other lanes
            logits, hidden = self.cache.read(ids, tree_attention.take_layout(self.model))
        else:
            logits = self.model(ids[None], cache=self.cache.layers)[0]
            self.cache.length += ids.shape[0]
            hidden = None
        if self.features is not None:
            if self.keep_features:
                self.features.write(start, self.taps.take()[0] if hidden is None else hidden)
            else:  # standard decoding: nothing kept, and nothing stale left behind either
                self.taps.seen.clear()
                self.features.forget_from(start)
        return _to_width(logits, self.width)

    def why_no_trees(self) -> str | None:
        """None when this model and cache can read a tree in one forward; else why not."""
        return tree_attention.why_not(self.model, self.cache)

    def forward_tree(self, drafted: mx.array, tree: Tree) -> mx.array:
        """Read the pending ids and the nodes of `tree` (ids `drafted`, (n,)) in one forward,
        the last pending id its root; returns logits (1 + len(tree), width): after the root, then after each node.
        The cache then holds the whole block until `keep_path` says what to keep."""
        pending = len(self.pending)
        layout = tree_attention.TreeLayout.chain_then_tree(
            start=self.cache.length, pending=pending, tree_parents=tree.parents
        )
        inputs = mx.concatenate([mx.array(self.pending, dtype=TOKEN), drafted.astype(TOKEN)])
        with tree_attention.reading(self.model, layout):
            logits = self.forward(inputs)
        return logits[pending - 1 :]

    def keep_path(self, *, block: int, kept: list[int], ids: list[int], mark) -> list[int]:
        """The one rollback, for a chain and a tree alike: the forwards since `mark` read a
        block of `block` rows (the pending ids, then a proposal's nodes); keep its rows
        `kept` (increasing: the pending ids' and the accepted path's), whose ids are `ids`,
        as if they had been read one at a time, and forget the rest. Returns the ids to read
        again (put them in front of pending).

        Where the rows kept are the block's first (a chain's path) the rest is trimmed, or,
        where a part cannot drop rows (a recurrent state), the cache goes back to `mark` and
        the kept ids are read again. Elsewhere (a tree's path) the kept rows move to the
        block's front (caches.keep_block_rows), the target's features with them."""
        start = self.cache.length - block
        self.tokens += list(ids)
        if kept == list(range(len(kept))):
            if not self.cache.rewind(len(self.tokens), mark):
                return []
            again = self.tokens[mark.length :]
            del self.tokens[mark.length :]
            return again
        self.cache.keep_block_rows(block, kept)
        if self.features is not None and self.keep_features:
            self.features.keep_block_rows(start, block, kept)
        return []

    def join(self, packed: PackedCache) -> None:
        """Move into a lane of `packed` (a batch's): what the cache holds is copied over when
        it reads back exactly, else read again."""
        lane = packed.lane()
        states = _exported(self.cache, len(self.tokens))
        if states:
            packed.adopt(lane, states, length=len(self.tokens))
        else:
            self.invalidate(self.history)
        self.cache, self.checkpoints = lane, []

    def leave(self) -> None:
        """Out of its lane, into a cache of its own holding the same ids (read again later
        where they cannot be copied into it exactly)."""
        lane, history, states = self.cache, self.history, None
        try:
            length = lane.length
            states = lane.packed.gather(lane) if length else []
            mx.eval(states)
        finally:  # out of the lane whatever happens: a cache of its own, the row freed
            self.cache = self.cache_options.make(self.model, self.name)
            lane.packed.release(lane)
            if states is None or not _imported(self.cache, states, length=length):
                self.invalidate(history)

    def sync(self, ids: list[int]) -> int:
        """Make history == ids, keeping what the cache already holds of them, and leave at
        least the last id pending. Returns how many ids were reused from the cache."""
        with self.atomic(ids):
            if not self.cache.holds(len(self.tokens)):
                self.reset()  # a second interrupt during the first one's cleanup left them apart
            common = common_prefix(self.tokens, ids, limit=len(ids) - 1)
            if common < len(self.tokens):
                if self.cache.trim_to(common):
                    del self.tokens[common:]
                elif (checkpoint := self._checkpoint_within(ids[:common])) is not None:
                    self.cache.restore(checkpoint.mark)
                    del self.tokens[len(checkpoint.ids) :]
                else:  # a state that cannot be trimmed: read everything again
                    self.reset()
            self.pending = list(ids[len(self.tokens) :])
            self.heard = 0
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
        """Read all pending ids but the last, in chunks (shorter in a batch, where the other
        lanes wait for each chunk)."""
        step = min(step, self.cache.chunk or step)
        with self.atomic(self.history):
            while len(self.pending) > 1:
                chunk = self.pending[: min(step, len(self.pending) - 1)]
                self.forward(mx.array(chunk, dtype=TOKEN))
                mx.eval(self.cache.state)
                self.tokens += chunk
                del self.pending[: len(chunk)]
                mx.clear_cache()

    @contextmanager
    def atomic(self, history: list[int]):
        """On any exception inside (Ctrl-C above all), keep what the cache still holds of
        `history` exactly, and make the rest the ids to read next time: the cursor stays
        truthful about what its cache holds."""
        try:
            yield
        except BaseException:
            self.recover(list(history))
            raise

    def recover(self, history: list[int]) -> None:
        """After an interruption: back to the ids known to be read (`tokens`) when every
        part can be trimmed there exactly (restore refuses a part left mid-update, or one
        that cannot drop its tail), else to the longest checkpoint among them, else an empty
        cache; `history` minus what is kept becomes pending."""
        try:
            if self.tokens != history[: len(self.tokens)]:
                raise CacheRollbackError("the ids read are not a prefix of the history")
            try:
                self.cache.restore(Mark(len(self.tokens)))  # every part by its own count
            except CacheRollbackError:
                checkpoint = self._checkpoint_within(self.tokens)
                if checkpoint is None:
                    raise
                self.cache.restore(checkpoint.mark)
                del self.tokens[len(checkpoint.ids) :]
            self.pending = history[len(self.tokens) :]
        except BaseException:
            self.invalidate(history)

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


def path_rows(pending: int, path: list[int]) -> list[int]:
    """The rows of a verify block (`pending` ids, the last the root, then a proposal's nodes
    in node order) that hold the pending ids and the accepted `path` (node numbers)."""
    return list(range(pending)) + [pending - 1 + node for node in path]


def _exported(cache, length: int) -> list | None:
    """Per layer, the keys and values of a cache holding `length` ids in position order
    (quantized ones as their triples): all of them, or under a --max-kv-size window
    (KeptRotatingKVCache) its first ids and its newest, in time order; None where some layer
    does not hold them so (a sliding window that wrapped)."""
    if isinstance(cache, Lane) or not length or not cache.holds(length):
        return None
    states = []
    for layer in cache.layers:
        if type(layer) is KeptRotatingKVCache and layer.keys is not None:
            # every row it holds, in time order (rollback keeps a wrapped one in it, caches._trim)
            states.append((layer._temporal_order(layer.keys), layer._temporal_order(layer.values)))
            continue
        plain = type(layer) in (mlx_cache.KVCache, mlx_cache.QuantizedKVCache)
        window = type(layer) is mlx_cache.RotatingKVCache and not layer.keep and layer.offset == layer._idx
        if not (plain or window) or layer.keys is None:
            return None
        held = layer.keys_and_values() if plain else (layer.keys, layer.values)
        if held[0] is None or columns_of(held[0]) < layer.offset:
            return None
        held_ids = lambda x, count=layer.offset: x[..., :count, :]  # noqa: E731 - the columns it holds
        states.append(tuple(each_array(held_ids, buffer) for buffer in held))
    return states


def _imported(cache: ModelCache, states: list, *, length: int | None = None) -> bool:
    """Fill a fresh cache with per-layer keys and values of `length` ids in position order:
    all of them, or under a window its first `keep` and its newest; False where some layer
    cannot hold them so (a type not listed, a window shorter than its buffer needs)."""
    if not states:
        return True
    held = columns_of(states[0][0])
    length = held if length is None else length
    for layer, (keys, values) in zip(cache.layers, states):
        if isinstance(keys, tuple) != (type(layer) is mlx_cache.QuantizedKVCache):
            return False  # quantized keys into a plain layer, or the other way round
        if type(layer) in (mlx_cache.KVCache, mlx_cache.QuantizedKVCache) and held == length:
            layer.keys, layer.values, layer.offset = keys, values, length
        elif type(layer) in (mlx_cache.RotatingKVCache, KeptRotatingKVCache) and (
            held == length or held >= layer.max_size
        ):
            # in time order: what a block update leaves (past the window too; the next update
            # drops the oldest but the kept), so that it trims back as such a cache does; a
            # window's worth at least where the oldest are gone (a shorter buffer would grow)
            layer.keys, layer.values, layer.offset, layer._idx = keys, values, length, held
        else:
            return False
    cache.length = length
    return True


def common_prefix(a: list[int], b: list[int], *, limit: int | None = None) -> int:
    """How many leading ids `a` and `b` share (at most `limit`)."""
    limit = min(len(a), len(b), len(a) if limit is None else limit)
    common = 0
    while common < limit and a[common] == b[common]:
        common += 1
    return common


def _to_width(logits: mx.array, width: int) -> mx.array:
    """Cut or pad (with -inf: probability zero) the last axis to `width` ids."""
    have = logits.shape[-1]
    if have > width:
        return logits[..., :width]
    if have < width:
        pad = mx.full((*logits.shape[:-1], width - have), -mx.inf, dtype=logits.dtype)
        return mx.concatenate([logits, pad], axis=-1)
    return logits
