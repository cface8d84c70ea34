"""The answer path every route shares (the OpenAI routes in app.py, Anthropic's in
messages.py, the Responses API's in responding.py): a generation submitted to the worker,
its events read in one loop (`parts`: text pieces and parsed calls in order, then its Done),
and answered whole or as server-sent events through the route's `View`; the client's leaving
cancels it, and a failure becomes a status and a body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from starlette.responses import JSONResponse, StreamingResponse

from ..decoding.events import Done, Prefill, Round
from ..drafters.history import DEFAULT_NAMESPACE
from ..errors import InvalidOption, MlxspecError, PromptTooLong
from ..options import Options
from ..tool_calls import ToolCall, ToolCallSplitter
from .schema import RequestError, error_body
from .tools import ToolUse
from .worker import END, job_note

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# answered before the body was read to its end: the rest of it is not worth reading
CLOSING = {408, 413}


SHUTTING_DOWN = "the server is shutting down"


@dataclass(frozen=True)
class Prompt:
    """A request read and checked: what the worker runs, and the tools in force."""

    ids: list[int]
    options: Options
    tools: ToolUse | None = None

    @property
    def parsing(self) -> ToolUse | None:
        """The tools whose calls are parsed out of the output (None: the output is text)."""
        return self.tools if self.tools is not None and self.tools.parses else None


class View(Protocol):
    """How one route shapes an answer: whole, or as a stream's events (dicts) framed as
    server-sent events. A view is made per request (a stream's view keeps its state)."""

    trailer: str  # sent after the last event ("data: [DONE]" on OpenAI's older routes)

    def whole(self, parts: list[str | ToolCall], done: Done) -> dict: ...

    def opening(self, prefill: Prefill) -> list[dict]: ...

    def feed(self, part: str | ToolCall) -> list[dict]: ...

    def closing(self, done: Done) -> list[dict]: ...

    def failed(self, error: BaseException) -> list[dict]: ...

    def frame(self, event: dict) -> str: ...


def note_of(options: Options, tools: ToolUse | None) -> str | None:
    """What the console line says was in force beside the prompt: tools, a grammar."""
    grammar = options.grammar.describe() if options.grammar else None
    return job_note(tools=tools.note() if tools else None, grammar=grammar)


def shutting_down() -> RequestError:
    return RequestError(SHUTTING_DOWN, status=503, kind="server_error")


async def answer(request, worker, prompt: Prompt, *, view: View, stream: bool):
    """A generation's answer, for every route: `view.whole` as one JSON body, or, where
    `stream`, the view's events. Refused with a plain error until the generation has
    started; a client that leaves stops it."""
    options = prompt.options
    note = note_of(options, prompt.tools)
    job = worker.submit(prompt.ids, options, asyncio.get_running_loop(), note=note, namespace=namespace(request))
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    streaming = False
    try:
        first = await job.next()  # the Prefill, once the generation has started
        if isinstance(first, BaseException):
            raise first
        if first is END:
            raise shutting_down()
        if not stream:
            return JSONResponse(view.whole(*await gathered(job, prompt.parsing)))
        # from here Starlette listens for the disconnect; two listeners would steal its message
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        streaming = True
        return EventStream(events(job, first, view, prompt.parsing), on_close=job.cancel)
    finally:
        watcher.cancel()
        if not streaming:
            job.cancel()  # no-op once it finished; stops it if this handler failed or was cancelled


async def parts(job, tools: ToolUse | None) -> AsyncIterator[str | ToolCall | Done]:
    """The generation's text pieces and parsed calls, in order, then its Done; an error the
    engine raised is raised here. Ends without a Done when the server shuts down. With
    tools, a call's markup is held back until it closes and comes as one ToolCall."""
    splitter = ToolCallSplitter(tools.format, tools=tools.tools) if tools is not None else None
    while (item := await job.next()) is not END:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Round) and item.text:
            for part in splitter.feed(item.text) if splitter else [item.text]:
                yield part
        elif isinstance(item, Done):
            for part in (splitter.feed(item.text) + splitter.finish()) if splitter else [item.text]:
                if part != "":
                    yield part
            yield item


async def gathered(job, tools: ToolUse | None) -> tuple[list[str | ToolCall], Done]:
    """The whole answer's parts and its Done (a 503 when the server shut down first)."""
    found, done = [], None
    async for part in parts(job, tools):
        if isinstance(part, Done):
            done = part
        else:
            found.append(part)
    if done is None:
        raise shutting_down()
    return found, done


async def events(job, prefill: Prefill, view: View, tools: ToolUse | None):
    """The answer as the view's server-sent events; a failure (the shutdown included) as
    its error events, after whatever was sent."""
    for event in view.opening(prefill):
        yield view.frame(event)
    ended = False
    try:
        async for part in parts(job, tools):
            ended = isinstance(part, Done)
            for event in view.closing(part) if ended else view.feed(part):
                yield view.frame(event)
    except Exception as e:
        ended = True
        for event in view.failed(e):
            yield view.frame(event)
    if not ended:
        for event in view.failed(shutting_down()):
            yield view.frame(event)
    if view.trailer:
        yield view.trailer


class EventStream(StreamingResponse):
    """Server-sent events; `on_close` runs however the response ends (a client gone before
    the first event included, where a generator's own `finally` would never run)."""

    def __init__(self, events, *, on_close):
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def namespace(request) -> str:
    """Whose history a request drafts from: its API key's (RequireKey names it)."""
    return request.scope.get("state", {}).get("namespace", DEFAULT_NAMESPACE)


async def _cancel_on_disconnect(request, job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


def error_of(e: BaseException) -> tuple[dict, int]:
    """A failure as the OpenAI routes answer it: its body and status."""
    if isinstance(e, RequestError):
        return e.body(), e.status
    if isinstance(e, PromptTooLong):
        return error_body(str(e), code="context_length_exceeded"), 400
    if isinstance(e, InvalidOption):
        return error_body(str(e)), 400
    if isinstance(e, MlxspecError):
        return error_body(str(e), kind="server_error"), 500
    return error_body(f"internal error: {type(e).__name__}: {e}", kind="server_error"), 500


def error_response(e: BaseException) -> JSONResponse:
    body, status = error_of(e)
    return JSONResponse(body, status_code=status, headers={"Connection": "close"} if status in CLOSING else None)
