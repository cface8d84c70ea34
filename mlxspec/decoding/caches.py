"""Taking a model's cache back to an earlier length, exactly, for every cache type mlx-lm uses.

After verification the target's cache holds the whole drafted block and the draft's holds
its own proposals; both must forget the rejected tail. How depends on the layer:

- KVCache, QuantizedKVCache: lowering `offset` forgets the tail (the next write lands
  over it). ConcatenateKVCache's trim does not (its next update appends after the stale
  rows), so it is refused like any unknown type.
- RotatingKVCache (sliding windows): trimmable while it has not wrapped. Once wrapped, a
  multi-token update (the target's verify) leaves its buffer in time order and longer than
  the window, so slicing off the newest rows is exact; after single-token updates (the
  draft) the rows it would need were overwritten, so it is restored from a snapshot.
  With kept tokens (`keep > 0`, what `max_kv_size` builds) mlx-lm's block mask hides them
  from a block's later queries, which single-token steps see: `KeptRotatingKVCache`
  masks a block as the steps it stands for would read, and is rolled back the same way.
- ArraysCache (recurrent/SSM state) and CacheList holding one: a state cannot be trimmed,
  so it is restored from a snapshot taken at the start of the round and the kept tokens
  are fed again.

mlx-lm's `trim_prompt_cache` silently trims nothing when any layer refuses; here every
rewind is checked against the length it must reach, and a layer type not listed above is
refused up front rather than decoded wrongly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models import cache as mlx_cache

from ..errors import UnsupportedCache

# checked without MLX (cache_options.py), so that a command refuses them before loading models
from .cache_options import check_cache_options


class KeptRotatingKVCache(mlx_cache.RotatingKVCache):
    """A rotating cache whose first `keep` tokens every query sees, in a block as alone.

    Decoding one token at a time, the query at position p reads the kept tokens and the
    newest `max_size - keep` up to p. mlx-lm masks a block of queries with a plain window
    over its buffer instead, so from the block's second query on the kept tokens drop out:
    a verify pass (and a session's prefill in other chunks than a fresh one's) would read
    another context than the steps it stands for. This mask gives every query of a block
    the context of a single step; buffer, updates and rollback are mlx-lm's.
    """

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        if N == 1:
            return super().make_mask(N, window_size=window_size, return_array=return_array)
        if window_size not in (None, self.max_size):
            # no mlx-lm model passes a window of its own to a cache with kept tokens
            raise UnsupportedCache(f"a window of {window_size} over a {self.max_size}-token cache with kept tokens")
        # The buffer after this block's update (RotatingKVCache._update_concat), in time
        # order: the kept rows, up to max_size - 1 - keep newest earlier rows, the block.
        earlier = min(self.max_size - 1, self.offset)
        rows = mx.arange(earlier + N)
        positions = mx.where(rows < self.keep, rows, rows + (self.offset - earlier))[None]
        queries = mx.arange(self.offset, self.offset + N)[:, None]
        recent = queries - positions < self.max_size - self.keep
        return (positions <= queries) & ((positions < self.keep) | recent)


_TRIM_TYPES = (mlx_cache.KVCache, mlx_cache.QuantizedKVCache)
_ROTATING = (mlx_cache.RotatingKVCache, KeptRotatingKVCache)
_STATE_TYPES = (mlx_cache.ArraysCache,)


class CacheRollbackError(RuntimeError):
    """A rewind did not reach the length it had to: a bug, never a user error."""


def _kind(layer) -> str:
    t = type(layer)
    if t in _TRIM_TYPES:
        return "trim"
    if t in _ROTATING:
        if layer.keep and t is not KeptRotatingKVCache:
            raise UnsupportedCache(
                f"RotatingKVCache with keep={layer.keep} is not supported as mlx-lm builds it: a block of "
                "queries would not see the kept tokens that single steps see (build caches with "
                "mlxspec.caches.make_cache(..., max_kv_size=N))"
            )
        return "rotating"
    if t in _STATE_TYPES:
        return "state"
    if t is mlx_cache.CacheList:
        kinds = {_kind(part) for part in layer.caches}
        return "trim" if kinds == {"trim"} else "snapshot"
    raise UnsupportedCache(
        f"cache type {t.__name__} is not supported: mlxspec cannot roll it back exactly "
        "(supported: KVCache, QuantizedKVCache, RotatingKVCache, ArraysCache, CacheList of these)"
    )


def _view(x):
    # A new array node over the same data: KVCache writes into its buffers in place, so a
    # plain reference would follow the writes, while this keeps the values of the moment.
    return x[...] if isinstance(x, mx.array) else x


@dataclass
class Mark:
    """A cache's length and the snapshots needed to come back to it, by (layer, part)."""

    length: int
    states: dict[tuple[int, int], object] = field(default_factory=dict)


