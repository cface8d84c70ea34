"""Sampling: the whole engine (draft, verify, rewinds, caches) must emit exactly the target's
distribution. On a pair with 6-id vocabularies and sharp, different p and q, thousands of
seeded runs give the joint law of the first three emitted ids (216 outcomes), which a
marginal could not: a rewind bug only changes later tokens. That law is tested against the
exact one, computed from the target's own warped distributions over every prefix.

Sample size and threshold. Significance 1e-3 fixes the critical value c for the
degrees of freedom at hand (about 30-60 after pooling rare outcomes, c ~ 60-100). With
N = 4000 runs, a deviation of effect size w (Cohen: w^2 = sum (p1 - p0)^2 / p0) gives a
non-centrality N w^2; for w = 0.15 that is 90, putting the statistic's mean about 2.5
standard deviations above c (power ~0.99), and the sabotaged rules below sit far beyond.
Seeds are fixed, so each check is deterministic; the threshold says how surprising a pass
of a wrong engine would be.
"""

from __future__ import annotations

import itertools
from collections import Counter

import mlx.core as mx
import pytest

import mlxspec
from mlxspec.decoding import engine, rounds, verify
from mlxspec.decoding.caches import ModelCache
from mlxspec.decoding.events import Round
from mlxspec.decoding.sampling import SamplingParams, warp
from mlxspec.decoding.tree import best_size as size_by_costs
from mlxspec.drafters.lookup import NGramIndex, PromptLookup
from mlxspec.drafting import Policy
from mlxspec.drafting.shape import TreeShape
from mlxspec.generation import Session
from mlxspec.models.synthetic import ARCHITECTURES
from mlxspec.options import AUTO
from tests.conftest import primed_for_early_stop
from tests.support.chisquare import critical_value, goodness_of_fit
from tests.support.controllers import drafted
from tests.support.tree_walks import count_point_mass_paths

VOCAB = 6
PROMPT = [1, 4, 2]
LENGTH = 3
GAMMA = 2
RUNS = 4000
# the sabotaged rules below fail by far at a quarter of the runs (chi-square 10,694, 269 and
# 2,505 against a threshold of 33 at 1,000 runs): the harness's own checks need no more
HARNESS_RUNS = RUNS // 4
# the adaptive modes draft by the chain's rule (or the tree walk's) held at RUNS above; what
# they add is a choice of what to propose, made before the round. Half the runs hold them to
# w = 0.2 (non-centrality 80: power about 0.99), and keep the suite within CI's half hour
ADAPTIVE_RUNS = RUNS // 2
SIGNIFICANCE = 1e-3

SETTINGS = {
    "temp1": SamplingParams(temp=1.0),
    "temp0.7-top_p0.9": SamplingParams(temp=0.7, top_p=0.9),
    "temp1-top_k4": SamplingParams(temp=1.0, top_k=4),
}


