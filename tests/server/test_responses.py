"""`POST /v1/responses`, OpenAI's Responses API: `mlxspec serve` in a subprocess driven by the
real `openai` client's `responses.create` and `responses.stream` (and httpx for what the
client would not send). Greedy answers are checked against the library's standard decoding
of the same ids and against the chat route; tool calls and a Codex-style loop with the tiny
model of tests/support/tool_models.py taught Qwen3's markup (test_tool_calls.py's fixture)."""

from __future__ import annotations

import json
import signal

import httpx
import jsonschema
import openai
import pytest

import mlxspec
from tests.server.test_server import KEY, SAMPLING, TIMEOUT, chat_ids, check_sampled, running_server, standard
from tests.server.test_server_grammar import SCHEMAS
from tests.server.test_tool_calls import (  # noqa: F401 (fixtures)
    AFTER_CALL,
    ANSWER,
    MAX_TOKENS,
    PARIS,
    ROME,
    TOOLS,
    qwen3,
    server_ids,
)

OTHER_KEY = "other-key-456"
QUESTION = "def merge_sort(items):"
USER = [{"role": "user", "content": QUESTION}]
# the chat route's TOOLS in the Responses API's shape
FUNCTIONS = [{"type": "function", **tool["function"], "strict": True} for tool in TOOLS]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The bundled pair behind two API keys."""
    log = tmp_path_factory.mktemp("responses") / "serve.log"
    with running_server("--api-key", KEY, "--api-key", OTHER_KEY, log=log) as (url, _):
        yield url


@pytest.fixture(scope="module")
def pair():
    return mlxspec.load_pair()


def client_of(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=TIMEOUT, max_retries=0)


@pytest.fixture
def client(served):
    return client_of(served)


def ask(client, input, **fields):
    return client.responses.create(model="m", input=input, **{"max_output_tokens": 24, "temperature": 0, **fields})


def post(url: str, body: dict, key: str = KEY) -> httpx.Response:
    return httpx.post(f"{url}/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)


# --- text on the bundled pair -----------------------------------------------------------
def test_a_response_is_standard_decoding_with_usage(client, pair):
    response = ask(client, QUESTION)
    ids = chat_ids(pair, USER)
    expected = standard(pair, ids, 24)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == "tiny-target"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.status == "incomplete"  # cut short, as the response
    assert [part.type for part in message.content] == ["output_text"] and response.output_text == expected.text
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    usage = response.usage
    assert usage.input_tokens == len(ids) and usage.output_tokens == len(expected.tokens) == 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens
    spec = usage.model_extra["speculative"]
    assert spec["gamma"] == "auto" and spec["rounds"] >= 1 and spec["accepted"] <= spec["tested"] <= spec["drafted"]


def test_sampling_fields_reach_the_engine(client, pair):
    top = {key: SAMPLING[key] for key in ("temperature", "top_p")}  # the client's own fields
    extra = {key: value for key, value in SAMPLING.items() if key not in top}
    answers = [ask(client, QUESTION, **top, extra_body=extra).output_text for _ in range(2)]
    check_sampled(pair, chat_ids(pair, USER), answers)


def test_instructions_and_items_read_as_the_chat_routes_messages(client):
    """instructions a system message; message items (text parts, an assistant's output_text)
    the chat route's messages: the same prompt, the same greedy answer."""
    items = [
        {"role": "user", "content": QUESTION},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "    if len(items) < 2:"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]},
    ]
    response = ask(client, items, instructions="You write Python.", max_output_tokens=32)
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "    if len(items) < 2:"},
        {"role": "user", "content": "go on"},
    ]
    chat = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=32)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens and response.instructions == "You write Python."


