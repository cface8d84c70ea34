"""The cost model on hand-computed values."""

import pytest

from mlxspec.theory import best_gamma, expected_tokens_by_position, expected_tokens_per_round, predicted_speedup


def test_expected_tokens_hand_computed():
    # (1 - 0.7^6) / 0.3 = (1 - 0.117649) / 0.3
    assert expected_tokens_per_round(0.7, 5) == pytest.approx(2.94117, abs=1e-4)
    assert expected_tokens_per_round(0.85, 5) == pytest.approx(4.1529, abs=1e-3)
    assert expected_tokens_per_round(0.0, 5) == 1.0
    assert expected_tokens_per_round(1.0, 5) == 6.0


def test_predicted_speedup_hand_computed():
    assert predicted_speedup(0.7, 5, 0.1) == pytest.approx(1.96, abs=0.005)
    assert predicted_speedup(0.85, 5, 0.1) == pytest.approx(2.77, abs=0.005)
    assert expected_tokens_per_round(0.85, 5) == pytest.approx(4.2, abs=0.05)
    assert predicted_speedup(0.85, 5, 0.1) == pytest.approx(2.8, abs=0.05)
    # a costly verify eats the gain
    assert predicted_speedup(0.7, 5, 0.1, v=2.0) == pytest.approx(2.94117 / 2.5, abs=1e-4)


def test_positions_with_equal_rates_match_the_closed_form():
    assert expected_tokens_by_position([0.7] * 5) == pytest.approx(expected_tokens_per_round(0.7, 5))
    assert expected_tokens_by_position([0.9, 0.5, 0.0]) == pytest.approx(1 + 0.9 + 0.45)


def test_best_gamma_prefers_standard_decoding_when_drafting_cannot_pay():
    flat = [1.0] * 10
    assert best_gamma(0.8, 0.1, flat, range(1, 9))[0] >= 4
    assert best_gamma(0.1, 0.5, flat, range(1, 9)) == (0, 1.0)
    linear = [float(k) for k in range(1, 11)]  # verify cost grows with tokens: no gain
    assert best_gamma(0.8, 0.1, linear, range(1, 9)) == (0, 1.0)


def test_alpha_out_of_range():
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.2, 3)
