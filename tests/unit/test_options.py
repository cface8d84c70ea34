"""Options as the API takes them: γ and the tree read by one parser (options.parse_count),
the same for the API, every command, a server request and bench (issues 39 and 40)."""

from __future__ import annotations

import pytest

from mlxspec.errors import InvalidOption
from mlxspec.measure.bench import BenchConfig
from mlxspec.options import AUTO, MOST_GAMMA, MOST_TREE, Options


@pytest.mark.parametrize(
    "value,message",
    [
        ("²", "must be a whole number from 0 to {most} or 'auto', got '²'"),  # isdigit, and int() a ValueError
        ("١٢", "must be a whole number from 0 to {most} or 'auto', got '١٢'"),  # int() read 12
        ("", "got ''"),
        (1.0, "got 1.0"),
        (True, "got True"),
        ("-1", "got '-1'"),
        ("+4", "got '+4'"),
        (100_000, "must be at most {most}, got 100000"),
        ("9" * 5000, "must be at most {most}, got 99999999999999999999… (5000 digits)"),  # int() refuses 5000 digits
    ],
)
@pytest.mark.parametrize("field,most", [("gamma", MOST_GAMMA), ("tree", MOST_TREE)])
def test_a_count_is_ascii_digits_within_its_bound_or_auto(field, most, value, message):
    for make in (
        lambda: Options.build(**{field: value}),
        lambda: Options().replace(**{field: value}),
        lambda: Options(**{field: value}),
    ):
        with pytest.raises(InvalidOption, match="^" + field) as refused:
            make()
        assert message.format(most=most) in str(refused.value)


def test_counts_read_the_same_everywhere():
    options = Options.build(gamma=" 0064 ", tree="AUTO")
    assert options.gamma == MOST_GAMMA and options.tree is AUTO
    assert Options(gamma="3", tree=MOST_TREE).gamma == 3
    config = BenchConfig(prompts=[], gammas=["2", 2, "auto", AUTO], temps=[0.0], trees=[" 8", "0"])
    assert config.gammas == [2, "auto"] and config.trees == [8, 0]
    with pytest.raises(InvalidOption, match="tree .* at most 256"):
        BenchConfig(prompts=[], gammas=[2], temps=[0.0], trees=[257])


def test_what_auto_chooses_stays_within_what_a_request_may_ask():
    """The bounds' reasons (options.py) rest on auto's own ceilings lying well inside them."""
    from mlxspec.drafting import ControllerConfig
    from mlxspec.drafting.policy import TREE_AUTO_MAX, TREE_LOOKUP_NODES

    assert ControllerConfig().max_gamma * 8 <= MOST_GAMMA
    assert max(TREE_AUTO_MAX, TREE_LOOKUP_NODES) * 8 <= MOST_TREE
