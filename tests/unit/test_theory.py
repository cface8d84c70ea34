"""The cost model on hand-computed values."""

import pytest

from mlxspec.drafting.theory import (
    cost_ratio,
    expected_tokens_by_position,
    expected_tokens_per_round,
    predicted_speedup,
    predicted_speedup_mean,
    predicted_speedup_of,
)
from mlxspec.stats import Stats


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


def test_mean_gamma_takes_tau_at_the_nearest_length_and_cost_at_the_mean():
    assert predicted_speedup_mean(0.7, 5.0, 0.1) == pytest.approx(predicted_speedup(0.7, 5, 0.1))
    assert predicted_speedup_mean(0.7, 2.4, 0.1, v=1.2) == pytest.approx(
        expected_tokens_per_round(0.7, 2) / (0.24 + 1.2)
    )
    assert predicted_speedup_mean(0.7, 0.3, 0.1) == pytest.approx(expected_tokens_per_round(0.7, 1) / 1.03)
    # auto's plain steps: half the rounds emit one token for one target step
    # tokens 0.5 * (1 + 0.7 + 0.49) + 0.5 = 1.595; cost 0.5 * (2 * 0.1 + 1) + 0.5 = 1.1
    assert predicted_speedup_mean(0.7, 2.0, 0.1, plain_share=0.5) == pytest.approx(1.595 / 1.1)
    assert predicted_speedup_mean(0.7, 2.0, 0.1, plain_share=1.0) == pytest.approx(1.0)


def test_alpha_out_of_range():
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.2, 3)


def test_a_runs_prediction_takes_the_mean_over_drafting_rounds_and_the_plain_share():
    auto = Stats(rounds=10, plain_rounds=6, drafted=12, tested=10, accepted=7, gamma="auto")
    assert auto.mean_gamma == 3.0 and auto.plain_share == 0.6
    assert predicted_speedup_of(auto, c=0.1) == pytest.approx(predicted_speedup_mean(0.7, 3.0, 0.1, plain_share=0.6))
    fixed = Stats(rounds=10, plain_rounds=6, drafted=12, tested=10, accepted=7, gamma=4)
    assert predicted_speedup_of(fixed, c=0.1) == pytest.approx(predicted_speedup_mean(0.7, 4, 0.1, plain_share=0.6))
    assert predicted_speedup_of(Stats(), c=0.1) is None
    assert cost_ratio(0.002, 0.02) == pytest.approx(0.1) and cost_ratio(None, 0.02) is None
