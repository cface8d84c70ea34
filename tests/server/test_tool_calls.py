"""Tool calls, OpenAI's shape: `mlxspec serve` in a subprocess, the real `openai` client, and
tiny qwen3 models whose tokenizers carry Qwen3's (Hermes `<tool_call>` JSON) and Mistral's
(`[TOOL_CALLS]`) markup, taught here to answer fixed conversations with fixed replies
(tests/support/tool_models.py). The calls are parsed from text the engine generated, with mlx-lm's
parsers, speculatively (prompt lookup: the tools' names and arguments are in the prompt)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest

import mlxspec
from mlxspec.generation import encode_messages
from mlxspec.models.synthetic import IM_END
from mlxspec.server.schema import ChatBody, template_messages
from mlxspec.tool_calls import split_tool_calls, tool_format
from tests.server.test_server import ROOT, TIMEOUT, running_server
from tests.support import fuzz_targets as fuzz
from tests.support.tool_models import (
    MISTRAL_MARKERS,
    MISTRAL_TEMPLATE,
    QWEN3_CODER_MARKERS,
    QWEN3_CODER_TEMPLATE,
    QWEN3_MARKERS,
    QWEN3_TEMPLATE,
    build_tool_model,
    teach,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
PARIS_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASKED = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
AFTER_CALL = PARIS + [
    {"role": "assistant", "content": None, "tool_calls": [ASKED]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
]
ANSWER = "It is 22 C and sunny in Paris."
ROME = [{"role": "user", "content": "And in Rome?"}]
ROME_REPLY = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
BROKEN = [{"role": "user", "content": "Break the format."}]
BROKEN_REPLY = '<tool_call>\n{"name": get_weather, city}\n</tool_call>'
# a number past a double's range: valid JSON, infinity as a Python float
HUGE = [{"role": "user", "content": "How hot is a star's core?"}]
HUGE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 1e999}}\n</tool_call>'
QWEN3_LESSONS = [
    (PARIS, PARIS_CALL),
    (AFTER_CALL, ANSWER),
    (ROME, ROME_REPLY),
    (BROKEN, BROKEN_REPLY),
    (HUGE, HUGE_CALL),
]

OSLO = "Weather in Oslo?"  # Mistral, no tools given: as `mlxspec generate` asks
MISTRAL_PARIS = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'
MISTRAL_OSLO = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
MAX_TOKENS = 64
CODER_PARIS = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def server_ids(tokenizer, messages, tools=TOOLS) -> list[int]:
    """The ids the server renders for these messages (its own code path)."""
    body = ChatBody.model_validate({"messages": messages})
    return encode_messages(tokenizer, template_messages(body), tools=tools)


def taught(factory, run_folder, name, *, template, markers, lessons, end):
    """A model taught `lessons` [(messages, tools, reply)], checked: greedy decoding answers
    each with its reply. Taught once a run (half a minute each): the server files that use it
    share the folder, a lock between test processes."""
    import mlx_lm
    from filelock import FileLock

    folder = run_folder / "taught" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):
        fresh = not (folder / "taught.json").exists()
        if fresh:
            build_tool_model(factory.tokenizer_dir, folder, template=template, markers=markers, eos_ids=factory.eos)
        _, tokenizer = mlx_lm.load(str(folder))
        examples = [(server_ids(tokenizer, messages, tools), reply) for messages, tools, reply in lessons]
        if fresh:
            (folder / "taught.json").write_text(json.dumps({"loss": teach(folder, examples, end=end)}))
    loss = json.loads((folder / "taught.json").read_text())["loss"]
    pair = mlxspec.load_pair(str(folder))
    for ids, reply in examples:
        assert mlxspec.generate(pair, ids, gamma=0, max_tokens=MAX_TOKENS).text == reply, f"not learnt (loss {loss})"
    return folder, pair


@pytest.fixture(scope="module")
def qwen3(factory, run_folder):
    lessons = [(messages, TOOLS, reply) for messages, reply in QWEN3_LESSONS]
    return taught(
        factory,
        run_folder,
        "qwen3-tools",
        template=QWEN3_TEMPLATE,
        markers=QWEN3_MARKERS,
        lessons=lessons,
        end=IM_END,
    )


@pytest.fixture(scope="module")
def mistral(factory, run_folder):
    lessons = [(PARIS, TOOLS, MISTRAL_PARIS), ([{"role": "user", "content": OSLO}], None, MISTRAL_OSLO)]
    template, markers = MISTRAL_TEMPLATE, MISTRAL_MARKERS
    return taught(
        factory,
        run_folder,
        "mistral-tools",
        template=template,
        markers=markers,
        lessons=lessons,
        end="<|endoftext|>",
    )


@pytest.fixture(scope="module")
def qwen3_coder(factory, run_folder):
    lessons = [(PARIS, TOOLS, CODER_PARIS), (AFTER_CALL, TOOLS, ANSWER)]
    template, markers = QWEN3_CODER_TEMPLATE, QWEN3_CODER_MARKERS
    return taught(
        factory, run_folder, "qwen3-coder-tools", template=template, markers=markers, lessons=lessons, end=IM_END
    )


@pytest.fixture(scope="module")
def served(qwen3, tmp_path_factory):
    log = tmp_path_factory.mktemp("tools") / "serve.log"
    with running_server("--target", str(qwen3[0]), log=log) as (url, _):
        yield url, log


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def ask(client, messages, **fields):
    return client.chat.completions.create(
        model="m", messages=messages, temperature=0, max_tokens=MAX_TOKENS, **{"tools": TOOLS, **fields}
    )


def the_call(call, city: str) -> None:
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": city}


# --- Qwen3 through the server -----------------------------------------------------------
def test_a_call_comes_back_as_tool_calls(client, served, qwen3):
    reply = ask(client, PARIS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    the_call(call, "Paris")
    assert reply.usage.prompt_tokens == len(server_ids(qwen3[1].tokenizer, PARIS))
    spec = reply.usage.model_extra["speculative"]
    assert spec["accepted"] > 0  # prompt lookup drafted from the tools in the prompt, and was right
    log = served[1].read_text()
    assert "tool calls: read with mlx-lm's json_tools parser (<tool_call> … </tool_call>)" in log
    assert "tools 1 (auto)" in log  # the console line says tools were in force


def test_a_streamed_call_comes_as_openai_sends_it(client):
    chunks = list(ask(client, ROME, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    text = "".join(d.content or "" for d in deltas)
    assert text.strip() == "Let me look."
    head, rest = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.name == "get_weather" and head.function.arguments == ""
    assert rest.index == 0 and rest.id is None and json.loads(rest.function.arguments) == {"city": "Rome"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the client's own accumulator reads the deltas into the same message
    with client.chat.completions.stream(model="m", messages=ROME, tools=TOOLS, temperature=0) as stream:
        message = stream.get_final_completion().choices[0].message
    assert message.content.strip() == "Let me look."
    the_call(message.tool_calls[0], "Rome")


def test_a_tool_result_is_rendered_and_answered(client, qwen3):
    reply = ask(client, AFTER_CALL)
    assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "stop"
    assert not reply.choices[0].message.tool_calls
    rendered = qwen3[1].tokenizer.decode(server_ids(qwen3[1].tokenizer, AFTER_CALL))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert "<tool_response>\n22 C, sunny\n</tool_response>" in rendered
    assert reply.usage.prompt_tokens == len(server_ids(qwen3[1].tokenizer, AFTER_CALL))


def test_markup_that_does_not_parse_comes_back_as_content(client):
    reply = ask(client, BROKEN)
    assert reply.choices[0].message.content == BROKEN_REPLY and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    chunks = list(ask(client, BROKEN, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == BROKEN_REPLY
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


def test_tool_choice_none_leaves_the_markup_as_text(client):
    reply = ask(client, PARIS, tool_choice="none")
    assert reply.choices[0].message.content == PARIS_CALL and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("gamma", [0, "auto"])
def test_tool_choice_required_or_named_forces_one_valid_call(client, choice, gamma):
    """A grammar in the model's own markup: where it was taught to answer with text first
    (Rome) or with broken markup, it now calls, and the arguments parse."""
    for messages in (ROME, BROKEN, PARIS):
        reply = ask(client, messages, tool_choice=choice, extra_body={"gamma": gamma})
        choice_ = reply.choices[0]
        assert choice_.finish_reason == "tool_calls", choice_.message
        [call] = choice_.message.tool_calls
        assert call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments)["city"], str)
    the_call(
        ask(client, PARIS, tool_choice=choice, extra_body={"gamma": gamma}).choices[0].message.tool_calls[0], "Paris"
    )


def test_tool_choice_refusals(client, qwen3):
    with pytest.raises(openai.BadRequestError, match="not among the tools") as raised:
        ask(client, PARIS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert raised.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError, match="not both"):
        ask(client, PARIS, tool_choice="required", response_format={"type": "json_object"})
    from mlxspec.server.schema import RequestError
    from mlxspec.server.tools import ToolUse
    from mlxspec.tool_calls import ToolFormat

    mistral = ToolFormat(parser=None, start="[TOOL_CALLS]", end="", name="mistral")
    with pytest.raises(RequestError, match="constrained decoding in its own markup"):
        ToolUse(tools=TOOLS, choice="required", format=mistral).forced_call(qwen3[1].tokenizer)


def test_bad_tools_and_bad_history_are_400s_naming_the_field(served):
    url = f"{served[0]}/v1/chat/completions"
    bad_call = {**ASKED, "function": {"name": "get_weather", "arguments": "{city"}}
    cases = [
        ({"messages": PARIS, "tools": [{"type": "function"}]}, "tools[0]"),
        ({"messages": PARIS, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"messages": [PARIS[0], {"role": "assistant", "tool_calls": [bad_call]}], "tools": TOOLS},
            "messages[1].tool_calls[0].function.arguments",
        ),
    ]
    for body, param in cases:
        answer = httpx.post(url, json={"model": "m", **body}, timeout=TIMEOUT)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


# --- tool parameters as clients write them (issue 28) ------------------------------------
def weather_tool(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {**TOOLS[0]["function"], "parameters": parameters}}]


# What Pydantic writes for a model (extra="forbid") with a constrained field: the arguments'
# schema refers to $defs
PYDANTIC_PARAMETERS = {
    "$defs": {"City": {"type": "string", "maxLength": 12, "title": "City"}},
    "additionalProperties": False,
    "properties": {"city": {"$ref": "#/$defs/City"}},
    "required": ["city"],
    "title": "WeatherArgs",
    "type": "object",
}
# a $ref to its own root: a place near the city, itself such an object
NEAR_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "near": {"$ref": "#"}},
    "required": ["city"],
}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_resolve_parameters_against_their_own_schema(client, choice):
    """Pydantic's $defs were refused ("Pointer '/$defs/City' does not exist"): the parameters
    sat inside a wrapper schema, against which '#' resolved."""
    import jsonschema

    for messages in (PARIS, ROME):
        reply = ask(client, messages, tools=weather_tool(PYDANTIC_PARAMETERS), tool_choice=choice)
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), PYDANTIC_PARAMETERS)


def test_a_ref_to_the_parameters_root_is_the_parameters(qwen3):
    """'#' in a tool's parameters named the wrapper (name and arguments), so a nested place had
    to be a call: now it is the parameters."""
    from mlxspec.grammar import matcher_for
    from mlxspec.server.tools import ToolUse

    _, pair = qwen3
    forced = ToolUse(tools=weather_tool(NEAR_PARAMETERS), choice="required", format=tool_format(pair.tokenizer))
    matcher = matcher_for(
        forced.forced_call(pair.tokenizer), pair.tokenizer, width=pair.target.width, eos_ids=pair.eos_ids
    )
    arguments = {"city": "Paris", "near": {"city": "Rome", "near": {"city": "Oslo"}}}
    call = json.dumps({"name": "get_weather", "arguments": arguments})
    ids = pair.tokenizer.encode(f"<tool_call>\n{call}\n</tool_call>", add_special_tokens=False)
    assert matcher.walk(ids) == len(ids) and matcher.accepting


HOSTILE_PARAMETERS = {
    "a chain of 1,000 $defs": (fuzz.ref_chain(1000), "nests deeper than 512 levels"),
    "a chain past any stack": (fuzz.ref_chain(20000, "array"), "nests deeper than 512 levels"),
    "a type the engine rejects": ({"type": "object", "properties": {"a": {"type": "strng"}}}, "not one the grammar"),
    "a text, not an object": ({"type": "string"}, "must describe an object"),
    "too wide for the engine": (fuzz.wide_schema(2000), "gives up at the start of a reply"),
}


@pytest.mark.parametrize("case", list(HOSTILE_PARAMETERS))
def test_hostile_tool_parameters_are_400s_naming_them_and_the_server_serves(served, client, case):
    """The chain killed the server; a rejected type was a 400 naming response_format; a text
    was "called" with the markup returned as content. Each is a 400 naming the tool's
    parameters now (the second tool's, beside a good one), and /health answers after."""
    parameters, words = HOSTILE_PARAMETERS[case]
    url = f"{served[0]}/v1/chat/completions"
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        body = {"messages": PARIS, "tools": [other, *weather_tool(parameters)], "tool_choice": choice}
        for stream in (False, True):
            answer = httpx.post(url, json={"model": "m", "max_tokens": 8, "stream": stream, **body}, timeout=TIMEOUT)
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == "tools[1].function.parameters" and words in error["message"], error
            assert "\n" not in error["message"]
            assert httpx.get(f"{served[0]}/health", timeout=TIMEOUT).json()["status"] == "ok"
    the_call(ask(client, PARIS, tool_choice="required").choices[0].message.tool_calls[0], "Paris")


# --- compact calls: a random model cannot spend its tokens on white space (issue 29) ------
BOUNDED = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "units"],
    "additionalProperties": False,
}
COMPACT_MAX_TOKENS = 160  # the call's fixed text and its bounded values fit with room to spare


