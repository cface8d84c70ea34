"""A draft whose output layer covers only part of the target's vocabulary.

A small draft's cost is mostly its output layer: a 576-wide draft of SmolLM2 reads a
49152 x 576 head every step, more than its layers. Restricted to the ids the target
actually writes most (8191 of 49152 cover nearly all of its text), the head costs a sixth.
The rule stays exact: the draft's distribution q is zero outside the subset, so it never
proposes those ids, while the target's p is never cut (an id outside the subset is still
emitted, as a recovered or bonus token, with exactly the target's probability).

On disk it is an ordinary mlx-lm model over its own small vocabulary, plus
`subset_vocab.json` naming, for each of its rows, the target id it stands for; its last
row stands for every other id (the draft reads them as one token and never proposes it).
`SubsetVocabModel` wraps the model so that it reads and writes target ids, and everything
that takes a model (the engine, mlx-lm's own speculative decoding) takes it unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

VOCAB_FILE = "subset_vocab.json"


def read_subset(path: Path) -> tuple[list[int], int] | None:
    """(target ids of the draft's rows, the target's vocabulary size), or None for a
    folder that holds an ordinary model."""
    file = Path(path) / VOCAB_FILE
    if not file.exists():
        return None
    data = json.loads(file.read_text())
    return [int(i) for i in data["target_ids"]], int(data["target_vocab_size"])


def write_subset(path: Path, target_ids: list[int], target_vocab_size: int) -> None:
    (Path(path) / VOCAB_FILE).write_text(
        json.dumps({"target_vocab_size": target_vocab_size, "target_ids": list(target_ids)})
    )


class SubsetVocabModel(nn.Module):
    """An mlx-lm model over a subset of the target's ids, seen as one over all of them:
    inputs (B, L) of target ids, logits (B, L, target_vocab_size) with -inf outside the
    subset."""

    def __init__(self, model: nn.Module, target_ids: list[int], target_vocab_size: int):
        super().__init__()
        self.model = model
        other = len(target_ids)  # the row every id outside the subset reads
        to_draft = [other] * target_vocab_size
        for row, target_id in enumerate(target_ids):
            to_draft[target_id] = row
        self._to_draft = mx.array(to_draft, dtype=mx.uint32)
        self._target_ids = mx.array(target_ids, dtype=mx.uint32)
        self.target_vocab_size = target_vocab_size
        if hasattr(model, "make_cache"):  # else mlx-lm builds its default caches from `layers`
            self.make_cache = model.make_cache

    def __call__(self, inputs: mx.array, cache=None, **kwargs) -> mx.array:
        logits = self.model(self._to_draft[inputs], cache=cache, **kwargs)
        out = mx.full((*logits.shape[:-1], self.target_vocab_size), -mx.inf, dtype=logits.dtype)
        out[..., self._target_ids] = logits[..., : self._target_ids.shape[0]]
        return out

    @property
    def layers(self):
        return self.model.layers
