"""What a prompt-cache file must show before its caches are used: its metadata of the
right kinds, every tensor it was written with present and finite, a digest (written at
save) over its ids and tensors that still matches, and every layer's tensors at least as long
as its offset says. A file that fails any of these is refused in one line naming it, rather
than decoding from caches that do not hold the prompt they claim."""

from __future__ import annotations

import hashlib
import json

from ..errors import ModelLoadError

# The metadata fields and the kinds they must have (int: a whole number, not a bool).
_FIELDS = {"text": str, "ids": list, "user": str, "system": (str, type(None)), "raw": bool, "models": dict}
_MODEL_FIELDS = {"name": str, "config": str, "weight_bytes": int, "width": int, "layers": int}
_OPTION_FIELDS = ("max_kv_size", "kv_bits", "kv_group_size")


class DamagedPromptCache(ModelLoadError):
    """A prompt-cache file altered or damaged since it was written."""


def digest(ids, arrays: dict, layout: dict) -> str:
    """sha256 over the ids, mlx-lm's layout metadata (each layer's class and state) and every
    tensor's name, type, shape and bytes."""
    h = hashlib.sha256(json.dumps([[int(i) for i in ids], layout], sort_keys=True).encode())
    for name in sorted(arrays):
        array = arrays[name]
        h.update(json.dumps([name, str(array.dtype), list(array.shape)]).encode())
        h.update(bytes(memoryview(array)))
    return h.hexdigest()


def check_metadata(path, meta: dict) -> None:
    """Refuse metadata whose fields are missing or of the wrong kind."""

    def bad(field: str) -> DamagedPromptCache:
        return DamagedPromptCache(f"{path} has damaged metadata ({field}): make it again with `mlxspec cache-prompt`")

    for field, kind in _FIELDS.items():
        if field not in meta or not _is(meta[field], kind):
            raise bad(field)
    if len(meta["ids"]) < 2 or not all(_is(i, int) and i >= 0 for i in meta["ids"]):
        raise bad("ids")
    if not meta["models"] or not set(meta["models"]) <= {"target", "draft"} or "target" not in meta["models"]:
        raise bad("models")
    for role, made in meta["models"].items():
        if not isinstance(made, dict) or not all(_is(made.get(k), kind) for k, kind in _MODEL_FIELDS.items()):
            raise bad(f"models.{role}")
    options = meta.get("cache_options")
    if not isinstance(options, dict) or set(options) != set(_OPTION_FIELDS):
        raise bad("cache_options")
    if not all(options[k] is None or (_is(options[k], int) and options[k] > 0) for k in _OPTION_FIELDS):
        raise bad("cache_options")
    tensors = meta.get("tensors")
    if (
        not isinstance(tensors, list)
        or not all(isinstance(t, str) for t in tensors)
        or not _is(meta.get("digest"), str)
    ):
        raise bad("digest")


def _is(value, kind) -> bool:
    if kind is int or kind == (int,):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def layout(flat: dict) -> dict:
    """The file's metadata besides mlxspec's own: mlx-lm's classes and layer states."""
    return {key: value for key, value in flat.items() if key != "0.mlxspec"}


def check_tensors(path, meta: dict, arrays: dict, flat: dict) -> None:
    """Every tensor written present, finite, and the digest of ids and tensors unchanged."""
    import mlx.core as mx

    if missing := sorted(set(meta["tensors"]) - set(arrays)):
        raise DamagedPromptCache(f"{path} lacks tensor {missing[0]}: it is damaged, make it again")
    if extra := sorted(set(arrays) - set(meta["tensors"])):
        raise DamagedPromptCache(f"{path} holds tensor {extra[0]}, which it was not written with: make it again")
    for name in sorted(arrays):
        array = arrays[name]
        if mx.issubdtype(array.dtype, mx.floating) and not mx.isfinite(array).all().item():
            raise DamagedPromptCache(
                f"{path}: tensor {name} holds NaN or infinite values: it is damaged, make it again"
            )
    if digest(meta["ids"], arrays, layout(flat)) != meta["digest"]:
        raise DamagedPromptCache(
            f"{path} does not match the digest written with it (its ids or tensors were altered): make it again"
        )


def check_layers(path, layers: list) -> None:
    """Every layer's keys and values at least as long as its offset says (a window's: as its size)."""
    from ..decoding.caches import _parts

    for i, layer in enumerate(layers):
        for part in _parts(layer):
            keys, values = getattr(part, "keys", None), getattr(part, "values", None)
            if keys is None or values is None:
                if getattr(part, "offset", 0):
                    raise DamagedPromptCache(f"{path}: layer {i} says {part.offset} tokens and holds none")
                continue
            # buffers grow in steps (longer than the offset is room); a window holds at least
            # its newest max_size positions
            window = getattr(part, "max_size", None)
            shortest = min(part.offset, window) if window else part.offset
            for what, tensor in (("keys", keys), ("values", values)):
                length = (tensor[0] if isinstance(tensor, (list, tuple)) else tensor).shape[-2]
                if length < shortest:
                    raise DamagedPromptCache(
                        f"{path}: layer {i}'s {what} hold {length} positions for an offset of {part.offset}: "
                        "it is damaged, make it again"
                    )
