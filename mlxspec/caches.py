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

from .errors import InvalidOption, UnsupportedCache

KV_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize accepts
KV_GROUP_SIZES = (32, 64, 128)
KEPT_TOKENS = 4  # mlx-lm's make_prompt_cache keeps the first 4 tokens past max_kv_size


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
    """A cache's length and the snapshots needed to come back to it."""

    length: int
    states: dict[int, object] = field(default_factory=dict)


class ModelCache:
    """One model's per-layer caches and how many tokens they hold."""

    def __init__(self, layers: list, model_name: str = "model"):
        self.layers = layers
        try:
            self.kinds = [_kind(layer) for layer in layers]
        except UnsupportedCache as e:
            raise UnsupportedCache(f"{model_name}: {e}") from None
        self.length = 0
        self._restorable = [i for i, k in enumerate(self.kinds) if k != "trim"]

    @property
    def state(self):
        return [layer.state for layer in self.layers]

    @property
    def needs_snapshots(self) -> bool:
        """Whether some layer may need restoring rather than trimming."""
        return bool(self._restorable)

    def mark(self) -> Mark:
        """Remember the current length; snapshots (zero-copy views) only where a layer
        may need restoring."""
        return Mark(self.length, {i: tree_map(_view, self.layers[i].state) for i in self._restorable})

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

    def trim_to(self, length: int) -> bool:
        """Trim every layer to `length` tokens if every layer can; False (nothing done) if not."""
        drop = self.length - length
        if drop < 0:
            raise CacheRollbackError(f"cannot trim {self.length} tokens to {length}")
        if drop and not all(self._can_trim(i, drop) for i in range(len(self.layers))):
            return False
        if drop:
            for i in range(len(self.layers)):
                self._trim(i, drop)
            self.length = length
            self._check()
        return True

    def restore(self, mark: Mark) -> None:
        """Go back to exactly the state at `mark` (which stays usable: the layers get views
        of its snapshots, not the snapshots themselves)."""
        for i, layer in enumerate(self.layers):
            if i in mark.states:
                layer.state = tree_map(_view, mark.states[i])
                continue
            # Each part by its own count: after an interrupt mid-forward, layers (and the
            # parts of a CacheList) may disagree on their length.
            for part in _parts(layer):
                drop = part.offset - mark.length
                if drop < 0:
                    raise CacheRollbackError(
                        f"layer {i} ({type(part).__name__}) holds {part.offset} tokens, fewer than the mark's "
                        f"{mark.length}"
                    )
                if drop and part.trim(drop) != drop:
                    raise CacheRollbackError(f"layer {i} ({type(part).__name__}) could not drop {drop} tokens")
        self.length = mark.length
        self._check()

    def _can_trim(self, i: int, n: int) -> bool:
        kind, layer = self.kinds[i], self.layers[i]
        if kind == "trim":
            return True
        if kind == "rotating":
            if layer.offset < layer.max_size:
                return n <= layer.offset
            # Wrapped: exact only when the buffer is in time order (as a multi-token update
            # leaves it) and keeps at least a full window after the cut.
            return layer._idx == layer.keys.shape[2] and layer.keys.shape[2] - n >= layer.max_size
        return False

    def _trim(self, i: int, n: int) -> None:
        layer = self.layers[i]
        if self.kinds[i] == "rotating" and layer.offset >= layer.max_size:
            layer.keys = layer.keys[..., : layer._idx - n, :]
            layer.values = layer.values[..., : layer._idx - n, :]
            layer.offset -= n
            layer._idx -= n
            return
        trimmed = layer.trim(n)
        if trimmed != n:
            raise CacheRollbackError(f"layer {i} ({type(layer).__name__}) trimmed {trimmed} of {n} tokens")

    def _check(self) -> None:
        """Every layer that counts its tokens (CacheList parts included) must agree with the
        length we believe."""
        for i, layer in enumerate(self.layers):
            for part in _parts(layer):
                if part.offset != self.length:
                    raise CacheRollbackError(
                        f"layer {i} ({type(part).__name__}) holds {part.offset} tokens, expected {self.length}"
                    )


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
    _check_cache_options(max_kv_size, kv_bits, kv_group_size)
    layers = [_with_options(layer, kv_bits, kv_group_size) for layer in mlx_cache.make_prompt_cache(model, max_kv_size)]
    return ModelCache(layers, model_name)


def _with_options(layer, kv_bits: int | None, kv_group_size: int):
    if type(layer) is mlx_cache.KVCache and kv_bits is not None:
        return mlx_cache.QuantizedKVCache(group_size=kv_group_size, bits=kv_bits)
    if type(layer) is mlx_cache.RotatingKVCache and layer.keep:
        return KeptRotatingKVCache(max_size=layer.max_size, keep=layer.keep)
    return layer


def _check_cache_options(max_kv_size, kv_bits, kv_group_size) -> None:
    whole = isinstance(max_kv_size, int) and not isinstance(max_kv_size, bool)
    if max_kv_size is not None and not (whole and max_kv_size > KEPT_TOKENS):
        raise InvalidOption(
            f"max KV size must be a whole number above {KEPT_TOKENS} (the first {KEPT_TOKENS} tokens are always "
            f"kept), got {max_kv_size!r}"
        )
    if kv_bits is not None and kv_bits not in KV_BITS:
        raise InvalidOption(f"KV bits must be one of {', '.join(map(str, KV_BITS))}, got {kv_bits!r}")
    if kv_group_size not in KV_GROUP_SIZES:
        raise InvalidOption(
            f"KV group size must be one of {', '.join(map(str, KV_GROUP_SIZES))}, got {kv_group_size!r}"
        )


def check_supported(model, model_name: str) -> None:
    """Raise UnsupportedCache now, at load time, rather than at the first generation."""
    make_cache(model, model_name)
