"""Which examples a training run holds out, by a rule on their own content: the same split
for every run over the same data (sequences.py's examples, conversations.py's corpus)."""

from __future__ import annotations

import hashlib

HELD_OUT_EVERY = 16  # about one example in 16 held out


def conversation_is_held_out(conversation: list[dict]) -> bool:
    """A conversation (or a prompt cut from one) is held out when the sha256 of its first user
    turn's text (UTF-8, as a big-endian number) is 0 modulo HELD_OUT_EVERY."""
    first = next(t["content"] for t in conversation if t["role"] == "user")
    return int.from_bytes(hashlib.sha256(first.encode()).digest(), "big") % HELD_OUT_EVERY == 0