class ModelCache:
    """One model's per-layer caches and how many tokens they hold. A layer is one cache or
    a CacheList of parts; rollback works part by part."""

    chunk: int | None = None  # at most this many ids per prefill forward (None: any)

    def __init__(self, layers: list, model_name: str = "model"):
        self.layers = layers
        try:
            self.kinds = [_kind(layer) for layer in layers]
        except UnsupportedCache as e:
            raise UnsupportedCache(f"{model_name}: {e}") from None
        self.length = 0
        # (layer, part, cache) of every part that may need restoring rather than trimming
        self._restorable = [
            (i, j, part)
            for i, layer in enumerate(layers)
            for j, part in enumerate(_all_parts(layer))
            if _kind(part) != "trim"
        ]

    @property
    def state(self):
        return [layer.state for layer in self.layers]

    @property
    def needs_snapshots(self) -> bool:
        """Whether some layer may need restoring rather than trimming."""
        return bool(self._restorable)

    def mark(self, *, reads: int | None = None) -> Mark:
        """Remember the current length, with snapshots (zero-copy views) of the parts that
        may not trim back to it.

        `reads`: what follows reads at most this many ids (a verify block, or the draft's
        single steps); None: anything may follow (a checkpoint). A window those ids cannot
        wrap trims back exactly and is not snapshotted: a live view of a buffer makes the
        next in-place write (a single-id step) copy it. One they may wrap is: after a block
        the buffer is new (mlx-lm's concatenating update never writes into the old one, so
        the view costs nothing), and an interrupt inside that update can leave the keys
        reordered and the values not, which only a snapshot undoes."""
        states = {}
        for i, j, part in self._restorable:
            if _kind(part) == "rotating" and reads is not None and part.offset + reads < part.max_size:
                continue
            states[i, j] = tree_map(_view, part.state)
        return Mark(self.length, states)

    def rewind(self, length: int, mark: Mark) -> int:
        """Forget everything after the first `length` tokens, `length >= mark.length`.

        Returns how many tokens (the ones in mark.length .. length) must be fed again: 0 when
        every layer could be trimmed, else the cache went back to `mark`.
        """
        if length < mark.length:
            raise CacheRollbackError(f"cannot rewind to {length}, before the mark at {mark.length}")
        if self.trim_to(length):
            return 0
        self.restore(mark)
        return length - mark.length

    def keep_block_rows(self, count: int, kept: list[int]) -> None:
        """The last `count` rows were read as a tree (one block): keep the block's rows
        `kept` (increasing: the accepted path, which the tree numbers in order), moved to
        the block's front, and forget the rest. The rows kept were computed at their
        path's positions attending to their ancestors, so the cache is then what reading
        that path one id at a time would have left. Raises CacheRollbackError where a part
        cannot (a state, a window written in place since)."""
        if list(kept) != sorted(set(kept)) or (kept and not 0 <= kept[0] <= kept[-1] < count):
            raise CacheRollbackError(f"rows {kept} are not increasing rows of a {count}-row block")
        drop = count - len(kept)
        moved = [r for i, r in enumerate(kept) if r != i]
        if moved:
            for layer in self.layers:
                for part in _all_parts(layer):
                    _move_block_rows(part, count, kept)
        if drop and not self.trim_to(self.length - drop):
            raise CacheRollbackError(f"the tree's {drop} rejected rows cannot be dropped exactly")

    def can_trim_to(self, length: int) -> bool:
        """Whether every layer can be trimmed back to `length` tokens exactly."""
        drop = self.length - length
        return drop >= 0 and all(_can_trim(part, drop) for layer in self.layers for part in _all_parts(layer))

    def trim_to(self, length: int) -> bool:
        """Trim every layer to `length` tokens if every layer can; False (nothing done) if not."""
        drop = self.length - length
        if drop < 0:
            raise CacheRollbackError(f"cannot trim {self.length} tokens to {length}")
        if not drop:
            return True
        if not self.can_trim_to(length):
            return False
        for layer in self.layers:
            for part in _all_parts(layer):
                _trim(part, drop)
        self.length = length
        self._check()
        return True

    def restore(self, mark: Mark) -> None:
        """Go back to exactly the state at `mark` (which stays usable: the parts get views of
        its snapshots, not the snapshots themselves); the others are trimmed, each by its own
        count (after an interrupt mid-forward, layers and parts may disagree on their length).
        Raises CacheRollbackError where neither can be done exactly."""
        for i, layer in enumerate(self.layers):
            for j, part in enumerate(_all_parts(layer)):
                if (i, j) in mark.states:
                    part.state = tree_map(_view, mark.states[i, j])
                    continue
                if not isinstance(getattr(part, "offset", None), int):
                    raise CacheRollbackError(f"layer {i} ({type(part).__name__}) has no snapshot to go back to")
                if not _intact(part):
                    raise CacheRollbackError(f"layer {i} ({type(part).__name__}) was left mid-update")
                drop = part.offset - mark.length
                if drop < 0:
                    raise CacheRollbackError(
                        f"layer {i} ({type(part).__name__}) holds {part.offset} tokens, fewer than the mark's "
                        f"{mark.length}"
                    )
                if drop:
                    if not _can_trim(part, drop):
                        raise CacheRollbackError(f"layer {i} ({type(part).__name__}) cannot drop {drop} tokens exactly")
                    _trim(part, drop)
        self.length = mark.length
        self._check()

    def _check(self) -> None:
        """Every layer that counts its tokens (CacheList parts included) must agree with the
        length we believe."""
        for i, layer in enumerate(self.layers):
            for part in _parts(layer):
                if part.offset != self.length:
                    raise CacheRollbackError(
                        f"layer {i} ({type(part).__name__}) holds {part.offset} tokens, expected {self.length}"
                    )

    def holds(self, length: int) -> bool:
        """Whether the cache and every part that counts its tokens hold `length` tokens."""
        return self.length == length and all(part.offset == length for layer in self.layers for part in _parts(layer))