@pytest.fixture(scope="module")
def random_hermes(factory, tmp_path_factory):
    """An untaught qwen3 with Qwen3's (Hermes) template and markers, and a noisy copy as its
    draft, served: a model as weak as they come."""
    from mlxspec.models import synthetic

    target = build_tool_model(
        factory.tokenizer_dir,
        factory.root / "hermes-random",
        template=QWEN3_TEMPLATE,
        markers=QWEN3_MARKERS,
        eos_ids=factory.eos,
    )
    draft = factory.root / "hermes-random-draft"
    tokenizer_dir = target.parent / f"{target.name}-tokenizer"
    synthetic.build_model(
        "qwen3", draft, tokenizer_dir=tokenizer_dir, seed=4, like=target, noise=0.1, eos_token_ids=factory.eos
    )
    log = tmp_path_factory.mktemp("hermes-random") / "serve.log"
    with running_server("--target", str(target), "--draft", str(draft), log=log) as (url, _):
        yield url, target


def forced_calls(url: str, parameters: dict, *, chat_choice, anthropic_choice: dict):
    """A call forced on both APIs from the random model, greedy and sampled, without a draft
    and with one: yields (sampling, the chat route's arguments, the Messages route's input)
    once each came back as a call."""
    import anthropic

    chat = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    messages = anthropic.Anthropic(base_url=url, api_key="unused", timeout=TIMEOUT, max_retries=0)
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": parameters}}]
    for temperature, seeds in ((0, [0]), (1, [0, 1, 2])):
        for gamma in (0, 3):
            for seed in seeds:
                sampling = {"temperature": temperature, "seed": seed, "gamma": gamma}
                reply = chat.chat.completions.create(
                    model="m",
                    messages=PARIS,
                    tools=tools,
                    tool_choice=chat_choice,
                    max_tokens=COMPACT_MAX_TOKENS,
                    temperature=temperature,
                    seed=seed,
                    extra_body={"gamma": gamma},
                )
                choice = reply.choices[0]
                assert choice.finish_reason == "tool_calls", (sampling, choice.message.content)
                [call] = choice.message.tool_calls
                message = messages.messages.create(
                    model="m",
                    messages=PARIS,
                    tools=[{"name": "forecast", "input_schema": parameters}],
                    tool_choice=anthropic_choice,
                    max_tokens=COMPACT_MAX_TOKENS,
                    extra_body=sampling,
                )
                assert message.stop_reason == "tool_use", (sampling, message.content)
                [block] = message.content
                yield sampling, json.loads(call.function.arguments), block.input


