"""What every round of one generation carries, bundled once (engine.decode) instead of passed
as five keywords through the loop, the plain stretches and the rounds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import mlx.core as mx

from ..grammar import Matcher
from .sampling import SamplingParams


@dataclass(frozen=True, kw_only=True)
class Carry:
    params: SamplingParams  # one sampler for draft, target and standard decoding
    eos_ids: frozenset[int]  # a round ends the generation at the first of these it emits
    key: mx.array  # split once per round, never the global seed
    grammar: Matcher | None = None  # every id drawn from logits it masks (grammar.py)

    def split(self) -> tuple[Carry, Carry]:
        """(what the rest of the generation carries, what this round carries): the key split
        in two, as `key, round_key = mx.random.split(key)`."""
        key, round_key = mx.random.split(self.key)
        return self.keyed(key), self.keyed(round_key)

    def keyed(self, key: mx.array) -> Carry:
        """The same with another key (a round's drafter draws with a key of its own)."""
        return dataclasses.replace(self, key=key)
