"""A token tree read in one forward of an mlx-lm model: each node at the position of its
depth, attending to the context and to its own ancestors only.

Rather than fork model files, the attention modules of a supported family are given a
subclass of their own class (as capture.py taps layers): while a `TreeLayout` is active on
the model, the attention ignores the mask the model built for a causal block and uses the
tree's, computed from its own cache (a plain cache sees all the context; a sliding window
sees what a single step at that node's position would see), and its rotary embedding
places each row at its node's position (one call, the rows moved onto the batch axis, where
`mx.fast.rope` takes an offset per row). With no layout active they run exactly as before.

Parameters, their names and the forward are unchanged, so weights, quantization and the
hidden-state taps are not disturbed. A family whose cache holds recurrent state cannot read
a tree (there is no way to give a state two children), and one whose attention does not
have this shape is not wrapped: both draft chains.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as mlx_cache

from .caches import KeptRotatingKVCache
from .capture import model_family

# Families whose attention is `self_attn(x, mask, cache)` applying `self.rope(x, offset=cache.offset)`
# and mlx-lm's (or its own bool-aware) attention, checked exact in the tests.
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "gemma3", "glm4_moe_lite")
_PLAIN = (mlx_cache.KVCache, mlx_cache.QuantizedKVCache)
_WINDOWED = (mlx_cache.RotatingKVCache, KeptRotatingKVCache)


@dataclass
class TreeLayout:
    """The rows a forward appends, as a tree over the cache: row i of the block sits at
    `positions[i]`; `parents[i]` is the block row it hangs from (-1: the context before the
    block). `earlier` tree rows, already in a plain cache from an earlier forward of the same
    tree (a drafter growing it), come first in `parents` and `positions`; rows of the block
    are the last `len(parents) - earlier`."""

    positions: list[int]
    parents: list[int]
    earlier: int = 0
    _masks: dict = field(default_factory=dict, repr=False)

    @classmethod
    def chain_then_tree(cls, *, start: int, pending: int, tree_parents: tuple[int, ...]) -> TreeLayout:
        """A verify block: `pending` ids in a chain from position `start` (the last one the
        tree's root), then the tree's nodes (parents as TokenTree numbers them)."""
        parents = list(range(-1, pending - 1)) + [pending - 1 + p for p in tree_parents]
        return cls.from_parents(start=start, parents=parents)

    @classmethod
    def from_parents(cls, *, start: int, parents: list[int], earlier: int = 0) -> TreeLayout:
        positions = []
        for parent in parents:
            positions.append(start if parent < 0 else positions[parent] + 1)
        return cls(positions, list(parents), earlier)

    @property
    def fresh(self) -> int:
        return len(self.parents) - self.earlier

    def sees(self) -> np.ndarray:
        """(rows, rows) bool: row i attends to row j, an ancestor of i or i itself."""
        n = len(self.parents)
        sees = np.eye(n, dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                sees[i] |= sees[parent]
        return sees

    def fresh_positions(self) -> mx.array:
        return mx.array(self.positions[self.earlier :], dtype=mx.int32)

    def mask_for(self, layer_cache) -> mx.array:
        """(fresh rows, keys after the update) bool, for one layer's cache as it stands
        before the block is written into it."""
        kind = type(layer_cache)
        key = (kind, layer_cache.offset, getattr(layer_cache, "max_size", None), getattr(layer_cache, "keep", 0))
        if key not in self._masks:
            self._masks[key] = mx.array(self._mask(layer_cache))
        return self._masks[key]

    def _mask(self, layer_cache) -> np.ndarray:
        sees = self.sees()[self.earlier :]  # (fresh, rows)
        queries = np.array(self.positions[self.earlier :])[:, None]
        if isinstance(layer_cache, _PLAIN):
            context = layer_cache.offset - self.earlier  # rows before the tree's first
            return np.concatenate([np.ones((len(queries), context), dtype=bool), sees], axis=1)
        if isinstance(layer_cache, _WINDOWED):
            if self.earlier:
                raise ValueError("a sliding window reads a tree in one block only")
            # RotatingKVCache._update_concat: the buffer in time order, its `keep` first rows
            # and the newest earlier ones (a window's worth less one), then the block
            offset, size, keep = layer_cache.offset, layer_cache.max_size, layer_cache.keep
            earlier = 0 if layer_cache.keys is None else min(size - 1, offset)
            rows = np.arange(earlier)
            context_positions = np.where(rows < keep, rows, rows + (offset - earlier))[None]
            recent = size - keep
            context = (context_positions <= queries) & (
                (context_positions < keep) | (queries - context_positions < recent)
            )
            tree_positions = np.array(self.positions)[None]
            return np.concatenate([context, sees & (queries - tree_positions < recent)], axis=1)
        raise TypeError(f"a tree cannot be read through a {type(layer_cache).__name__}")


class TreeSlot:
    """The layout a model's wrapped modules read while a tree forward runs (None otherwise)."""

    layout: TreeLayout | None = None


_WRAPPED: dict[type, type] = {}


def _tree_attention_class(cls: type) -> type:
    if cls not in _WRAPPED:

        def __call__(self, x, mask=None, cache=None, *args, **kwargs):
            layout = self._mlxspec_tree.layout
            if layout is not None:
                mask = layout.mask_for(cache)
            return cls.__call__(self, x, mask, cache, *args, **kwargs)

        _WRAPPED[cls] = type(f"Tree{cls.__name__}", (cls,), {"__call__": __call__})
    return _WRAPPED[cls]


# Rotary embeddings that take an array of offsets, one per row (checked against single
# steps for each); DynamicNTKScalingRoPE reads its offset as one number (rope_scaling
# "dynamic"), and a class not listed here drafts chains
ROPES_BY_ROW = ("RoPE", "Llama3RoPE", "YarnRoPE", "SuScaledRoPE")


def _unwrapped(cls: type) -> type:
    return cls.__bases__[0] if cls in _WRAPPED.values() else cls


def _tree_rope_class(cls: type) -> type:
    if cls not in _WRAPPED:

        def __call__(self, x, offset=0, *args, **kwargs):
            layout = self._mlxspec_tree.layout
            if layout is None:
                return cls.__call__(self, x, offset, *args, **kwargs)
            return rotate_at(lambda rows, positions: cls.__call__(self, rows, positions, *args, **kwargs), x, layout)

        _WRAPPED[cls] = type(f"Tree{cls.__name__}", (cls,), {"__call__": __call__})
    return _WRAPPED[cls]


def rotate_at(rope, x: mx.array, layout: TreeLayout) -> mx.array:
    """`rope(x, offset)` with each of the block's rows at its own position
    (`layout.fresh_positions()`, batch-major: a packed batch's lanes, packed.py)."""
    return rotate_rows(rope, x, layout.fresh_positions())


def rotate_rows(rope, x: mx.array, positions: mx.array) -> mx.array:
    """`rope(x, offset)` with row i of x (batch, heads, rows, dim) at `positions` (batch *
    rows,), batch-major: x goes through as (batch * rows, heads, 1, dim), where an offset
    array is one per row."""
    batch, heads, rows, dim = x.shape
    flat = x.transpose(0, 2, 1, 3).reshape(batch * rows, heads, 1, dim)
    rotated = rope(flat, positions)
    return rotated.reshape(batch, rows, heads, dim).transpose(0, 2, 1, 3)


def _attention_modules(model) -> list | None:
    inner = getattr(model, "language_model", model)
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if not layers:
        return None
    modules = [getattr(layer, "self_attn", None) for layer in layers]
    return modules if all(m is not None and hasattr(m, "rope") for m in modules) else None


def why_not(model, cache) -> str | None:
    """None when `model` with `cache` (a caches.ModelCache) can read trees; else why not."""
    family = model_family(model)
    if family not in FAMILIES:
        return f"{family} targets read chains only (trees: {', '.join(FAMILIES)})"
    modules = _attention_modules(model)
    if modules is None:
        return f"this {family} model's attention is not of the shape trees are read through"
    for rope in {_unwrapped(type(m.rope)) for m in modules}:  # inline: see why_not_family
        if rope.__name__ not in ROPES_BY_ROW:
            return f"{rope.__name__} cannot place a tree's rows at their own positions"
    for layer in cache.layers:
        if type(layer) not in (*_PLAIN, *_WINDOWED):
            return f"a {type(layer).__name__} cannot hold a tree's branches"
    return None


def why_not_rope(rope) -> str | None:
    """None when a rotary embedding places each row of a block at its own position."""
    name = _unwrapped(type(rope)).__name__
    return None if name in ROPES_BY_ROW else f"{name} cannot place a tree's rows at their own positions"


def why_not_family(model) -> str | None:
    """None when `model`'s attention can read a block laid out by position and mask (a tree,
    a packed batch); else why not. (`why_not` itself makes no call of its own here: the
    session walk's Ctrl-C lands at a counted call, and its negative control was tuned so.)"""
    return why_not(model, _NO_LAYERS)


class _NoLayers:
    layers: tuple = ()


_NO_LAYERS = _NoLayers()


def install(model, attention_modules=None) -> TreeSlot:
    """Wrap `model`'s attention modules (once; `attention_modules`: these, for a model not
    laid out as mlx-lm's are, such as an MTP head's one layer); returns the slot a tree
    forward sets."""
    slot = getattr(model, "_mlxspec_tree", None)
    if slot is not None:
        return slot
    slot = TreeSlot()
    for attention in attention_modules if attention_modules is not None else _attention_modules(model) or ():
        for module, wrap in ((attention, _tree_attention_class), (attention.rope, _tree_rope_class)):
            if type(module) not in _WRAPPED.values():
                module.__class__ = wrap(type(module))
            object.__setattr__(module, "_mlxspec_tree", slot)
    object.__setattr__(model, "_mlxspec_tree", slot)
    return slot


def take_layout(model) -> TreeLayout | None:
    """The layout a forward of `model` is to read (None: a chain), cleared: a batch's lane
    hands it to the packed forward, and other lanes' reads in between must not find it."""
    slot = getattr(model, "_mlxspec_tree", None)
    if slot is None:
        return None
    layout, slot.layout = slot.layout, None
    return layout


@contextmanager
def reading(model, layout: TreeLayout):
    """While inside, `model`'s forward reads its block as `layout` says."""
    slot = install(model)
    slot.layout = layout
    try:
        yield
    finally:
        slot.layout = None
