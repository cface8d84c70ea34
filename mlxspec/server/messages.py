"""`POST /v1/messages` (Anthropic's Messages API) and `/v1/messages/count_tokens`: the request
is translated into the chat route's (anthropic.py) and runs on the same worker, prompt
cache and engine; only the answer's shape differs. Refusals and failures come back in
Anthropic's error shape, with the chat route's status codes.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..decoding.events import Done, Prefill, Round
from ..errors import MlxspecError
from ..tool_calls import ToolCallSplitter
from . import anthropic, encode, schema
from .answer import CLOSING, answer, error_of, note_of
from .anthropic import Blocks, Reply
from .limits import read_body
from .schema import RequestError
from .tools import ToolUse, tool_use
from .worker import END


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
            # any / tool: the reply held to one call by a grammar in the model's markup
            if (forced := tools.forced_call(api.pair.tokenizer)) is not None:
                await api.offload.run(api.check_forced_call, forced, tools)
                options = options.replace(grammar=forced)
        except RequestError as e:
            raise anthropic.reworded_choice(e, body) from None
        messages = schema.template_messages(chat)
        ids = await api.offload.run(
            encode.chat_ids, api.pair, messages, think=options.think, tools=tools.tools, per_token=api.per_token
        )
        return options, ids, tools

    async def _answer(self, request, ids: list[int], options, *, stream: bool, tools: ToolUse):
        parsing = tools if tools.parses else None
        reply = Reply(model=self.api.model)

        def events(job, first):
            return _events(job, reply, first, tools=parsing)

        return await answer(
            request,
            self.api.worker,
            ids,
            options,
            note=note_of(options, tools),
            whole=lambda job: _whole(job, reply, tools=parsing),
            stream=events if stream else None,
        )


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
    body, status = error_of(e)  # the chat route's message and status
    return anthropic.error_body(body["error"]["message"], status), status


def error_response(e: BaseException) -> JSONResponse:
    body, status = error_body(e)
    return JSONResponse(body, status_code=status, headers={"Connection": "close"} if status in CLOSING else None)
