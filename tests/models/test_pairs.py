"""Loading a pair: compatibility by token ids, memory, logit widths, bad folders."""

from __future__ import annotations

import json
import shutil

import pytest

import mlxspec
from mlxspec.errors import (
    IncompatiblePair,
    InsufficientMemory,
    ModelLoadError,
    ModelNotFound,
    PromptTooLong,
    UnsupportedCache,
)
from mlxspec.models import synthetic
from tests.conftest import stdlib_texts

PROMPT = list(range(10, 22))


def test_vocabularies_are_compared_entry_by_entry(factory, tmp_path):
    target, _ = factory.pair("llama")
    # same size (512), trained on other text: same vocabulary size, different ids
    other_tok = tmp_path / "other-tok"
    synthetic.train_tokenizer(stdlib_texts(60)[30:], 512, other_tok)
    draft = tmp_path / "other-draft"
    synthetic.build_model("llama", draft, tokenizer_dir=other_tok, seed=3, eos_token_ids=factory.eos)
    with pytest.raises(IncompatiblePair, match=r"id \d+ is '.*' for the target and '.*' for the draft"):
        mlxspec.load_pair(str(target), str(draft))


def test_end_of_sequence_ids_must_agree(factory, tmp_path):
    target, draft = factory.pair("llama")
    other = tmp_path / "draft-other-eos"
    shutil.copytree(draft, other)
    config = json.loads((other / "config.json").read_text())
    config["eos_token_id"] = [factory.eos[0]]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(IncompatiblePair, match="end sequences on different ids"):
        mlxspec.load_pair(str(target), str(other))


def test_memory_estimate_refuses_a_pair_that_cannot_fit(factory, monkeypatch):
    target, draft = factory.pair("llama")
    monkeypatch.setenv("MLXSPEC_MEMORY_LIMIT", "100MB")
    with pytest.raises(InsufficientMemory, match="needs about .* and this machine allows 100 MiB"):
        mlxspec.load_pair(str(target), str(draft))


def test_missing_and_corrupt_folders(factory, tmp_path):
    target, draft = factory.pair("llama")
    with pytest.raises(ModelNotFound, match="no model folder"):
        mlxspec.load_pair(str(tmp_path / "nope"), str(draft))
    broken = tmp_path / "broken"
    shutil.copytree(target, broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="cannot load"):
        mlxspec.load_pair(str(broken), str(draft))
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no .*safetensors"):
        mlxspec.load_pair(str(broken), str(draft))
    (broken / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        mlxspec.load_pair(str(broken), str(draft))


def test_unknown_repo_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match="not in the local Hugging Face cache"):
        mlxspec.load_pair("mlx-community/No-Such-Model-4bit")


def test_unknown_cache_type_is_refused(factory):
    chunked = factory.model("llama4-chunked", arch="llama4", seed=1)
    with pytest.raises(UnsupportedCache, match="ChunkedKVCache is not supported"):
        mlxspec.load_pair(str(chunked))


def test_wider_target_and_narrower_draft(factory):
    """A target padded past the tokenizer (Qwen-style) and a draft whose table stops short of
    it: the engine samples the draft over the target's ids, never cuts the target, and feeds
    the draft a placeholder for ids it cannot embed. Output stays exactly the target's."""
    target = factory.model("wide-target", arch="llama", vocab_size=576, seed=1, head_scale=4.0)
    draft = factory.model("narrow-draft", arch="llama", vocab_size=500, seed=2, head_scale=4.0)
    pair = mlxspec.load_pair(str(target), str(draft))
    assert (pair.target.width, pair.draft.width) == (576, 500)
    prompt = PROMPT + [505, 510]  # ids the draft's table does not have
    standard = mlxspec.generate(pair, prompt, max_tokens=40, gamma=0)
    for gamma in (1, 3, 6):
        assert mlxspec.generate(pair, prompt, max_tokens=40, gamma=gamma).tokens == standard.tokens
    sampled = mlxspec.generate(pair, prompt, max_tokens=40, gamma=3, temp=1.0, seed=0)
    assert len(sampled.tokens) == 40 and max(sampled.tokens) < 576


def test_prompt_longer_than_the_context(factory):
    short = factory.model("short-context", arch="llama", seed=1, overrides={"max_position_embeddings": 32})
    pair = mlxspec.load_pair(str(short))
    with pytest.raises(PromptTooLong, match="40 tokens and .* reads at most 32"):
        mlxspec.generate(pair, list(range(40)), gamma=0)
    result = mlxspec.generate(pair, list(range(20)), gamma=0, max_tokens=100)
    assert result.finish_reason == "context" and len(result.tokens) == 12
