"""The tree's rule alone, on hand-made distributions: recursive rejection over a node's
point-mass children (the residual after several rejected siblings, by hand and in float64)
is the target's own draw, which is why a tree walk follows the target's choice at every
node; the walk's one-hot cases; and the joint law of two emitted ids over trees of any
shape, with a walk that shares its draws across nodes as the negative control; and a chain
verified by the chain's rule or walked as a tree, against Leviathan et al.'s law by hand."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.decoding import verify
from mlxspec.decoding.sampling import SamplingParams
from mlxspec.decoding.tree import LevelPrice, TokenTree
from mlxspec.decoding.verify import acceptance_probability, residual, walk_tree
from tests.support.chisquare import critical_value, goodness_of_fit


def f64(x):
    return mx.array(np.array(x, dtype=np.float64), dtype=mx.float64)


def test_residual_after_two_rejected_siblings_hand_computed():
    """Children 1 and 3 tried as point masses at p = (.5, .3, .1, .1): child 1 is kept with
    p(1) = .3; rejected, p becomes (.5, 0, .1, .1) / .7; child 3 is kept with (.1 / .7) = 1/7;
    rejected, p becomes (.5, 0, .1, 0) / .6."""
    p = [0.5, 0.3, 0.1, 0.1]
    with mx.stream(mx.cpu):
        one, three = f64(np.eye(4)[1]), f64(np.eye(4)[3])
        assert float(np.array(acceptance_probability(f64(p)[1], one[1]))) == pytest.approx(0.3, abs=1e-15)
        p2 = residual(f64(p), one)
        assert np.allclose(np.array(p2), [5 / 7, 0.0, 1 / 7, 1 / 7], atol=1e-15)
        assert float(np.array(acceptance_probability(p2[3], three[3]))) == pytest.approx(1 / 7, abs=1e-15)
        p3 = residual(p2, three)
        assert np.allclose(np.array(p3), [5 / 6, 0.0, 1 / 6, 0.0], atol=1e-15)


def point_mass_law(p, children) -> np.ndarray:
    """P(emitted = x) when the children are tried in turn as point masses, by the rule's own
    functions in float64: accepted with p_i(x_i), else p_{i+1} = residual(p_i, one-hot)."""
    p = np.array(p, dtype=np.float64)
    out, reach = np.zeros_like(p), 1.0
    with mx.stream(mx.cpu):
        p_i = f64(p)
        for x in children:
            point = f64(np.eye(len(p))[x])
            accept = float(np.array(acceptance_probability(p_i[x], point[x])))
            out[x] += reach * accept
            reach *= 1 - accept
            p_i = residual(p_i, point)
        out += reach * np.array(p_i)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_recursive_rejection_over_point_masses_is_the_targets_draw(seed):
    """Whatever the children and their order, each id comes out with exactly p: trying them in
    turn is the same as drawing from p and following the child drawn."""
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(3, 9))
    p = rng.dirichlet(np.full(vocab, 0.5))
    children = list(rng.permutation(vocab)[: int(rng.integers(1, vocab + 1))])
    assert np.allclose(point_mass_law(p, children), p, atol=1e-12, rtol=0)


def one_hot(i, n=5):
    row = [0.0] * n
    row[i] = 1.0
    return row


#       root
#      /    \
#   1:2      2:1
#   |   \      \
#  3:3  4:0    5:4
TREE = TokenTree.of((2, 1, 3, 0, 4), (0, 0, 1, 1, 2))


def walk(tree, target_rows, params=SamplingParams(temp=1.0), seed=0):
    return walk_tree(tree, mx.log(mx.array(target_rows)), params, mx.random.key(seed))


def test_one_hot_walks_take_the_branch_the_target_takes():
    anything = one_hot(0)
    for seed in range(5):
        # the root's second child, its child, then the bonus after that leaf
        target = [one_hot(1), anything, one_hot(4), anything, anything, one_hot(3)]
        assert walk(TREE, target, seed=seed) == ([2, 5], 3)
        # the root's first child, then that one's second child
        target = [one_hot(2), one_hot(0), anything, anything, one_hot(1), anything]
        assert walk(TREE, target, seed=seed) == ([1, 4], 1)
        # no child at the root: the target's own id
        target = [one_hot(3)] + [anything] * 5
        assert walk(TREE, target, seed=seed) == ([], 3)


def test_greedy_follows_the_argmax():
    target_ids = [2, 0, 4, 1, 2, 1]
    assert TREE.follow(target_ids) == ([1, 4], 2)
    logits = mx.array([[5.0 if i == t else 0.0 for i in range(5)] for t in target_ids])
    assert walk_tree(TREE, logits, SamplingParams(), mx.random.key(0)) == ([1, 4], 2)


def test_a_chain_is_the_tree_whose_parents_count_up():
    chain = TokenTree.chain([4, 4, 2])
    assert chain.parents == (0, 1, 2) and chain.is_chain and chain.depth == 3
    assert not TREE.is_chain and TREE.depths == (0, 1, 1, 2, 2, 2)


def test_a_node_must_come_after_its_parent():
    with pytest.raises(ValueError):
        TokenTree.of((1, 2), (0, 2))


# The joint law of the first two emitted ids over trees of random shape and ids (any shape
# the drafter likes is exact), against p1(a) p2(b | a). With a spine, the root's first child
# is drawn from q1 and its own first child from q2(. | it): both tried by min(1, p/q).
VOCAB = 5
RNG = np.random.default_rng(7)
P1 = RNG.dirichlet(np.full(VOCAB, 0.6))
P2 = RNG.dirichlet(np.full(VOCAB, 0.6), size=VOCAB)
Q1 = RNG.dirichlet(np.full(VOCAB, 0.6))
Q2 = RNG.dirichlet(np.full(VOCAB, 0.6), size=VOCAB)
TRIALS = 4000


def random_tree(rng, *, spine: bool, biased: bool = False) -> tuple[TokenTree, np.ndarray, list[int], np.ndarray]:
    """Root children: (a drawn one, then) 1-3 distinct point masses; under each, 0-2 more (and
    under the drawn one its own drawn child first). `biased`: the drawn child is kept only
    when the draft was sure of it, a place that depends on the draw. Returns the tree, the
    target's rows after every node, the spine's nodes and their q rows."""
    ids, parents, spine_nodes, spine_rows = [], [], [], []
    first = int(rng.choice(VOCAB, p=Q1)) if spine else None
    if first is not None and not (biased and Q1[first] < Q1.max()):
        ids.append(first), parents.append(0), spine_nodes.append(1), spine_rows.append(Q1)
    for x in rng.permutation(VOCAB)[: int(rng.integers(1, 4))]:
        if int(x) != first:
            ids.append(int(x)), parents.append(0)
    for node in range(1, len(ids) + 1):
        if spine_nodes and node == 1:
            y = int(rng.choice(VOCAB, p=Q2[ids[0]]))
            ids.append(y), parents.append(1), spine_nodes.append(len(ids)), spine_rows.append(Q2[ids[0]])
        for y in rng.permutation(VOCAB)[: int(rng.integers(0, 3))]:
            if not any(parents[k] == node and ids[k] == int(y) for k in range(len(ids))):
                ids.append(int(y)), parents.append(node)
    tree = TokenTree.of(ids, parents)
    rows = [P1] + [P2[ids[k - 1]] if tree.depths[k] == 1 else np.full(VOCAB, 1 / VOCAB) for k in range(1, len(ids) + 1)]
    return tree, np.array(rows, dtype=np.float32), spine_nodes, np.array(spine_rows, dtype=np.float32)


def joint_law_statistic(*, spine: bool = False, shared_draws: bool = False, biased: bool = False) -> float:
    rng = np.random.default_rng(11)
    counts = Counter()
    walk_key = verify.node_choice
    for trial in range(TRIALS):
        tree, rows, spine_nodes, spine_rows = random_tree(rng, spine=spine, biased=biased)
        drawn = {tree.parents[n - 1]: (n, mx.array(q)) for n, q in zip(spine_nodes, spine_rows)}
        if shared_draws:  # one key at every node: the draws at a node and at its child are tied
            verify.node_choice = lambda logits, params, key, fixed=mx.random.key(trial), **kw: walk_key(
                logits, params, fixed, **kw
            )
        try:
            path, token = walk_tree(
                tree, mx.log(mx.array(rows)), SamplingParams(temp=1.0), mx.random.key(trial), drawn=drawn
            )
        finally:
            verify.node_choice = walk_key
        emitted = tree.path_ids(path) + [token]
        if len(emitted) == 1:  # the next round draws the second id from p2(. | first)
            emitted.append(int(rng.choice(VOCAB, p=P2[token])))
        counts[tuple(emitted[:2])] += 1
    expected = {(a, b): P1[a] * P2[a][b] for a in range(VOCAB) for b in range(VOCAB)}
    statistic, df = goodness_of_fit(counts, expected)
    return statistic / critical_value(df, 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("spine", [False, True], ids=["point-masses", "spine"])
def test_walks_over_trees_of_any_shape_keep_the_targets_joint_law(spine):
    assert joint_law_statistic(spine=spine) < 1


@pytest.mark.slow
def test_the_harness_catches_draws_shared_across_nodes():
    assert joint_law_statistic(shared_draws=True) > 1


@pytest.mark.slow
def test_the_harness_catches_a_drawn_child_kept_for_what_was_drawn():
    """A drawn child whose place depends on its draw (kept only when the draft was sure of
    it) is no sample of q: the rule's min(1, p/q) then favours it, and the law moves."""
    assert joint_law_statistic(spine=True, biased=True) > 1


