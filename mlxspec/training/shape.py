"""Where a run's data is tapped and what its drafter reads of it: positions on the target's
residual stream (capture.install_stream), and the kind's layers nearest them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..drafters import DFLASH, EAGLE3
from ..errors import TrainingError
from .settings import Settings
from .store import read_taps


@dataclass(frozen=True)
class TargetShape:
    """What the run's files must fit: the target's vocabulary, the layers the drafter reads
    (`aux`, as its kind counts them) and the taps its data holds (`stream`). An EAGLE-3
    head reads the hidden states entering its `aux` layers (low, middle, high); a DFlash
    drafter the outputs of its `target_layer_ids` (training/dflash.py): one data path,
    tapped on the residual stream (capture.install_stream). Data made for one kind can
    teach the other (--data-from): the drafter then reads the taps nearest its own."""

    vocab_size: int
    aux: tuple[int, ...]
    hidden_size: int
    kind: str
    stream: tuple[int, ...]  # the data's taps, as stream positions

    @classmethod
    def of(cls, config: dict, layers: int, *, kind: str = EAGLE3, stream: tuple[int, ...] | None = None) -> TargetShape:
        """The kind's own layers, or where the data holds other taps (`stream`), the taps
        nearest them."""
        from ..decoding.capture import default_aux_layers
        from .dflash import target_layer_ids

        text = config.get("text_config") or config
        own = tuple(target_layer_ids(layers) if kind == DFLASH else default_aux_layers(layers))
        if stream is None:
            aux, stream = own, to_stream(own, kind=kind)
        else:
            aux = nearest_taps(own, kind=kind, stream=stream, layers=layers)
        return cls(int(text["vocab_size"]), aux, int(text["hidden_size"]), kind, tuple(stream))

    @property
    def own_stream(self) -> tuple[int, ...]:
        """The drafter's layers as stream positions (a DFlash layer's output enters the next)."""
        return to_stream(self.aux, kind=self.kind)

    @property
    def feature_width(self) -> int:
        """The width of the features the drafter reads."""
        return self.hidden_size * len(self.aux)

    @property
    def data_width(self) -> int:
        """The width of the features the data's shards hold."""
        return self.hidden_size * len(self.stream)

    @property
    def columns(self) -> np.ndarray | None:
        """The data's feature columns the drafter reads, in its order (None: all, as they are)."""
        if self.stream == self.own_stream:
            return None
        taps = [self.stream.index(p) for p in self.own_stream]
        return np.concatenate([np.arange(t * self.hidden_size, (t + 1) * self.hidden_size) for t in taps])

    def tap(self, model):
        """The target's Taps where the data is made (capture.py)."""
        from ..decoding.capture import install_stream

        return install_stream(model, self.stream)


def to_stream(layer_ids: tuple[int, ...], *, kind: str) -> tuple[int, ...]:
    """A kind's layer ids as stream positions: an EAGLE-3 head's id is the layer its state
    enters, a DFlash drafter's the layer whose output it is."""
    return tuple(i + 1 for i in layer_ids) if kind == DFLASH else tuple(layer_ids)


def nearest_taps(own: tuple[int, ...], *, kind: str, stream: tuple[int, ...], layers: int) -> tuple[int, ...]:
    """For each of the kind's own layers, the nearest the data holds (the deeper of two as
    near), as the kind counts layers. An EAGLE-3 head reads three states entering layers
    (one may repeat, as a shallow target's do), a DFlash drafter the outputs of as many
    layers as it likes (each once): a tap the kind cannot name is passed over."""
    usable = sorted({p for p in stream if (p < layers if kind == EAGLE3 else p >= 1)})
    if not usable:
        raise TrainingError(f"the data's taps (stream positions {list(stream)}) hold nothing a {kind} drafter reads")
    chosen = [min(usable, key=lambda p: (abs(p - want), -p)) for want in to_stream(own, kind=kind)]
    return tuple(dict.fromkeys(p - 1 for p in chosen)) if kind == DFLASH else tuple(chosen)


def data_shape(out: Path, settings: Settings, config: dict, layers: int) -> TargetShape:
    """The run's shape: its data's taps as recorded (a run begun from another's data has
    that run's), else its own kind's."""
    return TargetShape.of(config, layers, kind=settings.kind, stream=read_taps(out / "data", layers=layers))