def test_a_forced_call_from_a_random_model_comes_back_parsed_on_both_routes(random_hermes):
    """With white space free between JSON tokens, this model wrote `<tool_call>\n{\n\n   \n…`
    until max tokens and no call came back. Compact, it can spend its tokens only on the
    values: greedy and sampled, without a draft and with one, on /v1/chat/completions and
    /v1/messages, the call parses, valid, inside max tokens; greedy speculative calls are
    standard decoding's."""
    import jsonschema

    url, _ = random_hermes
    named = {"type": "function", "function": {"name": "forecast"}}
    greedy = {}
    calls = forced_calls(url, BOUNDED, chat_choice=named, anthropic_choice={"type": "tool", "name": "forecast"})
    for sampling, arguments, given in calls:
        jsonschema.validate(arguments, BOUNDED)
        jsonschema.validate(given, BOUNDED)
        if sampling["temperature"] == 0:
            greedy[sampling["gamma"]] = (arguments, given)
    assert greedy[0] == greedy[3]


# a tool schema as most are written: no `additionalProperties`, so by JSON Schema extra keys
# of any name are allowed; left open, this model wrote `{"city": "", "units": "F", "ototot…`
# until max tokens (issue 38)
OPEN = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "units": {"enum": ["C", "F"]},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
    },
    "required": ["city"],
}


