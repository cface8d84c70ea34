"""EAGLE-3 heads on the real pretrained targets: the shipped SmolLM2 and Gemma 3 270M heads
give exactly their target's output and are right far more often than an untrained head; a
random head on Gemma 3 270M stays exact past the 512-token window (its sliding layers
wrapped before the first round)."""

from __future__ import annotations

import pytest

import mlxspec
from mlxspec.generation import Session
from mlxspec.models.presets import resolve_name
from tests.models.test_real_models import GAMMAS, long_code_prompt
from tests.support import real_models
from tests.support.heads import make_head

pytestmark = pytest.mark.slow

SMOLLM2_HEAD = resolve_name("bundled:smollm2-eagle3")
GEMMA3_HEAD = resolve_name("bundled:gemma3-270m-eagle3")


def test_the_shipped_smollm2_head_is_exact_and_beats_an_untrained_one(tmp_path):
    pair = real_models.pair(real_models.SMOLLM2, str(SMOLLM2_HEAD))
    assert pair.draft.kind == "eagle3"
    prompt = "Explain in two sentences what a hash table is."
    standard = mlxspec.generate(pair, prompt, max_tokens=48, gamma=0).tokens
    acceptance = {}
    for gamma in GAMMAS:
        result = mlxspec.generate(pair, prompt, max_tokens=48, gamma=gamma)
        assert result.tokens == standard, gamma
        acceptance[gamma] = result.stats.acceptance_rate
    sampled = mlxspec.generate(pair, prompt, max_tokens=48, gamma=3, temp=0.7, seed=1)
    assert sampled.stats.tokens > 0
    trained = acceptance[3]
    untrained_dir = make_head(real_models.folder(real_models.SMOLLM2), tmp_path / "untrained", draft_vocab=0.17)
    untrained = mlxspec.load_pair(str(real_models.folder(real_models.SMOLLM2)), str(untrained_dir))
    chance = mlxspec.generate(untrained, prompt, max_tokens=48, gamma=3).stats.acceptance_rate
    assert trained > chance + 0.05, (trained, chance)


def test_the_shipped_gemma3_head_is_exact_and_beats_an_untrained_one(tmp_path):
    target_dir = real_models.folder(real_models.GEMMA3)
    pair = real_models.pair(real_models.GEMMA3, str(GEMMA3_HEAD))
    assert pair.draft.kind == "eagle3"
    prompt = "The history of the printing press begins"  # a base model: text to continue
    standard = mlxspec.generate(pair, prompt, max_tokens=40, gamma=0, raw=True).tokens
    acceptance = {}
    for gamma in (1, 3, "auto"):
        result = mlxspec.generate(pair, prompt, max_tokens=40, gamma=gamma, raw=True)
        assert result.tokens == standard, gamma
        acceptance[gamma] = result.stats.acceptance_rate
    trained = acceptance[3]
    untrained_dir = make_head(target_dir, tmp_path / "untrained", draft_vocab=0.03)
    untrained = mlxspec.load_pair(str(target_dir), str(untrained_dir))
    chance = mlxspec.generate(untrained, prompt, max_tokens=40, gamma=3, raw=True).stats.acceptance_rate
    assert trained > chance + 0.1, (trained, chance)


def test_a_head_on_gemma3_is_exact_once_the_window_wraps(tmp_path):
    target_dir = real_models.folder(real_models.GEMMA3)
    head = make_head(target_dir, tmp_path / "gemma3-head", draft_vocab=0.05, seed=1)
    pair = mlxspec.load_pair(str(target_dir), str(head))
    prompt = long_code_prompt(600, pair.tokenizer)
    session = Session(pair)
    standard = mlxspec.generate(pair, prompt, max_tokens=16, gamma=0, raw=True, session=session).tokens
    for gamma in (1, 3, "auto"):
        result = mlxspec.generate(pair, prompt, max_tokens=16, gamma=gamma, raw=True, session=session)
        assert result.tokens == standard, gamma