def _can_trim(part, n: int) -> bool:
    kind = _kind(part)
    if kind == "trim":
        return True
    if kind == "rotating":
        if part.offset < part.max_size:
            return n <= part.offset
        # Wrapped: exact only when the buffer is in time order (as a multi-token update
        # leaves it) and, after the cut, keeps a full window, or every token read (a block
        # that crossed the window's edge: nothing was dropped yet)
        if part.keys is None or part._idx != part.keys.shape[2]:
            return False
        rows = part.keys.shape[2]
        return rows - n >= part.max_size or (rows == part.offset and n <= part.offset)
    return False


def _intact(part) -> bool:
    """Whether the part's last update ran to its end. An interrupt inside mlx-lm's update
    can leave the keys grown and not the values, or the buffer grown and not its counters;
    trimming such a part by its count would keep rows no fresh cache has."""
    keys, values = part.keys, part.values
    if keys is None or values is None:
        return keys is None and values is None
    rows = _rows(keys)
    if rows != _rows(values):
        return False
    if _kind(part) == "rotating":
        # Past the window (a buffer grown beyond it, or counters that say so), only a
        # finished block update leaves the buffer in time order, _idx at its end. Out of
        # order (single steps wrote into it), it looks the same whether or not a block
        # update was cut between reordering its keys and its values: not trusted.
        past_window = rows > part.max_size or part.offset >= part.max_size
        return part._idx <= rows and not (past_window and part._idx != rows)
    return True


