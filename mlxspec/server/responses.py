"""OpenAI's Responses API shapes: a request translated into the chat request the server already
serves (so every rule, template path and refusal is the chat route's), and the response, its
output items, stream events and usage the `openai` client reads (openai/types/responses:
Response, ResponseOutputMessage, ResponseFunctionToolCall, the Response*Event types,
ResponseUsage). Plain Python (no MLX).

The translation is the one vLLM's and LM Studio's servers make: `instructions` is a system
message first (and, as OpenAI has it, not carried to the next response by
`previous_response_id`); `input` a text is one user message; a `message` item is a message
(text, or input_text / output_text parts); a `function_call` item is an assistant's call
(calls after an assistant's text join its message, as the model wrote them); a
`function_call_output` item is a `tool` message. Function tools (`name`, `description`,
`parameters`) are chat's function tools, `tool_choice` {"type": "function", "name": ...} a
named function, `text.format` the chat route's response_format, `max_output_tokens` its
max_tokens; `reasoning.effort` "none" the template's enable_thinking false (other efforts change
nothing). What the server cannot honour (built-in tools, background responses, reasoning items,
item references, images and files, log probabilities) is a 400 naming the field.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..decoding.events import Done
from ..stats import Stats
from ..tool_calls import ToolCall
from . import blocks, schema
from .schema import ChatBody, RequestError
from .stored import size_of

# service_tier, user, prompt_cache_key, safety_identifier, stream_options: change nothing here
_STRICT = ConfigDict(strict=True, extra="ignore")

# `include` values that ask for nothing this server could leave out (it writes no reasoning
# items); Codex sends this one with every request
NOTHING_TO_INCLUDE = ("reasoning.encrypted_content",)
# the request fields the chat request takes as they are
SAME_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "gamma", "tree", "history", "chat_template_kwargs")
# how the chat route's refusals name a field, and how the Responses API names it
RENAMED = (
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    (".function.parameters", ".parameters"),
)


class ResponsesBody(BaseModel):
    model_config = _STRICT
    model: str | None = None  # any value: the server has one pair
    input: str | list[dict] | None = None
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None  # ignored: a model calls as many as it writes
    text: dict | None = None  # {"format": {...}}; verbosity is a hint, ignored
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # mlxspec's own (extra_body), as on the chat route
    min_p: float | None = None
    seed: int | None = None
    gamma: Any = None
    tree: Any = None
    history: bool | None = None
    chat_template_kwargs: dict | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict | None = None  # echoed
    # refused when they ask for something (refuse_unsupported)
    background: bool | None = None
    reasoning: dict | None = None  # effort "none": no thinking; other efforts and summary change nothing
    include: list[str] | None = None
    truncation: str | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    conversation: Any = None
    prompt: Any = None


def refuse_unsupported(body: ResponsesBody) -> None:
    refusals = [
        (body.background, "background", "background responses are not supported: the answer comes with the request"),
        (body.conversation is not None, "conversation", "conversations are not supported: use previous_response_id"),
        (body.prompt is not None, "prompt", "prompt templates are not supported: give input"),
        (body.top_logprobs, "top_logprobs", "log probabilities are not supported"),
        (body.max_tool_calls is not None, "max_tool_calls", "max_tool_calls is not supported"),
        (
            body.truncation not in (None, "disabled"),
            "truncation",
            "truncation 'auto' is not supported: an input longer than the context is refused",
        ),
    ]
    for refused, param, message in refusals:
        if refused:
            raise RequestError(message, param=param)
    for i, name in enumerate(body.include or []):
        if name not in NOTHING_TO_INCLUDE:
            raise RequestError(f"include {name!r} is not supported", param=f"include[{i}]")
    if body.input is None:
        raise RequestError("input is required", param="input")


def input_items(body: ResponsesBody) -> list[dict]:
    """The request's input as items (a text is one user message)."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    return list(body.input or [])


def translate(body: ResponsesBody, earlier: list[dict]) -> tuple[ChatBody, list[dict], int]:
    """On the offload thread (a body of many items takes seconds to read): the chat request,
    the request's input items in their plain form (what a stored response keeps) and their
    size (stored.size_of)."""
    chat = chat_body(body, earlier)
    items = [plain_item(item) for item in input_items(body)]
    return chat, items, size_of(items)


