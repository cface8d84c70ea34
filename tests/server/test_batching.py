"""`mlxspec serve --max-batch N`: concurrent requests share the target's forwards, each answer
exactly the one it gets alone (greedy, and seeded sampling at a fixed gamma), a client that
leaves mid-batch changes no other answer, and no more than N generate at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

import mlxspec
from tests.server.test_server import ROOT, TIMEOUT, chat_ids, health, running_server, standard

PROMPTS = ["Write a poem about the sea.", "Explain recursion.", "List five fruits.", "What is MLX?"]


@pytest.fixture(scope="module")
def pair():
    return mlxspec.load_pair()


@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    log = tmp_path_factory.mktemp("batched") / "serve.log"
    with running_server("--max-batch", "4", log=log) as (url, _):
        yield url, log


def ask(url: str, prompt: str, **fields) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    messages = [{"role": "user", "content": prompt}]
    extra = {k: fields.pop(k) for k in ("gamma", "tree") if k in fields}
    reply = client.chat.completions.create(model="m", messages=messages, extra_body=extra, **fields)
    return reply.choices[0].message.content


def test_concurrent_requests_share_forwards_and_get_their_own_answers(batched, pair):
    url, log = batched
    greedy = dict(temperature=0, max_tokens=48)
    seeded = dict(temperature=0.9, seed=11, max_tokens=48, gamma=2, tree=0)
    asks = [(PROMPTS[0], greedy), (PROMPTS[1], seeded), (PROMPTS[2], greedy), (PROMPTS[3], {**seeded, "seed": 12})]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda item: ask(url, item[0], **dict(item[1])), asks))
    for (prompt, fields), answer in zip(asks, answers):
        ids = chat_ids(pair, [{"role": "user", "content": prompt}])
        if fields["temperature"] == 0:
            expected = standard(pair, ids, 48).text
        else:
            expected = mlxspec.generate(pair, ids, temp=0.9, seed=fields["seed"], gamma=2, tree=0, max_tokens=48).text
        assert answer == expected, prompt
    assert "batch of " in log.read_text(), "no request ran beside another"
    assert health(url)["max_batch"] == 4


@pytest.mark.alone  # timed: the dropped request must stop within seconds
def test_a_client_that_leaves_mid_batch_changes_no_other_answer(batched, pair):
    url, _ = batched
    before = health(url)["stopped"]
    stay = PROMPTS[:3]
    expected = [standard(pair, chat_ids(pair, [{"role": "user", "content": p}]), 64).text for p in stay]
    dropped = threading.Event()

    def leave():
        body = {"messages": [{"role": "user", "content": "def long():"}], "temperature": 0, "max_tokens": 1500}
        with httpx.Client(timeout=TIMEOUT) as http:
            with http.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as response:
                for received, _ in enumerate(response.iter_lines()):
                    if received == 6:
                        break
        dropped.set()

    with ThreadPoolExecutor(4) as pool:
        leaving = pool.submit(leave)
        answers = list(pool.map(lambda p: ask(url, p, temperature=0, max_tokens=64), stay))
        leaving.result(timeout=TIMEOUT)
    assert answers == expected
    deadline = time.monotonic() + 10
    while health(url)["stopped"] == before:
        assert time.monotonic() < deadline, "the dropped request kept generating"
        time.sleep(0.05)


def test_no_more_than_max_batch_generate_at_once(tmp_path):
    with running_server("--max-batch", "2", log=tmp_path / "serve.log") as (url, _):
        seen = []
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(ask, url, p, temperature=0, max_tokens=40) for p in PROMPTS + PROMPTS[:2]]
            while not all(f.done() for f in futures):
                state = health(url)
                seen.append(state["generating"])
                time.sleep(0.02)
            for f in futures:
                f.result()
    assert max(seen) == 2, seen


@pytest.mark.parametrize("value", ["0", "two"])
def test_a_max_batch_out_of_range_is_one_line(value):
    result = subprocess.run(
        [sys.executable, "-m", "mlxspec", "serve", "--max-batch", value],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "--max-batch" in result.stderr
