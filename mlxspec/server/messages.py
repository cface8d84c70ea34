"""`POST /v1/messages` (Anthropic's Messages API) and `/v1/messages/count_tokens`: the request
is translated into the chat route's (anthropic.py) and runs on the same worker, prompt
cache and engine; only the answer's shape differs. Refusals and failures come back in
Anthropic's error shape, with the chat route's status codes.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..decoding.events import Done, Prefill
from ..errors import MlxspecError
from . import anthropic, schema
from .answer import CLOSING, answer, error_of
from .anthropic import Blocks, Reply
from .limits import read_body
from .schema import RequestError


class Messages:
    """The routes, over the chat route's Api (its worker, pair, limits and prologue)."""

    def __init__(self, api):
        self.api = api

    async def create(self, request):
        api = self.api
        try:
            body = schema.parse(anthropic.MessagesBody, await read_body(request, api.limits))
            prompt = await self._prompt(body, check=True)
            view = MessageView(Reply(model=api.model))
            return await answer(request, api.worker, prompt, view=view, stream=body.stream)
        except (RequestError, MlxspecError) as e:
            return error_response(e)

    async def count_tokens(self, request):
        try:
            body = schema.parse(anthropic.CountBody, await read_body(request, self.api.limits))
            prompt = await self._prompt(body, check=False)
            return JSONResponse({"input_tokens": len(prompt.ids)})
        except (RequestError, MlxspecError) as e:
            return error_response(e)

    async def _prompt(self, body, *, check: bool):
        """The chat route's prologue on the request translated; its refusal of a tool_choice
        names the value as Anthropic's client sent it."""
        chat = anthropic.chat_body(body)
        try:
            return await self.api.chat_prompt(chat, check=check)
        except RequestError as e:
            raise anthropic.reworded_choice(e, body) from None


class MessageView:
    """Anthropic's message whole, or its event sequence: message_start, a ping, each
    block's start, deltas and stop, message_delta, message_stop; an `error` event where
    the generation failed."""

    trailer = ""

    def __init__(self, reply: Reply):
        self.reply = reply
        self.blocks = Blocks()

    def whole(self, parts, done: Done) -> dict:
        blocks = Blocks()
        for part in parts:
            blocks.feed(part)
        blocks.finish()
        return self.reply.whole(blocks, done)

    def opening(self, prefill: Prefill) -> list[dict]:
        start = self.reply.start(prompt_tokens=prefill.prompt_tokens, processed_tokens=prefill.processed_tokens)
        return [start, anthropic.PING]

    def feed(self, part) -> list[dict]:
        return self.blocks.feed(part)

    def closing(self, done: Done) -> list[dict]:
        return self.blocks.finish() + self.reply.end(self.blocks, done)

    def failed(self, error: BaseException) -> list[dict]:
        return [error_body(error)[0]]

    def frame(self, event: dict) -> str:
        return anthropic.sse(event)


def error_body(e: BaseException) -> tuple[dict, int]:
    body, status = error_of(e)  # the chat route's message and status
    return anthropic.error_body(body["error"]["message"], status), status


def error_response(e: BaseException) -> JSONResponse:
    body, status = error_body(e)
    return JSONResponse(body, status_code=status, headers={"Connection": "close"} if status in CLOSING else None)
