"""A request's prompt as token ids, on the offload thread: a text that cannot fit the target's
context is refused by its length first (see length.py), so that it is never tokenized."""

from __future__ import annotations

from ..errors import InvalidOption
from ..generation import encode_messages, encode_prompt
from .length import fewest_tokens
from .schema import RequestError


def completion_ids(pair, prompt: str | list[int], *, per_token: float | None) -> list[int]:
    if isinstance(prompt, str):
        refuse_by_length(pair, prompt, per_token=per_token, param="prompt")
    return encode_prompt(pair, prompt, raw=True)  # a completion has no template


def chat_ids(
    pair, messages: list[dict], *, think: bool | None, tools: list | None, per_token: float | None
) -> list[int]:
    tokenizer = pair.tokenizer
    try:
        if per_token is not None:
            refuse_by_length(pair, _rendered(tokenizer, messages, think=think, tools=tools), per_token=per_token)
        return encode_messages(tokenizer, messages, think=think, tools=tools)
    except RequestError:
        raise
    except InvalidOption as e:
        raise RequestError(str(e), param="tools") from None
    except Exception as e:  # the template's own checks (roles that must alternate, ...)
        raise RequestError(f"the chat template cannot render these messages: {e}", param="messages") from None


def refuse_by_length(pair, text: str, *, per_token: float | None, param: str = "messages") -> None:
    context = pair.target.context_length
    if per_token is None or context is None:
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if (fewest := fewest_tokens(size, per_token)) >= context:
        raise RequestError(
            f"{param} has {size} bytes of text, so at least {fewest} tokens, "
            f"and {pair.target.label} reads at most {context}",
            param=param,
            code="context_length_exceeded",
        )


def _rendered(tokenizer, messages: list[dict], *, think: bool | None, tools: list | None) -> str:
    """The text the ids will be read from: the chat template's (it may leave parts out), or,
    without one, the messages' contents, which the plain transcript holds verbatim."""
    if not tokenizer.has_chat_template:
        return "".join(m["content"] for m in messages)
    extra = {} if think is None else {"enable_thinking": think}
    if tools:
        extra["tools"] = tools
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
