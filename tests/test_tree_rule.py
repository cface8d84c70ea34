"""The tree's acceptance rule alone, on hand-made distributions: the residual after several
rejected siblings by hand, the exact law of one node's children in float64, the tree walk's
one-hot cases, and the joint law of two emitted ids over trees drawn from the draft
(with a sabotaged rule that the same harness must catch)."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.tree import TokenTree
from mlxspec.verify import acceptance_probability, residual, tree_speculative_sample
from tests.chisquare import critical_value, goodness_of_fit


def f64(x):
    return mx.array(np.array(x, dtype=np.float64), dtype=mx.float64)


def without(q, drawn):
    """q with the ids already drawn removed and renormalised: what the next sibling is drawn from."""
    q = np.array(q, dtype=np.float64)
    q[list(drawn)] = 0
    return q / q.sum()


def test_residual_after_two_rejected_siblings_hand_computed():
    p = [0.5, 0.3, 0.2, 0.0]
    q = [0.4, 0.4, 0.1, 0.1]
    with mx.stream(mx.cpu):
        # child 1 drew id 1 from q and was rejected: max(0, p - q) = (.1, 0, .1, 0) / .2
        p2 = residual(f64(p), f64(q))
        assert np.allclose(np.array(p2), [0.5, 0.0, 0.5, 0.0], atol=1e-15)
        # child 2 drew id 0 from q without id 1, (.4, 0, .1, .1) / .6; kept with 0.5 / (2/3)
        q2 = without(q, [1])
        assert np.allclose(np.array(acceptance_probability(p2[0], f64(q2)[0])), 0.75, atol=1e-15)
        # rejected too: max(0, (.5, 0, .5, 0) - (2/3, 0, 1/6, 1/6)) = (0, 0, 1/3, 0) -> id 2 for sure
        p3 = residual(p2, f64(q2))
        assert np.allclose(np.array(p3), [0.0, 0.0, 1.0, 0.0], atol=1e-15)


def node_law(p, q, children: int, *, replace: bool = False) -> np.ndarray:
    """P(emitted = x) at one node whose `children` ids are drawn from q (without replacement
    unless `replace`), tried in turn by the rule's own functions, in float64."""
    p, q = np.array(p, dtype=np.float64), np.array(q, dtype=np.float64)

    def law(p_i, drawn, left):
        if left == 0:
            return p_i
        q_i = q if replace else without(q, drawn)
        with mx.stream(mx.cpu):
            accept = np.array(acceptance_probability(f64(p_i), f64(q_i)))
            p_next = np.array(residual(f64(p_i), f64(q_i)))
        out = np.zeros_like(p_i)
        for x in np.flatnonzero(q_i > 0):
            out[x] += q_i[x] * accept[x]
            out += q_i[x] * (1 - accept[x]) * law(p_next, drawn + [x], left - 1)
        return out

    return law(p, [], children)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("children", [1, 2, 3])
@pytest.mark.parametrize("replace", [False, True])
def test_a_nodes_children_reproduce_the_target_exactly(seed, children, replace):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(4, 7))
    p = rng.dirichlet(np.full(vocab, 0.4))
    q = rng.dirichlet(np.full(vocab, 0.4))
    assert np.allclose(node_law(p, q, children, replace=replace), p, atol=1e-12, rtol=0)


def test_point_masses_reproduce_the_target_exactly():
    """Prompt lookup's candidates (q one-hot each): accepted with p_i(x), then removed."""
    p = np.array([0.1, 0.5, 0.15, 0.25])
    with mx.stream(mx.cpu):
        p_i, out, reach = f64(p), np.zeros(4), 1.0
        for x in (1, 3):  # two candidates after one another
            point = np.eye(4)[x]
            a = float(np.array(acceptance_probability(p_i[x], f64(point)[x])))
            out[x] += reach * a
            reach *= 1 - a
            p_i = residual(p_i, f64(point))
        out += reach * np.array(p_i)
    assert np.allclose(out, p, atol=1e-15)


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


def walk(tree, draft_rows, target_rows, seed=0):
    path, token = tree_speculative_sample(
        tree, mx.array(tree.ids), mx.array(draft_rows), mx.array(target_rows), mx.random.key(seed)
    )
    return [n for n in path.tolist() if n], token.item()


