"""Drafting from history (drafters/history/) through the engine, sessions and the real
server: greedy ids identical with the index on and off across multi-request replays, beside
a draft model and with trees; a server's index bounded, one API key's history never drafting
for another (asserted on the rounds each request's proposals came from), and a damaged
index file refused in one line and rebuilt. (The index alone: test_history_index.py.)"""

from __future__ import annotations

import httpx
import openai
import pytest

import mlxspec
from mlxspec.generation import Session, encode_messages
from tests.server.test_server import KEY, TIMEOUT, running_server

CODE = "def merge_sorted(left, right):\n    result = []\n"
FOLLOW_UPS = [CODE, CODE + "    i = j = 0\n", "import os\n\n" + CODE, CODE]


def replay(pair, prompts, *, session: Session | None, **options) -> list[mlxspec.GenerationResult]:
    return [mlxspec.generate(pair, p, max_tokens=40, session=session, raw=True, **options) for p in prompts]


@pytest.mark.parametrize("tree", [0, "auto"])
def test_a_sessions_history_drafts_and_stays_exact(tree):
    """The bundled pair's target with prompt lookup alone: the same ids with the history on
    and off, and later requests drafting from earlier answers."""
    pair = mlxspec.load_pair("bundled:tiny-target", "ngram")
    off = replay(pair, FOLLOW_UPS, session=Session(pair), gamma=4, tree=tree, history=False)
    on = replay(pair, FOLLOW_UPS, session=Session(pair), gamma=4, tree=tree, history=True)
    standard = [mlxspec.generate(pair, p, max_tokens=40, gamma=0, raw=True).tokens for p in FOLLOW_UPS]
    assert [r.tokens for r in on] == [r.tokens for r in off] == standard
    assert on[0].stats.history_rounds == 0 and sum(r.stats.history_rounds for r in on[1:]) > 0
    assert all(r.stats.history_rounds == 0 for r in off)
    # the repeated request drafts its whole answer from the first one's
    assert on[3].stats.tokens_per_round > off[3].stats.tokens_per_round


def test_history_beside_a_draft_model_and_trees_stays_exact(load_pair):
    pair = load_pair("llama")
    prompts = [list(range(10, 22)), list(range(10, 22)), list(range(12, 22)) + [5, 6]]
    for tree in (0, 8):
        session = Session(pair)
        for prompt in prompts:
            standard = mlxspec.generate(pair, prompt, max_tokens=30, gamma=0).tokens
            result = mlxspec.generate(pair, prompt, max_tokens=30, gamma=3, tree=tree, ngram=True, session=session)
            assert result.tokens == standard, (tree, prompt)


def test_a_session_forgets_nothing_it_was_not_told():
    """Each Session has its own history: one session's answers never draft for another."""
    pair = mlxspec.load_pair("bundled:tiny-target", "ngram")
    first = Session(pair)
    replay(pair, [CODE, CODE], session=first, gamma=4)
    other = replay(pair, [CODE], session=Session(pair), gamma=4)[0]
    assert other.stats.history_rounds == 0


# --- the server ---------------------------------------------------------------------------
KEYS = (KEY, "key-two-5678")  # the first is the one running_server asks /health with
LIMIT = 600  # ids a key's index keeps: a few answers' worth


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("history-server")
    args = ["--target", "bundled:tiny-target", "--draft", "ngram", "--history-tokens", str(LIMIT)]
    args += [item for key in KEYS for item in ("--api-key", key)]
    with running_server(*args, log=folder / "serve.log") as (url, _):
        yield url


def ask(url: str, key: str, content: str) -> dict:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=TIMEOUT, max_retries=0)
    return client.completions.create(model="x", prompt=content, max_tokens=40, temperature=0).model_dump()


def health(url: str, key: str) -> dict:
    return httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT).json()


