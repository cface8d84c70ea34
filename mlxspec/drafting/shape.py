"""Whether a generation's rounds read trees: decided once, here, from the target's cursor,
the drafter, the options' `tree` and the temperature, and read by the policy (its plans),
prompt lookup (tries or chains) and the run's summary (why a tree asked for was drafted as
chains). Pure Python: the cursor and the drafter only answer `why_no_trees()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..options import Auto

TREE_EXTRA_DEPTH = 2  # `--tree auto` levels beyond the chain the controller would draft


class ReadsTrees(Protocol):
    """A target cursor or a drafter: None when it can read a tree in one forward, else why not."""

    def why_no_trees(self) -> str | None: ...


class Drafting(ReadsTrees, Protocol):
    # whether `--tree auto` grows its trees: a head's level costs one small forward; a
    # separate draft model's reads the frontier through all its layers, and measured here its
    # trees never beat its chain (docs/results/trees.md), so auto drafts chains there
    auto_trees: bool


@dataclass(frozen=True)
class TreeShape:
    """How a generation's rounds are shaped. `tree` 0: chains (every proposal, lookup's too);
    else a drafter grows trees of at most `tree` nodes (or AUTO) and lookup proposes every
    continuation it found as a trie."""

    tree: int | Auto = 0
    extra_depth: int = 0  # levels an auto tree reaches beyond the controller's chain (--gamma auto, greedy)
    chains_only: str | None = None  # why a tree asked for (--tree N) is drafted as chains

    @property
    def reads_trees(self) -> bool:
        return bool(self.tree)


CHAINS = TreeShape()


def tree_shape(
    *, target: ReadsTrees, drafter: Drafting | None, tree: int | Auto, greedy: bool, gamma_auto: bool
) -> TreeShape:
    """The one decision: trees when asked for (`tree`), the target can read them and the
    drafter (if any) can grow them, and, under auto, the drafter's trees pay (`auto_trees`).
    An auto tree reaches deeper than the controller's chain only at temperature 0: under
    sampling its drawn spine is kept whole, so a tree as deep as the chain."""
    if not tree:
        return CHAINS
    why = target.why_no_trees()
    if why is None and drafter is not None and drafter.why_no_trees() is not None:
        why = "this drafter proposes chains only"
    if why is not None:
        return TreeShape(chains_only=why if not isinstance(tree, Auto) else None)
    if isinstance(tree, Auto) and drafter is not None and not drafter.auto_trees:
        return CHAINS
    return TreeShape(tree=tree, extra_depth=TREE_EXTRA_DEPTH if greedy and gamma_auto else 0)