def test_a_forced_call_with_an_open_schema_ends_in_a_parsed_call(random_hermes):
    """Properties the schema does not name are not generated (as llama.cpp's and vLLM's
    grammars take a missing `additionalProperties`, and OpenAI's strict mode requires), at
    every depth: forced, greedy and sampled, with and without the draft, on both APIs, the
    random model's call ends, parses and names only the schema's keys."""
    import jsonschema

    url, _ = random_hermes
    closed = {**OPEN, "additionalProperties": False}
    closed["properties"] = {
        **OPEN["properties"],
        "where": {**OPEN["properties"]["where"], "additionalProperties": False},
    }
    calls = list(forced_calls(url, OPEN, chat_choice="required", anthropic_choice={"type": "any"}))
    assert len(calls) == 8
    for _, arguments, given in calls:
        jsonschema.validate(arguments, closed)
        jsonschema.validate(given, closed)


# --- a template without tools -----------------------------------------------------------
def test_tools_to_a_model_without_a_tool_format_are_refused(factory, tmp_path):
    target, _ = factory.pair("qwen3")  # ChatML, no tools section: as SmolLM2's
    log = tmp_path / "serve.log"
    with running_server("--target", str(target), log=log) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="tools are not supported by this model") as raised:
            ask(client, PARIS)
        assert raised.value.body["param"] == "tools" and raised.value.status_code == 400
        assert ask(client, PARIS, tools=None).choices[0].message.content  # without tools it answers
    assert "tool calls: none (mlx-lm infers no tool-call format for this model" in log.read_text()


