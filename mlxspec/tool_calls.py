"""Tool calls in a model's output, found with mlx-lm's own machinery rather than parsers of
ours: the tokenizer's tool-call markers and parser (`TokenizerWrapper.tool_call_start`,
`tool_call_end`, `tool_parser`, which mlx-lm infers from the chat template in
`tokenizer_utils._infer_tool_parser`) and its `TextStateMachine`, which holds back text that
may be the start of a marker.

The splitting follows mlx_lm/server.py (`handle_completion`, `ToolCallFormatter`, mlx-lm
0.32): text between the markers is a call's text, handed to the parser when the end marker
arrives, or when the output ends (Mistral's `[TOOL_CALLS]` has no end marker). Where mlx-lm
drops a call its parser refuses (it logs a warning), here the markup comes back as text:
what does not parse is still the model's answer, never an error.

Plain Python at import (mlx-lm is imported when a splitter is made), so views can use it.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass

TEXT, TOOL = "normal", "tool"  # mlx-lm's state names


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes tool calls, as mlx-lm reads them from its tokenizer."""

    parser: Callable  # mlx-lm's parse_tool_call(text, tools) -> a call or a list of calls
    start: str  # e.g. "<tool_call>"
    end: str  # "" where a call runs to the end of the output
    name: str  # the parser's module in mlx_lm.tool_parsers, e.g. "json_tools"

    def describe(self) -> str:
        markers = f"{self.start} … {self.end}" if self.end else f"{self.start} …"
        return f"mlx-lm's {self.name} parser ({markers})"


def tool_format(tokenizer) -> ToolFormat | None:
    """The tokenizer's tool-call format, or None where mlx-lm knows none for it."""
    if not getattr(tokenizer, "has_tool_calling", False) or tokenizer.tool_parser is None:
        return None
    parser = tokenizer.tool_parser
    name = getattr(parser, "__module__", "").rsplit(".", 1)[-1] or "unknown"
    return ToolFormat(parser=parser, start=tokenizer.tool_call_start, end=tokenizer.tool_call_end or "", name=name)


def tool_line(tokenizer) -> str:
    """One line for a server's start: how it reads tool calls, or that it cannot."""
    format = tool_format(tokenizer)
    if format is None:
        return (
            "tool calls: none (mlx-lm infers no tool-call format for this model from its chat template): "
            "a request with tools gets a 400"
        )
    return f"tool calls: read with {format.describe()}"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: `arguments` is JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def describe(self) -> str:
        return f"{self.name}({self.arguments})"


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _calls(parsed, *, taken: set[str] = frozenset()) -> list[ToolCall]:
    """mlx-lm's parsed call(s) as ToolCalls; ValueError for anything not shaped as a call. An
    id the model wrote (Mistral's parser keeps it) is kept unless an earlier call of the reply
    (`taken`) or of this markup has it: clients key calls by id (the openai client's stream
    state fails on two calls with one id)."""
    calls = []
    taken = set(taken)
    for call in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise ValueError("not a call: no function name")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as JSON text
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError("a call's arguments must be an object")
        written = call.get("id")
        call_id = written if isinstance(written, str) and written and written not in taken else new_call_id()
        taken.add(call_id)
        text = json.dumps(_finite(arguments), ensure_ascii=False, allow_nan=False)
        calls.append(ToolCall(id=call_id, name=call["name"], arguments=text))
    if not calls:
        raise ValueError("no call")
    return calls


def _finite(value):
    """`value` with each number past a double's range (`1e999`: valid JSON, and the grammar of
    a forced call allows it; a random model wrote one) as the largest double of its sign:
    parsed, it is infinity, which JSON cannot carry (the arguments came back as `Infinity`, and
    Anthropic's route answered 500). A NaN is no JSON number: ValueError, the markup stays text."""
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            raise ValueError("NaN is not JSON")
        return math.copysign(sys.float_info.max, value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


class ToolCallSplitter:
    """Streamed text in; text pieces and ToolCalls out, in order. `feed` each piece, then
    `finish` once; a call's markup is held back until it closes (or the output ends)."""

    def __init__(self, format: ToolFormat, *, tools: list | None = None):
        from mlx_lm.generate import TextStateMachine

        self.format = format
        self.tools = tools
        self.calls: list[ToolCall] = []
        # the tool transitions of mlx_lm.generate.make_text_state_machine, and no others:
        # reasoning stays in the text here, as everywhere in mlxspec
        transitions = {TEXT: [(format.start, TOOL)], TOOL: [(format.end, TEXT)] if format.end else []}
        self._machine = TextStateMachine
        self._state = TextStateMachine(transitions).make_state(TEXT)
        self._previous = TEXT
        self._call_text = ""

    def feed(self, piece: str) -> list[str | ToolCall]:
        self._state, segments = self._machine.split(self._state, piece)
        return self._take(segments)

    def finish(self) -> list[str | ToolCall]:
        """What was held back: a partial marker as text, an open call parsed (or as text)."""
        self._state, held, state = self._machine.flush(self._state)
        out = self._take([(state, held)])
        if self._previous == TOOL:
            out += self._close(closed=False)
        return out

    def _take(self, segments) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        for state, text in segments:
            if state == TOOL:
                self._call_text += text
            else:
                if self._previous == TOOL:
                    out += self._close(closed=True)
                if text:
                    out.append(text)
            self._previous = state
        return out

    def _close(self, *, closed: bool) -> list[str | ToolCall]:
        text, self._call_text = self._call_text, ""
        try:
            calls = _calls(self.format.parser(text, self.tools), taken={call.id for call in self.calls})
        except Exception:  # any parser's failure: the markup is the answer
            return [self.format.start + text + (self.format.end if closed else "")]
        self.calls += calls
        return list(calls)


def split_tool_calls(text: str, format: ToolFormat, *, tools: list | None = None) -> tuple[str, list[ToolCall]]:
    """A whole output's text outside calls, and its calls."""
    splitter = ToolCallSplitter(format, tools=tools)
    parts = splitter.feed(text) + splitter.finish()
    return "".join(p for p in parts if isinstance(p, str)), splitter.calls