def _kind(item: dict) -> str | None:
    """An input item's type; an item with a role and no type is a message, as OpenAI reads it."""
    return item.get("type", "message" if "role" in item else None)


def plain_item(item: dict) -> dict:
    """An item as kept for previous_response_id: only the fields the translation reads, the
    text parts joined (a client's other fields are not kept: they would cost memory and
    change nothing). `item` has been read by chat_messages, so it is sound."""
    kind = _kind(item)
    if kind == "message":
        return {"type": "message", "role": item["role"], "content": _text(item.get("content"), "content")}
    if kind == "function_call":
        return {key: item[key] for key in ("type", "call_id", "name", "arguments")}
    return {"type": kind, "call_id": item["call_id"], "output": _text(item.get("output"), "output")}


def chat_body(body: ResponsesBody, earlier: list[dict]) -> ChatBody:
    """The request as the chat request it means, after the conversation `earlier` (a stored
    response's input and output items), validated as the chat route's own."""
    labelled = [(item, "previous_response_id") for item in earlier]
    labelled += [(item, f"input[{i}]") for i, item in enumerate(input_items(body))]
    if not labelled:
        raise RequestError("input is empty: give a text or at least one item", param="input")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat: dict[str, Any] = {"messages": system + chat_messages(labelled)}
    if body.tools:
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(body.tool_choice)
    if (fmt := (body.text or {}).get("format")) is not None:
        chat["response_format"] = _format(fmt)
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    for name in SAME_FIELDS:
        if (value := getattr(body, name)) is not None:
            chat[name] = value
    if _thinks_not(body.reasoning) and "enable_thinking" not in (body.chat_template_kwargs or {}):
        chat["chat_template_kwargs"] = {**(body.chat_template_kwargs or {}), "enable_thinking": False}
    return schema.parse(ChatBody, json.dumps(chat).encode())


def _thinks_not(reasoning: dict | None) -> bool:
    """`reasoning.effort` "none" switches a chat template's thinking off (Qwen3's
    enable_thinking); any other effort leaves the template's default, and no reasoning items
    or summaries are written: agents send `reasoning` with every request (Codex does for
    reasoning models), so refusing it would refuse them."""
    if reasoning is None:
        return False
    if not isinstance(reasoning, dict):
        raise RequestError("reasoning must be an object ({'effort': ..., 'summary': ...})", param="reasoning")
    effort = reasoning.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise RequestError(f"reasoning.effort must be one of {', '.join(EFFORTS)}, got {effort!r}", param="reasoning")
    return effort == "none"


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def chat_messages(labelled: list[tuple[dict, str]]) -> list[dict]:
    messages: list[dict] = []
    for item, where in labelled:
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an item (an object with a type)", param=where)
        kind = _kind(item)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(
                    f"{where}.role must be 'user', 'system', 'developer' or 'assistant'", param=f"{where}.role"
                )
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = _call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # the calls the model wrote after its text
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where}.call_id must be a text", param=f"{where}.call_id")
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            raise RequestError(f"{where}: reasoning items are not supported (this server writes none)", param=where)
        elif kind == "item_reference":
            raise RequestError(f"{where}: item references are not supported: send the item itself", param=where)
        else:
            raise RequestError(
                f"{where}: only message, function_call and function_call_output items are supported"
                + (f", not {kind!r}" if isinstance(kind, str) else ""),
                param=where,
            )
    return messages


def _call(item: dict, where: str) -> dict:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str) or (key == "name" and not item[key]):
            raise RequestError(f"{where}.{key} must be a text", param=f"{where}.{key}")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _text(content, param: str) -> str:
    """A text, or text parts (input_text, output_text), as one text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in ("input_text", "output_text") and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(
        f"{param}: only text is supported (a text, or {{'type': 'input_text', 'text': ...}} parts)", param=param
    )


def _tool(tool: dict, param: str) -> dict:
    """A function tool as chat's. `strict` is not passed on to the template: a forced call is
    held to the parameters by a grammar whatever it says, and under auto calls are parsed."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise RequestError(
            f"{param}: {kind!r} tools are not supported: only function tools (this server runs no built-in tools)",
            param=param,
        )
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise RequestError(f"{param}.name must be a non-empty text", param=f"{param}.name")
    if tool.get("strict") not in (None, True, False):
        raise RequestError(f"{param}.strict must be true or false", param=f"{param}.strict")
    # in chat's order (name, description, parameters): templates write the tools as JSON
    function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _tool_choice(choice) -> str | dict:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...} "
        "(this server runs no built-in tools)",
        param="tool_choice",
    )