def test_a_spine_child_accepted_is_taken_and_a_rejected_one_recovers():
    """Hand-made: a drawn child that the rule accepts is taken even where the target's draw
    at that row names another; a rejected one leaves the recovered id (never itself)."""
    tree = TokenTree.of((2, 1), (0, 0))  # node 1 (id 2) drawn, node 2 (id 1) a point mass
    assert tree.follow([1, 4, 4], {0: (1, True)}) == ([1], 4)
    assert tree.follow([1, 4, 4], {0: (1, False)}) == ([2], 4)
    assert tree.follow([3, 4, 4], {0: (1, False)}) == ([], 3)


def chain_outcome_law(p3: np.ndarray) -> dict[tuple, float]:
    """Leviathan et al.'s rule over a chain x1 ~ Q1, x2 ~ Q2(. | x1), by hand in float64:
    the probability of each (accepted drafts, emitted ids)."""
    law = Counter()
    for x1 in range(VOCAB):
        a1 = min(1.0, P1[x1] / Q1[x1])
        r1 = np.maximum(P1 - Q1, 0) / np.maximum(P1 - Q1, 0).sum()
        for x2 in range(VOCAB):
            drafted = Q1[x1] * Q2[x1][x2]
            a2 = min(1.0, P2[x1][x2] / Q2[x1][x2])
            r2 = np.maximum(P2[x1] - Q2[x1], 0) / np.maximum(P2[x1] - Q2[x1], 0).sum()
            for y in range(VOCAB):
                law[(0, (y,))] += drafted * (1 - a1) * r1[y]
                law[(1, (x1, y))] += drafted * a1 * (1 - a2) * r2[y]
                law[(2, (x1, x2, y))] += drafted * a1 * a2 * p3[y]
    return law