@pytest.fixture(scope="module")
def small_pair(factory):
    """One-layer llamas over 6 ids; the draft is an unrelated random model, so q differs from
    p everywhere (acceptance around one half) and both are sharp."""
    config = dict(ARCHITECTURES["llama"], hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    target = factory.model("dist-target", arch=config, vocab_size=VOCAB, seed=11, head_scale=5.0)
    draft = factory.model("dist-draft", arch=config, vocab_size=VOCAB, seed=12, like=target, noise=0.8)
    return mlxspec.load_pair(str(target), str(draft))


def policy(session, gamma: int, tree: int = 0, width: int = 2) -> Policy | None:
    """A fixed draft length from the draft model (None: standard decoding); `tree` > 0: a
    tree of at most that many nodes, `gamma` levels deep, `width` children per node."""
    if not gamma:
        return None
    return Policy(gamma=gamma, stop=0.0, controller=session.controller, shape=TreeShape(tree=tree), tree_width=width)


def exact_law(model, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first LENGTH ids) under standard decoding, from the target's warped rows."""
    law = {}
    rows = {}
    for prefix_len in range(LENGTH):
        for prefix in itertools.product(range(VOCAB), repeat=prefix_len):
            logits = model(mx.array([PROMPT + list(prefix)]))[0, -1]
            rows[prefix] = warp(logits, params).tolist()
    for outcome in itertools.product(range(VOCAB), repeat=LENGTH):
        p = 1.0
        for i in range(LENGTH):
            p *= rows[outcome[:i]][outcome[i]]
        if p > 0:
            law[outcome] = p
    return law


def sample_joint(
    pair,
    params: SamplingParams,
    gamma: int,
    runs: int,
    seed: int,
    *,
    prompt=PROMPT,
    fates: Counter | None = None,
    tree: int = 0,
    width: int = 2,
) -> Counter:
    """How often each sequence of the first LENGTH ids came out over `runs` generations;
    `fates`, where given, counts the drafting rounds by how many drafts were accepted (by
    tree rounds' nodes too, as "nodes=N")."""
    counts = Counter()
    for i in range(runs):
        session = Session(pair)
        emitted = []
        for event in engine.decode(
            session.target,
            session.draft,
            prompt,
            policy=policy(session, gamma, tree, width),
            params=params,
            max_tokens=LENGTH,
            eos_ids=frozenset(),
            key=mx.random.key(seed + i),
        ):
            if isinstance(event, Round):
                emitted += event.emitted
                if fates is not None and event.drafted:
                    fates[event.accepted] += 1
                if fates is not None and event.nodes:
                    fates[f"nodes={event.nodes}"] += 1
                    fates[f"rank={event.branches != ()}"] += 1
        counts[tuple(emitted)] += 1
    return counts


def fits(counts: Counter, law: dict) -> tuple[bool, float, float]:
    statistic, df = goodness_of_fit(counts, law)
    threshold = critical_value(df, SIGNIFICANCE)
    return statistic <= threshold, statistic, threshold


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_sampling_has_the_targets_joint_law(small_pair, name):
    params = SETTINGS[name]
    law = exact_law(small_pair.target.model, params)
    counts = sample_joint(small_pair, params, GAMMA, RUNS, seed=1000)
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"{name}: chi2 {statistic:.1f} > {threshold:.1f}"


@pytest.mark.slow
def test_standard_decoding_has_the_targets_joint_law(small_pair):
    """The harness itself: plain sampling through the same code passes the same test."""
    params = SETTINGS["temp1"]
    law = exact_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(sample_joint(small_pair, params, 0, RUNS, seed=5000), law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


def test_the_pair_exercises_every_path(small_pair):
    """p and q must differ enough that rejections, recoveries and bonuses all happen."""
    params = SETTINGS["temp1"]
    session = Session(small_pair)
    fates = Counter()
    for i in range(200):
        session.reset()
        for event in engine.decode(
            session.target,
            session.draft,
            PROMPT,
            policy=policy(session, GAMMA),
            params=params,
            max_tokens=LENGTH,
            eos_ids=frozenset(),
            key=mx.random.key(i),
        ):
            if isinstance(event, Round) and event.drafted:
                fates[event.fates[-1]] += 1
                fates[f"accepted={event.accepted}"] += 1
    assert fates["recovered"] > 40 and fates["bonus"] > 20, fates
    assert all(fates[f"accepted={n}"] > 10 for n in range(GAMMA + 1)), fates


@pytest.mark.slow
def test_harness_rejects_always_accepting(small_pair, monkeypatch):
    monkeypatch.setattr(verify, "acceptance_probability", lambda p, q: mx.ones_like(p))
    params = SETTINGS["temp1"]
    law = exact_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(sample_joint(small_pair, params, GAMMA, HARNESS_RUNS, seed=1000), law)
    assert not ok, f"a rule that accepts everything passed: chi2 {statistic:.1f} <= {threshold:.1f}"


@pytest.mark.slow
def test_harness_rejects_missing_rewind(small_pair, monkeypatch):
    """Caches that keep rejected drafts give later tokens the wrong context."""

    def no_rewind(self, length, mark):
        self.length = length  # the bookkeeping moves, the layers keep the rejected tokens
        return 0

    monkeypatch.setattr(ModelCache, "rewind", no_rewind)
    params = SETTINGS["temp1"]
    law = exact_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(sample_joint(small_pair, params, GAMMA, HARNESS_RUNS, seed=1000), law)
    assert not ok, f"an engine that never rewinds passed: chi2 {statistic:.1f} <= {threshold:.1f}"


@pytest.mark.slow
def test_harness_rejects_unclamped_residual(small_pair, monkeypatch):
    """Sampling the correction from p - q without max(0, .) (renormalised |p - q|) is wrong."""
    monkeypatch.setattr(verify, "residual", lambda p, q: mx.abs(p - q) / mx.abs(p - q).sum(axis=-1, keepdims=True))
    params = SETTINGS["temp1"]
    law = exact_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(sample_joint(small_pair, params, GAMMA, HARNESS_RUNS, seed=1000), law)
    assert not ok, f"an unclamped residual passed: chi2 {statistic:.1f} <= {threshold:.1f}"


# Trees of branching 2 and 3, three levels deep: one child of each spine node drawn from q,
# its siblings the draft's most probable other ids, tried after it, the residual
# renormalised after each rejected one.
TREES = {"width2": dict(tree=7, width=2), "width3": dict(tree=10, width=3)}


# Each warp once and each shape twice (pairs, not the whole product: the walk does not
# depend on the warp's kind, and the whole product cost the suite two more minutes).
TREE_CASES = [("temp1", "width2"), ("temp0.7-top_p0.9", "width3"), ("temp1-top_k4", "width2"), ("temp0.7", "width3")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "shape"), TREE_CASES, ids=[f"{name}-{shape}" for name, shape in TREE_CASES])
def test_trees_have_the_targets_joint_law(small_pair, name, shape):
    params = SETTINGS.get(name) or SamplingParams(temp=0.7)
    law = exact_law(small_pair.target.model, params)
    fates = Counter()
    counts = sample_joint(small_pair, params, 3, RUNS, seed=3000, fates=fates, **TREES[shape])
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"{name}, {shape}: chi2 {statistic:.1f} > {threshold:.1f}"
    # trees that branch, and walks that end in every way: an early miss, a branch taken, a bonus
    assert sum(v for k, v in fates.items() if str(k).startswith("nodes=")) > RUNS / 2, fates
    assert all(fates[n] > 50 for n in range(3)), fates


@pytest.mark.slow
def test_harness_rejects_a_walk_that_shares_its_draws_across_nodes(small_pair, monkeypatch):
    """The target's decisions at a node and at its children must be independent draws: one
    key for every node ties them, and the law moves."""
    original = verify.node_choice

    def shared(logits, params, key, **drawn):
        return original(logits, params, mx.random.key(0), **drawn)

    monkeypatch.setattr(verify, "node_choice", shared)
    params = SETTINGS["temp1"]
    law = exact_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(
        sample_joint(small_pair, params, 3, HARNESS_RUNS, seed=3000, **TREES["width3"]), law
    )
    assert not ok, f"a walk with shared draws passed: chi2 {statistic:.1f} <= {threshold:.1f}"


def primed_for_trees():
    """A controller that has timed verifies of 2 to 9 ids, each id 4% of a one-id verify
    more, and plain steps, so `--tree auto` drafts and sizes its trees (tree.best_size) from
    the first round."""
    from mlxspec.drafting import Controller

    controller = Controller()
    for r in range(24):
        size = 1 + r % 8
        drafted(controller, drafted=size, accepted=size // 2, draft=size * 0.002, verify=0.01 * (1 + 0.04 * size))
    for _ in range(8):  # a plain step dearer than such a round: drafting wins
        controller.observe_plain(0.02)
    assert controller.choose() > 0
    return controller


ADAPTIVE = {
    "auto": dict(gamma="auto"),
    "early-stop": dict(gamma=GAMMA, min_p=0.7),
    "ngram+model": dict(gamma=GAMMA, ngram=True),
    "ngram-only": dict(gamma=GAMMA, ngram=True, no_model=True),
    "learned-stop": dict(gamma=GAMMA, min_p="auto", primed=primed_for_early_stop),
    # the history of earlier answers proposing beside the model: chains, and tries
    "history+model": dict(gamma=GAMMA, history=True),
    "history-tries+model": dict(gamma=GAMMA, history=True, tree=8),
    # trees sized each round from the measured costs: the cut reads the drafts' values, and
    # stays exact because the drawn spine is always kept whole (only point masses are cut)
    "tree-auto": dict(gamma="auto", tree=AUTO, primed=primed_for_trees),
}
# earlier prompts and answers for the history: the prompt continued several ways
EARLIER = [[1, 4, 2, 3, 3, 0], [1, 4, 2, 5, 1, 4], [1, 4, 2, 3, 5, 2], [0, 1, 4, 2, 3, 1], [4, 2, 5, 1, 0]]


def sample_joint_with(
    pair, params, runs, seed, gamma, ngram=False, min_p=0.0, no_model=False, primed=None, history=False, tree=0
):
    import copy

    from mlxspec.drafters.history import HistoryStore

    controller = primed() if primed else None
    store = HistoryStore(limit_tokens=1024) if history else None
    for earlier in EARLIER if history else ():
        store.index("default").add_turn(earlier[:3], earlier[3:], keep_prompt=True)
    counts = Counter()
    counts.early_stops, counts.sources = 0, Counter()
    for i in range(runs):
        session = Session(pair)
        lookup = PromptLookup(PROMPT, min_match=2, index=NGramIndex(max_n=2, min_n=1)) if ngram else None
        if history:  # the store as it stands: a run's own ids join only its local index
            lookup = store.drafter(min_match=1).begin(PROMPT)
        drafting = Policy(
            gamma=AUTO if gamma == "auto" else gamma,
            stop=AUTO if min_p == "auto" else min_p,
            controller=copy.deepcopy(controller) if controller else session.controller,
            lookup=lookup,
            draft_model=not no_model,
            shape=TreeShape(tree=tree),
        )
        emitted = []
        for event in engine.decode(
            session.target,
            None if no_model else session.draft,
            PROMPT,
            policy=drafting,
            params=params,
            max_tokens=LENGTH,
            eos_ids=frozenset(),
            key=mx.random.key(seed + i),
        ):
            if isinstance(event, Round):
                emitted += event.emitted
                counts.early_stops += event.early_stop
                counts.sources[event.source] += 1
                counts.sources["tree"] += bool(event.nodes)
        counts[tuple(emitted)] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(ADAPTIVE))
def test_adaptive_drafting_keeps_the_targets_joint_law(small_pair, mode, monkeypatch):
    """Auto draft lengths, early stops, point-mass (prompt lookup) proposals and trees sized
    each round, through the whole engine: the joint law is still the target's (temperature
    1). "learned-stop" runs the learned threshold's path (confidences read back, rounds that
    wait at each step); in 3-id runs the threshold primed from past rounds stays as it is,
    which is the point: one chosen from the past, like gamma, leaves each round exact."""
    params = SETTINGS["temp1"]
    law = exact_law(small_pair.target.model, params)
    sized = Counter()  # (nodes grown, nodes kept) of each tree auto sized

    def best_size(values, depths, **costs):
        kept = size_by_costs(values, depths, **costs)
        sized[len(values), kept] += 1
        return kept

    monkeypatch.setattr(rounds, "best_size", best_size)
    followed = count_point_mass_paths(monkeypatch)
    counts = sample_joint_with(small_pair, params, ADAPTIVE_RUNS, 9000, **ADAPTIVE[mode])
    if mode == "tree-auto":  # trees cut by their costs, the drawn spine kept whole, point masses taken
        assert sum(n for (grown, kept), n in sized.items() if kept < grown) > ADAPTIVE_RUNS / 4, sized
        assert followed[True] > ADAPTIVE_RUNS / 10, followed
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"{mode}: chi2 {statistic:.1f} > {threshold:.1f}"
    if "stop" in mode:
        assert counts.early_stops > ADAPTIVE_RUNS / 10, counts.early_stops
    if "history" in mode:  # the history proposed (from the store, not only the run's own ids)
        assert counts.sources["history"] > ADAPTIVE_RUNS / 4, counts.sources
    if "tries" in mode or "tree" in mode:
        assert counts.sources["tree"] > ADAPTIVE_RUNS / 4, counts.sources


def test_point_mass_proposals_are_exercised(small_pair):
    """With a 6-id vocabulary, prompt lookup finds a match in most runs, and its proposals are
    both accepted (bonus) and rejected (recovered from p with the proposal removed)."""
    sources = Counter()
    for i in range(100):
        session = Session(small_pair)
        lookup = PromptLookup(PROMPT, index=NGramIndex(max_n=2, min_n=1))
        drafting = Policy(gamma=GAMMA, stop=0.0, controller=session.controller, lookup=lookup, draft_model=False)
        for event in engine.decode(
            session.target,
            None,
            PROMPT,
            policy=drafting,
            params=SETTINGS["temp1"],
            max_tokens=LENGTH,
            eos_ids=frozenset(),
            key=mx.random.key(i),
        ):
            if isinstance(event, Round):
                sources[event.source] += 1
                sources[event.fates[-1]] += 1
    assert sources["ngram"] > 50 and sources["recovered"] > 15 and sources["bonus"] > 15, sources
