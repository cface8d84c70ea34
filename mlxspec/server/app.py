"""The routes (Starlette): a request is read and checked here, queued on the worker, and
answered as one JSON body or as server-sent events.

Everything that can be refused before queueing is (a body over the size limit, bad fields, a
prompt that does not fit the context, speculative options without a draft): a bad request
never waits behind another's generation. Templating and tokenizing run on the offload
thread, after a text too long for the context was refused by its length alone, so the
event loop stays free for /health and the other clients. A stream's headers go out once its
generation has started, so an error the engine raises at the start is still a plain 400.
While a request waits or runs, a client that disconnects stops its generation at the next
round.
"""

from __future__ import annotations

import hmac
import itertools
import json
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..decoding.events import Done
from ..errors import InvalidOption, MlxspecError, PromptTooLong
from ..generation import check_drafting, check_ids
from ..grammar import check_spec
from ..models.loading import looks_like_path
from ..models.pairs import fit_context
from ..options import Options
from ..tool_calls import ToolCall, tool_format
from . import anthropic, encode, schema
from .answer import Prompt, answer, error_of, error_response, namespace
from .formats import response_grammar
from .length import bytes_per_token
from .limits import Limits, read_body
from .messages import Messages
from .offload import Offload
from .responding import Responses
from .schema import Reply, RequestError, error_body
from .tools import ToolUse, tool_use
from .worker import Worker


def public_name(name: str) -> str:
    """A model's name as clients see it: a repo id or registry name as it is, a local folder
    or file by its last part (no path of this machine leaves it)."""
    return name.rstrip("/").split("/")[-1] if looks_like_path(name) else name


def model_id(pair) -> str:
    return public_name(pair.target.name)


