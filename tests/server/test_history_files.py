"""`serve --history-keep` against hostile and unlucky files and signals (issue 39), through
the real server process: a FIFO at a history's path neither hangs a request nor /health;
SIGTERM saves the history as Ctrl-C does, and a restarted server counts it before its first
request; one namespace that cannot be saved leaves the others saved and no partial file;
the files are private (0600 in a 0700 folder) and named by a keyed digest, not a plain hash
of the key; /health tells a key nothing of another key's requests."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

import mlxspec
from mlxspec.drafters.history import read_documents
from mlxspec.models.paths import tokenizer_digest
from tests.server.test_server import KEY, running_server

OTHER_KEY = "other-key-456"
TARGET = ["--target", "bundled:tiny-target", "--draft", "ngram", "--history-keep"]
PROMPT = "def merge_sorted(left, right):\n    result = []\n"
BOUND = 30  # seconds a request to the bundled tiny pair takes at most here, on a loaded machine


def ask(url: str, key: str, *, timeout: float = BOUND) -> dict:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=timeout, max_retries=0)
    return client.completions.create(model="x", prompt=PROMPT, max_tokens=20, temperature=0).model_dump()


def health(url: str, key: str, *, timeout: float = 5) -> dict:
    return httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {key}"}, timeout=timeout).json()


def history_folder(cache: Path) -> Path:
    """Where the server keeps the bundled pair's histories under `cache`."""
    return cache / "history" / tokenizer_digest(mlxspec.load_pair("bundled:tiny-target", "ngram").tokenizer)


@pytest.mark.alone  # timed against the wall clock: the request and /health answer within a bound
def test_a_fifo_at_the_history_path_neither_hangs_a_request_nor_health(tmp_path):
    """A file that blocks on open (a FIFO here; a hung mount alike) where the history is
    kept: refused in one line, the request answered, /health and other requests answered."""
    cache = tmp_path / "cache"
    folder = history_folder(cache)
    folder.mkdir(parents=True)
    os.mkfifo(folder / "default.npz")
    with running_server(*TARGET, log=tmp_path / "serve.log", env={"MLXSPEC_CACHE": str(cache)}) as (url, _):
        assert health(url, "unused")["status"] == "ok"
        started = time.monotonic()
        replies = []
        asking = threading.Thread(target=lambda: replies.append(ask(url, "unused")))
        asking.start()
        while asking.is_alive() and time.monotonic() - started < BOUND:
            assert health(url, "unused")["status"] == "ok"  # the event loop never waits on the worker
            time.sleep(0.2)
        asking.join(timeout=1)
        assert replies and replies[0]["choices"][0]["text"], "the request did not answer"
        assert ask(url, "unused")["choices"][0]["text"] == replies[0]["choices"][0]["text"]
    log = (tmp_path / "serve.log").read_text()
    assert "not a regular file" in log and "Traceback" not in log


def test_sigterm_saves_the_history_and_a_restart_counts_it_before_any_request(tmp_path):
    cache = tmp_path / "cache"
    env = {"MLXSPEC_CACHE": str(cache)}
    args = [*TARGET, "--api-key", KEY]
    with running_server(*args, log=tmp_path / "first.log", env=env, stop=signal.SIGTERM) as (url, _):
        ask(url, KEY)
        ask(url, KEY)
    folder = history_folder(cache)
    [saved] = folder.glob("key-*.npz")
    assert len(read_documents(saved)) == 2
    assert not list(folder.glob("*.partial"))
    with running_server(*args, log=tmp_path / "second.log", env=env, stop=signal.SIGTERM) as (url, _):
        assert health(url, KEY)["history"]["documents"] == 2  # read at start, not at the first request
        assert ask(url, KEY)["usage"]["speculative"]["history_rounds"] > 0


def test_kept_histories_are_private_and_not_named_by_a_plain_hash_of_the_key(tmp_path):
    cache = tmp_path / "cache"
    args = [*TARGET, "--api-key", KEY]
    with running_server(*args, log=tmp_path / "serve.log", env={"MLXSPEC_CACHE": str(cache)}) as (url, _):
        ask(url, KEY)
    folder = history_folder(cache)
    [saved] = folder.glob("key-*.npz")
    assert KEY not in saved.name
    assert saved.stem != "key-" + hashlib.sha256(KEY.encode()).hexdigest()[:32]  # no offline guessing from the name
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "key-secret").stat().st_mode) == 0o600


def test_a_history_kept_under_its_old_name_is_renamed_and_read(tmp_path):
    """Files written before the keyed names (sha256 of the key) are renamed at the first start
    with that key, and drafted from."""
    cache = tmp_path / "cache"
    env = {"MLXSPEC_CACHE": str(cache)}
    args = [*TARGET, "--api-key", KEY]
    with running_server(*args, log=tmp_path / "first.log", env=env) as (url, _):
        ask(url, KEY)
    folder = history_folder(cache)
    [saved] = folder.glob("key-*.npz")
    old = folder / f"key-{hashlib.sha256(KEY.encode()).hexdigest()[:32]}.npz"
    saved.rename(old)
    (folder / "key-secret").unlink()  # as before there was one
    with running_server(*args, log=tmp_path / "second.log", env=env) as (url, _):
        assert health(url, KEY)["history"]["documents"] == 1
    assert not old.exists() and len(list(folder.glob("key-*.npz"))) == 1


def test_one_namespace_that_cannot_be_saved_leaves_the_others_saved(tmp_path):
    cache = tmp_path / "cache"
    env = {"MLXSPEC_CACHE": str(cache)}
    with running_server(*TARGET, "--api-key", KEY, log=tmp_path / "first.log", env=env) as (url, _):
        ask(url, KEY)
    folder = history_folder(cache)
    [blocked] = folder.glob("key-*.npz")  # the first key's file
    blocked.unlink()
    blocked.mkdir()  # a folder where it goes
    args = [*TARGET, "--api-key", KEY, "--api-key", OTHER_KEY]
    with running_server(*args, log=tmp_path / "second.log", env=env) as (url, _):
        ask(url, KEY)  # held first, saved first
        ask(url, OTHER_KEY)
    assert blocked.is_dir() and not list(folder.glob("*.partial"))
    [other] = set(folder.glob("key-*.npz")) - {blocked}
    assert len(read_documents(other)) == 1
    log = (tmp_path / "second.log").read_text()
    assert f"{blocked}: the history could not be saved" in log and "Traceback" not in log


def test_health_tells_a_key_nothing_of_another_keys_requests(tmp_path):
    args = ["--target", "bundled:tiny-target", "--draft", "ngram", "--api-key", KEY, "--api-key", OTHER_KEY]
    with running_server(*args, log=tmp_path / "serve.log") as (url, _):
        ask(url, KEY)
        ask(url, KEY)
        mine, theirs = health(url, KEY), health(url, OTHER_KEY)
    assert (mine["served"], mine["cached_sessions"], mine["history"]["documents"]) == (2, 1, 2)
    assert theirs == {
        "status": "ok",
        "model": mine["model"],
        "busy": False,
        "generating": 0,
        "max_batch": mine["max_batch"],
        "queued": 0,
        "cached_sessions": 0,
        "served": 0,
        "stopped": 0,
        "history": {**mine["history"], "documents": 0, "slots": 0, "bytes": theirs["history"]["bytes"]},
    }