def test_a_stream_sends_the_typed_events_in_order(client, pair):
    expected = standard(pair, chat_ids(pair, USER), 24)
    with client.responses.stream(model="m", input=QUESTION, max_output_tokens=24, temperature=0) as stream:
        events = list(stream)
    raw = [e for e in events if e.type != "response.output_text.delta" or e.delta]
    kinds = [e.type for e in raw]
    deltas = [e for e in raw if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # cut at max_output_tokens, as OpenAI ends such a stream
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    item_id = events[2].item.id
    assert all(e.item_id == item_id and e.output_index == 0 and e.content_index == 0 for e in deltas)
    assert "".join(e.delta for e in deltas) == expected.text == events[-4].text
    created, last = events[0].response, events[-1].response
    assert created.status == "in_progress" and created.output == [] and created.id == last.id
    assert last.output[0].content[0].text == expected.text and last.usage.output_tokens == 24
    assert events[-2].item.status == last.output[0].status == "incomplete"


@pytest.mark.parametrize("name", ["enum", "nested"])
def test_text_format_json_schema_holds_the_answer_as_the_chat_route(client, name):
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "name": name, "schema": schema, "strict": True}
    response = ask(client, QUESTION, text={"format": fmt}, max_output_tokens=120)
    jsonschema.validate(json.loads(response.output_text), schema)
    chat = client.chat.completions.create(
        model="m",
        messages=USER,
        temperature=0,
        max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
    )
    assert response.output_text == chat.choices[0].message.content and response.text.format.type == "json_schema"
    assert isinstance(json.loads(ask(client, QUESTION, text={"format": {"type": "json_object"}}).output_text), dict)


def test_previous_response_id_is_kept_per_key_and_store_false_is_not(served, client):
    first = ask(client, QUESTION)
    second = ask(client, "go on", previous_response_id=first.id)
    messages = USER + [{"role": "assistant", "content": first.output_text}, {"role": "user", "content": "go on"}]
    chat = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=24)
    assert second.output_text == chat.choices[0].message.content and second.previous_response_id == first.id
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    third = ask(client, "and then?", previous_response_id=second.id, max_output_tokens=1)  # both turns before it
    messages += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "and then?"}]
    chat = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=1)
    assert third.usage.input_tokens == chat.usage.prompt_tokens
    # another key does not see it, and a response not stored is not found
    with pytest.raises(openai.NotFoundError) as refused:
        ask(client_of(served, OTHER_KEY), "go on", previous_response_id=first.id)
    assert refused.value.body["code"] == "previous_response_not_found"
    assert refused.value.body["param"] == "previous_response_id"
    unstored = ask(client, QUESTION, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        ask(client, "go on", previous_response_id=unstored.id)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "name": "f"}]}, "tools"),  # no tool-call format for the bundled pair
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": []}, "input"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(served, fields, param):
    answer = post(served, {"model": "m", "input": QUESTION, **fields})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert post(served, {"model": "m", "input": QUESTION, "max_output_tokens": 2}).status_code == 200


def test_reasoning_as_agents_send_it_is_taken(client):
    """Codex sends `reasoning` (effort, summary) to reasoning models: once a 400. Any effort
    but "none" changes nothing; "none" is the template's enable_thinking false."""
    plain = ask(client, QUESTION).output_text
    for effort in ("minimal", "medium", "high"):
        assert ask(client, QUESTION, reasoning={"effort": effort, "summary": "auto"}).output_text == plain


