"""Token ids to text, incrementally, and stop strings.

Decoding each new id alone breaks multi-byte characters and SentencePiece's leading spaces,
and decoding the whole output every step is quadratic. Like vLLM's incremental detokenizer,
decode a short window twice (with and without the newest ids) and emit the difference once
it no longer ends in a partial character.
"""

from __future__ import annotations

_PARTIAL = "\ufffd"


class TextStream:
    def __init__(self, tokenizer, context: list[int] = ()):
        """`context`: the last few prompt ids, so the first generated id decodes as it
        continues the prompt (SentencePiece drops a leading space at the very start)."""
        self._tokenizer = tokenizer
        self.tokens: list[int] = list(context)
        self.text = ""
        self._window = 0  # start of the ids decoded for context
        self._shown = len(self.tokens)  # ids whose text is accounted for

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def add(self, token: int) -> str:
        """Append one id; returns the text it completes (possibly empty)."""
        self.tokens.append(token)
        before = self._decode(self.tokens[self._window : self._shown])
        after = self._decode(self.tokens[self._window :])
        if len(after) > len(before) and not after.endswith(_PARTIAL):
            piece = after[len(before) :]
            self._window, self._shown = self._shown, len(self.tokens)
            self.text += piece
            return piece
        return ""

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the very end)."""
        before = self._decode(self.tokens[self._window : self._shown])
        after = self._decode(self.tokens[self._window :])
        piece = after[len(before) :]
        self._window = self._shown = len(self.tokens)
        self.text += piece
        return piece


def find_stop(text: str, stops: tuple[str, ...], searched: int) -> int | None:
    """Index in `text` where the earliest stop string starts, looking only at matches that
    end after position `searched` (earlier text was checked already)."""
    best = None
    for stop in stops:
        at = text.find(stop, max(0, searched - len(stop) + 1))
        if at >= 0 and (best is None or at < best):
            best = at
    return best
