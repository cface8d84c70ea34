"""`POST /v1/messages`, Anthropic's Messages API: `mlxspec serve` in a subprocess driven by the
real `anthropic` client (and httpx for what the client would not send). Greedy answers are
checked against the library's standard decoding of the same ids and against the OpenAI chat
route; tool use with the tiny models of tests/support/tool_models.py taught Qwen3's and Mistral's
markup (test_tool_calls.py's fixtures)."""

from __future__ import annotations

import json
import sys
import time

import anthropic
import httpx
import openai
import pytest

import mlxspec
from mlxspec.generation import encode_messages
from mlxspec.server.schema import ChatBody, template_messages
from tests.server.test_server import KEY, TIMEOUT, chat_ids, health, running_server, standard
from tests.server.test_tool_calls import (  # noqa: F401 (fixtures)
    AFTER_CALL,
    ANSWER,
    HUGE,
    MAX_TOKENS,
    PARIS,
    ROME,
    TOOLS,
    mistral,
    qwen3,
    server_ids,
)
from tests.support import fuzz_targets as fuzz

USER = [{"role": "user", "content": "def merge_sort(items):"}]
SYSTEM = "You write Python."
AUTH = {"x-api-key": KEY}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The bundled pair behind an API key."""
    log = tmp_path_factory.mktemp("anthropic") / "serve.log"
    with running_server(log=log, env={"MLXSPEC_API_KEY": KEY}) as (url, _):
        yield url, log


@pytest.fixture(scope="module")
def pair():
    return mlxspec.load_pair()


@pytest.fixture
def client(served):
    return anthropic.Anthropic(base_url=served[0], api_key=KEY, timeout=TIMEOUT, max_retries=0)


def ask(client, messages, **fields):
    fields = {"max_tokens": 24, "extra_body": {"temperature": 0}, **fields}
    return client.messages.create(model="m", messages=messages, **fields)


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens


# --- plain messages on the bundled pair ---------------------------------------------------
def test_a_message_is_standard_decoding_with_usage(client, pair):
    message = ask(client, USER)
    expected = standard(pair, chat_ids(pair, USER), 24)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == expected.text
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert prompt_tokens(message.usage) == len(chat_ids(pair, USER))
    assert message.usage.output_tokens == len(expected.tokens) == 24
    spec = message.usage.model_extra["speculative"]
    assert spec["gamma"] == "auto" and spec["rounds"] >= 1 and spec["accepted"] <= spec["tested"] <= spec["drafted"]


def test_greedy_text_equals_the_chat_route(served, client):
    chat = openai.OpenAI(base_url=f"{served[0]}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
    messages = USER + [{"role": "assistant", "content": "    if len(items) < 2:"}, {"role": "user", "content": "go on"}]
    system = [{"type": "text", "text": SYSTEM}]  # a system prompt as text blocks
    via_messages = ask(client, messages, system=system, max_tokens=32)
    via_chat = chat.chat.completions.create(
        model="m", messages=[{"role": "system", "content": SYSTEM}] + messages, temperature=0, max_tokens=32
    )
    assert text_of(via_messages) == via_chat.choices[0].message.content
    assert prompt_tokens(via_messages.usage) == via_chat.usage.prompt_tokens
    assert via_messages.usage.output_tokens == via_chat.usage.completion_tokens


def test_the_system_prompt_is_rendered(client, pair):
    message = ask(client, USER, system=SYSTEM)
    ids = chat_ids(pair, [{"role": "system", "content": SYSTEM}] + USER)
    assert prompt_tokens(message.usage) == len(ids) > len(chat_ids(pair, USER))
    assert text_of(message) == standard(pair, ids, 24).text


def test_a_stream_has_anthropics_event_sequence(client, pair):
    expected = standard(pair, chat_ids(pair, USER), 24)
    with client.messages.stream(model="m", messages=USER, max_tokens=24, extra_body={"temperature": 0}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    # the client's helper adds its own "text" events beside the raw ones
    raw = [k for k in kinds if k not in ("text",)]
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    start = events[0].message
    assert start.content == [] and start.stop_reason is None and prompt_tokens(start.usage) == len(chat_ids(pair, USER))
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == expected.text
    assert text_of(final) == expected.text and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 24 and final.id == start.id


def test_a_stream_on_the_wire_starts_with_a_ping_and_names_each_event(served):
    body = {"model": "m", "messages": USER, "max_tokens": 8, "stream": True, "temperature": 0}
    answer = httpx.post(f"{served[0]}/v1/messages", json=body, headers=AUTH, timeout=TIMEOUT)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in answer.text.split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    datas = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in frames]
    assert [d["type"] for d in datas] == names
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    end = datas[-2]
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == 8 and end["usage"]["speculative"]["rounds"] >= 1


def test_stop_sequences_end_the_text_and_are_named(client, pair):
    ids = chat_ids(pair, USER)
    full = standard(pair, ids, 40).text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    message = ask(client, USER, max_tokens=40, stop_sequences=["never appears", stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert text_of(message) == full[: full.index(stop)] == standard(pair, ids, 40, stop=[stop]).text
    with client.messages.stream(
        model="m", messages=USER, max_tokens=40, stop_sequences=[stop], extra_body={"temperature": 0}
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text_of(final)) == ("stop_sequence", stop, text_of(message))


def test_top_k_temperature_seed_and_gamma_reach_the_engine(client, pair):
    sampling = {"temperature": 0.9, "top_k": 5, "top_p": 0.95, "seed": 7, "gamma": 2}
    replies = [text_of(ask(client, USER, extra_body=sampling)) for _ in range(2)]
    ids = chat_ids(pair, USER)
    expected = mlxspec.generate(pair, ids, temp=0.9, top_k=5, top_p=0.95, seed=7, gamma=2, max_tokens=24)
    assert replies == [expected.text, expected.text]
    other = mlxspec.generate(pair, ids, temp=0.9, top_p=0.95, seed=7, gamma=2, max_tokens=24)
    assert other.text != expected.text  # top_k changed the draw: it was not ignored


def test_every_route_keeps_the_speculative_figures(served):
    chat = openai.OpenAI(base_url=f"{served[0]}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
    completion = chat.completions.create(model="m", prompt="def f(x):", max_tokens=8, temperature=0)
    stream = chat.chat.completions.create(
        model="m", messages=USER, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    usages = [completion.usage, [c for c in stream if c.usage][-1].usage]
    for usage in usages:
        assert usage.model_extra["speculative"]["rounds"] >= 1 and usage.model_extra["speculative"]["gamma"] == "auto"


def test_count_tokens(client, pair):
    counted = client.messages.count_tokens(model="m", messages=USER, system=SYSTEM)
    assert counted.input_tokens == len(chat_ids(pair, [{"role": "system", "content": SYSTEM}] + USER))


# --- keys and refusals ----------------------------------------------------------------------
def test_an_api_key_as_x_api_key_or_bearer(served):
    url = served[0]
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
        refused = httpx.post(f"{url}/v1/messages", json={}, headers=headers, timeout=TIMEOUT)
        assert refused.status_code == 401
        assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
            model="m", messages=USER, max_tokens=4
        )
    bearer = anthropic.Anthropic(base_url=url, auth_token=KEY, timeout=TIMEOUT, max_retries=0)
    assert ask(bearer, USER, max_tokens=4).usage.output_tokens == 4
    # the OpenAI routes take x-api-key too
    assert httpx.get(f"{url}/v1/models", headers=AUTH, timeout=TIMEOUT).status_code == 200


LONG = "word " * 3000  # more than the bundled target's 2048 tokens
BAD_REQUESTS = {
    "no max_tokens": ({"messages": USER}, "max_tokens is required"),
    "no messages": ({"max_tokens": 8}, "messages is required"),
    "empty messages": ({"messages": [], "max_tokens": 8}, "messages is empty"),
    "a system role in messages": (
        {"messages": [{"role": "system", "content": "x"}], "max_tokens": 8},
        "messages[0].role",
    ),
    "an image": (
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 8},
        "a user message takes text and tool_result blocks, not 'image'",
    ),
    "a server tool": (
        {"messages": USER, "max_tokens": 8, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "'web_search_20250305' tools are not supported",
    ),
    "a tool without a schema": ({"messages": USER, "max_tokens": 8, "tools": [{"name": "f"}]}, "input_schema"),
    "a text block without its text": (
        {"messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 8},
        "messages[0].content[0]: a text block needs its text",
    ),
    "a bad tool_choice": ({"messages": USER, "max_tokens": 8, "tool_choice": {"type": "maybe"}}, "tool_choice must"),
    "negative temperature": ({"messages": USER, "max_tokens": 8, "temperature": -1}, "temperature must be >= 0"),
    "an empty stop sequence": ({"messages": USER, "max_tokens": 8, "stop_sequences": [""]}, "stop_sequences"),
    "zero max_tokens": ({"messages": USER, "max_tokens": 0}, "max tokens must be"),
    "too long": ({"messages": [{"role": "user", "content": LONG}], "max_tokens": 8}, "reads at most 2048"),
    "not JSON": (b"{nope", "not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_is_a_400_in_anthropics_shape(served, case):
    body, message = BAD_REQUESTS[case]
    content = body if isinstance(body, bytes) else json.dumps({"model": "m", **body}).encode()
    headers = {**AUTH, "Content-Type": "application/json"}
    answer = httpx.post(f"{served[0]}/v1/messages", content=content, headers=headers, timeout=TIMEOUT)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"] and "\n" not in error["error"]["message"]


def test_the_server_keeps_serving_after_refusals(served, client, pair):
    with pytest.raises(anthropic.BadRequestError, match="temperature must be >= 0") as raised:
        ask(client, USER, extra_body={"temperature": -1})
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        ask(client, USER, tools=[], tool_choice={"type": "sometimes"})
    wrong_method = httpx.get(f"{served[0]}/v1/messages", headers=AUTH, timeout=TIMEOUT)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert text_of(ask(client, USER, max_tokens=12)) == standard(pair, chat_ids(pair, USER), 12).text


@pytest.mark.alone  # timed against the wall clock: generation stops within 5 s of the client leaving
def test_a_client_that_leaves_mid_stream_leaves_the_server_serving(served, client, pair):
    url = served[0]
    messages = [{"role": "user", "content": "def long_function():"}]
    before = health(url, Authorization=f"Bearer {KEY}")["stopped"]
    body = {"model": "m", "messages": messages, "max_tokens": 1900, "stream": True, "temperature": 0}
    with httpx.Client(timeout=TIMEOUT, headers=AUTH) as http:
        with http.stream("POST", f"{url}/v1/messages", json=body) as response:
            assert response.status_code == 200
            received = 0
            for line in response.iter_lines():
                received += line.startswith("data:")
                if received == 4:
                    break
    closed = time.monotonic()
    while (state := health(url, Authorization=f"Bearer {KEY}"))["busy"] or state["stopped"] == before:
        assert time.monotonic() - closed < 5, f"still generating after the client left: {state}"
        time.sleep(0.05)
    again = ask(client, messages, max_tokens=20)
    assert text_of(again) == standard(pair, chat_ids(pair, messages), 20).text
    assert again.usage.cache_read_input_tokens == prompt_tokens(again.usage) - 1  # the cut left the caches exact


def test_tools_to_a_model_without_a_tool_format_are_refused(client):
    with pytest.raises(anthropic.BadRequestError, match="tools are not supported by this model") as raised:
        ask(client, USER, tools=ANTHROPIC_TOOLS)
    assert raised.value.body["error"]["type"] == "invalid_request_error"


# --- tool use: Qwen3 (Hermes <tool_call> JSON) and Mistral ([TOOL_CALLS]) ------------------
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
CALLED = [
    PARIS[0],
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "22 C, sunny"}]},
]


@pytest.fixture(scope="module")
def qwen3_served(qwen3, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("anthropic-qwen3") / "serve.log"
    with running_server("--target", str(qwen3[0]), log=log) as (url, _):
        yield anthropic.Anthropic(base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0), log


def ask_tools(client, messages, **fields):
    return ask(client, messages, tools=ANTHROPIC_TOOLS, max_tokens=MAX_TOKENS, **fields)


def the_tool_use(block, city: str) -> None:
    assert block.type == "tool_use" and block.id and block.name == "get_weather" and block.input == {"city": city}


def test_a_call_comes_back_as_tool_use(qwen3_served, qwen3):  # noqa: F811
    client, log = qwen3_served
    message = ask_tools(client, PARIS)
    assert message.stop_reason == "tool_use" and [b.type for b in message.content] == ["tool_use"]
    the_tool_use(message.content[0], "Paris")
    assert prompt_tokens(message.usage) == len(server_ids(qwen3[1].tokenizer, PARIS))
    assert message.usage.model_extra["speculative"]["accepted"] > 0  # prompt lookup drafted from the tools
    assert "tools 1 (auto)" in log.read_text()  # the console line says tools were in force


def test_a_call_with_a_number_past_a_double_s_range_comes_back_whole(qwen3_served):
    """`1e999` parses as infinity, which JSON cannot carry: this route answered 500 and the
    chat route sent `{"city": Infinity}`. Both send the largest double, whole and streamed."""
    client, _ = qwen3_served
    url = str(client.base_url).rstrip("/")
    largest = {"city": sys.float_info.max}
    message = ask_tools(client, HUGE)
    assert message.stop_reason == "tool_use" and message.content[0].input == largest
    with client.messages.stream(model="m", messages=HUGE, tools=ANTHROPIC_TOOLS, max_tokens=MAX_TOKENS) as stream:
        assert stream.get_final_message().content[0].input == largest
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    reply = chat.chat.completions.create(model="m", messages=HUGE, tools=TOOLS, temperature=0, max_tokens=MAX_TOKENS)
    arguments = reply.choices[0].message.tool_calls[0].function.arguments
    assert json.loads(arguments, parse_constant=lambda name: pytest.fail(f"{name} is not JSON")) == largest


def test_a_streamed_call_comes_as_input_json_delta(qwen3_served):
    client, _ = qwen3_served
    with client.messages.stream(
        model="m", messages=ROME, tools=ANTHROPIC_TOOLS, max_tokens=MAX_TOKENS, extra_body={"temperature": 0}
    ) as stream:
        events = [e for e in stream if e.type in ("content_block_start", "content_block_delta", "content_block_stop")]
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert [(e.index, e.content_block.type) for e in starts] == [(0, "text"), (1, "tool_use")]
    assert starts[1].content_block.input == {} and starts[1].content_block.name == "get_weather"
    [json_delta] = [e.delta for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert json.loads(json_delta.partial_json) == {"city": "Rome"}
    assert [e.index for e in events if e.type == "content_block_stop"] == [0, 1]
    assert final.stop_reason == "tool_use" and final.content[0].text.strip() == "Let me look."
    the_tool_use(final.content[1], "Rome")


def test_a_tool_result_is_rendered_as_the_chat_routes_and_answered(qwen3_served, qwen3):  # noqa: F811
    client, _ = qwen3_served
    message = ask_tools(client, CALLED)
    assert text_of(message) == ANSWER and message.stop_reason == "end_turn"
    # the same ids as the OpenAI form of the conversation (assistant tool_calls, a tool message)
    assert prompt_tokens(message.usage) == len(server_ids(qwen3[1].tokenizer, AFTER_CALL))
    counted = client.messages.count_tokens(model="m", messages=CALLED, tools=ANTHROPIC_TOOLS)
    assert counted.input_tokens == len(server_ids(qwen3[1].tokenizer, AFTER_CALL))
    # thinking disabled reaches the template (Qwen3's: an empty thinking block after the prompt)
    as_chat = template_messages(ChatBody.model_validate({"messages": AFTER_CALL}))
    unthinking = encode_messages(qwen3[1].tokenizer, as_chat, think=False, tools=TOOLS)
    assert len(unthinking) != counted.input_tokens
    disabled = client.messages.count_tokens(
        model="m", messages=CALLED, tools=ANTHROPIC_TOOLS, thinking={"type": "disabled"}
    )
    assert disabled.input_tokens == len(unthinking)


def test_the_servers_no_think_applies_unless_the_request_says_otherwise(qwen3, tmp_path):  # noqa: F811
    tokenizer = qwen3[1].tokenizer
    as_chat = template_messages(ChatBody.model_validate({"messages": AFTER_CALL}))
    with running_server("--target", str(qwen3[0]), "--no-think", log=tmp_path / "serve.log") as (url, _):
        client = anthropic.Anthropic(base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0)
        for thinking, think in ((None, False), ({"type": "enabled"}, True)):
            extra = {"thinking": thinking} if thinking else {}
            counted = client.messages.count_tokens(model="m", messages=CALLED, tools=ANTHROPIC_TOOLS, **extra)
            assert counted.input_tokens == len(encode_messages(tokenizer, as_chat, think=think, tools=TOOLS))


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_tool_choice_any_or_a_named_tool_forces_one_call(qwen3_served, choice):
    """Held by the chat route's grammar in the model's own markup: where the model was taught
    to answer with text first (Rome), it now calls, and the input parses."""
    client, _ = qwen3_served
    for messages in (ROME, PARIS):
        message = ask_tools(client, messages, tool_choice=choice)
        assert message.stop_reason == "tool_use" and [b.type for b in message.content] == ["tool_use"]
        assert message.content[0].name == "get_weather" and isinstance(message.content[0].input["city"], str)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_hostile_input_schemas_are_400s_and_the_server_serves(qwen3_served, choice):
    """A chain of 1,000 $defs in input_schema killed the server under tool_choice any or tool,
    and on /v1/messages/count_tokens, which generates nothing: a 400 in Anthropic's shape now,
    streamed or not, and /health answers after each."""
    client, _ = qwen3_served
    url = str(client.base_url).rstrip("/")
    for schema, words in (
        (fuzz.ref_chain(1000), "nests deeper than 512 levels"),
        (fuzz.ref_chain(20000, "anyOf"), "nests deeper than 512 levels"),
        (fuzz.wide_schema(2000), "gives up at the start of a reply"),
        ({"type": "string"}, "must describe an object"),
    ):
        tools = [{"name": "get_weather", "input_schema": schema}]
        body = {"model": "m", "messages": PARIS, "tools": tools, "tool_choice": choice}
        for route, extra in (
            ("messages", {"max_tokens": 8}),
            ("messages", {"max_tokens": 8, "stream": True}),
            ("messages/count_tokens", {}),
        ):
            answer = httpx.post(f"{url}/v1/{route}", json={**body, **extra}, timeout=TIMEOUT)
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error" and words in error["message"], error
            assert "\n" not in error["message"]
            assert httpx.get(f"{url}/health", timeout=TIMEOUT).json()["status"] == "ok"
    message = ask_tools(client, PARIS, tool_choice=choice)
    assert message.stop_reason == "tool_use" and message.content[0].input == {"city": "Paris"}


def test_a_coding_agents_request_is_served(qwen3_served, qwen3):  # noqa: F811
    """Fields a coding agent sends that change nothing here (cache_control, metadata, betas,
    a query string, thinking blocks in the history) are read past, not refused."""
    client, _ = qwen3_served
    cached = {"cache_control": {"type": "ephemeral"}}
    tools = [{**tool, **cached} for tool in ANTHROPIC_TOOLS]
    history = [
        {"role": "user", "content": [{"type": "text", "text": PARIS[0]["content"], **cached}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The user wants the weather.", "signature": "x"},
                CALLED[1]["content"][0],
            ],
        },
        CALLED[2],
    ]
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": MAX_TOKENS,
        "messages": history,
        "tools": tools,
        "metadata": {"user_id": "someone"},
        "temperature": 0,
        "stream": True,
    }
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
    url = f"{client.base_url}".rstrip("/") + "/v1/messages?beta=true"
    with httpx.Client(timeout=TIMEOUT) as http:
        answer = http.post(url, json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    deltas = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    text = "".join(d["delta"]["text"] for d in deltas if d["type"] == "content_block_delta")
    assert text == ANSWER and deltas[-2]["delta"]["stop_reason"] == "end_turn"
    start = deltas[0]["message"]["usage"]
    assert start["input_tokens"] + start["cache_read_input_tokens"] == len(server_ids(qwen3[1].tokenizer, AFTER_CALL))


def test_tool_choice_none_leaves_the_markup_as_text(qwen3_served):
    client, _ = qwen3_served
    message = ask_tools(client, PARIS, tool_choice={"type": "none"})
    assert [b.type for b in message.content] == ["text"] and message.stop_reason == "end_turn"
    assert "<tool_call>" in text_of(message)


def test_a_mistral_call_comes_back_as_tool_use(mistral, tmp_path):  # noqa: F811
    with running_server("--target", str(mistral[0]), log=tmp_path / "serve.log") as (url, _):
        client = anthropic.Anthropic(base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0)
        message = ask_tools(client, PARIS)
        assert message.stop_reason == "tool_use" and [b.type for b in message.content] == ["tool_use"]
        the_tool_use(message.content[0], "Paris")
        with client.messages.stream(
            model="m", messages=PARIS, tools=ANTHROPIC_TOOLS, max_tokens=MAX_TOKENS, extra_body={"temperature": 0}
        ) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "tool_use"
        the_tool_use(final.content[0], "Paris")
        # holding Mistral to a call would need a grammar in its own markup, not built: refused
        with pytest.raises(anthropic.BadRequestError, match="constrained decoding") as raised:
            ask_tools(client, PARIS, tool_choice={"type": "any"})
        assert "tool_choice {'type': 'any'}" in raised.value.body["error"]["message"]


# --- the translation and the blocks, on their own ---------------------------------------------
def test_tool_results_come_before_the_users_text_and_thinking_is_left_out():
    from mlxspec.server.anthropic import CountBody, chat_messages

    body = CountBody.model_validate(
        {
            "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "x"},
                        {"type": "text", "text": "Two calls."},
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                        {"type": "tool_use", "id": "t2", "name": "g", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "and now?"},
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "1"}]},
                        {"type": "tool_result", "tool_use_id": "t2", "content": "2", "is_error": True},
                    ],
                },
            ],
        }
    )
    calls = [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "t2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    assert chat_messages(body) == [
        {"role": "system", "content": "AB"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Two calls.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "t1", "content": "1"},
        {"role": "tool", "tool_call_id": "t2", "content": "2"},
        {"role": "user", "content": "and now?"},
    ]


def test_blocks_drop_white_space_beside_calls_and_keep_an_answer_that_is_only_white_space():
    from mlxspec.server.anthropic import Blocks
    from mlxspec.tool_calls import ToolCall

    call = ToolCall(id="call_1", name="f", arguments='{"a": 1}')
    blocks = Blocks()
    events = [e for part in ["\n", "Sure", ".\n", call, "\n ", call, "\n"] for e in blocks.feed(part)]
    events += blocks.finish()
    assert blocks.content == [
        {"type": "text", "text": "\nSure.\n"},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
    ]
    assert [(e["type"], e["index"]) for e in events] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
    ]
    only_space = Blocks()
    assert only_space.feed("\n") == [] and only_space.feed(" ") == []
    only_space.finish()
    assert only_space.content == [{"type": "text", "text": "\n "}] and not only_space.called


# --- the real SmolLM2 pair (slow) -------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_answers_through_the_messages_api(tmp_path):
    from mlxspec.models.presets import resolve_name
    from tests.support import real_models

    target, draft = real_models.folder(real_models.SMOLLM2), str(resolve_name("bundled:smollm2-draft"))
    pair = mlxspec.load_pair(str(target), draft)
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    with running_server("--target", str(target), "--draft", draft, log=tmp_path / "serve.log") as (url, _):
        client = anthropic.Anthropic(base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0)
        message = ask(client, question, max_tokens=32)
        assert "Paris" in text_of(message) and message.stop_reason == "end_turn"
        assert text_of(message) == standard(pair, chat_ids(pair, question), 32).text
        assert message.usage.model_extra["speculative"]["accepted"] > 0
        # SmolLM2's template has no tools section: a tools request is refused in one line, not dropped
        with pytest.raises(anthropic.BadRequestError, match="tools are not supported by this model"):
            ask(client, question, tools=ANTHROPIC_TOOLS)
