"""Prompt caches in a file (`mlxspec cache-prompt`, `--prompt-cache`): a later call reads only
what follows the cached start, and emits what it would from empty caches, on every cache
family and with the cache options; files made for other models or options are refused."""

from __future__ import annotations

import json

import pytest

import mlxspec
from mlxspec.chat import Conversation
from mlxspec.decoding.caches import CacheOptions
from mlxspec.decoding.events import Prefill, Round
from mlxspec.generation import Session
from mlxspec.options import Options
from mlxspec.prompt_cache import store as prompt_cache
from tests.cli.test_chat import exact_reply
from tests.cli.test_cli import run
from tests.conftest import fresh_standard

TEXT = "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n\n"
SYSTEM = "You review Python code."
CASES = {
    "KVCache": ("llama", CacheOptions()),
    "RotatingKVCache (window 8, wrapped)": ("gemma3_text", CacheOptions()),
    "ArraysCache": ("qwen3_next", CacheOptions()),
    "kept tokens (max_kv_size)": ("qwen3", CacheOptions(max_kv_size=12)),
    "quantized KV": ("llama_kv32", CacheOptions(kv_bits=4, kv_group_size=32)),
}


def follow(pair, session, ids, gamma, max_tokens=20):
    events = list(mlxspec.stream(pair, ids, session=session, gamma=gamma, max_tokens=max_tokens))
    prefill = next(e for e in events if isinstance(e, Prefill))
    return prefill, [t for e in events if isinstance(e, Round) for t in e.emitted]


@pytest.mark.parametrize("case", list(CASES))
def test_a_loaded_prompt_cache_reads_only_what_follows_and_stays_exact(load_pair, tmp_path, case):
    arch, options = CASES[case]
    pair = load_pair(arch)
    path = tmp_path / "prompt.safetensors"
    saved = prompt_cache.save(path, Session(pair, cache_options=options), TEXT, system=SYSTEM)
    cached = prompt_cache.read(path)
    assert cached.ids == saved.ids and cached.system == SYSTEM and cached.user == TEXT and len(cached.ids) > 12
    for gamma in (0, 3, "auto"):
        session = Session(pair, cache_options=options)
        assert prompt_cache.restore(cached, session) == ["target", "draft"]
        ids = prompt_cache.prompt_ids(cached, pair, "Is this right?")
        assert ids[: len(cached.ids)] == list(cached.ids)
        prefill, emitted = follow(pair, session, ids, gamma)
        assert prefill.processed_tokens == len(ids) - len(cached.ids) + 1  # the rest, and the last cached id
        assert emitted == fresh_standard(pair, ids, 20, options), (case, gamma)


def test_a_raw_prompt_cache_and_the_command_line(capsys, factory, tmp_path):
    target, draft = (str(p) for p in factory.pair("llama"))
    path = tmp_path / "raw.safetensors"
    code, _, err = run(capsys, "cache-prompt", TEXT, "--raw", "-o", str(path), "-t", target, "-d", draft)
    assert code == 0 and f"--prompt-cache {path}" in err
    code, out, err = run(
        capsys, "generate", "def main():", "--prompt-cache", str(path), "-t", target, "-d", draft, "-m", "16"
    )
    assert code == 0 and "new of" in err.strip().splitlines()[-1]
    code, out, _ = run(
        capsys, "generate", "def main():", "--prompt-cache", str(path), "-t", target, "-d", draft, "-m", "16", "--json"
    )
    result = json.loads(out)
    pair = mlxspec.load_pair(target, draft)
    cached = prompt_cache.read(path)
    ids = prompt_cache.prompt_ids(cached, pair, "def main():")
    assert result["prompt_tokens"] == len(ids) and result["stats"]["prefill_tokens"] == len(ids) - len(cached.ids) + 1
    assert result["tokens"] == [t for t in fresh_standard(pair, ids, 16) if t not in pair.eos_ids]