@pytest.mark.parametrize("rule", ["chain rule", "tree walk"])
def test_the_chain_rule_is_the_tree_walk_over_a_chain_whose_every_node_is_drawn(rule):
    """The two paths a round may take agree: a chain of two ids drawn from q, verified by the
    chain's rule (speculative_sample) or walked as a tree whose spine is the whole chain, is
    accepted and recovered with the same law, Leviathan et al.'s, computed by hand."""
    rng = np.random.default_rng(5)
    p3 = RNG.dirichlet(np.full(VOCAB, 0.6))
    counts = Counter()
    for trial in range(TRIALS):
        x1 = int(rng.choice(VOCAB, p=Q1))
        x2 = int(rng.choice(VOCAB, p=Q2[x1]))
        target = mx.array(np.array([P1, P2[x1], p3], dtype=np.float32))
        key = mx.random.key(trial)
        if rule == "chain rule":
            q = mx.array(np.array([Q1, Q2[x1]], dtype=np.float32))
            accepted, token = verify.speculative_sample(mx.array([x1, x2]), q, target, key)
            accepted, token = int(accepted.item()), int(token.item())
        else:
            chain = TokenTree.chain([x1, x2])
            drawn = {0: (1, mx.array(Q1.astype(np.float32))), 1: (2, mx.array(Q2[x1].astype(np.float32)))}
            path, token = walk_tree(chain, mx.log(target), SamplingParams(temp=1.0), key, drawn=drawn)
            accepted = len(path)
        counts[(accepted, (x1, x2)[:accepted] + (token,))] += 1
    statistic, df = goodness_of_fit(counts, chain_outcome_law(p3))
    assert statistic < critical_value(df, 1e-4)


def test_first_choices_follow_every_node_s_first_child():
    """Parents (0, 0, 1, 1, 2, 4): the root's first child is 1, 1's is 3, 3 has none."""
    tree = TokenTree.of([7, 8, 9, 10, 11, 12], [0, 0, 1, 1, 2, 4])
    assert tree.first_choices == (1, 3)
    assert TokenTree.chain([5, 6, 7]).first_choices == (1, 2, 3)
    assert TokenTree.chain([]).first_choices == ()