def test_one_keys_history_never_drafts_for_another(served):
    first = ask(served, KEYS[0], CODE)
    again = ask(served, KEYS[0], CODE)
    other = ask(served, KEYS[1], CODE)
    assert first["choices"][0]["text"] == again["choices"][0]["text"] == other["choices"][0]["text"]
    assert again["usage"]["speculative"]["history_rounds"] > 0  # its own earlier answer
    assert other["usage"]["speculative"]["history_rounds"] == 0  # nothing of the other key's
    # nor its cached conversation: a prompt sharing its prefix reads it anew (else the
    # usage's cached tokens, and the prefill's time, would tell what the other key sent)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    mine, theirs = health(served, KEYS[0])["history"], health(served, KEYS[1])["history"]
    assert mine["documents"] >= 2 and theirs["documents"] == 1


def test_a_servers_history_stays_within_its_limit(served):
    sizes = []
    for i in range(24):
        ask(served, KEYS[1], f"# request {i}\n" + CODE + f"    total_{i} = 0\n")
        reply = health(served, KEYS[1])
        assert "history" in reply, reply
        sizes.append(reply["history"])
    assert all(s["slots"] <= LIMIT for s in sizes)
    assert sizes[-1]["bytes"] == sizes[-8]["bytes"]  # full: it forgets the oldest, it does not grow


def test_greedy_answers_are_the_same_with_the_history_on_and_off(served):
    pair = mlxspec.load_pair("bundled:tiny-target", "ngram")
    client = openai.OpenAI(base_url=f"{served}/v1", api_key=KEYS[0], timeout=TIMEOUT, max_retries=0)
    messages = [{"role": "user", "content": CODE}]
    for history in (True, False, True):
        reply = client.chat.completions.create(
            model="x", messages=messages, max_tokens=30, temperature=0, extra_body={"history": history}
        )
        ids = encode_messages(pair.tokenizer, messages)
        assert reply.choices[0].message.content == mlxspec.generate(pair, ids, max_tokens=30, gamma=0).text
        if not history:
            assert reply.usage.model_extra["speculative"]["history_rounds"] == 0


def test_a_damaged_history_file_is_refused_in_one_line_and_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    args = ["--target", "bundled:tiny-target", "--draft", "ngram", "--history-keep"]
    env = {"MLXSPEC_CACHE": str(cache)}
    with running_server(*args, log=tmp_path / "first.log", env=env) as (url, _):
        ask(url, "unused", CODE)
        ask(url, "unused", CODE)
    [saved] = (cache / "history").glob("*/default.npz")  # a folder per tokenizer
    saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])  # cut short
    with running_server(*args, log=tmp_path / "second.log", env=env) as (url, _):
        reply = ask(url, "unused", CODE)
        assert reply["usage"]["speculative"]["history_rounds"] == 0
        assert health(url, "unused")["history"]["documents"] == 1  # read afresh: the damaged file was not loaded
    refusals = [
        line for line in (tmp_path / "second.log").read_text().splitlines() if "starting an empty history" in line
    ]
    assert len(refusals) == 1 and "Traceback" not in (tmp_path / "second.log").read_text()
    with running_server(*args, log=tmp_path / "third.log", env=env) as (url, _):
        # the file rewritten at the second run's end reads back sound: its answer drafts this one
        assert ask(url, "unused", CODE)["usage"]["speculative"]["history_rounds"] > 0
        assert health(url, "unused")["history"]["documents"] == 2


def test_a_history_file_with_ids_past_the_models_is_refused(tmp_path):
    """A file kept for a model with a larger vocabulary (one copied in, or a folder shared by
    hand) would send ids the target cannot read into its forward: refused like damage."""
    from mlxspec.drafters.history import HistoryStore

    kept = HistoryStore(folder=tmp_path, limit_tokens=1024)
    kept.index("default").add_turn([5, 6, 7, 8], [9, 600, 11], keep_prompt=True)
    kept.save()
    warnings = []
    fresh = HistoryStore(folder=tmp_path, limit_tokens=1024, vocab_size=512, warn=warnings.append)
    assert fresh.describe("default")["documents"] == 0 and fresh.index("default").documents == 0
    assert len(warnings) == 1 and "id 600 is past this model's 512 ids" in warnings[0]
    wide = HistoryStore(folder=tmp_path, limit_tokens=1024, vocab_size=601, warn=warnings.append)
    assert wide.index("default").documents == 1 and len(warnings) == 1
