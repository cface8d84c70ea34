"""The acceptance rule alone, on hand-made distributions."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.decoding.verify import acceptance_probability, greedy_sample, residual, speculative_sample

THE, A, MANY = 0, 1, 2
P = [0.6, 0.1, 0.3]  # target
Q = [0.1, 0.7, 0.2]  # draft


def f64(x):
    return mx.array(np.array(x, dtype=np.float64), dtype=mx.float64)


def test_residual_hand_computed():
    # max(0, p - q) = (.5, 0, .1), normalised by .6
    with mx.stream(mx.cpu):
        got = residual(f64(P), f64(Q))
        assert np.allclose(np.array(got), [5 / 6, 0.0, 1 / 6], atol=1e-15)
        assert np.allclose(np.array(got), [0.833333, 0.0, 0.166667], atol=1e-6)


def test_acceptance_probability_hand_computed():
    with mx.stream(mx.cpu):
        got = np.array(acceptance_probability(f64(P), f64(Q)))
    assert np.allclose(got, [1.0, 0.1 / 0.7, 1.0], atol=1e-15)


def output_law(p, q):
    """P(emitted = x) for one drafted position, from the rule's own functions, in float64:
    the draft proposes y ~ q; it is kept with probability a(y), else x ~ residual."""
    with mx.stream(mx.cpu):
        accept = np.array(acceptance_probability(f64(p), f64(q)))
        fix = np.array(residual(f64(p), f64(q)))
    q = np.array(q, dtype=np.float64)
    rejected = float((q * (1 - accept)).sum())
    return q * accept + rejected * fix


def test_rule_reproduces_the_target_exactly():
    assert np.allclose(output_law(P, Q), P, atol=1e-15, rtol=0)


@pytest.mark.parametrize("seed", range(20))
def test_rule_reproduces_random_targets_exactly(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 12))
    p = rng.dirichlet(np.full(vocab, 0.3))
    q = rng.dirichlet(np.full(vocab, 0.3))
    q[rng.integers(vocab)] = 0.0  # ids the draft never proposes (filtered out by top-k, say)
    q /= q.sum()
    assert np.allclose(output_law(p, q), p, atol=1e-12, rtol=0)


def test_identical_distributions_accept_everything():
    assert np.allclose(output_law(P, P), P, atol=1e-15)
    with mx.stream(mx.cpu):
        assert np.array(acceptance_probability(f64(P), f64(P))).min() == 1.0


def one_hot(i, n=4):
    row = [0.0] * n
    row[i] = 1.0
    return row


def run_rule(drafted, draft_rows, target_rows, seed=0):
    n, token = speculative_sample(
        mx.array(drafted, dtype=mx.uint32), mx.array(draft_rows), mx.array(target_rows), mx.random.key(seed)
    )
    return n.item(), token.item()


def test_one_hot_perfect_match_takes_the_bonus():
    drafted = [2, 0, 3]
    for seed in range(10):
        assert run_rule(drafted, [one_hot(t) for t in drafted], [one_hot(t) for t in drafted] + [one_hot(1)], seed) == (
            3,
            1,
        )


def test_one_hot_early_mismatch_recovers_the_targets_id():
    drafted = [2, 0, 3]
    target = [one_hot(2), one_hot(1), one_hot(3), one_hot(0)]  # disagrees at position 1
    for seed in range(10):
        assert run_rule(drafted, [one_hot(t) for t in drafted], target, seed) == (1, 1)


def test_one_hot_all_rejected():
    drafted = [2, 2]
    target = [one_hot(0), one_hot(0), one_hot(0)]
    for seed in range(10):
        assert run_rule(drafted, [one_hot(2), one_hot(2)], target, seed) == (0, 0)


def test_a_nan_draft_row_is_rejected_and_the_target_sampled():
    """A draft whose logits overflowed proposes from a NaN row: never accepted (NaN > 0 is
    false; it once counted as q = 0 and was accepted with probability 1), and the id comes
    from p. The MTP review found it: a head with NaN weights emitted its own argmax."""
    nan = [float("nan")] * 3
    counts = np.zeros(3)
    for seed in range(2000):
        n, token = run_rule([0, 0], [nan, nan], [P, P, P], seed)
        assert n == 0
        counts[token] += 1
    assert np.allclose(counts / counts.sum(), P, atol=0.04)


def test_no_drafts_is_a_plain_sample_of_the_target():
    counts = np.zeros(3)
    for seed in range(2000):
        n, token = speculative_sample(
            mx.array([], dtype=mx.uint32), mx.zeros((0, 3)), mx.array([P]), mx.random.key(seed)
        )
        assert n.item() == 0
        counts[token.item()] += 1
    assert np.allclose(counts / counts.sum(), P, atol=0.04)


def test_single_position_frequencies_match_the_target():
    """Drafts drawn from q and run through the rule: emitted ids follow p (4000 draws,
    3-sigma bounds per id)."""
    n_draws = 4000
    draft_keys = mx.random.split(mx.random.key(7), n_draws)
    counts = np.zeros(3)
    for i in range(n_draws):
        drafted = mx.random.categorical(mx.log(mx.array(Q)), key=draft_keys[i])[None]
        n, token = speculative_sample(drafted.astype(mx.uint32), mx.array([Q]), mx.array([P, Q]), mx.random.key(i))
        counts[drafted.item() if n.item() == 1 else token.item()] += 1
    freq = counts / n_draws
    sigma = np.sqrt(np.array(P) * (1 - np.array(P)) / n_draws)
    assert np.all(np.abs(freq - P) < 3.5 * sigma), (freq, P)


@pytest.mark.parametrize(
    "drafted,target,expected",
    [
        ([1, 2, 3], [1, 2, 3, 0], (3, 0)),
        ([1, 2, 3], [1, 0, 3, 0], (1, 0)),
        ([1, 2, 3], [2, 2, 3, 0], (0, 2)),
    ],
)
def test_greedy_is_argmax_matching(drafted, target, expected):
    n, token = greedy_sample(mx.array(drafted, dtype=mx.uint32), mx.array(target, dtype=mx.uint32))
    assert (n.item(), token.item()) == expected


def test_greedy_matches_the_rule_with_one_hot_rows():
    for drafted in itertools.product(range(3), repeat=2):
        for target in itertools.product(range(3), repeat=3):
            greedy = greedy_sample(mx.array(drafted, dtype=mx.uint32), mx.array(target, dtype=mx.uint32))
            rule = run_rule(list(drafted), [one_hot(t, 3) for t in drafted], [one_hot(t, 3) for t in target])
            assert (greedy[0].item(), greedy[1].item()) == rule
