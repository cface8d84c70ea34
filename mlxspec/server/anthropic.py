"""Anthropic's Messages API shapes: a request translated into the OpenAI chat request the
server already serves (so every rule, template path and refusal is the chat route's), and
the message, stream events and errors the `anthropic` client reads. Plain Python (no MLX).

The translation follows what Ollama's Messages API does (ollama/ollama, anthropic/anthropic.go):
`system` becomes a system message; a user's `tool_result` blocks become `tool` messages
placed before the user's text; an assistant's `tool_use` blocks become its `tool_calls`;
`tool_choice` auto / none / any / tool become OpenAI's auto / none / required / a named
function, so `any` and `tool` get the chat route's answer for those. Thinking blocks in the
history are left out (chat templates drop earlier reasoning). The response shapes are the
`anthropic` client's own types (anthropic/types: Message, Raw*Event, Usage).

`usage` follows Anthropic's split of the prompt: `input_tokens` are those read now,
`cache_read_input_tokens` those the prompt cache already held; mlxspec's speculative
figures ride along under `speculative`, as on the OpenAI routes.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..decoding.events import Done
from ..stats import Stats
from ..tool_calls import ToolCall
from . import blocks, schema
from .schema import ChatBody, RequestError

_STRICT = ConfigDict(strict=True, extra="ignore")  # cache_control, metadata and the like change nothing here

# Anthropic's error types by status (docs.anthropic.com, "Errors")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}

# Anthropic's tool_choice types, as OpenAI's tool_choice
AUTO, NONE, ANY, TOOL = "auto", "none", "any", "tool"


# --- requests -------------------------------------------------------------------------
class AnthropicMessage(BaseModel):
    model_config = _STRICT
    role: Literal["user", "assistant"]
    content: str | list[dict]


class CountBody(BaseModel):
    """What /v1/messages/count_tokens reads: a conversation, no generation settings."""

    model_config = _STRICT
    model: str | None = None  # any value: the server has one pair
    messages: list[AnthropicMessage]
    system: str | list[dict] | None = None
    tools: list[dict] | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None  # {"type": "enabled"} / {"type": "disabled"}: the template's enable_thinking


class MessagesBody(CountBody):
    max_tokens: int  # required, as Anthropic's API has it
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    seed: int | None = None  # mlxspec's own (extra_body), as on the OpenAI routes
    gamma: Any = None
    tree: Any = None
    history: bool | None = None


def chat_body(body: CountBody) -> ChatBody:
    """The request as the OpenAI chat request it means, validated as the chat route's own."""
    chat: dict[str, Any] = {"messages": chat_messages(body)}
    if body.tools:
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(body.tool_choice)
    think = (body.thinking or {}).get("type")
    if think in ("enabled", "disabled"):
        chat["chat_template_kwargs"] = {"enable_thinking": think == "enabled"}
    if isinstance(body, MessagesBody):
        for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "gamma", "tree", "history"):
            if (value := getattr(body, name)) is not None:
                chat[name] = value
        if body.stop_sequences:
            if not all(body.stop_sequences):
                raise RequestError("stop_sequences has an empty text", param="stop_sequences")
            chat["stop"] = body.stop_sequences
    return schema.parse(ChatBody, json.dumps(chat).encode())


def chat_messages(body: CountBody) -> list[dict]:
    if not body.messages:
        raise RequestError("messages is empty: give at least one message", param="messages")
    messages = []
    if body.system:
        messages.append({"role": "system", "content": _texts(body.system, "system")})
    for i, message in enumerate(body.messages):
        messages += _message(message, f"messages[{i}]")
    return messages


def _message(message: AnthropicMessage, param: str) -> list[dict]:
    """One Anthropic message as chat messages: tool results first (each a `tool` message),
    then the text and calls."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts, calls, results = [], [], []
    for j, block in enumerate(message.content):
        where = f"{param}.content[{j}]"
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise RequestError(f"{where}: a text block needs its text ('text': a string)", param=f"{where}.text")
            texts.append(block["text"])
        elif kind == "tool_use" and message.role == "assistant":
            calls.append(_call(block, where))
        elif kind == "tool_result" and message.role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise RequestError(f"{where}.tool_use_id must be a text", param=f"{where}.tool_use_id")
            content = _texts(block.get("content") or "", f"{where}.content")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content})
        elif kind in ("thinking", "redacted_thinking") and message.role == "assistant":
            continue
        else:
            raise RequestError(
                f"{where}: a {message.role} message takes "
                + ("text and tool_result blocks" if message.role == "user" else "text and tool_use blocks")
                + (f", not {kind!r}" if isinstance(kind, str) else ""),
                param=where,
            )
    out = list(results)
    if texts or calls or not results:
        chat = {"role": message.role, "content": "".join(texts)}
        if calls:
            chat["tool_calls"] = calls
        out.append(chat)
    return out


def _call(block: dict, where: str) -> dict:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not block["name"]:
        raise RequestError(f"{where}: a tool_use block needs an id and a name", param=where)
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.input must be an object", param=f"{where}.input")
    function = {"name": block["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}
    return {"id": block["id"], "type": "function", "function": function}


def _texts(content, param: str) -> str:
    """A text, or a list of text blocks, as one text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in content
    ):
        return "".join(b["text"] for b in content)
    raise RequestError(
        f"{param}: only text is supported (a text, or {{'type': 'text', 'text': ...}} blocks)", param=param
    )