def test_one_hot_walks_take_the_branch_the_target_takes():
    drafts = [one_hot(t) for t in TREE.ids]
    anything = one_hot(0)
    for seed in range(5):
        # the root's second child (its first rejected), its child, then the bonus after that leaf
        target = [one_hot(1), anything, one_hot(4), anything, anything, one_hot(3)]
        assert walk(TREE, drafts, target, seed) == ([2, 5], 3)
        # the root's first child, then that one's second child (after the first was rejected)
        target = [one_hot(2), one_hot(0), anything, anything, one_hot(1), anything]
        assert walk(TREE, drafts, target, seed) == ([1, 4], 1)
        # no child at the root: the target's own id
        target = [one_hot(3)] + [anything] * 5
        assert walk(TREE, drafts, target, seed) == ([], 3)


def test_greedy_path_matches_the_sampled_walk_on_one_hot_rows():
    drafts = [one_hot(t) for t in TREE.ids]
    target_ids = [2, 0, 4, 1, 2, 1]
    path, token = TREE.greedy_path(target_ids)
    assert (path, token) == ([1, 4], 2)
    assert walk(TREE, drafts, [one_hot(t) for t in target_ids]) == (path, token)


def test_a_chain_is_the_tree_whose_parents_count_up():
    chain = TokenTree.chain([4, 4, 2])
    assert chain.parents == (0, 1, 2) and chain.is_chain and chain.depth == 3
    assert not TREE.is_chain and TREE.depths == (0, 1, 1, 2, 2, 2)


def test_a_node_must_come_after_its_parent():
    with pytest.raises(ValueError):
        TokenTree.of((1, 2), (0, 2))


# The joint law of the first two emitted ids over trees drawn from the draft: at the root two
# children drawn without replacement from q1, under each two drawn from q2(. | its id).
VOCAB = 5
RNG = np.random.default_rng(7)
P1 = RNG.dirichlet(np.full(VOCAB, 0.6))
Q1 = RNG.dirichlet(np.full(VOCAB, 0.6))
P2 = RNG.dirichlet(np.full(VOCAB, 0.6), size=VOCAB)
Q2 = RNG.dirichlet(np.full(VOCAB, 0.6), size=VOCAB)
TRIALS = 4000


def drawn_tree(rng, *, sabotage: bool = False):
    """A depth-2 tree, two children drawn without replacement at the root and under each of
    them, with the rows each was drawn from and the target's rows after every node;
    `sabotage` declares q itself for every sibling (the removal of earlier ones forgotten)."""
    ids, parents, rows = [], [], []

    def draw_children(q, parent):
        drawn = []
        for _ in range(2):
            q_i = without(q, drawn)
            x = int(rng.choice(VOCAB, p=q_i))
            drawn.append(x)
            ids.append(x)
            parents.append(parent)
            rows.append(q if sabotage else q_i)

    draw_children(Q1, 0)  # nodes 1, 2
    first, second = ids
    draw_children(Q2[first], 1)  # nodes 3, 4
    draw_children(Q2[second], 2)  # nodes 5, 6
    after_leaf = np.full(VOCAB, 1 / VOCAB)  # the bonus's law does not enter the first two ids
    targets = [P1, P2[first], P2[second]] + [after_leaf] * 4
    return TokenTree.of(ids, parents), np.array(rows), np.array(targets)


def first_two(tree, path, token):
    emitted = tree.path_ids(path) + [token]
    return tuple(emitted[:2]) if len(emitted) >= 2 else None


def joint_law_statistic(*, sabotage: bool) -> tuple[float, float, Counter]:
    rng = np.random.default_rng(11)
    counts = Counter()
    for trial in range(TRIALS):
        tree, rows, targets = drawn_tree(rng, sabotage=sabotage)
        path, token = walk(tree, rows.astype(np.float32), targets.astype(np.float32), seed=trial)
        pair = first_two(tree, path, token)
        if pair is None:
            # nothing accepted at the root: the second id would come from the next round's
            # p2(. | first); draw it here from the same law, so the pair's law is the target's
            pair = (token, int(rng.choice(VOCAB, p=P2[token])))
        counts[pair] += 1
    expected = {(a, b): P1[a] * P2[a][b] for a in range(VOCAB) for b in range(VOCAB)}
    statistic, df = goodness_of_fit(counts, expected)
    return statistic, critical_value(df, 1e-4), counts


@pytest.mark.slow
def test_trees_drawn_from_the_draft_keep_the_targets_joint_law():
    statistic, critical, _ = joint_law_statistic(sabotage=False)
    assert statistic < critical


@pytest.mark.slow
def test_the_harness_catches_siblings_declared_with_replacement():
    statistic, critical, _ = joint_law_statistic(sabotage=True)
    assert statistic > critical
