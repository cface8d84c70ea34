"""The answer path every route shares (the OpenAI routes in app.py, Anthropic's in
messages.py): a generation submitted to the worker and answered whole or as server-sent
events, the client's leaving cancelling it, and a failure turned into a status and a body.
"""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse, StreamingResponse

from ..drafters.history import DEFAULT_NAMESPACE
from ..errors import InvalidOption, MlxspecError, PromptTooLong
from ..options import Options
from .schema import RequestError, error_body
from .tools import ToolUse
from .worker import END, job_note

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# answered before the body was read to its end: the rest of it is not worth reading
CLOSING = {408, 413}


def note_of(options: Options, tools: ToolUse | None) -> str | None:
    """What the console line says was in force beside the prompt: tools, a grammar."""
    grammar = options.grammar.describe() if options.grammar else None
    return job_note(tools=tools.note() if tools else None, grammar=grammar)


async def answer(request, worker, ids: list[int], options: Options, *, note, whole, stream):
    """A generation's answer, for every route: `whole(job)` as one JSON body, or, where
    `stream` is given, the server-sent events `stream(job, first_event)` yields. Refused with
    a plain error until the generation has started; a client that leaves stops it."""
    job = worker.submit(ids, options, asyncio.get_running_loop(), note=note, namespace=namespace(request))
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    streaming = False
    try:
        first = await job.next()  # the Prefill, once the generation has started
        if isinstance(first, BaseException):
            raise first
        if first is END:
            raise RequestError("the server is shutting down", status=503, kind="server_error")
        if stream is None:
            return JSONResponse(await whole(job))
        # from here Starlette listens for the disconnect; two listeners would steal its message
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        streaming = True
        return EventStream(stream(job, first), on_close=job.cancel)
    finally:
        watcher.cancel()
        if not streaming:
            job.cancel()  # no-op once it finished; stops it if this handler failed or was cancelled


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
