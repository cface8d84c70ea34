"""The warp function: temperature, top-k, top-p, min-p, on hand-made logits and against
mlx-lm's own filters (so "top-p 0.9" means here what it means in mlx-lm)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlxspec.decoding.sampling import SamplingParams, sample, warp
from mlxspec.errors import InvalidOption

PROBS = [0.5, 0.3, 0.15, 0.05]
LOGITS = mx.array([math.log(p) for p in PROBS])


def kept(params):
    return (np.array(warp(LOGITS, params)) > 0).tolist()


def test_temperature_one_is_softmax():
    assert np.allclose(np.array(warp(LOGITS, SamplingParams(temp=1.0))), PROBS, atol=1e-6)


def test_temperature_sharpens_after_filtering():
    got = np.array(warp(LOGITS, SamplingParams(temp=0.5, top_k=2)))
    expected = np.array([0.5**2, 0.3**2, 0, 0])
    assert np.allclose(got, expected / expected.sum(), atol=1e-6)


def test_top_k():
    assert kept(SamplingParams(temp=1.0, top_k=2)) == [True, True, False, False]
    assert kept(SamplingParams(temp=1.0, top_k=4)) == [True] * 4


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    # mass before each token: 0, .5, .8, .95
    assert kept(SamplingParams(temp=1.0, top_p=0.8)) == [True, True, False, False]
    assert kept(SamplingParams(temp=1.0, top_p=0.81)) == [True, True, True, False]
    assert kept(SamplingParams(temp=1.0, top_p=0.4)) == [True, False, False, False]


def test_min_p_is_relative_to_the_top_token():
    assert kept(SamplingParams(temp=1.0, min_p=0.31)) == [True, True, False, False]  # floor .155
    assert kept(SamplingParams(temp=1.0, min_p=0.29)) == [True, True, True, False]  # floor .145
    assert kept(SamplingParams(temp=1.0, min_p=0.05)) == [True] * 4


def test_rows_are_warped_independently():
    rows = mx.stack([LOGITS, LOGITS[::-1]])
    got = np.array(warp(rows, SamplingParams(temp=1.0, top_k=1)))
    assert got[0].tolist() == [1, 0, 0, 0] and got[1].tolist() == [0, 0, 0, 1]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "options",
    [dict(top_p=0.9), dict(top_p=0.5), dict(min_p=0.05), dict(top_k=7), dict(top_p=0.8, min_p=0.02, top_k=20)],
)
def test_filters_agree_with_mlx_lm(seed, options):
    logits = mx.random.normal((64,), key=mx.random.key(seed)) * 3
    logprobs = logits - mx.logsumexp(logits)
    theirs = logprobs
    if "top_p" in options:
        theirs = apply_top_p(theirs, options["top_p"])
    if "min_p" in options:
        theirs = apply_min_p(theirs, options["min_p"])
    if "top_k" in options:
        theirs = apply_top_k(theirs, options["top_k"])
    ours = warp(logits, SamplingParams(temp=1.0, **options))
    assert (np.array(ours) > 0).tolist() == np.isfinite(np.array(theirs)).tolist()
    expected = np.array(mx.softmax(theirs))
    assert np.allclose(np.array(ours), expected, atol=1e-6)


def test_sample_is_reproducible_with_a_key():
    probs = mx.array([0.2, 0.3, 0.5])
    draws = [sample(probs, mx.random.key(3)).item() for _ in range(3)]
    assert len(set(draws)) == 1


@pytest.mark.parametrize(
    "options",
    [
        dict(temp=-0.1),
        dict(temp=float("nan")),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(min_p=1.0),
        dict(min_p=-0.1),
    ],
)
def test_invalid_settings_are_refused(options):
    with pytest.raises(InvalidOption):
        SamplingParams(**options)


@pytest.mark.parametrize("temp", [1e-45, 1e-39, 1.1e-38])
def test_a_temperature_below_float32s_normal_range_is_greedy(temp):
    """Below float32's smallest normal number (2^-126) a temperature is subnormal, 1/temp
    overflows, and sampling at it is greedy decoding in the limit: it is decoded greedily."""
    assert SamplingParams(temp=temp).greedy and SamplingParams(temp=temp).temp == 0
    assert not SamplingParams(temp=2.0**-126).greedy


@pytest.mark.parametrize("temp", [2.0**-126, 1e-37, 1e-30])
def test_a_tiny_temperature_puts_all_the_mass_on_the_top_id(temp):
    """Just above that bound the warp is still a distribution (never a NaN row), all on the
    top id, even when the top id's logprob is far from 0 (a hundred close rivals: -4.6,
    which divided by 2^-126 overflows float32)."""
    crowded = mx.array([[8.99] * 50 + [9.0] + [8.99] * 50 + [-20.0]])
    probs = np.array(warp(crowded, SamplingParams(temp=temp)))
    assert np.isfinite(probs).all() and probs[0, 50] == 1.0 and probs.sum() == 1.0


def test_a_top_p_below_float32s_range_keeps_the_top_id():
    assert kept(SamplingParams(temp=0.7, top_p=1e-300)) == [True, False, False, False]
    assert kept(SamplingParams(temp=0.7, top_p=1e-40)) == [True, False, False, False]