def create_app(
    *,
    worker: Worker,
    pair,
    defaults: Options,
    api_keys: dict[str, str] | None = None,  # each key and its history's namespace (HistoryStore.namespace_of)
    limits: Limits = Limits(),
    offload: Offload | None = None,
):
    api = Api(worker, pair, defaults, limits=limits, offload=offload or Offload())
    messages = Messages(api)
    responses = Responses(api)
    app = Starlette(
        routes=[
            Route("/health", api.health, methods=["GET"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
            Route("/v1/completions", api.completions, methods=["POST"]),
            Route("/v1/responses", responses.create, methods=["POST"]),
            Route("/v1/messages", messages.create, methods=["POST"]),
            Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    return RequireKey(app, api_keys) if api_keys else app


class Api:
    def __init__(self, worker: Worker, pair, defaults: Options, *, limits: Limits, offload: Offload):
        self.worker = worker
        self.pair = pair
        self.defaults = defaults
        self.limits = limits
        self.offload = offload
        self.per_token = bytes_per_token(pair.tokenizer)  # None: no early refusal by length
        self.model = model_id(pair)
        self.tool_format = tool_format(pair.tokenizer)  # None: mlx-lm knows no tool-call format for it
        self.started = int(time.time())

    async def health(self, request):
        """The server's state as the caller's key sees it: its own requests' counts and its own
        history (without keys, everyone's: one namespace). Never waits on the worker."""
        worker, mine = self.worker, namespace(request)
        return JSONResponse(
            {
                "status": "ok",
                "model": self.model,
                **worker.state_of(mine),
                "history": worker.history.describe(mine) if worker.history is not None else None,
            }
        )

    async def models(self, request):
        pair = self.pair
        card = {
            "id": self.model,
            "object": "model",
            "created": self.started,
            "owned_by": "mlxspec",
            # mlxspec's own: what serves it
            "target": public_name(pair.target.name),
            "draft": public_name(pair.draft.name) if pair.draft else None,
            "prompt_lookup": pair.ngram,
            "context_length": pair.target.context_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def chat_completions(self, request):
        try:
            body = schema.parse(schema.ChatBody, await read_body(request, self.limits))
            prompt = await self.chat_prompt(body)
            view = ChatView(Reply(chat=True, model=self.model), include_usage=body.include_usage)
            return await answer(request, self.worker, prompt, view=view, stream=body.stream)
        except (RequestError, MlxspecError) as e:
            return error_response(e)

    async def completions(self, request):
        try:
            body = schema.parse(schema.CompletionBody, await read_body(request, self.limits))
            options = await self.options_of(body)
            prompt = schema.completion_prompt(body)
            ids = await self.offload.run(encode.completion_ids, self.pair, prompt, per_token=self.per_token)
            self._check(ids, options, "prompt")
            view = ChatView(Reply(chat=False, model=self.model), include_usage=body.include_usage)
            return await answer(request, self.worker, Prompt(ids, options), view=view, stream=body.stream)
        except (RequestError, MlxspecError) as e:
            return error_response(e)

    async def options_of(self, body) -> Options:
        """The request's options: the server's defaults, overridden by its fields, with its
        response_format's grammar (checked against the tokenizer, on the offload thread)."""
        options = schema.request_options(body, self.defaults)
        if (grammar := response_grammar(body)) is not None:
            await self.offload.run(self.check_grammar, grammar, param="response_format")
            options = options.replace(grammar=grammar)
        return options

    async def chat_prompt(self, body: schema.ChatBody, *, check: bool = True) -> Prompt:
        """A chat request read into what the worker runs, the one prologue of every chat-shaped
        route (chat completions, and Anthropic's and the Responses API's requests translated
        into one): options, response_format's grammar, the tools and a forced call's grammar,
        the template and the ids, and (where `check`) the checks against the pair."""
        options = await self.options_of(body)
        tools = tool_use(body, self.tool_format)
        if (forced := tools.forced_call(self.pair.tokenizer)) is not None:
            if options.grammar is not None:
                raise RequestError("give tool_choice or response_format, not both", param="tool_choice")
            await self.offload.run(self.check_forced_call, forced, tools)
            options = options.replace(grammar=forced)
        messages = schema.template_messages(body)
        ids = await self.offload.run(
            encode.chat_ids, self.pair, messages, think=options.think, tools=tools.tools, per_token=self.per_token
        )
        if check:
            self._check(ids, options, "messages")
        return Prompt(ids, options, tools)

    def check_grammar(self, grammar, *, param: str) -> None:
        """A 400 naming `param` when the grammar engine rejects the grammar or gives up at
        its start (the first call builds the tokenizer's bridge, about a second): on the
        offload thread, before the request queues."""
        try:
            check_spec(grammar, self.pair.tokenizer, width=self.pair.target.width, eos_ids=self.pair.eos_ids)
        except InvalidOption as e:
            raise RequestError(str(e), param=param) from None

    def check_forced_call(self, grammar, tools: ToolUse) -> None:
        """As check_grammar for a tool_choice's grammar: each tool's arguments alone first, so
        that a refusal names the tool whose parameters the engine refuses (and the start of
        its arguments is walked), then the whole call (naming tool_choice)."""
        for param, arguments in tools.parameter_specs():
            self.check_grammar(arguments, param=param)
        self.check_grammar(grammar, param="tool_choice")

    def _check(self, ids: list[int], options: Options, param: str) -> None:
        if not ids:
            raise RequestError(f"{param} is empty", param=param)
        try:
            check_ids(self.pair, ids)
        except InvalidOption as e:
            raise RequestError(str(e), param=param) from None
        try:
            fit_context(self.pair, len(ids), options.max_tokens)
        except PromptTooLong as e:
            raise RequestError(str(e), param=param, code="context_length_exceeded") from None
        try:
            check_drafting(self.pair, options)
        except InvalidOption:
            raise RequestError(
                "this server has nothing to draft with (no draft model, no prompt lookup): ask for gamma 0",
                param="gamma",
            ) from None


class ChatView:
    """Chat completions and text completions, whole or as chunks: text outside calls as it
    comes, each call once it is whole (its markup is held back until it closes)."""

    trailer = "data: [DONE]\n\n"

    def __init__(self, reply: Reply, *, include_usage: bool):
        self.reply = reply
        self.include_usage = include_usage
        self.calls = itertools.count()  # a call's place among the reply's calls
        self.called = False

    def whole(self, parts, done: Done) -> dict:
        text = "".join(p for p in parts if isinstance(p, str))
        calls = [p.to_openai() for p in parts if isinstance(p, ToolCall)]
        return self.reply.whole(text, done.finish_reason, done.stats, tool_calls=calls)

    def opening(self, prefill) -> list[dict]:
        return [self.reply.chunk(first=True)] if self.reply.chat else []

    def feed(self, part) -> list[dict]:
        if isinstance(part, str):
            return [self.reply.chunk(part)]
        self.called = True
        return self.reply.call_chunks(part.to_openai(), next(self.calls))

    def closing(self, done: Done) -> list[dict]:
        end = [self.reply.chunk(finish_reason=done.finish_reason, called=self.called)]
        return end + ([self.reply.usage_chunk(done.stats)] if self.include_usage else [])

    def failed(self, error: BaseException) -> list[dict]:
        return [error_of(error)[0]]

    def frame(self, event: dict) -> str:
        return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _http_error(request, exc: HTTPException) -> JSONResponse:
    messages = {
        404: f"no such route: {request.method} {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }
    message = messages.get(exc.status_code, str(exc.detail))
    if anthropic_path(request.url.path):
        body = anthropic.error_body(message, exc.status_code)
    else:
        body = error_body(message, code=str(exc.status_code))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def anthropic_path(path: str) -> bool:
    """Anthropic's routes answer errors in Anthropic's shape."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


async def _internal_error(request, exc: Exception) -> JSONResponse:
    if anthropic_path(request.url.path):
        body, status = error_of(exc)
        return JSONResponse(anthropic.error_body(body["error"]["message"], status), status_code=status)
    return error_response(exc)


class RequireKey:
    """Every request must carry one of the keys, as `Authorization: Bearer KEY` (OpenAI's
    clients) or `x-api-key: KEY` (Anthropic's), compared in constant time. The key it carried
    names its history's namespace (`keys` maps each key to it: a keyed digest of the key):
    one key's earlier requests never draft for another's, whose acceptance speed would tell
    of them."""

    def __init__(self, app, keys: dict[str, str]):
        self.app = app
        self.keys = [(key.encode(), space) for key, space in keys.items()]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            bearer, api_key = headers.get(b"authorization", b""), headers.get(b"x-api-key")
            scheme, _, token = bearer.partition(b" ")
            given = [token.strip()] if scheme.lower() == b"bearer" else []
            given += [api_key] if api_key is not None else []
            matched = [space for key, space in self.keys for token in given if hmac.compare_digest(token, key)]
            if matched:
                scope.setdefault("state", {})["namespace"] = matched[0]
            else:
                sent = bearer or api_key is not None
                message = (
                    "invalid API key"
                    if sent
                    else "missing API key: send the header Authorization: Bearer KEY (or x-api-key: KEY)"
                )
                if anthropic_path(scope["path"]):
                    body = anthropic.error_body(message, 401)
                else:
                    body = error_body(message, code="invalid_api_key")
                response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