def test_files_for_other_models_or_options_are_refused(capsys, factory, tmp_path):
    # qwen3: a model mlx-lm gives --max-kv-size to (llama here builds its own caches)
    target, draft = (str(p) for p in factory.pair("qwen3"))
    other, _ = (str(p) for p in factory.pair("llama"))
    path = tmp_path / "made.safetensors"
    assert run(capsys, "cache-prompt", TEXT, "-o", str(path), "-t", target, "-d", draft)[0] == 0
    refusals = {
        "was made for target": ["-t", other, "--no-draft"],
        "was made with the default caches, not --max-kv-size 64": ["-t", target, "-d", draft, "--max-kv-size", "64"],
        "was made with no system prompt: drop --system": ["-t", target, "--system", "Other."],
    }
    for message, args in refusals.items():
        code, out, err = run(capsys, "generate", "x", "--prompt-cache", str(path), *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (message, err)
    (tmp_path / "junk.safetensors").write_bytes(b"not a cache")
    for name, message in (("junk.safetensors", "is not a prompt cache"), ("none.safetensors", "no prompt cache at")):
        code, _, err = run(capsys, "generate", "x", "--prompt-cache", str(tmp_path / name), "-t", "/no/such/model")
        assert code in (1, 2) and message in err and len(err.strip().splitlines()) == 1


def test_a_chat_starts_from_a_prompt_cache(load_pair, tmp_path):
    """The system prompt and the cached text come from the file; the first turn reads only
    the message after them, and every reply is exact (through /reset too)."""
    pair = load_pair("gemma3_text")
    path = tmp_path / "chat.safetensors"
    prompt_cache.save(path, Session(pair), TEXT, system=SYSTEM)
    cached = prompt_cache.read(path)
    conversation = Conversation(pair, settings=Options.build(temp=0.0, max_tokens=12, gamma=2), prompt_cache=cached)
    assert conversation.system == SYSTEM
    for user in ("What does it return?", "And for an empty line?"):
        exact_reply(conversation, user)
    first = conversation.turns[0]
    assert first.appended and first.reused_tokens == len(cached.ids) - 1
    assert conversation.messages()[1]["content"] == TEXT + "What does it return?"
    conversation.reset()
    exact_reply(conversation, "Once more.")
    assert conversation.turns[0].reused_tokens == len(cached.ids) - 1


# -- cache-prompt against hostile input (issue 28): refusals before reading, and why


def test_a_text_past_the_context_is_refused_before_it_is_read(capsys, factory, tmp_path):
    """The tiny target reads 1024 tokens: a text of thousands was read whole and saved, and
    generate then refused the file. Now one line before anything is read, no file."""
    target, draft = (str(p) for p in factory.pair("llama"))
    path = tmp_path / "long.safetensors"
    code, _, err = run(capsys, "cache-prompt", TEXT * 60, "--raw", "-o", str(path), "-t", target, "-d", draft)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "reads at most 1024" in lines[0], err
    assert not path.exists()


def test_an_out_name_without_the_suffix_is_refused_before_loading(capsys, factory, tmp_path):
    """MLX appends .safetensors to a name without it: the command then failed to read back
    the file it named, and left FILE.safetensors behind."""
    target = str(factory.pair("llama")[0])
    code, _, err = run(capsys, "cache-prompt", TEXT, "--raw", "-o", str(tmp_path / "cache"), "-t", target)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and ".safetensors" in lines[0] and "internal error" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_text_too_short_to_cache_says_why(capsys, factory, tmp_path):
    target = str(factory.pair("llama")[0])
    out = str(tmp_path / "a.safetensors")
    code, _, err = run(capsys, "cache-prompt", "a", "--raw", "-o", out, "-t", target, "--no-draft")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "the text is 1 token" in lines[0], err


def test_a_long_text_is_read_a_chunk_at_a_time_with_progress(load_pair, tmp_path):
    """Reported as it is read (a bar on a terminal), and read in chunks between which Ctrl-C
    is taken; the file is the one a single read makes."""
    pair = load_pair("llama")
    text = TEXT * 12  # some 700 tokens: two chunks
    seen = []
    saved = prompt_cache.save(
        tmp_path / "c.safetensors", Session(pair), text, raw=True, progress=lambda *d: seen.append(d)
    )
    total = len(saved.ids) - 1
    assert len(seen) >= 2 and seen[-1] == (total, total) and all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    session = Session(pair)
    prompt_cache.restore(prompt_cache.read(tmp_path / "c.safetensors"), session)
    assert follow(pair, session, list(saved.ids) + [5, 6], 3)[1] == fresh_standard(pair, list(saved.ids) + [5, 6], 20)