def test_a_level_is_read_only_while_its_frontier_covers_its_drafting_and_its_nodes():
    """LevelPrice(level .2, node .1, calibration .9, .5): children at depth 2 of frontier nodes
    worth .5 and .36 may add max(0, .5 * .5 - .1) + max(0, .5 * .36 - .1) = .15 + .08 = .23
    tokens, more than the level's .2; with .2 for the second, .15 + 0, less; a node worth no
    more than its verify adds nothing, however many there are; depths past those calibrated
    borrow the deepest."""
    price = LevelPrice(level=0.2, node=0.1, calibration=(0.9, 0.5))
    assert price.pays(depth=2, values=[0.5, 0.36])
    assert not price.pays(depth=2, values=[0.5, 0.2])
    # the same frontier at depth 1 adds .17 + .08 and pays; at depth 2 .05 + 0 and does not
    assert price.pays(depth=1, values=[0.3, 0.2]) and not price.pays(depth=2, values=[0.3, 0.2])
    assert not price.pays(depth=2, values=[0.2] * 50)  # .5 * .2 = .1: each exactly its verify
    assert price.pays(depth=3, values=[0.5, 0.36]) and not price.pays(depth=3, values=[0.5, 0.2])
    assert LevelPrice().pays(depth=4, values=[])  # nothing to pay for: the old "every level"
    flat = LevelPrice(level=0.2, calibration=())  # a flat curve, no calibration yet: v as it is
    assert flat.pays(depth=1, values=[0.1, 0.1]) and not flat.pays(depth=1, values=[0.1, 0.09])


def _grow(price, *, depth=4, temp=0.0):
    """A tree grown from fixed drafter rows over 4 ids (each level's rows the same): the head
    sure of id 0, at .7."""
    from mlxspec.decoding.carry import Carry
    from mlxspec.drafters.tree_growth import grow_tree

    row = mx.log(mx.array([0.7, 0.2, 0.06, 0.04]))
    levels_read = []

    def expand(growth, frontier):
        levels_read.append(len(frontier))
        return mx.broadcast_to(row, (len(frontier), 4))

    carry = Carry(params=SamplingParams(temp=temp), eos_ids=frozenset(), key=mx.random.key(0))
    drafts = grow_tree(row, expand, depth=depth, width=3, budget=32, carry=carry, price=price)
    assert drafts.levels == len(levels_read) + 1  # the first level comes from the caller's forward
    return drafts


@pytest.mark.parametrize("temp", [0.0, 0.7])
def test_a_tree_grows_only_the_levels_its_price_pays_for(temp):
    """Greedy, frontier values by level (surest three): .7 .2 .06, then .49 .14 .14, then .343
    .098 .098. With no price every level of four is read; with a level worth .3 tokens and
    each node .1 (calibration 1), level 2 may add .6 + .1 = .7 and is read, level 3 .39 + .04
    + .04 = .47 and is read, level 4 .243 and is not; a dear level reads the first alone, and
    under sampling the drawn spine stops where the levels stop."""
    assert _grow(None, temp=temp).levels == 4
    if not temp:
        priced = _grow(LevelPrice(level=0.3, node=0.1, calibration=(1.0,)))
        assert priced.levels == 3 and priced.tree.depth == 3
    dear = _grow(LevelPrice(level=5.0), temp=temp)
    assert dear.levels == 1 and dear.tree.depth == 1
    if temp:
        assert len(dear.spine) == 1


def test_at_temperature_0_the_drafter_s_own_chain_is_always_expanded():
    """Two children a level, two expanded: after the root (.5, .45, .05) the argmax 0 is unsure
    (.34, .33, .33) while 1 is sure (.5, .45): the surest two at depth 2 are 1's children
    (.225, .2025), not 0's first (.17). The chain of first choices, the drafter's own chain
    that the controller learns a chain's rates from, is expanded anyway, as deep as the tree."""
    from mlxspec.decoding.carry import Carry
    from mlxspec.drafters.tree_growth import grow_tree

    rows = {(): [0.5, 0.45, 0.05], (0,): [0.34, 0.33, 0.33], (1,): [0.5, 0.45, 0.05]}

    def row(path):
        return np.log(np.array(rows.get(tuple(path), [0.9, 0.05, 0.05]), dtype=np.float32))

    def expand(growth, frontier):
        return mx.array(np.stack([row([growth.candidates[n].token for n in growth.path(c)]) for c in frontier]))

    carry = Carry(params=SamplingParams(temp=0.0), eos_ids=frozenset(), key=mx.random.key(0))
    drafts = grow_tree(mx.array(row([])), expand, depth=3, width=2, budget=32, carry=carry)
    tree = drafts.tree
    assert tree.depth == 3 and drafts.levels == 3
    assert tree.path_ids(list(tree.first_choices)) == [0, 0, 0]
