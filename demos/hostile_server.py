"""Hostile inputs against a real `mlxspec serve` on 127.0.0.1 (issue 28): every grammar shape
that killed the server or slipped past its checks (chains of $defs 1,000 and 20,000 deep, of
every step; wide objects; recursive and missing references; patterns the engine cannot
build; non-object tool parameters; Pydantic's $defs), and the request fields that were
misread (n 0, a text block without its text, tiny temperatures), thrown at every route that
takes them: response_format on /v1/chat/completions and /v1/completions, tool_choice
required and named, Anthropic's tool_choice any and tool on /v1/messages, and
/v1/messages/count_tokens; streamed and not. Then the command line: `generate` with the deep
schema, the Lark chain, a stop= lexeme, and `serve --api-key ''`.

    python demos/hostile_server.py [--quick]

Two servers: the bundled pair (response_format, plain requests) and an untaught qwen3 with
Qwen3's (Hermes) chat template built here, with a noisy copy as its draft (tool calls; needs
the test extra: pip install -e ".[test]"). Each answer must be a 4xx with an error in one
line, or a 200 whose body (or every event of its stream) parses and, where it ended, matches
what was asked (JSON valid under the schema, a call parsed); after each, the process must be
alive and /health answer. Prints a count of how each input ended and exits 1 if any failed.
Loopback only, a bounded list of inputs, max_tokens small.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import jsonschema  # noqa: E402

from tests.conftest import ModelFactory, stdlib_texts  # noqa: E402
from tests.server.test_server import running_server  # noqa: E402
from tests.support import fuzz_targets as fuzz  # noqa: E402
from tests.support.tool_models import QWEN3_MARKERS, QWEN3_TEMPLATE, build_tool_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120
MAX_TOKENS = 24
LONG_CONTEXT = 8192  # a prompt longer than this (a tool schema the template shows whole) is refused by length


def schemas(quick: bool) -> dict[str, object]:
    """The schemas thrown at every route: what killed the server, what the engine gave up on,
    what was refused for the wrong reason, and ordinary ones beside them."""
    steps = ["object"] if quick else sorted(fuzz.CHAIN_STEPS)
    shapes: dict[str, object] = {}
    for step in steps:
        for levels in (150, 1000, 20000):
            shapes[f"chain {step} {levels}"] = fuzz.ref_chain(levels, step)
    shapes |= {
        "wide 400": fuzz.wide_schema(400),
        "wide 2000": fuzz.wide_schema(2000),
        "wide 40000": fuzz.wide_schema(40000),
        "wide refs 300": fuzz.wide_schema(300, refs=True),
        "recursive required": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        "recursive optional": {"type": "object", "properties": {"a": {"$ref": "#"}, "b": {"type": "integer"}}},
        "pattern a{1000000}": {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{1000000}$"}}},
        "missing pointer": {"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}},
        "bad type": {"type": "object", "properties": {"a": {"type": "strng"}}},
        "a text": {"type": "string", "maxLength": 5},
        "nested 90": _nested(90),
        "nested 300": _nested(300),
        "enum 5000": {"type": "object", "properties": {"e": {"enum": [f"v{i}" for i in range(5000)]}}},
        "pydantic defs": {
            "$defs": {"City": {"type": "string", "maxLength": 8}},
            "additionalProperties": False,
            "properties": {"city": {"$ref": "#/$defs/City"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "type": "object",
        },
        "true": True,
        "false": False,
        "not an object": [1, 2],
    }
    return shapes


def _nested(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


class Probe:
    """Sends one request, judges the answer, checks the server lives; counts how each ended."""

    def __init__(self, url: str, process: subprocess.Popen):
        self.url, self.process = url, process
        self.http = httpx.Client(timeout=TIMEOUT)
        self.seen: Counter = Counter()
        self.failures: list[str] = []

    def send(self, name: str, route: str, body: dict, *, check=None) -> None:
        stream = bool(body.get("stream"))
        try:
            if stream:
                with self.http.stream("POST", f"{self.url}{route}", json=body) as response:
                    if response.status_code == 200:
                        lines = list(response.iter_lines())
                    else:
                        lines = None
                        response.read()
                    verdict = self._judge(response, lines, route, check)
            else:
                verdict = self._judge(self.http.post(f"{self.url}{route}", json=body), None, route, check)
        except httpx.HTTPError as e:
            verdict = f"FAIL transport {type(e).__name__}: {e}"
        if self.process.poll() is not None:
            verdict = f"FAIL the server exited ({self.process.returncode})"
        else:
            health = self.http.get(f"{self.url}/health")
            if health.status_code != 200 or health.json().get("status") != "ok":
                verdict = f"FAIL /health {health.status_code}"
        kind = verdict if not verdict.startswith("FAIL") else "FAIL"
        self.seen[kind] += 1
        if verdict.startswith("FAIL"):
            self.failures.append(f"{name} {route}{' stream' if stream else ''}: {verdict}")

    def _judge(self, response: httpx.Response, lines, route: str, check) -> str:
        status = response.status_code
        if 400 <= status < 500:
            try:
                body = response.json()
            except ValueError:
                return f"FAIL {status} that is not JSON"
            error = body.get("error") or {}
            message = error.get("message", "")
            if not message or "\n" in message or "internal error" in message:
                return f"FAIL {status} without a one-line message: {message[:200]!r}"
            # by what it named (Anthropic's shape names nothing but its type)
            if body.get("type") == "error":
                return f"refused {status} (Anthropic's shape)"
            named = error.get("code") if error.get("code") == "context_length_exceeded" else error.get("param")
            return f"refused {status} ({_kind_of(named) if named else 'the body'})"
        if status != 200:
            return f"FAIL {status}: {response.text[:300]}"
        if lines is not None:
            return _judge_stream(lines, route)
        try:
            body = response.json()
        except ValueError:
            return "FAIL a 200 that is not JSON"
        return check(body) if check else "answered 200"


def _judge_stream(lines: list[str], route: str) -> str:
    events = [line[5:].strip() for line in lines if line.startswith("data:")]
    payloads = []
    for data in events:
        if data == "[DONE]":
            continue
        try:
            payloads.append(json.loads(data))
        except ValueError:
            return f"FAIL a stream event that is not JSON: {data[:200]}"
    errors = [p for p in payloads if p.get("error") or p.get("type") == "error"]
    if errors:
        return f"FAIL a 200 stream with an error event: {json.dumps(errors[0])[:300]}"
    ended = (
        events[-1:] == ["[DONE]"]
        if not route.startswith("/v1/messages")
        else payloads[-1:] == [{"type": "message_stop"}]
    )
    return "streamed 200" if ended else "FAIL a stream that did not end"


def json_check(schema, *, chat: bool):
    """A 200's text must be JSON valid under `schema` where it ended (not cut by max_tokens)."""

    def check(body: dict) -> str:
        choice = body["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        if choice["finish_reason"] != "stop":
            return "answered 200 (cut by max_tokens)"
        try:
            jsonschema.validate(json.loads(text), schema if isinstance(schema, dict) else {})
        except (ValueError, jsonschema.ValidationError) as e:
            return f"FAIL a 200 whose JSON does not validate: {str(e)[:200]}"
        return "answered 200"

    return check


def call_check(schema):
    """A forced call's 200: a call, its arguments valid; or cut by max_tokens."""

    def check(body: dict) -> str:
        if "choices" in body:
            choice = body["choices"][0]
            if choice["finish_reason"] == "length":
                return "answered 200 (cut by max_tokens)"
            calls = choice["message"].get("tool_calls") or []
            arguments = [json.loads(c["function"]["arguments"]) for c in calls]
        else:
            if body["stop_reason"] == "max_tokens":
                return "answered 200 (cut by max_tokens)"
            arguments = [b["input"] for b in body["content"] if b["type"] == "tool_use"]
        if len(arguments) != 1:
            return f"FAIL a forced call that came back as {len(arguments)} calls: {json.dumps(body)[:300]}"
        try:
            jsonschema.validate(arguments[0], schema)
        except jsonschema.ValidationError as e:
            return f"FAIL a call whose arguments do not validate: {str(e)[:200]}"
        return "answered 200"

    return check


def response_format_run(probe: Probe, shapes: dict) -> None:
    for name, schema in shapes.items():
        response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        for route, base in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "def f():"}]}),
            ("/v1/completions", {"prompt": "def f():"}),
        ):
            for stream in (False, True):
                body = {**base, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
                check = json_check(schema, chat=route.endswith("chat/completions"))
                probe.send(f"response_format {name}", route, {**body, "response_format": response_format}, check=check)


def fields_run(probe: Probe) -> None:
    """The misread fields, and tiny numbers: a 4xx or a valid 200."""
    chat = {"messages": [{"role": "user", "content": "def f():"}], "max_tokens": 8}
    messages = {"model": "m", "max_tokens": 8}
    for name, route, body in (
        ("n 0", "/v1/chat/completions", {**chat, "n": 0}),
        ("n -1", "/v1/chat/completions", {**chat, "n": -1}),
        ("temperature 1e-45", "/v1/chat/completions", {**chat, "temperature": 1e-45}),
        ("top_p 1e-300", "/v1/chat/completions", {**chat, "top_p": 1e-300}),
        (
            "response_format on completions",
            "/v1/completions",
            {"prompt": "x", "max_tokens": 8, "response_format": {"type": "json_object"}},
        ),
        (
            "a text block without text",
            "/v1/messages",
            {**messages, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        ),
        (
            "a text block with a number",
            "/v1/messages",
            {**messages, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        ),
        (
            "tool_choice any without tools",
            "/v1/messages",
            {**messages, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}},
        ),
    ):
        probe.send(name, route, body)


def tools_run(probe: Probe, shapes: dict) -> None:
    """Each schema as a tool's parameters, every route that forces a call."""
    user = [{"role": "user", "content": "What is the weather in Paris?"}]
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    for name, schema in shapes.items():
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
        objects = isinstance(schema, dict) and schema.get("type") in (None, "object")
        check = call_check(schema if objects else {})
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            for stream in (False, True):
                body = {"messages": user, "tools": [other, tool], "tool_choice": choice, "max_tokens": MAX_TOKENS}
                probe.send(f"tool_choice {name}", "/v1/chat/completions", {**body, "stream": stream}, check=check)
        anthropic_tool = {"name": "get_weather", "input_schema": schema}
        for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
            body = {"model": "m", "messages": user, "tools": [anthropic_tool], "tool_choice": choice}
            for stream in (False, True):
                probe.send(
                    f"anthropic {name}",
                    "/v1/messages",
                    {**body, "max_tokens": MAX_TOKENS, "stream": stream},
                    check=check,
                )
            probe.send(f"count_tokens {name}", "/v1/messages/count_tokens", body)


def cli_run(work: Path, seen: Counter, failures: list[str]) -> None:
    """The command line: one line and exit 2, or an answer; never a crash or an internal error."""
    deep, chain, stop = work / "deep.json", work / "chain.lark", work / "stop.lark"
    deep.write_text(json.dumps(fuzz.ref_chain(1000)))
    chain.write_text(fuzz.lark_chain(3000))
    stop.write_text('start: word\nword[stop=""]: /[a-z]+/\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for args in (
        ["generate", "def f():", "-m", "8", "--json-schema", str(deep)],
        ["generate", "def f():", "-m", "8", "--grammar", str(chain)],
        ["generate", "def f():", "-m", "24", "-g", "3", "--grammar", str(stop)],
        ["serve", "--api-key", "", "--port", "0"],
    ):
        try:
            done = subprocess.run(
                [sys.executable, "-m", "mlxspec", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
            )
        except subprocess.TimeoutExpired:
            seen["FAIL"] += 1
            failures.append(f"{args[:1] + args[-2:]}: no end within 120 s")
            continue
        errors = [line for line in done.stderr.splitlines() if line.startswith(("error", "internal error"))]
        if done.returncode == 0:
            seen["cli answered"] += 1
        elif done.returncode == 2 and len(errors) == 1 and errors[0].startswith("error"):
            seen["cli refused"] += 1
        else:
            seen["FAIL"] += 1
            failures.append(f"{args[:1] + args[-2:]}: exit {done.returncode}: {done.stderr.strip()[-300:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one chain step instead of all")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from mlxspec.models import synthetic

    shapes = schemas(args.quick)
    totals, failures = Counter(), []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        with served(failures, "bundled pair", log=work / "bundled.log") as (url, process):
            probe = Probe(url, process)
            response_format_run(probe, shapes)
            fields_run(probe)
            print(f"bundled pair: {sum(probe.seen.values())} requests ({_counts(probe.seen)})", flush=True)
            totals += probe.seen
            failures += probe.failures
        synthetic.train_tokenizer(stdlib_texts(), 512, work / "tokenizer")
        factory = ModelFactory(work, work / "tokenizer")
        target = build_tool_model(
            factory.tokenizer_dir, work / "hermes", template=QWEN3_TEMPLATE, markers=QWEN3_MARKERS, eos_ids=factory.eos
        )
        draft = work / "hermes-draft"
        synthetic.build_model(
            "qwen3",
            draft,
            tokenizer_dir=work / "hermes-tokenizer",
            seed=4,
            like=target,
            noise=0.1,
            eos_token_ids=factory.eos,
        )
        for folder in (target, draft):  # room for the tools' schemas in the prompt (the template shows them)
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": LONG_CONTEXT}))
        args = ("--target", str(target), "--draft", str(draft))
        with served(failures, "random Hermes model", *args, log=work / "hermes.log") as (url, process):
            probe = Probe(url, process)
            tools_run(probe, shapes)
            print(
                f"random Hermes model, tools: {sum(probe.seen.values())} requests ({_counts(probe.seen)})", flush=True
            )
            totals += probe.seen
            failures += probe.failures
        cli = Counter()
        cli_run(work, cli, failures)
        print(f"command line: {sum(cli.values())} runs ({_counts(cli)})", flush=True)
        totals += cli
    print(f"in all: {sum(totals.values())} inputs in {time.perf_counter() - start:.0f} s ({_counts(totals)})")
    for failure in failures:
        print(f"  {failure}")
    sys.exit(1 if failures else 0)


@contextlib.contextmanager
def served(failures: list[str], name: str, *args: str, log: Path):
    """running_server, whose own check of how the server ended (Ctrl-C, exit 130) is one more
    failure here rather than the end of the run."""
    try:
        with running_server(*args, log=log) as server:
            yield server
    except AssertionError as e:
        failures.append(f"{name}: {str(e)[:300]}")


def _kind_of(param: str) -> str:
    """tools[1].function.parameters -> tools[i].function.parameters"""
    return re.sub(r"\[\d+\]", "[i]", param)


def _counts(seen: Counter) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in seen.most_common())


if __name__ == "__main__":
    main()
