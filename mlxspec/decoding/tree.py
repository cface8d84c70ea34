"""A round's proposals as a tree of token ids: plain values, no MLX.

Node 0 is the root: the last id emitted, which the target has yet to read. Proposals are
nodes 1..n; `parents[k - 1]` is node k's parent, always an earlier node. A chain is the tree
whose parents are 0, 1, 2, ... (SGLang's and vLLM's drafts are the same flat arrays: ids,
each node's parent, its depth as its position). Siblings are numbered in the order they were
drawn, and the rule (verify.py) tries them in that order; that order is part of what makes
the rule exact under sampling.

The target reads the nodes in one forward, each at the position of its depth and attending
to the context and its own ancestors only (tree_attention.py); afterwards its cache keeps
the accepted path alone (caches.py), as if that path had been decoded one id at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

ROOT = 0


@dataclass(frozen=True)
class Tree:
    """The shape of a round's proposals: node k's parent is parents[k - 1], always < k.
    A drafter's ids may still be on the device while the shape is known."""

    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        for node, parent in enumerate(self.parents, start=1):
            if not 0 <= parent < node:
                raise ValueError(f"node {node}'s parent {parent} does not come before it")

    def __len__(self) -> int:
        return len(self.parents)

    @cached_property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(len(self.parents)))

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of every node, the root's (0) first: node k sits at position root + depth."""
        depths = [0]
        for parent in self.parents:
            depths.append(depths[parent] + 1)
        return tuple(depths)

    @property
    def depth(self) -> int:
        """The longest path's length in proposals (a chain's gamma)."""
        return max(self.depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Each node's children, root first, in the order they were drawn."""
        kids: list[list[int]] = [[] for _ in range(len(self.parents) + 1)]
        for node, parent in enumerate(self.parents, start=1):
            kids[parent].append(node)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def first_choices(self) -> tuple[int, ...]:
        """The chain of first children from the root: a drafter's first choice at every step
        (under sampling its drawn spine), the chain it would have proposed alone."""
        chain, node = [], ROOT
        while self.children[node]:
            node = self.children[node][0]
            chain.append(node)
        return tuple(chain)

    def ancestors(self, node: int) -> list[int]:
        """node's ancestors and itself, the root excluded, root side first."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node - 1]
        return path[::-1]


@dataclass(frozen=True)
class TokenTree(Tree):
    """A tree with its ids on the host (prompt lookup, the history index, a tree drafter
    that decided its shape from its ids): node k's id is ids[k - 1]."""

    ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.ids) != len(self.parents):
            raise ValueError(f"{len(self.ids)} ids but {len(self.parents)} parents")

    @classmethod
    def chain(cls, ids) -> TokenTree:
        ids = tuple(int(t) for t in ids)
        return cls(tuple(range(len(ids))), ids)

    @classmethod
    def of(cls, ids, parents) -> TokenTree:
        return cls(tuple(parents), tuple(int(t) for t in ids))

    def path_ids(self, path: list[int]) -> list[int]:
        return [self.ids[node - 1] for node in path]

    def step(self, node: int, choice: int, *, drawn: int | None = None, accepted: bool = False) -> int | None:
        """Where the walk goes from `node`: to its `drawn` child (drawn from q) when the rule
        accepted it, else to the child whose id is the target's `choice` there (on a
        rejection, the id recovered from the residual, which is never the drawn one);
        None where no child is: `choice` is then the round's next id."""
        if drawn is not None and accepted:
            return drawn
        return next((c for c in self.children[node] if c != drawn and self.ids[c - 1] == choice), None)

    def follow(self, choices: list[int], drawn: dict[int, tuple[int, bool]] | None = None) -> tuple[list[int], int]:
        """The walk from the root over the target's decisions at every node, made at once:
        `choices[k]` its id after node k (its argmax, or a draw), `drawn[k]` node k's drawn
        child and whether the rule accepted it. Returns the accepted nodes and the target's
        next id after the last of them (verify.py says why the walk is exact)."""
        path, node, drawn = [], ROOT, drawn or {}
        while (child := self.step(node, choices[node], **_drawn_at(drawn, node))) is not None:
            path.append(child)
            node = child
        return path, choices[node]

    def subtree(self, keep: list[int]) -> TokenTree:
        """The tree of the nodes in `keep` (each one's parent kept too), renumbered in order."""
        kept = sorted(set(keep))
        index = {ROOT: ROOT} | {node: i for i, node in enumerate(kept, start=1)}
        missing = [n for n in kept if self.parents[n - 1] not in index]
        if missing:
            raise ValueError(f"nodes {missing} are kept without their parents")
        return TokenTree(tuple(index[self.parents[n - 1]] for n in kept), tuple(self.ids[n - 1] for n in kept))


def _drawn_at(drawn: dict[int, tuple[int, bool]], node: int) -> dict:
    return {"drawn": drawn[node][0], "accepted": drawn[node][1]} if node in drawn else {}


@dataclass(frozen=True)
class LevelPrice:
    """What reading one more level of a drafter's tree must earn, in the round's tokens: the
    level's drafting (`level`: a forward of the drafter over its frontier) and the verify of
    each node it adds (`node`: the verify curve's slope; near 0 where it is flat). A frontier
    node of value v (its path's probability) puts its children on the accepted path with
    probability at most c_d v (`calibration` by depth, as in `best_size`), and a child is kept
    only where that beats its verify: so a level can add at most the sum over the frontier of
    max(0, c_d v - node), and is read only while that covers `level`. On a steep curve (a
    CPU, a small target) deep levels whose nodes `best_size` would cut are not drafted."""

    level: float = 0.0
    node: float = 0.0
    calibration: tuple[float, ...] = ()

    def pays(self, *, depth: int, values: Sequence[float]) -> bool:
        """A level of children at `depth` under frontier nodes of these `values` pays."""
        factor = _at_depth(self.calibration, depth)
        return sum(max(0.0, factor * v - self.node) for v in values) >= self.level


def _at_depth(calibration: Sequence[float], depth: int) -> float:
    """The correction at `depth` (beyond those known, the deepest; none known: 1)."""
    if not calibration:
        return 1.0
    return calibration[depth - 1] if depth <= len(calibration) else calibration[-1]


def best_size(
    values: Sequence[float],
    depths: Sequence[int],
    *,
    calibration: Sequence[float],
    costs: Sequence[float],
    drafting: float,
) -> int:
    """Nodes to keep of the ranked candidates (`values`, `depths` of each), given the seconds
    of a round keeping k of them, `costs[k]` (verify and overhead; k up to len(costs) - 1):
    the k that maximises E[tau](k) / (drafting + costs[k]), E[tau](k) = 1 + sum_{i<k} c_d(i)
    v_i with `calibration` c_d by depth (drafting/tree_budget.py says why)."""
    best, best_rate, expected = 0, 1.0 / (drafting + costs[0]), 1.0
    for k in range(1, min(len(values), len(costs) - 1) + 1):
        depth = depths[k - 1]
        expected += values[k - 1] * _at_depth(calibration, depth)
        rate = expected / (drafting + costs[k])
        if rate > best_rate:
            best, best_rate = k, rate
    return best