def _rows(buffer) -> int:
    # quantized buffers are (data, scales, biases) tuples
    return (buffer[0] if isinstance(buffer, (tuple, list)) else buffer).shape[2]


def _trim(part, n: int) -> None:
    if _kind(part) == "rotating" and part.offset >= part.max_size:
        part.keys = part.keys[..., : part._idx - n, :]
        part.values = part.values[..., : part._idx - n, :]
        part.offset -= n
        part._idx -= n
        return
    trimmed = part.trim(n)
    if trimmed != n:
        raise CacheRollbackError(f"{type(part).__name__} trimmed {trimmed} of {n} tokens")


def _move_block_rows(part, count: int, kept: list[int]) -> None:
    """Gather the kept rows of the newest `count`-row block to the block's front, in every
    buffer of the part (a quantized one's data, scales and biases alike)."""
    kind = _kind(part)
    if kind == "trim":
        first = part.offset - count
    elif kind == "rotating" and part.keys is not None and part._idx == _rows(part.keys):
        first = part._idx - count  # a block update left the buffer in time order, the block last
    else:
        raise CacheRollbackError(f"{type(part).__name__} does not hold a tree's block in order")
    rows = mx.array([first + r for r in kept])
    for name in ("keys", "values"):
        buffer = getattr(part, name)
        parts = list(buffer) if isinstance(buffer, (tuple, list)) else [buffer]
        for b in parts:
            b[..., first : first + len(kept), :] = b[..., rows, :]


def _all_parts(layer) -> list:
    """A layer's caches: itself, or a CacheList's parts."""
    return list(layer.caches) if type(layer) is mlx_cache.CacheList else [layer]


def _parts(layer) -> list:
    """The token-counting caches of a layer: itself, or a CacheList's parts."""
    parts = layer.caches if type(layer) is mlx_cache.CacheList else [layer]
    return [p for p in parts if isinstance(getattr(p, "offset", None), int)]


def layer_length(layer) -> int:
    """Tokens one layer's cache holds (a CacheList's first part's count)."""
    return _parts(layer)[0].offset


@dataclass(frozen=True)
class CacheOptions:
    """How a session's caches are built: `make_cache`'s keywords, kept together."""

    max_kv_size: int | None = None
    kv_bits: int | None = None
    kv_group_size: int = 64

    def make(self, model, model_name: str = "model") -> ModelCache:
        return make_cache(model, model_name, **asdict(self))


def make_cache(
    model,
    model_name: str = "model",
    *,
    max_kv_size: int | None = None,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
) -> ModelCache:
    """The model's cache, as mlx-lm builds it, with its options:

    max_kv_size: past this many tokens, forget the oldest but the first 4 (mlx-lm's
        make_prompt_cache: only for models that do not build their own cache; a model with
        sliding windows or recurrent state keeps its layout).
    kv_bits, kv_group_size: plain KV layers hold their keys and values quantized from the
        first token (mlx-lm's QuantizedKVCache); windows, states and CacheLists stay as built.
    """
    check_cache_options(max_kv_size, kv_bits, kv_group_size)
    layers = [_with_options(layer, kv_bits, kv_group_size) for layer in mlx_cache.make_prompt_cache(model, max_kv_size)]
    return ModelCache(layers, model_name)


def _with_options(layer, kv_bits: int | None, kv_group_size: int):
    if type(layer) is mlx_cache.KVCache and kv_bits is not None:
        return mlx_cache.QuantizedKVCache(group_size=kv_group_size, bits=kv_bits)
    if type(layer) is mlx_cache.RotatingKVCache and layer.keep:
        return KeptRotatingKVCache(max_size=layer.max_size, keep=layer.keep)
    return layer


def check_supported(model, model_name: str) -> None:
    """Raise UnsupportedCache now, at load time, rather than at the first generation."""
    make_cache(model, model_name)
