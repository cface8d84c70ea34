"""Token ids to text, incrementally, and stop strings; a user's text checked and read.

Decoding each new id alone breaks multi-byte characters and SentencePiece's leading spaces,
and decoding the whole output every step is quadratic. Like vLLM's incremental detokenizer,
decode a short window twice (with and without the newest ids) and emit the difference once
it no longer ends in a partial character.
"""

from __future__ import annotations

from pathlib import Path

from .errors import InvalidOption, MlxspecError


def ascii_digits(text: str) -> bool:
    """`text` is a whole number written in ASCII digits: `str.isdigit` also takes "²" (which
    `int` refuses) and `int` takes "١٢" (12), neither of which anyone typing a count means."""
    return text.isascii() and text.isdigit()


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

    def decode(self, ids: list[int]) -> str:
        """Text of ids on their own (e.g. drafts that were thrown away)."""
        return self._decode(ids)

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


class StopFilter:
    """Releases streamed text, holding back any tail that could be the start of a stop
    string, so text that turns out to belong to a stop string is never shown."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text, once one has

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text safe to show, whether a stop string was reached)."""
        if not self.stops:
            return piece, False
        self._held += piece
        found = earliest_stop(self._held, self.stops)
        if found is not None:
            at, self.matched = found
            released, self._held = self._held[:at], ""
            return released, True
        keep = _partial_stop_length(self._held, self.stops)
        released = self._held[: len(self._held) - keep]
        self._held = self._held[len(released) :]
        return released, False

    def flush(self) -> str:
        released, self._held = self._held, ""
        return released


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index in `text` where the earliest stop string starts."""
    found = earliest_stop(text, stops)
    return found[0] if found else None


def earliest_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the earliest stop string starts in `text`, and which it is (of two starting
    there, the first given)."""
    found = [(at, i) for i, stop in enumerate(stops) if (at := text.find(stop)) >= 0]
    if not found:
        return None
    at, i = min(found)
    return at, stops[i]


def _partial_stop_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that begins some stop string."""
    for n in range(min(len(text), max(map(len, stops)) - 1), 0, -1):
        if any(stop.startswith(text[-n:]) for stop in stops):
            return n
    return 0


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def opens_thinking(text: str) -> bool:
    """Whether a prompt ends inside a reasoning block (templates that open <think> for the model)."""
    return text.rstrip().endswith(THINK_OPEN)


class Reasoning:
    """Splits streamed text into (text, thinking) parts: thinking runs from <think> to
    </think>, the tags included. A tag spread over several pieces switches the state where it
    ends (what came before was shown already). Plain Python: views style the parts."""

    def __init__(self, thinking: bool = False):
        self.thinking = thinking
        self._tail = ""  # the last few characters, to find a tag that began in an earlier piece

    def split(self, piece: str) -> list[tuple[str, bool]]:
        text, offset = self._tail + piece, len(self._tail)
        parts, shown, search = [], 0, 0
        while True:
            tag = THINK_CLOSE if self.thinking else THINK_OPEN
            at = text.find(tag, search)
            if at < 0:
                break
            # an opening tag is thinking already; a closing one still is
            boundary = max((at if not self.thinking else at + len(tag)) - offset, shown)
            if boundary > shown:
                parts.append((piece[shown:boundary], self.thinking))
            shown, search = boundary, at + len(tag)
            self.thinking = not self.thinking
        if shown < len(piece):
            parts.append((piece[shown:], self.thinking))
        self._tail = text[-(len(THINK_CLOSE) - 1) :]
        return parts


def check_text(text: str | None, what: str) -> None:
    """Refuse text that is not Unicode a tokenizer can read: a lone surrogate (from bytes
    that were not UTF-8 on the command line) makes the tokenizer raise a TypeError."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidOption(f"{what} is not valid UTF-8 text (at character {e.start})") from None


def read_text_file(path: str | Path, what: str, error: type[MlxspecError] = InvalidOption) -> str:
    """A text file a user names (`what`: the option or role), as UTF-8; one line naming it
    when it is missing, a folder, unreadable or not text (a binary file)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a folder: give a file") from None
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x})") from None
    except OSError as e:
        raise error(f"{what} {path} cannot be read ({e.strerror or e})") from None
