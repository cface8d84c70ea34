"""Token trees through the whole engine: greedy ids equal standard decoding's with trees of 4,
8 and 16 nodes and `auto`, for draft-model and EAGLE-3-head trees on every family that takes
trees (sliding windows that wrap inside a round included), a nextn (MTP) head's trees on an
MLA target, MTP heads on hybrid targets and recurrent targets falling back to chains;
sessions that trim back into an earlier tree; a Ctrl-C inside a tree round; a grammar that
forbids some branches. (The sampled law: test_distribution.py.)"""

from __future__ import annotations

import mlx.core as mx
import pytest

import mlxspec
from mlxspec.decoding.plan import Plan
from mlxspec.generation import Session
from mlxspec.grammar import GrammarSpec
from tests.conftest import ctrl_c_at
from tests.models.test_eagle3 import FAMILIES as HEAD_FAMILIES
from tests.models.test_eagle3 import Heads

PROMPT = list(range(10, 22))
MAX_TOKENS = 40
TREE_FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "phi3", "gemma3_text", "llama_sliding"]
SIZES = (4, 8, 16, "auto")


@pytest.fixture(scope="module")
def heads(factory) -> Heads:
    return Heads(factory)


def check_trees_equal_standard(pair, *, gamma=3, prompt=PROMPT, **options):
    standard = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=0, **options).tokens
    rounds = {}
    for tree in SIZES:
        result = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=gamma, tree=tree, **options)
        assert result.tokens == standard, f"tree={tree}"
        rounds[tree] = result.stats
    return standard, rounds


@pytest.mark.parametrize("arch", TREE_FAMILIES)
def test_draft_model_trees_equal_standard(load_pair, arch):
    _, stats = check_trees_equal_standard(load_pair(arch))
    # a number grows the draft model's trees; auto drafts its chains (docs/trees.md)
    assert all(s.tree_rounds > 0 for t, s in stats.items() if t != "auto"), {t: s.tree_rounds for t, s in stats.items()}
    assert stats["auto"].tree_rounds == 0
    # branches the walk took and missed: some rounds accepted past a first child, some rejected
    assert stats[16].nodes_per_tree > 4 and 0.05 < stats[16].acceptance_rate < 1.0


@pytest.mark.parametrize("arch", HEAD_FAMILIES)
def test_head_trees_equal_standard(heads, arch):
    _, stats = check_trees_equal_standard(heads.pair(arch))
    assert all(s.tree_rounds > 0 for s in stats.values())


@pytest.mark.parametrize("vocab", [0.1], ids=["10%-vocab"])
def test_a_head_over_part_of_the_vocabulary_grows_trees_of_target_ids(heads, vocab):
    check_trees_equal_standard(heads.pair("qwen3", vocab=vocab))


def test_trees_reach_deeper_than_chains_of_the_same_length(load_pair):
    """What trees are for: more tokens per round than the chain of the same depth."""
    pair = load_pair("llama")
    chain = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=4).stats
    tree = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=4, tree=16).stats
    assert tree.tokens_per_round > chain.tokens_per_round


@pytest.mark.parametrize("arch", ["mamba", "qwen3_next", "falcon_h1"])
def test_recurrent_targets_draft_chains_and_stay_exact(load_pair, arch):
    pair = load_pair(arch)
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3, tree=8)
    assert result.tokens == standard and result.stats.tree_rounds == 0 and result.stats.model_rounds > 0
    # said once, in the run's summary line
    from mlxspec.views.summary import stats_line

    reason = result.stats.chains_only
    assert reason and "tree" in reason and f"chains ({reason})" in str(stats_line(result.stats))


def test_a_nextn_heads_trees_on_an_mla_target_equal_standard(factory):
    """GLM-4.7-Flash's shape: the target's multi-head latent attention reads the tree (its
    boolean mask and the rope of its positional part), the nextn head grows it."""
    from tests.models.test_mtp import Models

    _, stats = check_trees_equal_standard(Models(factory).pair("glm4_moe_lite"), gamma=2)
    assert all(s.tree_rounds > 0 for s in stats.values())
    assert stats[16].nodes_per_tree > 4


def test_mtp_heads_on_hybrid_targets_draft_chains(factory):
    from tests.models.test_mtp import Models

    pair = Models(factory).pair("qwen3_5")
    standard = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=0).tokens
    result = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=2, tree="auto")
    assert result.tokens == standard and result.stats.tree_rounds == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
@pytest.mark.parametrize("drafter", ["model", "head"])
def test_sessions_trim_back_into_an_earlier_tree(load_pair, heads, arch, drafter):
    """Chat-like calls on one session, each prompt ending inside what an earlier tree round
    emitted (the cache keeps the path's rows there, moved into place): each call gives what a
    fresh session gives, on a window that wraps too."""
    pair = load_pair(arch) if drafter == "model" else heads.pair(arch)
    session = Session(pair)
    first = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3, tree=8, session=session)
    assert first.stats.tree_rounds > 0
    for cut, extra in ((25, [7]), (9, []), (31, [5, 6]), (3, [9])):
        prompt = PROMPT + first.tokens[:cut] + extra
        fresh = mlxspec.generate(pair, prompt, max_tokens=16, gamma=0).tokens
        again = mlxspec.generate(pair, prompt, max_tokens=16, gamma=3, tree="auto", session=session).tokens
        assert again == fresh, (cut, extra)


