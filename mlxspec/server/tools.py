"""A chat request's `tools` and `tool_choice`: checked, and turned into what the server does
with them. Plain Python (no MLX).

- `auto` (the default with tools): the tools go to the chat template and the model's calls
  are parsed out of its output (tool_calls.py).
- `none`: the tools still go to the template, so the prompt (and the prompt cache) is the
  conversation's as before, as vLLM does by default; nothing is parsed, markup stays text.
- `required` and a named function hold the model to one call by a grammar in its own markup
  (`forced_call`): for formats whose calls are one JSON object between markers (mlx-lm's
  json_tools: Qwen3, Hermes), `<tool_call>` {"name": ..., "arguments": ...} `</tool_call>`,
  the arguments valid under the tool's parameters schema, speculative decoding kept exact
  (../grammar.py). Other formats refuse them (400 naming tool_choice). Checking the output after
  the fact could only fail the request once the model had answered otherwise.
- A model for which mlx-lm knows no tool-call format refuses tools (400 naming tools)
  rather than dropping them silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..tool_calls import ToolFormat
from .schema import ChatBody, RequestError

AUTO, NONE, REQUIRED, NAMED = "auto", "none", "required", "function"
JSON_CALL_FORMATS = ("json_tools",)  # mlx-lm parsers whose call is one JSON object between markers


@dataclass(frozen=True)
class ToolUse:
    tools: list[dict] | None  # for the chat template
    choice: str  # AUTO, NONE, REQUIRED or NAMED
    format: ToolFormat | None  # how the model writes calls (None: no tools in force)
    # the function it must call (choice NAMED): apart from `choice`, as a function may be
    # named "auto", "none" or "required"
    function: str | None = None

    @property
    def parses(self) -> bool:
        return self.format is not None and self.choice != NONE and bool(self.tools)

    @property
    def forced(self) -> bool:
        return self.choice not in (AUTO, NONE)

    def forced_call(self, tokenizer):
        """The grammar holding the reply to one call (tool_choice required or named), or None."""
        if not self.forced:
            return None
        if self.format is None or self.format.name not in JSON_CALL_FORMATS:
            raise RequestError(
                f"tool_choice {self.function or self.choice!r} is not supported for this model's tool-call format "
                f"({self.format.name if self.format else 'none'}): holding a model to a call needs constrained "
                "decoding in its own markup, built here only for one JSON object between markers (json_tools)",
                param="tool_choice",
            )
        from ..grammar import GrammarSpec

        tools = self.tools if self.choice == REQUIRED else [t for t in self.tools if _name(t) == self.function]
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": _name(tool)},
                    "arguments": tool["function"].get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for tool in tools
        ]
        schema = json.dumps({"anyOf": calls} if len(calls) > 1 else calls[0])
        start, end = _marker(tokenizer, self.format.start), _marker(tokenizer, self.format.end)
        lark = f'start: {start} "\\n" call "\\n" {end}\ncall: %json {schema}\n'
        return GrammarSpec("lark", lark, "tool_choice")

    def note(self) -> str | None:
        """For the console line, while tools are in force."""
        return f"tools {len(self.tools)} ({self.function or self.choice})" if self.tools else None


def _name(tool: dict) -> str:
    return tool["function"]["name"]


def _marker(tokenizer, text: str) -> str:
    """A call marker in llguidance's Lark: the special token by id where the tokenizer has it
    as one (Qwen's <tool_call>), else the text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    special = set(getattr(tokenizer, "all_special_ids", None) or []) | set(
        getattr(getattr(tokenizer, "_tokenizer", None), "added_tokens_decoder", {}) or {}
    )
    if len(ids) == 1 and ids[0] in special:
        return f"<[{ids[0]}]>"
    return json.dumps(text)


def tool_use(body: ChatBody, format: ToolFormat | None) -> ToolUse:
    tools = _checked_tools(body.tools)
    choice, function = _choice(body.tool_choice, tools)
    if tools and format is None:
        raise RequestError(
            "tools are not supported by this model: mlx-lm infers no tool-call format for it from its chat "
            "template (no tool parser), so its calls could not be read back",
            param="tools",
        )
    return ToolUse(tools=tools, choice=choice, format=format if tools else None, function=function)


def _checked_tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict):
            raise RequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}", param=f"tools[{i}]"
            )
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{i}].function.name must be a non-empty text", param=f"tools[{i}].function.name")
        if "parameters" in function and not isinstance(function["parameters"], dict):
            raise RequestError(
                f"tools[{i}].function.parameters must be a JSON schema object", param=f"tools[{i}].function.parameters"
            )
    return tools


def _choice(choice, tools: list[dict] | None) -> tuple[str, str | None]:
    """(AUTO, NONE, REQUIRED or NAMED; the function's name when NAMED)."""
    if choice is None:
        return (AUTO if tools else NONE), None
    if choice in (AUTO, NONE):
        return choice, None
    named = isinstance(choice, dict) and choice.get("type") == "function"
    if (choice == REQUIRED or named) and not tools:
        raise RequestError("tool_choice needs tools to choose from", param="tool_choice")
    if choice == REQUIRED:
        return REQUIRED, None
    if named:
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if not any(_name(tool) == name for tool in tools):
            raise RequestError(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
        return NAMED, name
    raise RequestError(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
        param="tool_choice",
    )
