"""`response_format` on `mlxspec serve` (the bundled pair, in a subprocess, through the real
`openai` client): JSON that parses and validates for several schemas at temperature 0 and 1,
speculative and standard; greedy answers equal to the library's standard decoding under the
same grammar; a schema the engine rejects is a 400 naming it; a client gone mid-stream
leaves the session exact."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pytest

import mlxspec
from mlxspec.grammar import GrammarSpec
from tests.server.test_server import TIMEOUT, chat_ids, client, health, pair, running_server, server  # noqa: F401 (fixtures)
from tests.support import fuzz_targets as fuzz

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "owner": {
                "type": "object",
                "properties": {
                    "first": {"type": "string", "maxLength": 8},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["first", "age"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "owner"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3}
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": -10, "maximum": 10},
            "n": {"type": "integer", "minimum": 0, "maximum": 999},
        },
        "required": ["x", "n"],
        "additionalProperties": False,
    },
}
MESSAGES = [{"role": "user", "content": "def merge_sort(items):"}]
MAX_TOKENS = 120


def json_schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_answers_validate(client, pair, name):  # noqa: F811
    schema = SCHEMAS[name]
    ids = chat_ids(pair, MESSAGES)
    reference = mlxspec.generate(
        pair, ids, gamma=0, temp=0, max_tokens=MAX_TOKENS, grammar=GrammarSpec.json_schema(schema)
    )
    for temperature in (0, 1):
        for gamma in (0, "auto"):
            reply = client.chat.completions.create(
                model="m",
                messages=MESSAGES,
                temperature=temperature,
                seed=7,
                max_tokens=MAX_TOKENS,
                response_format=json_schema_format(name, schema),
                extra_body={"gamma": gamma},
            )
            choice = reply.choices[0]
            assert choice.finish_reason == "stop", (temperature, gamma, choice.message.content)
            jsonschema.validate(json.loads(choice.message.content), schema)
            if temperature == 0:
                assert choice.message.content == reference.text, gamma


def test_json_object_and_a_streamed_schema(client):  # noqa: F811
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, response_format={"type": "json_object"}
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # the toy model may not close an open-ended object in time; what it wrote starts one
        assert reply.choices[0].message.content.startswith("{")
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        temperature=1,
        seed=3,
        max_tokens=MAX_TOKENS,
        stream=True,
        response_format=json_schema_format("nested", SCHEMAS["nested"]),
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), SCHEMAS["nested"])


@pytest.mark.parametrize(
    "response_format, message",
    [
        (json_schema_format("pet", {"type": "object", "properties": {"a": {"type": "strng"}}}), "'pet'"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema must be"),
        ({"type": "xml"}, "response_format.type must be"),
        ({"type": "json_schema", "json_schema": {"name": "s", "schema": "{not json"}}, "is not JSON"),
        # issue 39: "²" passed str.isdigit, and int() made it a 500
        (json_schema_format("sup", {"$ref": "#/$defs/x/²", "$defs": {"x": [{"type": "string"}]}}), "'sup'"),
    ],
    ids=["bad-type", "no-schema", "unknown-format", "schema-not-json", "superscript-index"],
)
def test_a_schema_the_engine_rejects_is_a_400_naming_it(server, client, pair, response_format, message):  # noqa: F811
    body = {"messages": MESSAGES, "response_format": response_format}
    response = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"
    assert error["param"].startswith("response_format") and "\n" not in error["message"]
    # and the server keeps serving
    reply = client.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=8)
    assert (
        reply.choices[0].message.content == mlxspec.generate(pair, chat_ids(pair, MESSAGES), gamma=0, max_tokens=8).text
    )


@pytest.mark.alone  # timed against the wall clock: generation stops within 10 s of the client leaving
def test_a_disconnect_mid_constrained_stream_leaves_the_session_exact(server, client, pair):  # noqa: F811
    """A long constrained stream cut after a few chunks, then the same request: the answer
    is a fresh standard decoding's under the grammar, from the caches the cut left."""
    # minLength keeps the answer long: unconstrained, this model closes the string at once and
    # the whole answer could be sent before the server sees the client go.
    schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 400}}, "required": ["text"]}
    response_format = json_schema_format("long", schema)
    before = health(server)["stopped"]
    body = {
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 1500,
        "stream": True,
        "response_format": response_format,
    }
    with httpx.Client(timeout=TIMEOUT) as http:
        with http.stream("POST", f"{server}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            received = 0
            for line in response.iter_lines():
                received += line.startswith("data:")
                if received == 4:
                    break
    closed = time.monotonic()
    while (state := health(server))["busy"] or state["stopped"] == before:
        assert time.monotonic() - closed < 10, f"still generating after the client left: {state}"
        time.sleep(0.05)
    again = client.chat.completions.create(
        model="m", messages=MESSAGES, temperature=0, max_tokens=24, response_format=response_format
    )
    reference = mlxspec.generate(
        pair, chat_ids(pair, MESSAGES), gamma=0, max_tokens=24, grammar=GrammarSpec.json_schema(schema)
    )
    assert again.choices[0].message.content == reference.text
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


# --- hostile schemas (issue 28) --------------------------------------------------------------
def post(url: str, route: str, body: dict) -> httpx.Response:
    """A chat or text completion request, as raw JSON: what came back."""
    if route == "completions":
        body = {"prompt": "def merge_sort(items):", **body}
    else:
        body = {"messages": MESSAGES, **body}
    return httpx.post(f"{url}/v1/{route}", json={"max_tokens": 8, **body}, timeout=TIMEOUT)


def assert_refused(response: httpx.Response, param: str, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"] and "\n" not in error["message"], error


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_deep_wide_and_chained_schemas_leave_the_server_serving(server, route):  # noqa: F811
    """A chain of 1,000 $defs overflowed the grammar engine's stack and killed the server: it
    is a 400 naming response_format now, streamed or not, as is a chain long enough to pass a
    stack of any size; a wide schema and a chain within the bound are answered; after each,
    /health answers."""
    param = "response_format.json_schema.schema"
    for stream in (False, True):
        for levels in (1000, 20000):
            response = post(
                server, route, {"response_format": json_schema_format("deep", fuzz.ref_chain(levels)), "stream": stream}
            )
            assert_refused(response, param, "nests deeper than 512 levels")
            assert health(server)["status"] == "ok"
    for schema in (fuzz.wide_schema(400), fuzz.wide_schema(300, refs=True), fuzz.ref_chain(150, "array")):
        response = post(server, route, {"response_format": json_schema_format("wide", schema), "temperature": 0})
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        text = choice["message"]["content"] if route.startswith("chat") else choice["text"]
        assert text.startswith("{" if "properties" in schema else "["), text
        assert health(server)["status"] == "ok"
    # wider than the engine's parser takes (it gives up on the opening brace), and past its
    # size limit: its refusals, one line each, before anything runs
    for properties in (2000, 40000):  # llguidance 1.9: a parser row of 8,007 items (2,000 at most); too large
        for stream in (False, True):
            body = {"response_format": json_schema_format("huge", fuzz.wide_schema(properties)), "stream": stream}
            assert_refused(post(server, route, body), "response_format", "is not one the grammar engine accepts")
            assert health(server)["status"] == "ok"


ENGINE_GIVES_UP = {
    "a recursive $ref that must be entered": {
        "type": "object",
        "properties": {"a": {"$ref": "#"}},
        "required": ["a"],
    },
    "a pattern too large to build": {"type": "string", "pattern": "^a{1000000}$"},
}


@pytest.mark.parametrize("name", list(ENGINE_GIVES_UP))
def test_a_grammar_the_engine_gives_up_on_at_its_start_is_a_400_before_anything_runs(server, client, pair, name):  # noqa: F811
    """These passed the compile and ended "the grammar engine gave up after 0 ids" with no
    param, streamed as a 200 then an error event: a 400 naming response_format now."""
    for route in ("chat/completions", "completions"):
        for stream in (False, True):
            body = {"response_format": json_schema_format("x", ENGINE_GIVES_UP[name]), "stream": stream}
            assert_refused(post(server, route, body), "response_format", "gives up at the start of a reply")
    reply = client.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=8)
    assert (
        reply.choices[0].message.content == mlxspec.generate(pair, chat_ids(pair, MESSAGES), gamma=0, max_tokens=8).text
    )


def test_text_completions_hold_the_text_to_response_format(client, pair):  # noqa: F811
    """/v1/completions took response_format and ignored it (a 200 with text that was not JSON)."""
    prompt = "def merge_sort(items):"
    schema = SCHEMAS["enum"]
    reference = mlxspec.generate(
        pair, prompt, gamma=0, temp=0, max_tokens=MAX_TOKENS, raw=True, grammar=GrammarSpec.json_schema(schema)
    )
    for temperature in (0, 1):
        for gamma in (0, "auto"):
            reply = client.completions.create(
                model="m",
                prompt=prompt,
                temperature=temperature,
                seed=5,
                max_tokens=MAX_TOKENS,
                extra_body={"gamma": gamma, "response_format": json_schema_format("enum", schema)},
            )
            jsonschema.validate(json.loads(reply.choices[0].text), schema)
            if temperature == 0:
                assert reply.choices[0].text == reference.text, gamma
