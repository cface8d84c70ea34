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

from ..errors import InvalidOption
from ..grammar import check_schema_depth
from ..tool_calls import ToolFormat
from .schema import ChatBody, RequestError

AUTO, NONE, REQUIRED, NAMED = "auto", "none", "required", "function"
JSON_CALL_FORMATS = ("json_tools",)  # mlx-lm parsers whose call is one JSON object between markers
# a forced call's JSON as chat templates write calls (tojson: json.dumps' ", " and ": "), and
# no other white space: left free, a small model fills a call with newlines until max tokens
# (8 of 8 forced calls of a random Hermes-template model did); llguidance's JSON options
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


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
        """The grammar holding the reply to one call (tool_choice required or named), or None:
        the model's markers around `{"name": NAME, "arguments": ARGUMENTS}`, written as the
        chat template writes calls (`, ` and `: `, json.dumps' separators, and no other white
        space: left free, a weak model fills the call with newlines until max tokens), each
        tool's arguments a JSON schema of their own (its `$ref`s resolve against it)."""
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

        rules = []
        for i, tool in self.candidates():
            head = '{"name": ' + json.dumps(_name(tool), ensure_ascii=False) + ', "arguments": '
            rules.append(f'call_{i}: {json.dumps(head)} arguments_{i} "}}"')
            rules.append(f"arguments_{i}: %json {json.dumps(arguments_schema(tool, i))}")
        start, end = _marker(tokenizer, self.format.start), _marker(tokenizer, self.format.end)
        calls = " | ".join(f"call_{i}" for i, _ in self.candidates())
        lark = f'start: {start} "\\n" call "\\n" {end}\ncall: {calls}\n' + "".join(rule + "\n" for rule in rules)
        try:
            return GrammarSpec("lark", lark, "tool_choice's grammar (the tools' parameters)")
        except InvalidOption as e:
            raise RequestError(str(e), param="tools") from None

    def candidates(self) -> list[tuple[int, dict]]:
        """(index in tools, tool) for the tools a forced call may call."""
        return [(i, t) for i, t in enumerate(self.tools) if self.choice == REQUIRED or _name(t) == self.function]

    def parameter_specs(self):
        """(param, the arguments' grammar alone) for each tool a forced call may call: to name
        the one whose parameters the grammar engine refuses."""
        from ..grammar import GrammarSpec

        for i, tool in self.candidates():
            label = f"the parameters of tool {_name(tool)!r}"
            yield f"tools[{i}].function.parameters", GrammarSpec.json_schema(arguments_schema(tool, i), label=label)

    def note(self) -> str | None:
        """For the console line, while tools are in force."""
        return f"tools {len(self.tools)} ({self.function or self.choice})" if self.tools else None


def _name(tool: dict) -> str:
    return tool["function"]["name"]


def arguments_schema(tool: dict, index: int) -> dict:
    """The JSON schema a forced call's arguments are held to: the tool's parameters as an
    object (what a call's arguments are; OpenAI refuses parameters of another type, and so
    does this), written compactly (the template's separators, CALL_JSON)."""
    param = f"tools[{index}].function.parameters"
    parameters = tool["function"].get("parameters") or {}
    declared = parameters.get("type")
    if declared is not None and "object" not in (declared if isinstance(declared, list) else [declared]):
        raise RequestError(
            f"{param} must describe an object (a call's arguments are one), not type {declared!r}", param=param
        )
    try:
        check_schema_depth(parameters, param)
    except InvalidOption as e:
        raise RequestError(str(e), param=param) from None
    options = parameters.get("x-guidance")
    return {
        **closed_objects(parameters),
        "type": "object",
        "x-guidance": {**CALL_JSON, **(options if isinstance(options, dict) else {})},
    }


# where a schema holds schemas: by name (one), by map (each value), by list (each item)
_SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def closed_objects(schema):
    """`schema` with `additionalProperties: false` on every object schema that names its
    properties and does not say: JSON Schema lets such an object take keys of any name, and
    a weak model forced to call then writes keys until max tokens (`{"city": "", "ototo…`).
    llama.cpp's grammars and vLLM's (`no-additional-properties`) read a missing value the
    same way, and OpenAI's strict mode requires it. An object that names no properties
    (`{"type": "object"}`) stays any object. Walks only where a schema holds schemas, so a
    property named "properties" is a name, not a keyword."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(sub) for sub in out[key]]
    if "additionalProperties" not in out and ("properties" in out or "patternProperties" in out):
        out["additionalProperties"] = False
    return out


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
