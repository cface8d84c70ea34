"""`POST /v1/responses` (OpenAI's Responses API): the request is translated into the chat
route's (responses.py) and read by the chat route's prologue, then runs on the same worker,
prompt cache and engine; only the answer's shape differs. A response is kept for
`previous_response_id` under the caller's API key unless it says `store: false`
(stored.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ..decoding.events import Done, Prefill
from ..errors import MlxspecError
from . import responses, schema
from .answer import answer, error_of, error_response, namespace
from .limits import read_body
from .responses import Items, Reply
from .schema import RequestError
from .stored import StoredResponses, size_of


class Responses:
    """The route, over the chat route's Api (its worker, pair, limits and prologue)."""

    def __init__(self, api, *, stored: StoredResponses | None = None):
        self.api = api
        self.stored = stored if stored is not None else StoredResponses()

    async def create(self, request):
        api = self.api
        try:
            body = schema.parse(responses.ResponsesBody, await read_body(request, api.limits))
            responses.refuse_unsupported(body)
            space = namespace(request)
            earlier, earlier_size = self._earlier(body, space)
            try:
                chat, asked, asked_size = await api.offload.run(responses.translate, body, earlier)
                prompt = await api.chat_prompt(chat)
            except RequestError as e:
                raise responses.reworded(e) from None
            reply = Reply(model=api.model, body=body)

            def keep(output: list[dict]) -> None:
                if body.store:
                    answered = [responses.plain_item(item) for item in output]
                    size = earlier_size + asked_size + size_of(answered)
                    self.stored.put(space, reply.id, earlier + asked + answered, size=size)

            return await answer(request, api.worker, prompt, view=ResponseView(reply, keep=keep), stream=body.stream)
        except (RequestError, MlxspecError) as e:
            return error_response(e)

    def _earlier(self, body, space: str) -> tuple[list[dict], int]:
        """The stored conversation `previous_response_id` names (its own key's alone), and its
        size."""
        if body.previous_response_id is None:
            return [], 0
        earlier = self.stored.get(space, body.previous_response_id)
        if earlier is None:
            raise RequestError(
                f"Previous response with id {body.previous_response_id!r} not found.",
                param="previous_response_id",
                code="previous_response_not_found",
                status=404,
            )
        return earlier


class ResponseView:
    """The response whole, or its events in order: response.created, response.in_progress,
    each output item's events (responses.Items), then response.completed (or
    response.incomplete where the output was cut short); an `error` and response.failed
    where the generation failed. Each event carries its sequence_number."""

    trailer = ""

    def __init__(self, reply: Reply, *, keep: Callable[[list[dict]], None]):
        self.reply = reply
        self.keep = keep
        self.items = Items()
        self.sequence = itertools.count()

    def whole(self, parts, done: Done) -> dict:
        items = Items()
        for part in parts:
            items.feed(part)
        items.cut = responses.cut_short(done)
        items.finish()
        return self._finished(items, done)

    def opening(self, prefill: Prefill) -> list[dict]:
        response = self.reply.response(status="in_progress", output=[])
        return [
            {"type": "response.created", "response": response},
            {"type": "response.in_progress", "response": response},
        ]

    def feed(self, part) -> list[dict]:
        return self.items.feed(part)

    def closing(self, done: Done) -> list[dict]:
        self.items.cut = responses.cut_short(done)
        events = self.items.finish()
        response = self._finished(self.items, done)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return events + [{"type": kind, "response": response}]

    def failed(self, error: BaseException) -> list[dict]:
        body, status = error_of(error)
        message, param = body["error"]["message"], body["error"]["param"]
        code = body["error"]["code"] or ("server_error" if status >= 500 else "invalid_prompt")
        failure = {"code": "server_error" if status >= 500 else "invalid_prompt", "message": message}
        response = self.reply.response(status="failed", output=self.items.content, error=failure)
        return [
            {"type": "error", "code": code, "message": message, "param": param},
            {"type": "response.failed", "response": response},
        ]

    def frame(self, event: dict) -> str:
        return responses.sse({**event, "sequence_number": next(self.sequence)})

    def _finished(self, items: Items, done: Done) -> dict:
        self.keep(items.content)
        return self.reply.finished(items, done)
