"""The OpenAI API's shapes: request bodies validated into `Options` and a prompt, and the
responses, stream chunks and errors the `openai` client reads. Plain Python (no MLX).

A request's sampling fields override the server's defaults (the command's options) one at a
time through `Options.replace`, so every rule lives in `Options` and a refused value names
the field it came from. Fields that would change the distribution in ways the engine cannot
keep exact (penalties, logit bias) or that it does not produce (n > 1, logprobs) are refused
with a 400 rather than ignored; fields that change nothing here (user, metadata) are ignored.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InvalidOption
from ..options import Options
from ..stats import Stats

# the engine's finish reasons, as OpenAI names them ("context": the context ended first)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


class RequestError(Exception):
    """A request the server refuses, with the OpenAI error fields."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def body(self) -> dict:
        return error_body(str(self), kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --- requests -------------------------------------------------------------------------
# strict: a number given as text, or a count as 1.5, is an error, not a guess
_STRICT = ConfigDict(strict=True, extra="ignore")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # tool_calls, tool_call_id, name: for the template
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = None  # text, or a list of {"type": "text", "text": ...} parts


class _Body(BaseModel):
    model_config = _STRICT
    model: str | None = None  # any value: the server has one pair
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # beyond OpenAI's fields, as vLLM and mlx-lm's server take them
    min_p: float | None = None
    seed: int | None = None
    stop: Any = None  # a text or a list of texts
    stream: bool = False
    stream_options: StreamOptions | None = None
    gamma: Any = None  # mlxspec's own: the draft length for this request (a number or "auto")
    tree: Any = None  # mlxspec's own: tree nodes verified per round (a number, "auto", 0: chains)
    history: bool | None = None  # mlxspec's own: prompt lookup reads this key's earlier requests too
    n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict | None = None
    logprobs: Any = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatBody(_Body):
    messages: list[Message]
    max_completion_tokens: int | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None  # "auto", "none"; "required" and a named function are refused (see tools.py)
    parallel_tool_calls: bool | None = None  # ignored: a model calls as many as it writes
    response_format: Any = None  # text, json_object, json_schema (formats.py)
    chat_template_kwargs: dict | None = None  # as vLLM: {"enable_thinking": false} for Qwen3


class CompletionBody(_Body):
    prompt: Any  # a text, a list of token ids, or a list of one text
    response_format: Any = None  # as the chat route's (formats.py), as vLLM takes it here
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


def parse(kind: type[_Body], raw: bytes) -> _Body:
    """The body as `kind`, or a RequestError naming the first thing wrong with it."""
    _refuse_non_finite(raw)
    try:
        return kind.model_validate_json(raw or b"")
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            detail = first["msg"].removeprefix("Invalid JSON: ")
            raise RequestError(f"the request body is not valid JSON ({detail})") from None
        if not first["loc"]:
            raise RequestError("the request body must be a JSON object") from None
        param = _param(first["loc"])
        if first["type"] == "missing":
            raise RequestError(f"{param} is required", param=param) from None
        raise RequestError(f"{param}: {first['msg']}", param=param) from None


def _refuse_non_finite(raw: bytes) -> None:
    """pydantic's JSON reader takes NaN and Infinity, which are not JSON: a field that is
    echoed (metadata, a format) then failed the response's writing after the generation ran
    (a 500), or went out bare in a stream that strict clients reject. Read again with
    Python's reader only where such a word appears at all (inside a text it is no constant)."""
    if b"NaN" not in raw and b"Infinity" not in raw:
        return

    def constant(name: str):
        raise RequestError(f"the request body is not valid JSON ({name} is not a JSON number)")

    try:
        json.loads(raw, parse_constant=constant)
    except ValueError:
        pass  # not JSON at all: pydantic's reader says where


def _param(loc: tuple) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_SETTINGS = (  # request field -> Options.replace keyword
    ("max_tokens", "max_tokens"),
    ("temperature", "temp"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("seed", "seed"),
    ("gamma", "gamma"),
    ("tree", "tree"),
    ("history", "history"),
)


def request_options(body: _Body, defaults: Options) -> Options:
    """The server's options with the request's fields, each checked by Options as it is set."""
    _refuse_unsupported(body)
    settings = [(key, name, getattr(body, key)) for key, name in _SETTINGS]
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        # the newer name wins, as in OpenAI's API
        settings[0] = ("max_completion_tokens", "max_tokens", body.max_completion_tokens)
    options = defaults
    for key, name, value in settings:
        if value is None:
            continue
        try:
            options = options.replace(**{name: value})
        except InvalidOption as e:
            raise RequestError(str(e), param=key) from None
    if body.stop is not None:
        options = options.replace(stop=_stops(body.stop))
    if isinstance(body, ChatBody) and body.chat_template_kwargs:
        think = body.chat_template_kwargs.get("enable_thinking")
        if think is not None and not isinstance(think, bool):
            raise RequestError(
                "chat_template_kwargs.enable_thinking must be true or false", param="chat_template_kwargs"
            )
        if think is not None:
            options = options.replace(think=think)
    return options


def _stops(stop) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop must be a text or a list of texts", param="stop")
    if any(not s for s in stops):
        raise RequestError("stop has an empty text", param="stop")
    return tuple(stops)


def _refuse_unsupported(body: _Body) -> None:
    if body.n is not None and body.n > 1:
        raise RequestError("n > 1 is not supported: one choice per request", param="n")
    if body.n is not None and body.n < 1:
        raise RequestError(f"n must be 1 (one choice per request), got {body.n}", param="n")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name):
            raise RequestError(
                f"{name} is not supported: speculative decoding here keeps the target's distribution exact, "
                "and a penalty would change it",
                param=name,
            )
    if body.logit_bias:
        raise RequestError("logit_bias is not supported", param="logit_bias")
    if body.logprobs not in (None, False, 0):
        raise RequestError("logprobs are not supported", param="logprobs")
    if isinstance(body, CompletionBody):
        if body.echo:
            raise RequestError("echo is not supported", param="echo")
        if body.suffix:
            raise RequestError("suffix is not supported", param="suffix")
        if body.best_of not in (None, 1):
            raise RequestError("best_of > 1 is not supported", param="best_of")


def template_messages(body: ChatBody) -> list[dict]:
    """The messages as a chat template reads them: text content, OpenAI's "developer" role
    as "system", other fields (tool_calls, tool_call_id, name) passed through."""
    if not body.messages:
        raise RequestError("messages is empty: give at least one message", param="messages")
    messages = []
    for i, message in enumerate(body.messages):
        content = _text(message.content, f"messages[{i}].content")
        role = "system" if message.role == "developer" else message.role
        extra = dict(message.model_extra or {})
        if extra.get("tool_calls"):
            extra["tool_calls"] = _template_calls(extra["tool_calls"], f"messages[{i}].tool_calls")
        messages.append({**extra, "role": role, "content": content})
    return messages


def _template_calls(calls, param: str) -> list[dict]:
    """An assistant's earlier calls as templates read them: the arguments as an object, not
    OpenAI's JSON text (templates write them with `tojson`), as mlx_lm/server.py's
    process_message_content does."""
    if not isinstance(calls, list):
        raise RequestError(f"{param} must be a list of calls", param=param)
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(
                f"{param}[{j}] must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}",
                param=f"{param}[{j}]",
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                where = f"{param}[{j}].function.arguments"
                raise RequestError(f"{where} is not JSON ({e})", param=where) from None
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


def _text(content, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"{param}: only text parts are supported ({{'type': 'text', 'text': ...}})", param=param
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{param} must be a text or a list of text parts", param=param)


def completion_prompt(body: CompletionBody) -> str | list[int]:
    """A completion's prompt: a text, or token ids."""
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt is empty", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, (int, float)) for t in prompt):
        wrong = next((i for i, t in enumerate(prompt) if isinstance(t, (bool, float))), None)
        if wrong is not None:  # 1.5 is no id, and 2.0 is not one either in OpenAI's schema
            raise RequestError(f"token ids are whole numbers: prompt[{wrong}] is {prompt[wrong]!r}", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("one prompt per request: batches of prompts are not supported", param="prompt")
    raise RequestError("prompt must be a text or a list of token ids", param="prompt")


# --- responses ------------------------------------------------------------------------
def usage(stats: Stats) -> dict:
    """OpenAI's token counts (cached: prompt tokens the prompt cache already held), and the
    speculative figures under `speculative`."""
    cached = stats.prompt_tokens - stats.prefill_tokens
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens,
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
        "speculative": speculative(stats),
    }


def speculative(stats: Stats) -> dict:
    """The engine's figures for one generation (None where nothing was drafted)."""
    return {
        "gamma": stats.gamma,  # the setting: a draft length or "auto"
        "rounds": stats.rounds,
        "drafted": stats.drafted,
        "tested": stats.tested,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,  # accepted / tested
        "tokens_per_round": stats.tokens_per_round,
        "mean_gamma": stats.mean_gamma,
        "plain_rounds": stats.plain_rounds,
        "tree_rounds": stats.tree_rounds,
        "nodes_per_tree": stats.nodes_per_tree,  # a tree round's nodes verified, on average
        "lookup_rounds": stats.ngram_rounds,  # proposed by lookup in this request's own text
        "history_rounds": stats.history_rounds,  # proposed from this key's earlier requests
        "lookup_on_repetition": stats.lookup_on_repetition,  # most accepted drafts: lookup on a looping answer
        "tokens_per_second": stats.tokens_per_second,  # decoding, prompt excluded
        "prefill_tokens": stats.prefill_tokens,
        "prefill_seconds": stats.prefill_seconds,
        "decode_seconds": stats.decode_seconds,
    }


def finish_reason_of(reason: str, *, called: bool) -> str:
    """OpenAI's finish reason: "tool_calls" when the model ended (not cut short) after calling,
    as mlx_lm/server.py decides it."""
    if called and reason in ("eos", "stop"):
        return "tool_calls"
    return FINISH_REASONS.get(reason, reason)


@dataclass(frozen=True)
class Reply:
    """One response's identity and shape: a chat completion or a text completion."""

    chat: bool
    model: str
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        if not self.id:
            object.__setattr__(self, "id", ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12))

    def _head(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": kind + (".chunk" if chunk and self.chat else ""), "created": self.created}

    def whole(self, text: str, finish_reason: str, stats: Stats, *, tool_calls: list[dict] = ()) -> dict:
        """`tool_calls`: OpenAI's calls (id, type, function), parsed from the output."""
        reason = finish_reason_of(finish_reason, called=bool(tool_calls))
        choice = {"index": 0, "logprobs": None, "finish_reason": reason}
        if self.chat:
            message = {"role": "assistant", "content": text}
            if tool_calls:
                message["content"] = text if text.strip() else None  # as OpenAI: no text beside the calls
                message["tool_calls"] = list(tool_calls)
            choice["message"] = message
        else:
            choice["text"] = text
        return {**self._head(False), "model": self.model, "choices": [choice], "usage": usage(stats)}

    def chunk(
        self, text: str | None = None, *, finish_reason: str | None = None, first: bool = False, called: bool = False
    ) -> dict:
        """A stream chunk: some text, or the end (finish_reason; `called`: calls were sent).
        A chat stream's first chunk names the role."""
        reason = finish_reason_of(finish_reason, called=called) if finish_reason else None
        choice = {"index": 0, "logprobs": None, "finish_reason": reason}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return {**self._head(True), "model": self.model, "choices": [choice]}

    def call_chunks(self, call: dict, index: int) -> list[dict]:
        """One call as OpenAI streams it: its index, id, type and name, then its arguments."""
        head = {"index": index, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        rest = {"index": index, "function": {"arguments": call["function"]["arguments"]}}
        return [self._delta({"tool_calls": [head]}), self._delta({"tool_calls": [rest]})]

    def _delta(self, delta: dict) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": None, "delta": delta}
        return {**self._head(True), "model": self.model, "choices": [choice]}

    def usage_chunk(self, stats: Stats) -> dict:
        """The last chunk when the client asked for usage: no choices."""
        return {**self._head(True), "model": self.model, "choices": [], "usage": usage(stats)}
