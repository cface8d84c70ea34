"""Whether a generation's rounds read trees is decided in one place (drafting/shape.py), from
the target's cursor, the drafter, `tree` and the temperature; prompt lookup's trie is its
chain, so the policy asks every lookup the same way."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mlxspec.drafters.lookup import PromptLookup
from mlxspec.drafting.shape import CHAINS, TREE_EXTRA_DEPTH, TreeShape, tree_shape
from mlxspec.options import AUTO


@dataclass
class Reader:
    """A cursor or drafter as the decision sees it: why it cannot read a tree (None: it can)."""

    why: str | None = None
    auto_trees: bool = True

    def why_no_trees(self) -> str | None:
        return self.why


def shape(target=Reader(), drafter=Reader(), *, tree=8, greedy=True, gamma_auto=True) -> TreeShape:
    return tree_shape(target=target, drafter=drafter, tree=tree, greedy=greedy, gamma_auto=gamma_auto)


def test_trees_when_asked_and_everyone_reads_them():
    assert shape() == TreeShape(tree=8, extra_depth=TREE_EXTRA_DEPTH)
    assert shape(drafter=None, tree=AUTO).tree is AUTO  # lookup alone grows tries
    assert shape(tree=0) is CHAINS and not CHAINS.reads_trees


@pytest.mark.parametrize(
    ("target", "drafter", "said"),
    [
        (Reader("a MambaCache cannot hold a tree's branches"), Reader(), "a MambaCache cannot hold a tree's branches"),
        (Reader(), Reader("its layer cannot"), "this drafter proposes chains only"),
    ],
)
def test_a_target_or_drafter_that_cannot_read_trees_drafts_chains_and_says_why_once(target, drafter, said):
    asked = shape(target, drafter, tree=8)
    assert not asked.reads_trees and asked.chains_only == said
    auto = shape(target, drafter, tree=AUTO)
    assert not auto.reads_trees and auto.chains_only is None  # auto asked for nothing to explain


def test_auto_drafts_chains_for_a_drafter_whose_trees_do_not_pay():
    assert shape(drafter=Reader(auto_trees=False), tree=AUTO) is CHAINS
    assert shape(drafter=Reader(auto_trees=False), tree=8).tree == 8  # asked for: trees


def test_auto_trees_go_deeper_than_the_chain_only_greedy_under_gamma_auto():
    assert shape(tree=AUTO).extra_depth == TREE_EXTRA_DEPTH
    assert shape(tree=AUTO, greedy=False).extra_depth == 0
    assert shape(tree=AUTO, gamma_auto=False).extra_depth == 0


def test_prompt_lookups_trie_is_its_chain():
    lookup = PromptLookup([1, 2, 3, 4, 5, 1, 2])
    assert lookup.trie(8).ids == lookup.chain(8) == (3, 4, 5, 1, 2)
    assert lookup.trie(8).is_chain and PromptLookup([1, 2]).trie(8) is None