# --- Mistral, and the command line ------------------------------------------------------
def test_mistral_calls_are_read_with_its_parser(mistral):
    _, pair = mistral
    format = tool_format(pair.tokenizer)
    assert format.name == "mistral" and format.end == ""  # a call runs to the end of the output
    text = mlxspec.generate(pair, server_ids(pair.tokenizer, PARIS), gamma=3, ngram=True, max_tokens=MAX_TOKENS).text
    content, [call] = split_tool_calls(text, format, tools=TOOLS)
    assert content == "" and call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}


def test_two_calls_that_write_one_id_get_two(mistral):
    """Mistral's parser keeps an id the model wrote; two calls with one id broke the openai
    client's stream state. The first keeps it, the second gets its own."""
    format = tool_format(mistral[1].tokenizer)
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}'
    _, calls = split_tool_calls(f"[TOOL_CALLS] [{call}, {call}]", format, tools=TOOLS)
    assert [c.name for c in calls] == ["get_weather"] * 2
    assert calls[0].id == "abcdefghi" and calls[1].id != "abcdefghi"


def test_generate_json_shows_parsed_calls(mistral):
    folder, _ = mistral
    command = [sys.executable, "-m", "mlxspec", "generate", OSLO, "--target", str(folder), "--json"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["text"] == MISTRAL_OSLO
    [call] = out["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}


def test_chat_shows_a_parsed_call(mistral):
    from tests.cli.test_chat import drive

    _, pair = mistral
    _, out, conversation = drive(pair, [OSLO], gamma=0, max_tokens=MAX_TOKENS)
    assert conversation.turns[0].assistant == MISTRAL_OSLO
    assert 'tool call: get_weather({"city": "Oslo"})' in out


# --- Qwen3-Coder: calls as XML -------------------------------------------------------------
def test_qwen3_coder_xml_calls_through_the_server(qwen3_coder, tmp_path):
    folder, pair = qwen3_coder
    assert tool_format(pair.tokenizer).name == "qwen3_coder"
    rendered = pair.tokenizer.decode(server_ids(pair.tokenizer, AFTER_CALL))
    assert CODER_PARIS in rendered and "<tool_response>\n22 C, sunny\n</tool_response>" in rendered
    log = tmp_path / "serve.log"
    with running_server("--target", str(folder), log=log) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        reply = ask(client, PARIS)
        assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
        the_call(reply.choices[0].message.tool_calls[0], "Paris")
        # streamed: the client's accumulator reads the call's deltas into the same message
        with client.chat.completions.stream(model="m", messages=PARIS, tools=TOOLS, temperature=0) as stream:
            final = stream.get_final_completion().choices[0]
        assert final.finish_reason == "tool_calls"
        the_call(final.message.tool_calls[0], "Paris")
        answered = ask(client, AFTER_CALL)
        assert answered.choices[0].message.content == ANSWER and answered.choices[0].finish_reason == "stop"
    assert "tool calls: read with mlx-lm's qwen3_coder parser (<tool_call> … </tool_call>)" in log.read_text()


# --- the splitter on fixed texts, fed in awkward pieces ---------------------------------
def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_the_splitter_holds_markup_back_and_numbers_the_calls(qwen3, size):
    from mlxspec.tool_calls import ToolCallSplitter

    format = tool_format(qwen3[1].tokenizer)
    two = f"Both.\n{PARIS_CALL}\n{ROME_REPLY.split(chr(10), 1)[1]} done <tool_cal"
    splitter = ToolCallSplitter(format, tools=TOOLS)
    out = [part for piece in pieces(two, size) for part in splitter.feed(piece)] + splitter.finish()
    text = "".join(p for p in out if isinstance(p, str))
    assert text == "Both.\n\n done <tool_cal"  # a marker's start that never completes is text
    assert [(c.name, json.loads(c.arguments)) for c in splitter.calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert len({c.id for c in splitter.calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n[1, 2]\n</tool_call>",  # JSON, not a call
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',  # arguments not an object
        '<tool_call>\n{"name": "get_weather", "argum',  # cut short (max_tokens)
    ],
)
def test_what_does_not_parse_is_text(qwen3, text):
    assert split_tool_calls(text, tool_format(qwen3[1].tokenizer), tools=TOOLS) == (text, [])


def test_a_mistral_call_cut_short_is_text(mistral):
    format = tool_format(mistral[1].tokenizer)
    cut = MISTRAL_PARIS[:-6]
    assert split_tool_calls(cut, format) == (cut, [])


def test_the_console_note_names_what_was_in_force():
    from mlxspec.server.worker import job_note

    assert job_note() is None and job_note(tools="tools 1 (auto)") == "tools 1 (auto)"
    assert job_note(tools="tools 1 (auto)", grammar="grammar json_schema") == "tools 1 (auto) · grammar json_schema"


def test_objects_that_name_their_properties_are_closed_where_the_schema_is_silent():
    """Hand-written cases: closed at every depth where a schema names properties and says
    nothing; a value the schema gives is kept; an object naming none stays any object; a
    property called "properties" is a name, not a keyword."""
    from mlxspec.server.tools import closed_objects

    text = {"type": "string"}
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": text}},
            "free": {"type": "object"},
            "open": {"type": "object", "properties": {"b": text}, "additionalProperties": True},
            "list": {"type": "array", "items": {"properties": {"c": text}}},
            "either": {"anyOf": [{"properties": {"d": text}}, text]},
        },
        "$defs": {"e": {"patternProperties": {"^x": text}}},
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    inner = closed["properties"]
    assert set(inner) == set(schema["properties"])  # no key "additionalProperties" among the names
    assert inner["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in inner["free"]
    assert inner["open"]["additionalProperties"] is True
    assert inner["list"]["items"]["additionalProperties"] is False
    assert inner["either"]["anyOf"] == [{"properties": {"d": text}, "additionalProperties": False}, text]
    assert closed["$defs"]["e"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the tool's own schema is left as it was