@pytest.mark.parametrize("drafter", ["model", "head"])
def test_a_ctrl_c_inside_a_tree_round_leaves_the_session_exact(load_pair, heads, drafter):
    pair = load_pair("gemma3_text") if drafter == "model" else heads.pair("gemma3_text")
    session = Session(pair)
    expected = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=0).tokens
    for at in (60, 300, 900, 2000, 4000):
        with ctrl_c_at(at):
            try:
                for _ in mlxspec.stream(pair, PROMPT, session=session, max_tokens=24, gamma=3, tree=8):
                    pass
            except KeyboardInterrupt:
                pass
        again = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=3, tree=8, session=session)
        assert again.tokens == expected, at


def test_a_grammar_that_forbids_some_branches(load_pair, heads):
    """Only lower-case words: the drafters' trees hold only ids the grammar allows after each
    node's path, the target's rows are masked along each path, and the ids are standard's."""
    words = GrammarSpec("regex", "[a-z ]{1,60}", "--regex")
    # auto: the head's trees (beside a draft model auto drafts chains)
    for pair, trees in ((load_pair("llama"), (8,)), (heads.pair("qwen3"), (8, "auto"))):
        standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0, grammar=words)
        for tree in trees:
            result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3, tree=tree, grammar=words)
            assert result.tokens == standard.tokens and result.stats.tree_rounds > 0, tree


def test_tree_rounds_report_their_nodes_and_branches(load_pair):
    pair = load_pair("llama")
    rounds = [
        e
        for e in mlxspec.stream(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3, tree=8)
        if isinstance(e, mlxspec.decoding.events.Round) and e.nodes
    ]
    assert rounds and all(1 <= len(r.drafted) <= 4 and r.accepted <= 3 for r in rounds)
    assert any(r.branches for r in rounds) and all(r.nodes <= 8 for r in rounds)
    mx.synchronize()


def test_auto_drafts_a_head_s_trees_at_every_temperature_as_deep_as_its_chain_under_sampling(load_pair, heads):
    """Where auto grows trees (docs/trees.md): a head's, at temperature 0 up to two levels
    deeper than the controller's chain, and under sampling (where the drawn spine is kept
    whole) no deeper than it; beside a separate draft model, chains."""
    from mlxspec.generation import Session, drafting_policy
    from mlxspec.options import Options

    pair = heads.pair("llama")
    greedy = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3)
    sampled = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3, temp=0.7, seed=1)
    assert greedy.stats.tree_rounds > 0 and sampled.stats.tree_rounds > 0
    ids = mlxspec.generation.encode_prompt(pair, PROMPT)
    for temp, extra in ((0.0, 2), (0.7, 0)):
        policy = drafting_policy(pair, Session(pair), Options.build(gamma="auto", temp=temp), ids)
        assert policy._tree_plan(3, remaining=100) == Plan(draft=3)  # before any verify is timed: a chain
        policy.controller.times.observe_verify(4, 0.01)
        plan = policy._tree_plan(3, remaining=100)
        assert policy.shape.extra_depth == extra and plan.draft == 3 + extra and plan.tree == 8
    beside_model = load_pair("llama")
    chained = mlxspec.generate(beside_model, PROMPT, max_tokens=MAX_TOKENS, gamma=3, temp=0.7, seed=1)
    assert chained.stats.model_rounds > 0 and chained.stats.tree_rounds == 0


@pytest.mark.parametrize("temp", [0.0, 0.7])
def test_a_tree_round_reports_what_its_first_choices_would_have_accepted_as_a_chain(heads, monkeypatch, temp):
    """What the controller learns from a head's tree rounds (it models a chain: docs/trees.md):
    the chain of the head's first choices in the tree, as long as the tree holds it, and how
    many of them led the accepted path, never more than the path; the levels the head grew,
    at most those planned and at least the tree's first-choice chain."""
    from mlxspec.drafting.controller import Controller

    seen = []
    observe = Controller.observe_round

    def spy(self, outcome, **kw):
        seen.append(outcome)
        return observe(self, outcome, **kw)

    monkeypatch.setattr(Controller, "observe_round", spy)
    pair = heads.pair("llama")
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0, temp=temp, seed=3)
    # a fixed γ and tree: every round drafts a tree of its own size, whatever this machine's timings
    result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3, tree=8, temp=temp, seed=3)
    trees = [o for o in seen if o.nodes]
    assert trees
    for o in trees:
        assert 1 <= o.first_choices <= o.levels <= o.plan.draft
        assert 0 <= o.first_choices_accepted <= min(o.accepted, o.first_choices)
    assert any(o.first_choices_accepted < o.accepted for o in trees) or temp == 0.7
    if not temp:
        assert result.tokens == standard.tokens
