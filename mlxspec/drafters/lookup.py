"""Prompt-lookup drafting: propose the tokens that followed the most recent earlier
occurrence of the longest suffix of the text so far (prompt and output together).

Code edits, summaries, retrieval answers and agents repeat long stretches of their input;
there the proposals are free and often right. A proposal is a point mass, so the rule
accepts it with probability p(x) and, after a rejection, draws from p with x removed.
"""

from __future__ import annotations

from ..decoding.plan import NGRAM
from ..decoding.tree import TokenTree


class NGramIndex:
    """For each n in [min_n, max_n], where each n-gram last occurred with a token after it."""

    def __init__(self, max_n: int = 4, min_n: int = 2):
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}

    def extend(self, tokens) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 2  # the n-grams ending just before the new token now have a follower
            for n in range(self.min_n, self.max_n + 1):
                if end - n + 1 >= 0:
                    self._last[n][tuple(self.tokens[end - n + 1 : end + 1])] = end

    def match(self) -> tuple[int, int] | None:
        """(length of the longest matching suffix, end of its latest earlier occurrence)."""
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(self.tokens) >= n:
                end = self._last[n].get(tuple(self.tokens[-n:]))
                if end is not None:
                    return n, end
        return None

    def propose(self, gamma: int, min_match: int | None = None) -> list[int]:
        """Up to `gamma` ids that followed the longest match of at least `min_match` (default
        min_n) tokens; empty when there is none."""
        found = self.match()
        if found is None or found[0] < (min_match or self.min_n):
            return []
        _, end = found
        return self.tokens[end + 1 : end + 1 + gamma]


class PromptLookup:
    """Prompt-lookup proposals for one generation: an index over the prompt and output so far.
    Beside a draft model only matches of `min_match` ids or more are used (shorter ones are
    guesses the model makes better).

    A lookup, not a drafter (decoding/drafter.py): it keeps no cache (nothing to begin,
    settle or undo), its q is a point mass (no rows), and it proposes beside any drafter, so
    the drafting policy, not the round loop, asks it each round, for a `chain` of ids or a
    `trie` (drafting/policy.py's Lookup), and it `hear`s every id emitted. Its trie is its
    chain: it keeps one continuation per match."""

    source = NGRAM  # where its proposals come from (the history drafter names two)

    def __init__(self, prompt: list[int], *, min_match: int | None = None, index: NGramIndex | None = None):
        self.index = index or NGramIndex()
        self.index.extend(prompt)
        self.min_match = min_match

    def chain(self, gamma: int) -> tuple[int, ...]:
        return tuple(self.index.propose(gamma, self.min_match)) if gamma > 0 else ()

    def trie(self, max_nodes: int) -> TokenTree | None:
        found = self.chain(max_nodes)
        return TokenTree.chain(found) if found else None

    def hear(self, ids) -> None:
        """Ids emitted (by any means): the index reads them, as a drafter hears them."""
        self.index.extend(ids)
