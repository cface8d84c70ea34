"""What the index proposes: the trie of the continuations of a matched suffix, grown best
first by path probability and cut by SuffixDecoding's MAX_SPEC (Oliaro et al., arXiv
2411.04975; Arctic Inference's `suffix_max_spec_factor`, `suffix_min_token_prob`)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from ...decoding.tree import TokenTree


@dataclass(frozen=True)
class Speculation:
    """How far to speculate from a match (SuffixDecoding's MAX_SPEC and Arctic's defaults)."""

    factor: float = 1.0  # MAX_SPEC = factor x match length + offset (the paper's alpha)
    offset: float = 0.0
    min_prob: float = 0.1  # no node whose path probability is lower

    def __post_init__(self) -> None:
        if not self.factor > 0 or not 0 <= self.min_prob <= 1:
            raise ValueError("need factor > 0 and 0 <= min_prob <= 1")

    def budget(self, match_length: int, max_nodes: int) -> int:
        return max(0, min(max_nodes, int(self.factor * match_length + self.offset + 1e-6)))


@dataclass(frozen=True)
class Proposal:
    """The continuations of a matched suffix as a trie, with their frequencies."""

    tree: TokenTree
    probs: tuple[float, ...]  # node k: its count over its parent's count
    reach: tuple[float, ...]  # node k: the product of probs along its path (the paper's D(N))
    match_length: int  # ids of the context matched
    occurrences: int  # earlier occurrences the trie was built from
    source: str  # "local" (this request's prompt and answer) or "history"

    @property
    def score(self) -> float:
        """Expected accepted ids, were the frequencies the target's (SuffixDecoding's score)."""
        return sum(self.reach)


def tally(continuations: list[tuple[int, ...]]) -> dict[tuple[int, ...], int]:
    """Distinct continuations with their counts, in order of first (newest) occurrence."""
    counts: dict[tuple[int, ...], int] = {}
    for row in continuations:
        counts[row] = counts.get(row, 0) + 1
    return counts


def grow(
    continuations: dict[tuple[int, ...], int], *, budget: int, min_prob: float, chain: bool = False
) -> tuple[TokenTree, tuple[float, ...], tuple[float, ...]] | None:
    """The trie of `continuations` (each with its count), grown best first by path probability
    (SuffixDecoding's greedy expansion), at most `budget` nodes, none whose path probability is
    below `min_prob`; siblings most frequent first (ties: the newest first). Returns the tree,
    each node's probability given its parent, and its path probability."""
    ids, parents, probs, reach = [], [], [], []
    frontier: list[tuple] = []
    drawn = itertools.count()  # the heap's tie-break: first offered, first taken

    def offer(node: int, rows: dict[tuple[int, ...], int], depth: int, node_reach: float) -> None:
        total = sum(rows.values())  # rows through the node, those ending there included
        children: dict[int, dict[tuple[int, ...], int]] = {}
        for row, count in rows.items():
            if depth < len(row):
                children.setdefault(row[depth], {})[row] = count
        ranked = sorted(((sum(sub.values()), token, sub) for token, sub in children.items()), key=lambda c: -c[0])
        for count, token, sub in ranked[:1] if chain else ranked:
            prob = count / total
            if node_reach * prob < min_prob:
                break  # the rest are rarer still
            heapq.heappush(frontier, (-node_reach * prob, next(drawn), node, token, prob, sub, depth + 1))

    offer(0, continuations, 0, 1.0)
    while frontier and len(ids) < budget:
        negative_reach, _, parent, token, prob, rows, depth = heapq.heappop(frontier)
        ids.append(token)
        parents.append(parent)
        probs.append(prob)
        reach.append(-negative_reach)
        offer(len(ids), rows, depth, -negative_reach)
    if not ids:
        return None
    return TokenTree.of(ids, parents), tuple(probs), tuple(reach)