def _tool(tool: dict, param: str) -> dict:
    """A client tool as OpenAI's function tool; Anthropic's server tools (web search, ...)
    are theirs to run, not this server's."""
    if tool.get("type") not in (None, "custom"):
        raise RequestError(
            f"{param}: {tool.get('type')!r} tools are not supported: only client tools (name, description, "
            "input_schema)",
            param=param,
        )
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise RequestError(f"{param}.name must be a non-empty text", param=f"{param}.name")
    if not isinstance(tool.get("input_schema"), dict):
        raise RequestError(f"{param}.input_schema must be a JSON schema object", param=f"{param}.input_schema")
    # in OpenAI's order (name, description, parameters): templates write the tools as JSON
    described = {"description": tool["description"]} if isinstance(tool.get("description"), str) else {}
    return {"type": "function", "function": {"name": tool["name"], **described, "parameters": tool["input_schema"]}}


def _tool_choice(choice: dict) -> str | dict:
    kind = choice.get("type")
    if kind in (AUTO, NONE):
        return kind
    if kind == ANY:
        return "required"
    if kind == TOOL and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(
        "tool_choice must be {'type': 'auto'}, {'type': 'any'}, {'type': 'tool', 'name': ...} or {'type': 'none'}",
        param="tool_choice",
    )


def reworded_choice(error: RequestError, body: CountBody) -> RequestError:
    """The chat route's refusal of a tool_choice, naming the value as the client sent it."""
    if error.param != "tool_choice" or body.tool_choice is None:
        return error
    return RequestError(f"tool_choice {body.tool_choice}: {error}", param="tool_choice", status=error.status)


# --- responses ------------------------------------------------------------------------
def usage(stats: Stats) -> dict:
    cached = stats.prompt_tokens - stats.prefill_tokens
    return {
        "input_tokens": stats.prefill_tokens,
        "output_tokens": stats.tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "speculative": schema.speculative(stats),
    }


def stop_reason(done: Done, *, called: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence: "tool_use" when the model ended after
    calling (as the chat route's "tool_calls")."""
    if called and done.finish_reason in ("eos", "stop"):
        return "tool_use", None
    if done.finish_reason == "stop":
        return "stop_sequence", done.stop_sequence
    reasons = {"length": "max_tokens", "context": "model_context_window_exceeded"}
    return reasons.get(done.finish_reason, "end_turn"), None


def tool_use_block(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}


class Blocks(blocks.Blocks):
    """Anthropic's content blocks: text blocks and tool_use blocks, each sent as
    content_block_start, deltas and content_block_stop."""

    def text_block(self, index: int) -> tuple[dict, list[dict]]:
        start = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        return {"type": "text", "text": ""}, [start]

    def text_added(self, index: int, block: dict, text: str) -> list[dict]:
        block["text"] += text
        return [{"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}]

    def text_closed(self, index: int, block: dict) -> list[dict]:
        return [{"type": "content_block_stop", "index": index}]

    def call_block(self, index: int, call: ToolCall) -> tuple[dict, list[dict]]:
        block = tool_use_block(call)
        delta = {"type": "input_json_delta", "partial_json": call.arguments}
        return block, [
            {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]


@dataclass(frozen=True)
class Reply:
    """One message's identity; its whole body and its stream's opening and closing events."""

    model: str
    id: str = field(default_factory=lambda: "msg_" + secrets.token_hex(12))

    def _message(self, content: list[dict], stop: tuple[str | None, str | None], usage: dict) -> dict:
        reason, sequence = stop
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }

    def whole(self, blocks: Blocks, done: Done) -> dict:
        return self._message(blocks.content, stop_reason(done, called=blocks.called), usage(done.stats))

    def start(self, *, prompt_tokens: int, processed_tokens: int) -> dict:
        """message_start: no content yet; the prompt's counts are known."""
        counts = {
            "input_tokens": processed_tokens,
            "output_tokens": 0,
            "cache_read_input_tokens": prompt_tokens - processed_tokens,
            "cache_creation_input_tokens": 0,
        }
        return {"type": "message_start", "message": self._message([], (None, None), counts)}

    def end(self, blocks: Blocks, done: Done) -> list[dict]:
        """message_delta (stop reason, the final usage), then message_stop."""
        reason, sequence = stop_reason(done, called=blocks.called)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}}
        return [{**delta, "usage": usage(done.stats)}, {"type": "message_stop"}]


def sse(event: dict) -> str:
    """One server-sent event as Anthropic sends it: its type named twice."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


PING = {"type": "ping"}


def error_body(message: str, status: int) -> dict:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
