"""The blocks an answer is made of, in order: runs of text and the calls between them, as
Anthropic's content blocks and the Responses API's output items both have them. Plain
Python (no MLX).

The order and the rule on white space are here once; each API says in a subclass how a block
looks and which stream events open, grow and close it. Text that is only white space is held
until more comes: beside a call it is dropped (as the chat route gives no content beside
calls), at the end of an answer without calls it is the answer.
"""

from __future__ import annotations

from ..tool_calls import ToolCall


class Blocks:
    """Text and calls in (`feed`, then `finish` once); the blocks whole in `content`, and
    the stream events that build them returned as they happen."""

    def __init__(self):
        self.content: list[dict] = []
        self.calls: list[ToolCall] = []
        self._text_index: int | None = None  # the open text block
        self._pending = ""

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def feed(self, part: str | ToolCall) -> list[dict]:
        if isinstance(part, str):
            return self._text(part)
        events = self._close()
        self._pending = ""
        index = len(self.content)
        block, opened = self.call_block(index, part)
        self.content.append(block)
        self.calls.append(part)
        return events + opened

    def finish(self) -> list[dict]:
        events = self._text("", force=not self.called) if self._pending else []
        return events + self._close()

    def _text(self, text: str, *, force: bool = False) -> list[dict]:
        events = []
        if self._text_index is None:
            self._pending += text
            if not self._pending.strip() and not force:
                return []
            text, self._pending = self._pending, ""
            self._text_index = len(self.content)
            block, opened = self.text_block(self._text_index)
            self.content.append(block)
            events += opened
        return events + self.text_added(self._text_index, self.content[self._text_index], text)

    def _close(self) -> list[dict]:
        if self._text_index is None:
            return []
        index, self._text_index = self._text_index, None
        return self.text_closed(index, self.content[index])

    # --- what each API says ------------------------------------------------------------
    def text_block(self, index: int) -> tuple[dict, list[dict]]:
        """A new, empty text block at `index`, and the events that open it."""
        raise NotImplementedError

    def text_added(self, index: int, block: dict, text: str) -> list[dict]:
        """`text` added to the open text block (which this updates), as events."""
        raise NotImplementedError

    def text_closed(self, index: int, block: dict) -> list[dict]:
        raise NotImplementedError

    def call_block(self, index: int, call: ToolCall) -> tuple[dict, list[dict]]:
        """A call's block, and the events that send it whole."""
        raise NotImplementedError
