"""A sound lower bound on a text's token count, read off the tokenizer once, so that a text
that cannot fit the context is refused by its length before anyone tokenizes it.

One token stands for at most `per_token` bytes of text (its longest vocabulary entry, or
added token, times what the normalizer can shrink the text by), so a text of n UTF-8 bytes
has at least ceil(n / per_token) tokens. Where no such bound holds (an unknown-token that
swallows any run of text, a normalizer that may delete characters) there is none, and
every text is tokenized: the refusal by length is an early exit, never a guess.
"""

from __future__ import annotations

import json
import math

# a Unicode normalization or lowercasing turns one code point (at most 4 UTF-8 bytes) into
# at least one byte (NFKC's U+1D400 MATHEMATICAL BOLD A -> "A"); composing code points
# (a base and its marks, Hangul jamo) shrinks less than that
UNICODE_SHRINK = 4
UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"}


def bytes_per_token(tokenizer) -> float | None:
    """The most bytes of input text one token can stand for, or None where unbounded or
    unknown (no fast tokenizer, a model other than BPE, a normalizer that may delete)."""
    backend = _backend(tokenizer)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None  # WordPiece and Unigram map whole unknown words or runs to one token
    if model.get("unk_token") and not model.get("byte_fallback") and model.get("fuse_unk"):
        return None  # a run of unknown characters fuses into one token
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None:
        return None
    # byte-level BPE writes each input byte as one character; otherwise a vocabulary entry's
    # UTF-8 length is at least what it stands for ("▁" is 3 bytes for a space, "<0x41>" 6)
    byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
    longest = max((len(t) if byte_level else len(t.encode())) for t in model.get("vocab", {}))
    added = [len(t.get("content", "").encode()) for t in spec.get("added_tokens", [])]
    return max([longest, *added]) * shrink


def fewest_tokens(text_bytes: int, per_token: float) -> int:
    return math.ceil(text_bytes / per_token)


def _backend(tokenizer):
    """The `tokenizers.Tokenizer` under mlx-lm's wrapper and transformers' fast tokenizer."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    return backend if hasattr(backend, "to_str") else None


def _shrink(normalizer: dict | None) -> float | None:
    """How many times shorter (in UTF-8 bytes) the normalizer can make a text; None: unbounded."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        total = 1
        for step in normalizer.get("normalizers", []):
            shrink = _shrink(step)
            if shrink is None:
                return None
            total *= shrink
        return total
    if kind in UNICODE_NORMALIZERS:
        return UNICODE_SHRINK
    if kind == "Prepend":
        return 1
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}).get("String"), normalizer.get("content", "")
        if pattern is None or not content:
            return None  # a regex, or a deletion
        return max(1, len(pattern.encode()) / len(content.encode()))
    return None  # Strip, StripAccents, BertNormalizer, Precompiled, ...: may delete characters
