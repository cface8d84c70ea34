"""`POST /v1/messages` (Anthropic's Messages API) and `/v1/messages/count_tokens`: the request
is translated into the chat route's (anthropic.py) and runs on the same worker, prompt
cache and engine; only the answer's shape differs. Refusals and failures come back in
Anthropic's error shape, with the chat route's status codes.
"""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse

from ..errors import MlxspecError
from ..events import Done, Prefill, Round
from ..tool_calls import ToolCallSplitter
from . import anthropic, encode, schema
from .anthropic import Blocks, Reply
from .app import CLOSING, EventStream, _cancel_on_disconnect, _error_body
from .limits import read_body
from .schema import RequestError
from .tools import ToolUse, tool_use
from .worker import END, job_note


class Messages:
    """The routes, over the chat route's Api (its worker, pair, limits and checks)."""

    def __init__(self, api):
        self.api = api

    async def create(self, request):
        api = self.api
        try:
            body = schema.parse(anthropic.MessagesBody, await read_body(request, api.limits))
            options, ids, tools = await self._prompt(body)
            api._check(ids, options, "messages")
            return await self._answer(request, ids, options, stream=body.stream, tools=tools)
        except (RequestError, MlxspecError) as e:
            return error_response(e)

    async def count_tokens(self, request):
        try:
            body = schema.parse(anthropic.CountBody, await read_body(request, self.api.limits))
            _, ids, _ = await self._prompt(body)
            return JSONResponse({"input_tokens": len(ids)})
        except (RequestError, MlxspecError) as e:
            return error_response(e)

    async def _prompt(self, body):
        """The request's options (the server's defaults, overridden), the prompt's ids and
        the tools in force."""
        api = self.api
        chat = anthropic.chat_body(body)
        options = schema.request_options(chat, api.defaults)
        try:
            tools = tool_use(chat, api.tool_format)
        except RequestError as e:
            raise anthropic.reworded_choice(e, body) from None
        messages = schema.template_messages(chat)
        ids = await api.offload.run(
            encode.chat_ids, api.pair, messages, think=options.think, tools=tools.tools, per_token=api.per_token
        )
        return options, ids, tools

    async def _answer(self, request, ids: list[int], options, *, stream: bool, tools: ToolUse):
        """As the chat route's `_answer`: refused with a plain error until the generation has
        started; a client that leaves stops it."""
        job = self.api.worker.submit(ids, options, asyncio.get_running_loop(), note=job_note(tools=tools.note()))
        parsing = tools if tools.parses else None
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        streaming = False
        try:
            first = await job.next()  # the Prefill, once the generation has started
            if isinstance(first, BaseException):
                raise first
            if first is END:
                raise RequestError("the server is shutting down", status=503, kind="server_error")
            reply = Reply(model=self.api.model)
            if not stream:
                return JSONResponse(await _whole(job, reply, tools=parsing))
            watcher.cancel()  # from here Starlette listens for the disconnect
            await asyncio.gather(watcher, return_exceptions=True)
            streaming = True
            return EventStream(_events(job, reply, first, tools=parsing), on_close=job.cancel)
        finally:
            watcher.cancel()
            if not streaming:
                job.cancel()


async def _parts(job, tools: ToolUse | None):
    """The generation's text pieces and parsed calls, in order, then its Done; an error the
    engine raised is raised here. Ends without a Done when the server shuts down."""
    splitter = ToolCallSplitter(tools.format, tools=tools.tools) if tools is not None else None
    while (item := await job.next()) is not END:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Round) and item.text:
            for part in splitter.feed(item.text) if splitter else [item.text]:
                yield part
        elif isinstance(item, Done):
            for part in (splitter.feed(item.text) + splitter.finish()) if splitter else [item.text]:
                yield part
            yield item


async def _whole(job, reply: Reply, *, tools: ToolUse | None) -> dict:
    blocks, done = Blocks(), None
    async for part in _parts(job, tools):
        if isinstance(part, Done):
            done = part
        else:
            blocks.feed(part)
    if done is None:
        raise RequestError("the server is shutting down", status=503, kind="server_error")
    blocks.finish()
    return reply.whole(blocks, done)


async def _events(job, reply: Reply, prefill: Prefill, *, tools: ToolUse | None):
    """Anthropic's event sequence: message_start, a ping, each block's start, deltas and
    stop, message_delta, message_stop; an `error` event where the generation failed."""
    yield anthropic.sse(reply.start(prompt_tokens=prefill.prompt_tokens, processed_tokens=prefill.processed_tokens))
    yield anthropic.sse(anthropic.PING)
    blocks = Blocks()
    try:
        async for part in _parts(job, tools):
            if isinstance(part, Done):
                for event in blocks.finish() + reply.end(blocks, part):
                    yield anthropic.sse(event)
                return
            for event in blocks.feed(part):
                yield anthropic.sse(event)
    except Exception as e:
        yield anthropic.sse(error_body(e)[0])
        return
    yield anthropic.sse(anthropic.error_body("the server is shutting down", 503))


def error_body(e: BaseException) -> tuple[dict, int]:
    body, status = _error_body(e)  # the chat route's message and status
    return anthropic.error_body(body["error"]["message"], status), status


def error_response(e: BaseException) -> JSONResponse:
    body, status = error_body(e)
    return JSONResponse(body, status_code=status, headers={"Connection": "close"} if status in CLOSING else None)
