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
- ArraysCache (recurrent/SSM state) and CacheList holding one: a state cannot be trimmed,
  so it is restored from a snapshot taken at the start of the round and the kept tokens
  are fed again.

mlx-lm's `trim_prompt_cache` silently trims nothing when any layer refuses; here every
rewind is checked against the length it must reach, and a layer type not listed above is
refused up front rather than decoded wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models import cache as mlx_cache

from .errors import UnsupportedCache

_TRIM_TYPES = (mlx_cache.KVCache, mlx_cache.QuantizedKVCache)
_ROTATING = mlx_cache.RotatingKVCache
_STATE_TYPES = (mlx_cache.ArraysCache,)


class CacheRollbackError(RuntimeError):
    """A rewind did not reach the length it had to: a bug, never a user error."""


def _kind(layer) -> str:
    t = type(layer)
    if t in _TRIM_TYPES:
        return "trim"
    if t is _ROTATING:
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


def make_cache(model, model_name: str = "model") -> ModelCache:
    return ModelCache(mlx_cache.make_prompt_cache(model), model_name)


def check_supported(model, model_name: str) -> None:
    """Raise UnsupportedCache now, at load time, rather than at the first generation."""
    make_cache(model, model_name)