def test_reasoning_effort_none_switches_the_template_s_thinking_off(tools_client):
    """On Qwen3's template (which writes an empty think block when thinking is off): the
    prompt "none" gives is enable_thinking false's, and not the default's."""
    default = ask_tools(tools_client, "Hello").usage.input_tokens
    unthinking = ask_tools(tools_client, "Hello", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    none = ask_tools(tools_client, "Hello", reasoning={"effort": "none"})
    assert none.usage.input_tokens == unthinking.usage.input_tokens != default


# --- tools: a model taught Qwen3's markup ---------------------------------------------
@pytest.fixture(scope="module")
def tools_client(qwen3, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("responses-qwen3") / "serve.log"
    with running_server("--target", str(qwen3[0]), log=log) as (url, _):
        yield client_of(url)


def ask_tools(client, input, **fields):
    fields = {"tools": FUNCTIONS, "max_output_tokens": MAX_TOKENS, "temperature": 0, **fields}
    return client.responses.create(model="m", input=input, **fields)


def the_call(item, city: str) -> None:
    assert item.type == "function_call" and item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert item.name == "get_weather" and json.loads(item.arguments) == {"city": city} and item.status == "completed"


def test_a_call_comes_back_as_a_function_call_item(tools_client, qwen3):  # noqa: F811
    response = ask_tools(tools_client, PARIS[0]["content"])
    [item] = response.output
    the_call(item, "Paris")
    assert response.status == "completed" and response.tools[0].name == "get_weather"
    assert response.usage.input_tokens == len(server_ids(qwen3[1].tokenizer, PARIS))


@pytest.mark.parametrize(
    "fields, param",
    [
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}], "tool_choice": "required"},
            "tools[0].parameters",
        ),
        ({"tool_choice": {"type": "function", "name": "get_time"}}, "tool_choice"),
        ({"tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "tool_choice"),
    ],
)
def test_the_chat_routes_tool_refusals_name_the_responses_fields(tools_client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        ask_tools(tools_client, PARIS[0]["content"], **fields)
    assert refused.value.body["param"] == param, refused.value.body
    assert "function.parameters" not in refused.value.body["message"]


def test_a_streamed_answer_with_text_and_a_call(tools_client):
    with tools_client.responses.stream(
        model="m", input=ROME[0]["content"], tools=FUNCTIONS, max_output_tokens=MAX_TOKENS, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(0, "message"), (1, "function_call")]
    [arguments] = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert arguments.output_index == 1 and json.loads(arguments.delta) == {"city": "Rome"}
    assert events[-1].type == "response.completed" and [e.sequence_number for e in events] == list(range(len(events)))
    message, call = final.output
    assert message.content[0].text.strip() == "Let me look." and final.output_text.strip() == "Let me look."
    the_call(call, "Rome")


@pytest.mark.parametrize("stream", [False, True])
def test_a_codex_style_loop_answers_alike_by_id_and_by_items(tools_client, stream):  # noqa: F811
    """A forced call, its output sent back, the answer: once through previous_response_id
    (the server's stored conversation) and once with the items sent back, as a client that
    stores nothing does; the same prompt and the same answer, the chat route's."""
    forced = {"type": "function", "name": "get_weather"}
    called = ask_tools(tools_client, ROME[0]["content"], tool_choice=forced)  # taught to answer with text first
    [call] = called.output
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments)["city"]

    def answer(**fields):
        if not stream:
            return ask_tools(tools_client, **fields)
        with tools_client.responses.stream(model="m", tools=FUNCTIONS, temperature=0, **fields) as events:
            return events.get_final_response()

    paris = answer(input=PARIS[0]["content"], tool_choice=forced)  # kept, streamed or not
    [call] = paris.output
    the_call(call, "Paris")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}
    by_id = answer(input=[result], previous_response_id=paris.id)
    sent_back = [{"role": "user", "content": PARIS[0]["content"]}, call.model_dump(exclude_none=True), result]
    by_items = answer(input=sent_back, store=False)
    assert by_id.output_text == by_items.output_text == ANSWER
    assert by_id.status == by_items.status == "completed"
    assert by_id.usage.input_tokens == by_items.usage.input_tokens
    chat = tools_client.chat.completions.create(model="m", messages=AFTER_CALL, tools=TOOLS, temperature=0)
    assert chat.choices[0].message.content == ANSWER and chat.usage.prompt_tokens == by_id.usage.input_tokens


def test_ctrl_c_ends_a_stream_with_an_error_and_response_failed(tmp_path):
    with running_server(log=tmp_path / "serve.log") as (url, process):
        body = {"model": "m", "input": QUESTION, "temperature": 0, "max_output_tokens": 100000, "stream": True}
        with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", f"{url}/v1/responses", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            process.send_signal(signal.SIGINT)
            tail = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]
    error, failed = tail[-2:]
    assert error["type"] == "error" and "shutting down" in error["message"] and error["code"] == "server_error"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": error["message"]}
    assert failed["sequence_number"] == error["sequence_number"] + 1
