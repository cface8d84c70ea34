"""Hidden states of chosen target layers, taken as the target runs its own forward.

A feature drafter (EAGLE-3, an MTP head) reads the residual stream the target already
computed. Rather than fork every model file, the chosen layers of an mlx-lm model are given a
subclass of their own class whose `__call__` records its input before running the layer as
before: the parameters, their names and the forward are unchanged, and a model without taps
runs exactly as it always did. Layer id `i` means the hidden state *entering* layer `i` (the
output of layer `i - 1`), as vLLM's `aux_hidden_state_layers` and EAGLE's code count them.
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import UnsupportedModel

# model_type -> how its decoder layers are reached; these families' layers take the residual
# stream as their first argument and return it
SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text", "gemma3")


class Taps:
    """What the tapped layers saw in the latest forward, in layer-id order."""

    def __init__(self, layer_ids: tuple[int, ...]):
        self.layer_ids = layer_ids
        self.seen: dict[int, mx.array] = {}

    def take(self) -> mx.array:
        """The recorded states, concatenated on the last axis: (batch, length, len(ids) * hidden)."""
        missing = [i for i in self.layer_ids if i not in self.seen]
        if missing:
            raise RuntimeError(f"no hidden state was recorded for layers {missing}")
        states = [self.seen[i] for i in self.layer_ids]  # an id may repeat (shallow targets)
        self.seen.clear()
        return states[0] if len(states) == 1 else mx.concatenate(states, axis=-1)


_TAPPED_CLASSES: dict[type, type] = {}


def _tapped_class(cls: type) -> type:
    if cls not in _TAPPED_CLASSES:

        def __call__(self, x, *args, **kwargs):
            self._mlxspec_taps.seen[self._mlxspec_layer_id] = x
            return cls.__call__(self, x, *args, **kwargs)

        _TAPPED_CLASSES[cls] = type(f"Tapped{cls.__name__}", (cls,), {"__call__": __call__})
    return _TAPPED_CLASSES[cls]


def model_family(model) -> str:
    args = getattr(model, "args", None)
    return getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def decoder_layers(model) -> list:
    family = model_family(model)
    if family not in SUPPORTED_FAMILIES:
        raise UnsupportedModel(
            f"drafting from hidden states supports {', '.join(SUPPORTED_FAMILIES)} targets, not {family}"
        )
    inner = getattr(model, "language_model", model)  # gemma3's multimodal wrapper
    return list(inner.model.layers)


def install(model, layer_ids: tuple[int, ...]) -> Taps:
    """Tap `layer_ids` of `model` (an mlx-lm model); returns the Taps they write to. A model
    is tapped once: a second call with other ids adds them to the same Taps."""
    layers = decoder_layers(model)
    bad = [i for i in layer_ids if not 0 <= i < len(layers)]
    if bad:
        raise UnsupportedModel(f"the target has {len(layers)} layers; a feature layer id must be below that, got {bad}")
    taps = getattr(model, "_mlxspec_taps", None)
    if taps is None:
        taps = Taps(tuple(layer_ids))
        object.__setattr__(model, "_mlxspec_taps", taps)
    else:
        taps.layer_ids = tuple(layer_ids)  # the newest head's choice
    for i in layer_ids:
        layer = layers[i]
        if not type(layer).__name__.startswith("Tapped"):
            layer.__class__ = _tapped_class(type(layer))
        object.__setattr__(layer, "_mlxspec_taps", taps)
        object.__setattr__(layer, "_mlxspec_layer_id", i)
    return taps


def taps_of(model) -> Taps | None:
    return getattr(model, "_mlxspec_taps", None)


def num_layers(model) -> int:
    return len(decoder_layers(model))


def default_aux_layers(count: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high features (its code and vLLM's default), kept inside a
    shallow target."""
    return (min(2, count - 1), count // 2, max(count - 3, 0))


FINAL = "final"  # a Taps id: the target's last hidden state after its final norm (an MTP head's input)
_TAPPED_NORMS: dict[type, type] = {}


def _tapped_norm_class(cls: type) -> type:
    if cls not in _TAPPED_NORMS:

        def __call__(self, x, *args, **kwargs):
            out = cls.__call__(self, x, *args, **kwargs)
            self._mlxspec_taps.seen[FINAL] = out if self._mlxspec_after_norm else x
            return out

        _TAPPED_NORMS[cls] = type(f"Tapped{cls.__name__}", (cls,), {"__call__": __call__})
    return _TAPPED_NORMS[cls]


def install_final(model, *, after_norm: bool = True) -> Taps:
    """Tap what `model`'s final norm returns (the hidden state its output layer reads), or
    with `after_norm` False what it is given: the feature an MTP head reads. Any family whose
    inner model ends in `norm` (mlx-lm's)."""
    inner = getattr(model, "language_model", model).model
    norm = getattr(inner, "norm", None)
    if norm is None:
        raise UnsupportedModel(f"{model_family(model)} has no final norm to read hidden states from")
    taps = getattr(model, "_mlxspec_taps", None)
    if taps is None:
        taps = Taps((FINAL,))
        object.__setattr__(model, "_mlxspec_taps", taps)
    else:
        taps.layer_ids = (FINAL,)
    if not type(norm).__name__.startswith("Tapped"):
        norm.__class__ = _tapped_norm_class(type(norm))
    object.__setattr__(norm, "_mlxspec_taps", taps)
    object.__setattr__(norm, "_mlxspec_after_norm", after_norm)
    return taps


def install_outputs(model, layer_ids: tuple[int, ...]) -> Taps:
    """Tap the *outputs* of `layer_ids` (as DFlash counts them: its reference hooks each
    layer's output): layer i's output is what enters layer i + 1, and the last layer's what
    enters the final norm. Returns the Taps, its ids in the order given."""
    count = num_layers(model)
    bad = [i for i in layer_ids if not 0 <= i < count]
    if bad:
        raise UnsupportedModel(f"the target has {count} layers; a feature layer id must be below that, got {bad}")
    return install_stream(model, tuple(i + 1 for i in layer_ids))


def install_stream(model, positions: tuple[int, ...]) -> Taps:
    """Tap the residual stream at `positions`: position p is the hidden state entering
    layer p, and position L (the target's layer count) the last layer's output, before the
    final norm. Both an EAGLE-3 head's layer ids and a DFlash drafter's (less one) count so;
    training data records its taps this way. Returns the Taps, in the order given."""
    count = num_layers(model)
    bad = [p for p in positions if not 0 <= p <= count]
    if bad:
        raise UnsupportedModel(f"the target has {count} layers; a stream position must be 0 to {count}, got {bad}")
    inputs = tuple(p for p in positions if p < count)
    taps = install(model, inputs) if inputs else None
    if count in positions:
        taps = install_final(model, after_norm=False)
    taps.layer_ids = tuple(p if p < count else FINAL for p in positions)
    return taps