def _format(fmt) -> dict:
    """text.format as chat's response_format."""
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(
            "text.format must be {'type': 'text'}, {'type': 'json_object'} or "
            "{'type': 'json_schema', 'name': ..., 'schema': {...}}",
            param="text.format",
        )
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    if not isinstance(fmt.get("schema"), dict):
        raise RequestError("text.format.schema must be a JSON schema object", param="text.format.schema")
    spec = {key: fmt[key] for key in ("name", "schema", "strict") if key in fmt}
    return {"type": "json_schema", "json_schema": spec}


def reworded(error: RequestError) -> RequestError:
    """The chat route's refusal, naming the field as the Responses API calls it."""
    param, message = error.param, str(error)
    for chat, ours in RENAMED:
        message = message.replace(chat, ours)
        param = param.replace(chat, ours) if param else param
    if param == "messages":
        param = "input"
    return RequestError(message, param=param, code=error.code, status=error.status, kind=error.kind)


# --- responses ------------------------------------------------------------------------
def usage(stats: Stats) -> dict:
    """The Responses API's token counts (cached: prompt tokens the prompt cache already held),
    and the speculative figures under `speculative`, as on the other routes."""
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.prompt_tokens - stats.prefill_tokens, "cache_write_tokens": 0},
        "output_tokens": stats.tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "speculative": schema.speculative(stats),
    }


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


class Items(blocks.Blocks):
    """The output items: a `message` with one output_text part for each run of text, a
    `function_call` for each call, and the stream events that build them (item added, the
    part added, deltas, done), each naming its output_index and item_id. A message open when
    the output was cut short ends `incomplete` (set `cut` before `finish`), as OpenAI's."""

    cut = False

    def text_block(self, index: int) -> tuple[dict, list[dict]]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item = {"id": _new_id("msg_"), "type": "message", "status": "in_progress", "role": "assistant"}
        item["content"] = [part]
        where = {"output_index": index, "item_id": item["id"]}
        return item, [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}},
            {"type": "response.content_part.added", **where, "content_index": 0, "part": dict(part)},
        ]

    def text_added(self, index: int, item: dict, text: str) -> list[dict]:
        item["content"][0]["text"] += text
        where = {"output_index": index, "item_id": item["id"], "content_index": 0}
        return [{"type": "response.output_text.delta", **where, "delta": text, "logprobs": []}]

    def text_closed(self, index: int, item: dict) -> list[dict]:
        item["status"] = "incomplete" if self.cut else "completed"
        part = item["content"][0]
        where = {"output_index": index, "item_id": item["id"], "content_index": 0}
        return [
            {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []},
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]

    def call_block(self, index: int, call: ToolCall) -> tuple[dict, list[dict]]:
        item = {"id": _new_id("fc_"), "type": "function_call", "status": "completed", "call_id": call.id}
        item |= {"name": call.name, "arguments": call.arguments}
        where = {"output_index": index, "item_id": item["id"]}
        return item, [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
            {"type": "response.function_call_arguments.delta", **where, "delta": call.arguments},
            {"type": "response.function_call_arguments.done", **where, "name": call.name, "arguments": call.arguments},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]


@dataclass(frozen=True)
class Reply:
    """One response's identity and the request's settings it echoes."""

    model: str
    body: ResponsesBody
    id: str = field(default_factory=lambda: _new_id("resp_"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, *, status: str, output: list[dict], done: Done | None = None, error: dict | None = None):
        body = self.body
        length = done is not None and cut_short(done)
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": None,
            "store": body.store,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "text": {"format": (body.text or {}).get("format") or {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": body.tools or [],
            "truncation": "disabled",
            "metadata": body.metadata or {},
            "usage": usage(done.stats) if done is not None else None,
        }

    def finished(self, items: Items, done: Done) -> dict:
        """The whole response: incomplete where the output was cut short (max_output_tokens,
        or the context's end)."""
        status = "incomplete" if cut_short(done) else "completed"
        return self.response(status=status, output=items.content, done=done)


def cut_short(done: Done) -> bool:
    return done.finish_reason in ("length", "context")


def sse(event: dict) -> str:
    """One server-sent event as OpenAI sends the Responses API's: its type named twice."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
