"""A chat request's `tools` and `tool_choice`: checked, and turned into what the server does
with them. Plain Python (no MLX).

- `auto` (the default with tools): the tools go to the chat template and the model's calls
  are parsed out of its output (tool_calls.py).
- `none`: the tools still go to the template, so the prompt (and the prompt cache) is the
  conversation's as before, as vLLM does by default; nothing is parsed, markup stays text.
- `required` and a named function are refused (400 naming tool_choice): holding the model
  to a call takes a grammar in the model's own tool-call markup, not built yet (the engine
  constrains output: grammar.py, response_format). Checking the output after
  the fact could only fail the request once the model had answered otherwise.
- A model for which mlx-lm knows no tool-call format refuses tools (400 naming tools)
  rather than dropping them silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tool_calls import ToolFormat
from .schema import ChatBody, RequestError

AUTO, NONE = "auto", "none"


@dataclass(frozen=True)
class ToolUse:
    tools: list[dict] | None  # for the chat template
    choice: str  # AUTO or NONE
    format: ToolFormat | None  # how the model writes calls (None: no tools in force)

    @property
    def parses(self) -> bool:
        return self.format is not None and self.choice == AUTO and bool(self.tools)

    def note(self) -> str | None:
        """For the console line, while tools are in force."""
        return f"tools {len(self.tools)} ({self.choice})" if self.tools else None


def tool_use(body: ChatBody, format: ToolFormat | None) -> ToolUse:
    tools = _checked_tools(body.tools)
    choice = _choice(body.tool_choice, tools)
    if tools and format is None:
        raise RequestError(
            "tools are not supported by this model: mlx-lm infers no tool-call format for it from its chat "
            "template (no tool parser), so its calls could not be read back",
            param="tools",
        )
    return ToolUse(tools=tools, choice=choice, format=format if tools else None)


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


def _choice(choice, tools: list[dict] | None) -> str:
    if choice is None:
        return AUTO if tools else NONE
    if choice in (AUTO, NONE):
        return choice
    named = isinstance(choice, dict) and choice.get("type") == "function"
    if choice == "required" or named:
        what = "'required'" if choice == "required" else "a named function"
        raise RequestError(
            f"tool_choice {what} is not supported yet: holding the model to a call needs constrained decoding "
            "in its tool-call markup, which this server does not build yet (response_format is constrained); "
            "use 'auto' (the model may call a tool) or 'none'",
            param="tool_choice",
        )
    raise RequestError(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
        param="tool_choice",
    )
