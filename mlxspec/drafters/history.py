"""Drafting from everything already said: a suffix index over the prompts and answers a
session or a server has seen, proposing the continuations of the longest matching suffix as
a tree of candidates (SuffixDecoding, Oliaro et al., arXiv 2411.04975; shipped in Snowflake's
Arctic Inference, arctic_inference/suffix_decoding and csrc/suffix_decoding/suffix_tree.cc).

What it follows from SuffixDecoding:
- two indexes consulted each round: the current request's own prompt and answer (`local`)
  and the shared history of earlier requests; the proposal with the higher score wins (the
  local one on a tie: the current request weighs most), as Arctic's `SuffixDecodingCache.
  speculate` compares its per-request and global trees;
- every earlier occurrence of the matched suffix counts, and a node's probability is its
  count over its parent's (occurrences whose document ended at the parent count in the
  parent, so siblings may sum to less than one);
- the tree grows best first by the product of those probabilities along the path (the
  paper's D(N)), stops below `min_prob` (Arctic's `suffix_min_token_prob`, 0.1), and holds at
  most MAX_SPEC = factor x match length + offset nodes (the paper's adaptive MAX_SPEC = alpha
  x p; Arctic's `suffix_max_spec_factor` 1.0 and `suffix_max_spec_offset` 0.0), and at most
  what the caller asks for;
- the score of a tree is the sum of its nodes' path probabilities (the expected accepted
  tokens were the frequencies right); among the match lengths the occurrences allow, the
  best score wins, ties to the longer match (Arctic's `SuffixTree::speculate`).

What it does differently, and why: not a suffix tree. Arctic's tree inserts every suffix up
to depth 64, in C++; in Python a node object per suffix step would cost hundreds of bytes
per token and forgetting old documents would mean walking the tree. Instead:
- the tokens live in one ring buffer (int32), documents one after another, each opened by an
  end marker (-1) so that no match or continuation crosses from one document into another;
  the ring has room for `limit_tokens` slots (a marker takes one), and when it is full the
  oldest documents are forgotten whole (only a single document longer than the limit loses
  its own beginning). The arrays grow by doubling up to the limit and never past it, so a
  long-running server's memory is flat;
- for each n-gram order n in {min_match, powers of two up to max_match}, a hash chain as in
  zlib's deflate: `heads[bucket]` holds the latest position whose n-gram hashes to that
  bucket, `back[slot]` the distance to the previous one (uint32, 0: none). Chains are walked
  newest first and stop at the oldest position kept: eviction is moving one number;
- a query walks the highest order whose n-gram occurred (at most `max_occurrences` steps,
  newest first: a very common suffix is judged on its recent occurrences), measures each
  occurrence's exact match length against the context with one numpy comparison (hash
  collisions fall out there), and builds the trie of what followed the longest ones.

A request's prompt and answer join the history as one document when it ends (a later
request then matches across their border: the chat template's assistant header before an
answer), less what the prompt resends: an agent's prompt begins with its last prompt and
answer, and only what follows them is added (`add_turn`), so a conversation resent turn
after turn neither fills the history nor counts its old turns again.

Memory: 4 bytes per slot for the token, 4 per order for its chain link, and 8 per order per
head bucket (a bucket for every one to two slots): 44 bytes per token of the limit at a power
of two, 46 MB at the default 2**20 (`footprint()`; tests/unit/test_history_index.py holds a long
stream of documents to it with tracemalloc), plus the 4 latest turns kept whole. A query
costs about a hundred microseconds whatever the history's size (docs/drafting.md has the
figures): the chain walk and the trie are bounded by `max_occurrences` and the tree's
budget, not by the history.

One index per namespace (`HistoryStore`; the server's: a digest of the API key), optionally
kept on disk as .npz with a format version and a sha256 of its content, refused in one line
when it does not read back whole.

Plain Python and numpy: no MLX. The drafter here proposes point masses, as prompt lookup
does (lookup.py), so the rule's exactness is untouched by anything it proposes.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import os
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..decoding.plan import HISTORY, NGRAM
from ..decoding.tree import TokenTree
from ..errors import DamagedHistory

END = -1  # opens every document in the ring: no match reads back past it, no continuation on
DEFAULT_LIMIT_TOKENS = 1 << 20  # 46 MB per namespace (footprint())
MAX_MATCH = 32  # longest suffix compared (Arctic keeps 64 of match and speculation together)
MIN_MATCH = 2  # shorter matches are guesses
MAX_OCCURRENCES = 256  # chain steps per query: the newest occurrences of a common suffix
RECENT_TURNS = 4  # a new prompt is compared with this many latest prompts and answers (kept whole)
_FIRST_CAPACITY = 1 << 8  # then doubled as needed: a request's own index stays small
_MOST_LIMIT = 1 << 31  # chain links are uint32 distances
_MOST_MATCH = 1 << 10
FORMAT = "mlxspec-history/1"
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")

# 64-bit polynomial hashing of n-grams (wrapping uint64 arithmetic, numpy arrays only)
_MIX = 0x9E3779B97F4A7C15  # spreads small ids over the word
_BASE = 0x5851F42D4C957F2D  # odd, so invertible modulo 2**64
_BASE_INVERSE = pow(_BASE, -1, 1 << 64)
_SPREAD = 0xD6E8FEB86659FD93  # multiplicative hashing into a table of 2**bits buckets
_MASK = (1 << 64) - 1
_FEW = 16  # new ids linked in plain Python rather than numpy
_CHUNK = 1 << 16  # new ids linked per numpy pass
_OFFSET_BITS = 17  # a position within a pass (under 2 * _CHUNK)


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


@dataclass(frozen=True)
class Match:
    """Where the context's longest suffix (at least the order searched) occurred before."""

    positions: np.ndarray  # (k,) int64: each occurrence's last id, newest first
    lengths: np.ndarray  # (k,) int64: its match length against the context


def orders_for(min_match: int, max_match: int) -> tuple[int, ...]:
    """The n-gram orders indexed: min_match and the powers of two above it up to max_match."""
    powers = [1 << k for k in range(max_match.bit_length()) if min_match < 1 << k <= max_match]
    return (min_match, *powers)


def footprint(limit_tokens: int, *, min_match: int = MIN_MATCH, max_match: int = MAX_MATCH) -> int:
    """Bytes of a full index's arrays: per slot the token (4) and a link per order (4), and per
    order a table of 8-byte heads with a bucket for every one to two slots."""
    orders = len(orders_for(min_match, max_match))
    return limit_tokens * (4 + 4 * orders) + 8 * orders * _buckets(limit_tokens)


def _buckets(capacity: int) -> int:
    return 1 << max(6, (capacity - 1).bit_length() - 1)


class HistoryIndex:
    """Documents of token ids in a bounded ring, with hash chains of their n-grams.

    `limit_tokens` None: unbounded (one request's own prompt and answer)."""

    def __init__(
        self,
        *,
        limit_tokens: int | None = DEFAULT_LIMIT_TOKENS,
        max_match: int = MAX_MATCH,
        min_match: int = MIN_MATCH,
        max_occurrences: int = MAX_OCCURRENCES,
    ):
        if limit_tokens is not None and not 2 <= limit_tokens <= _MOST_LIMIT:
            raise ValueError(f"limit_tokens must be from 2 to {_MOST_LIMIT}, got {limit_tokens}")
        if not 1 <= min_match <= max_match <= _MOST_MATCH or max_occurrences < 1:
            raise ValueError(f"need 1 <= min_match <= max_match <= {_MOST_MATCH} and max_occurrences >= 1")
        self.limit = limit_tokens
        self.max_match, self.min_match, self.max_occurrences = max_match, min_match, max_occurrences
        self.orders = orders_for(min_match, max_match)
        self._recent: deque[np.ndarray] = deque(maxlen=RECENT_TURNS)  # whole prompts + answers, int32
        self._reset(min(_FIRST_CAPACITY, limit_tokens or _FIRST_CAPACITY))

    def _reset(self, capacity: int) -> None:
        self._capacity = capacity
        buckets = _buckets(capacity)  # one for every one to two slots
        self._shift = np.uint64(64 - buckets.bit_length() + 1)
        self._tokens = np.full(capacity, END, np.int32)
        self._back = np.zeros((len(self.orders), capacity), np.uint32)
        self._heads = np.full((len(self.orders), buckets), -1, np.int64)
        self._end = 0  # the position after the newest slot (positions count every slot ever written)
        self._first = 0  # the oldest position kept
        self._starts: deque[int] = deque()  # each kept document's marker position, oldest first

    # --- what it holds --------------------------------------------------------------------
    @property
    def documents(self) -> int:
        return len(self._starts)

    @property
    def size(self) -> int:
        """Slots kept: ids and one marker per document."""
        return self._end - self._first

    @property
    def nbytes(self) -> int:
        """The ring and its chains (the latest turns kept whole for add_turn come on top)."""
        return self._tokens.nbytes + self._back.nbytes + self._heads.nbytes

    def kept(self) -> list[list[int]]:
        """The documents kept, oldest first (the oldest may have lost its beginning)."""
        slots = self._tokens[np.arange(self._first, self._end) % self._capacity].tolist()
        documents, current = [], None
        for token in slots:
            if token == END:
                current = []
                documents.append(current)
            elif current is None:  # the oldest document's beginning is gone
                current = [token]
                documents.append(current)
            else:
                current.append(token)
        return documents

    # --- adding ---------------------------------------------------------------------------
    def add(self, ids: Iterable[int]) -> None:
        """A new document."""
        self._append(np.concatenate([[END], _checked(ids)]))

    def add_turn(self, prompt: Iterable[int], answer: Iterable[int], *, keep_prompt: bool = True) -> None:
        """A request's prompt and answer as one document, less what the prompt resends: an
        agent's prompt begins with its last prompt and answer, and only what follows them is
        added, with max_match ids before it (the context a later match needs). Without
        `keep_prompt`, only the prompt's last max_match ids go before the answer."""
        prompt, answer = _checked(prompt), _checked(answer)
        known = self._resent(prompt) if keep_prompt else len(prompt)
        self.add(np.concatenate([prompt[max(0, known - self.max_match) :], answer]))
        self._recent.append(np.concatenate([prompt, answer]))

    def _resent(self, prompt: np.ndarray) -> int:
        """How many of the prompt's first ids one of the latest turns began with."""
        longest = 0
        for text in self._recent:
            length = min(len(text), len(prompt))
            same = text[:length] == prompt[:length]
            longest = max(longest, length if same.all() else int(np.argmin(same)))
        return longest

    def extend(self, ids: Iterable[int]) -> None:
        """More ids of the newest document (a new one if there is none)."""
        values = _checked(ids)
        self._append(values if self._starts else np.concatenate([[END], values]))

    def _append(self, values: np.ndarray) -> None:
        """Write `values` (ids, END opening each new document) after the newest slot."""
        if not len(values):
            return
        start, end = self._end, self._end + len(values)
        if end - self._first > self._capacity and (self.limit is None or self._capacity < self.limit):
            self._grow(end - self._first)
        self._starts.extend(start + np.flatnonzero(values == END))
        floor = end - self._capacity  # positions below it are overwritten
        while len(self._starts) > 1 and self._starts[0] < floor:
            self._starts.popleft()  # forgotten whole, the oldest first
        self._first = max(self._first, floor, self._starts[0])
        written = max(start, floor)
        self._tokens[np.arange(written, end) % self._capacity] = values[written - start :]
        self._end = end
        self._link(max(written, self._first))

    def _grow(self, needed: int) -> None:
        """Larger arrays (doubling, up to the limit), everything linked again. Only before the
        first eviction: until the ring is at its limit nothing is forgotten."""
        capacity = 1 << (needed - 1).bit_length()
        kept = self._tokens[np.arange(self._first, self._end) % self._capacity]
        self._reset(capacity if self.limit is None else min(capacity, self.limit))
        self._append(kept)

    def _link(self, since: int) -> None:
        """Chain the n-grams ending at positions since.. end-1 into each order's buckets."""
        if since >= self._end:
            return
        if self._end - since <= _FEW:
            window_start = max(self._first, since - self.orders[-1] + 1)
            self._link_few(
                self._tokens[np.arange(window_start, self._end) % self._capacity].tolist(), window_start, since
            )
            return
        for chunk in range(since, self._end, _CHUNK):  # bounded temporaries (a rebuild links everything)
            self._link_many(chunk, min(chunk + _CHUNK, self._end))

    def _link_many(self, since: int, until: int) -> None:
        window_start = max(self._first, since - self.orders[-1] + 1)
        window = self._tokens[np.arange(window_start, until) % self._capacity].astype(np.int64)
        fresh = np.arange(since - window_start, len(window))
        runs = _runs(window)[fresh]  # ids since the last marker (or the window's start)
        prefix = _prefix_sums(window)
        for i, n in enumerate(self.orders):
            at = fresh[runs >= n]
            if len(at):
                self._chain(i, window_start + at, self._bucket(_hashes(prefix, n, at)))

    def _link_few(self, window: list[int], window_start: int, since: int) -> None:
        """_link for the few ids of a round, in plain Python (numpy's overhead would cost more
        than the work): the same prefix sums, hashes and links."""
        prefix, runs, total, run = [], [], 0, 0
        for at, token in enumerate(window):
            total = (total + ((token + 1) * _MIX & _MASK) * _INVERSE_POWERS[at]) & _MASK
            run = 0 if token == END else run + 1
            prefix.append(total)
            runs.append(run)
        shift, capacity = int(self._shift), self._capacity
        for at in range(since - window_start, len(window)):
            position = window_start + at
            for order, n in enumerate(self.orders):
                if runs[at] < n:
                    break  # a marker (or the window's start) is nearer than this order
                hashed = (_BASE_POWERS[at] * (prefix[at] - (prefix[at - n] if at >= n else 0))) & _MASK
                bucket = ((hashed * _SPREAD) & _MASK) >> shift
                distance = position - int(self._heads[order, bucket])
                self._back[order, position % capacity] = distance if distance < 1 << 32 else 0
                self._heads[order, bucket] = position

    def _chain(self, order: int, positions: np.ndarray, buckets: np.ndarray) -> None:
        """positions: (k,) ascending; each is linked to the previous one in its bucket."""
        offsets = positions - positions[0]  # < _CHUNK + the longest order: sorted with the bucket, in one key
        keys = np.sort(buckets << _OFFSET_BITS | offsets)
        buckets, positions = keys >> _OFFSET_BITS, positions[0] + (keys & ((1 << _OFFSET_BITS) - 1))
        opens = np.ones(len(buckets), bool)  # first of its bucket in this batch
        opens[1:] = buckets[1:] != buckets[:-1]
        previous = np.empty_like(positions)
        previous[1:] = positions[:-1]
        previous[opens] = self._heads[order, buckets[opens]]
        distance = positions - previous  # to a position gone (or -1: none), the walk stops there
        self._back[order, positions % self._capacity] = np.where(distance < 1 << 32, distance, 0).astype(np.uint32)
        closes = np.ones(len(buckets), bool)
        closes[:-1] = opens[1:]
        self._heads[order, buckets[closes]] = positions[closes]

    def _bucket(self, hashes: np.ndarray) -> np.ndarray:
        return ((hashes * np.uint64(_SPREAD)) >> self._shift).astype(np.int64)

    # --- querying -------------------------------------------------------------------------
    def match(self, context: Iterable[int]) -> Match | None:
        """The earlier occurrences of the context's longest suffix that something followed,
        each with its match length (at least the highest order that occurred, at most
        max_match): found through that order's chain, newest first."""
        context = _checked(context)[-self.max_match :]
        if len(context) < self.min_match or not self._starts:
            return None
        window = context.astype(np.int64)
        prefix, last = _prefix_sums(window), np.array([len(window) - 1])
        for i in reversed(range(len(self.orders))):
            n = self.orders[i]
            if len(window) < n:
                continue
            bucket = int(self._bucket(_hashes(prefix, n, last))[0])
            positions = self._followed(self._walk(i, bucket))
            if not len(positions):
                continue
            lengths = self._match_lengths(positions, window)
            found = lengths >= n
            if found.any():
                return Match(positions[found], lengths[found])
        return None

    def _walk(self, order: int, bucket: int) -> np.ndarray:
        back, capacity, first = self._back[order], self._capacity, self._first
        position, found = int(self._heads[order, bucket]), []
        while position >= first and len(found) < self.max_occurrences:
            found.append(position)
            step = int(back[position % capacity])
            if not step:
                break
            position -= step
        return np.array(found, np.int64)

    def _followed(self, positions: np.ndarray) -> np.ndarray:
        """Those with an id after them in their document (the context's own end has none)."""
        after = positions + 1
        inside = after < self._end
        return positions[inside & (self._tokens[after % self._capacity] != END)]

    def _match_lengths(self, positions: np.ndarray, window: np.ndarray) -> np.ndarray:
        """(k,) how many ids before and at each position equal the context's last ones."""
        back = np.arange(len(window))
        slots = (positions[:, None] - back[None, :]) % self._capacity  # (k, len(window))
        same = self._tokens[slots] == window[::-1][None, :]
        same &= back[None, :] <= (positions - self._first)[:, None]  # kept ids only
        return np.where(same.all(axis=1), len(window), np.argmin(same, axis=1))

    def _continuations(self, positions: np.ndarray, depth: int) -> list[tuple[int, ...]]:
        """What followed each position: up to `depth` ids, cut at its document's end."""
        ahead = positions[:, None] + 1 + np.arange(depth)[None, :]  # (k, depth)
        ids = np.where(ahead < self._end, self._tokens[ahead % self._capacity], END)
        alive = np.logical_and.accumulate(ids != END, axis=1)
        lengths = alive.sum(axis=1).tolist()
        return [tuple(row[:n]) for row, n in zip(ids.tolist(), lengths)]

    def propose(
        self,
        context: Iterable[int],
        *,
        max_nodes: int,
        speculation: Speculation = Speculation(),
        chain: bool = False,
        min_match: int | None = None,
        source: str = "history",
    ) -> Proposal | None:
        """The trie of what followed the context's longest suffix, at most `max_nodes` nodes
        and MAX_SPEC by the match length; a path (the most frequent child at each step) when
        `chain`; matches shorter than `min_match` ignored. None when nothing is proposed."""
        found = self.match(context) if max_nodes > 0 else None
        if found is None:
            return None
        best = None
        for length in sorted(set(found.lengths.tolist()), reverse=True):
            if length < (min_match or self.min_match):
                break
            budget = speculation.budget(length, max_nodes)
            if best is not None and budget <= best.score:
                break  # a tree of `budget` nodes scores at most `budget`
            positions = found.positions[found.lengths >= length]
            continuations = _tally(self._continuations(positions, budget))
            grown = grow(continuations, budget=budget, min_prob=speculation.min_prob, chain=chain)
            if grown is None:
                continue
            tree, probs, reach = grown
            proposal = Proposal(tree, probs, reach, length, len(positions), source)
            if best is None or proposal.score > best.score:
                best = proposal
        return best

    # --- on disk --------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """The documents kept, as .npz (no pickles) with a header: format and sha256."""
        documents = self.kept()
        lengths = np.array([len(d) for d in documents], "<i8")
        tokens = np.array([t for d in documents for t in d], "<i4")
        header = {"format": FORMAT, "documents": len(documents), "tokens": int(tokens.size)}
        header["sha256"] = _digest(lengths, tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as f:  # written whole, then put in place: a crash leaves the old file
            np.savez(f, header=np.frombuffer(json.dumps(header).encode(), np.uint8), lengths=lengths, tokens=tokens)
        os.replace(partial, path)

    def load(self, path: Path, *, vocab_size: int | None = None) -> None:
        """Add the documents of a file `save` wrote; DamagedHistory (one line) if it is not
        sound (or holds an id at or past `vocab_size`), and then nothing is added."""
        documents = read_documents(path, vocab_size=vocab_size)
        values = [np.concatenate([[END], d]) for d in documents]
        if values:
            self._append(np.concatenate(values))


def _checked(ids: Iterable[int]) -> np.ndarray:
    values = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64)
    if values.ndim != 1 or (len(values) and values.min() < 0):
        raise ValueError("token ids are a flat sequence of non-negative integers")
    return values.astype(np.int32)


def _runs(window: np.ndarray) -> np.ndarray:
    """(w,) how many ids end at each place since the last marker (or the window's start)."""
    at = np.arange(len(window))
    last_marker = np.maximum.accumulate(np.where(window == END, at, -1))
    return at - last_marker


_POWERS: dict[int, np.ndarray] = {}


def _powers(base: int, count: int) -> np.ndarray:
    """(count,) base**k modulo 2**64, from a table kept and doubled as needed."""
    table = _POWERS.get(base)
    if table is None or len(table) < count:
        table = np.full(max(count, 2 * len(table) if table is not None else 64), base, np.uint64)
        table[0] = 1
        table = np.cumprod(table, dtype=np.uint64)
        _POWERS[base] = table
    return table[:count]


# for _link_few: its windows hold at most _FEW new ids and the longest order's history
_BASE_POWERS = [pow(_BASE, k, 1 << 64) for k in range(_MOST_MATCH + _FEW)]
_INVERSE_POWERS = [pow(_BASE_INVERSE, k, 1 << 64) for k in range(_MOST_MATCH + _FEW)]


def _prefix_sums(window: np.ndarray) -> np.ndarray:
    """(w,) sum over j <= k of mix(id[j]) * BASE**-j, modulo 2**64."""
    mixed = (window.astype(np.uint64) + np.uint64(1)) * np.uint64(_MIX)
    return np.cumsum(mixed * _powers(_BASE_INVERSE, len(window)), dtype=np.uint64)


def _hashes(prefix: np.ndarray, n: int, at: np.ndarray) -> np.ndarray:
    """(len(at),) the hash of the n ids ending at each place `at` (>= n - 1) of a window:
    sum over j < n of mix(id[at - j]) * BASE**j, modulo 2**64, from its prefix sums."""
    before = np.where(at >= n, prefix[np.maximum(at - n, 0)], np.uint64(0))
    return _powers(_BASE, int(at.max()) + 1)[at] * (prefix[at] - before)


def _tally(continuations: list[tuple[int, ...]]) -> dict[tuple[int, ...], int]:
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


def _digest(lengths: np.ndarray, tokens: np.ndarray) -> str:
    return hashlib.sha256(lengths.astype("<i8").tobytes() + tokens.astype("<i4").tobytes()).hexdigest()


def read_documents(path: Path, *, vocab_size: int | None = None) -> list[np.ndarray]:
    """The documents of a history file, checked whole; DamagedHistory naming what is wrong.
    With `vocab_size`, an id the model cannot read is damage too (a file from a model with a
    larger vocabulary would send it into the target's forward)."""
    refuse = f"{path}: not a sound history file"
    try:
        with np.load(path, allow_pickle=False) as archive:
            if sorted(archive.files) != ["header", "lengths", "tokens"]:
                raise DamagedHistory(f"{refuse} (holds {sorted(archive.files)}, not header, lengths, tokens)")
            header = json.loads(archive["header"].tobytes().decode())
            lengths, tokens = archive["lengths"], archive["tokens"]
    except DamagedHistory:
        raise
    except Exception as e:  # a damaged file fails in many ways (zip, npy header, JSON, CRC): each is one line
        raise DamagedHistory(f"{refuse} ({type(e).__name__}: {_one_line(e)})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else None
        raise DamagedHistory(f"{refuse} (format {found!r}, expected {FORMAT!r})")
    if lengths.dtype != np.dtype("<i8") or tokens.dtype != np.dtype("<i4") or lengths.ndim != 1 or tokens.ndim != 1:
        raise DamagedHistory(f"{refuse} (arrays of the wrong type or shape)")
    if header.get("sha256") != _digest(lengths, tokens):
        raise DamagedHistory(f"{refuse} (its content does not match its sha256)")
    if (lengths < 0).any() or int(lengths.sum()) != tokens.size or (tokens < 0).any():
        raise DamagedHistory(f"{refuse} (document lengths or token ids out of range)")
    if vocab_size is not None and tokens.size and int(tokens.max()) >= vocab_size:
        raise DamagedHistory(f"{refuse} (id {int(tokens.max())} is past this model's {vocab_size} ids)")
    return np.split(tokens.astype(np.int32), np.cumsum(lengths)[:-1]) if len(lengths) else []


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:200] or "unreadable"


# --- one request ------------------------------------------------------------------------
class HistoryDrafter:
    """Proposals for one request at a time: from its own prompt and answer (`local`) and from
    its namespace's history; the better scored wins, the local one on a tie.

    Mirrors lookup.PromptLookup (`propose(gamma)` a chain of ids, `hear(ids)`) and adds
    `propose_tree(max_nodes)`, `query` (the proposal with its scores), and a request's
    lifetime: `begin(prompt)`, `end()`. At `end()` the prompt and the answer go into the
    history as one document, so a later request matches across their border (the chat
    template's assistant header before an answer). A prompt that begins with one of the
    newest documents (an agent's conversation, resent with one more turn) adds only what
    follows it, so resent turns neither fill the history nor count twice; `keep_prompts=False`
    keeps only the prompt's last `max_match` ids before the answer."""

    def __init__(
        self,
        history: HistoryIndex | None,
        *,
        speculation: Speculation = Speculation(),
        min_match: int | None = None,
        keep_prompts: bool = True,
        lock: threading.Lock | None = None,
    ):
        self.history, self.speculation, self.min_match, self.keep_prompts = (
            history,
            speculation,
            min_match,
            keep_prompts,
        )
        self._lock = lock or threading.Lock()
        self.max_match = history.max_match if history is not None else MAX_MATCH
        self.local: HistoryIndex | None = None
        self._prompt: list[int] = []
        self._answer: list[int] = []
        self._context: deque[int] = deque(maxlen=self.max_match)
        self.source = NGRAM  # where the latest proposal came from: the request's own text, or "history"

    def begin(self, prompt: Iterable[int]) -> HistoryDrafter:
        shape = self.history
        self.local = HistoryIndex(
            limit_tokens=None,
            max_match=shape.max_match if shape is not None else MAX_MATCH,
            min_match=shape.min_match if shape is not None else MIN_MATCH,
        )
        self._prompt, self._answer = [int(t) for t in prompt], []
        self.local.add(self._prompt)
        self._context.clear()
        self._context.extend(self._prompt)
        return self

    def hear(self, ids: Iterable[int]) -> None:
        """Ids emitted (by any means): both the answer and the local index read them."""
        ids = [int(t) for t in ids]
        self._answer.extend(ids)
        self._context.extend(ids)
        if self.local is not None:
            self.local.extend(ids)

    def query(self, max_nodes: int, *, chain: bool = False) -> Proposal | None:
        if self.local is None:
            raise RuntimeError("begin(prompt) before proposing")
        options = {"max_nodes": max_nodes, "speculation": self.speculation, "chain": chain, "min_match": self.min_match}
        context = list(self._context)
        local = self.local.propose(context, source="local", **options)
        shared = None
        if self.history is not None:
            with self._lock:
                shared = self.history.propose(context, source="history", **options)
        found = local if shared is None or (local is not None and local.score >= shared.score) else shared
        self.source = HISTORY if found is shared and found is not None else NGRAM
        return found

    def propose(self, gamma: int) -> tuple[int, ...]:
        """Up to `gamma` ids: the most frequent path (a chain, as prompt lookup proposes)."""
        found = self.query(gamma, chain=True) if gamma > 0 else None
        return found.tree.ids if found else ()

    def propose_tree(self, max_nodes: int) -> TokenTree | None:
        found = self.query(max_nodes) if max_nodes > 0 else None
        return found.tree if found else None

    def end(self) -> None:
        """The request is over (answered, stopped or failed): its text joins the history."""
        if self.local is None:
            return
        if self.history is not None:
            with self._lock:
                self.history.add_turn(self._prompt, self._answer, keep_prompt=self.keep_prompts)
        self.local, self._prompt, self._answer = None, [], []

    def __enter__(self) -> HistoryDrafter:
        return self

    def __exit__(self, *exc) -> None:
        self.end()


# --- one index per namespace ------------------------------------------------------------
DEFAULT_NAMESPACE = "default"  # a session's own, or a server's without API keys


def namespace_of(api_key: str | None) -> str:
    """A namespace for an API key that names nothing of the key: a digest of it."""
    return DEFAULT_NAMESPACE if api_key is None else "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:32]


class HistoryStore:
    """One HistoryIndex per namespace (the server: a digest of the API key; a session: one),
    so one namespace's history never drafts for another's. At most `max_namespaces` held,
    the least recently used dropped first (saved first when `folder` is set): memory is at
    most max_namespaces x limit_tokens x bytes_per_token().

    With `folder`, a namespace's index is read from `<folder>/<namespace>.npz` when first
    used and written by `save`; a damaged or foreign file is refused in one line (passed to
    `warn`), and that namespace starts empty (the next save replaces the file)."""

    def __init__(
        self,
        *,
        limit_tokens: int = DEFAULT_LIMIT_TOKENS,
        max_namespaces: int = 16,
        folder: Path | None = None,
        speculation: Speculation = Speculation(),
        keep_prompts: bool = True,
        max_match: int = MAX_MATCH,
        min_match: int = MIN_MATCH,
        warn: Callable[[str], None] = print,
        vocab_size: int | None = None,
    ):
        if max_namespaces < 1:
            raise ValueError("max_namespaces must be >= 1")
        self.limit_tokens, self.max_namespaces, self.folder = limit_tokens, max_namespaces, folder
        self.speculation, self.keep_prompts, self.warn = speculation, keep_prompts, warn
        self.vocab_size = vocab_size  # ids a file may hold (the target's width)
        self._shape = {"limit_tokens": limit_tokens, "max_match": max_match, "min_match": min_match}
        self._indexes: OrderedDict[str, HistoryIndex] = OrderedDict()
        self._lock = threading.Lock()

    def path(self, namespace: str) -> Path | None:
        return self.folder / f"{namespace}.npz" if self.folder is not None else None

    def index(self, namespace: str) -> HistoryIndex:
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"a namespace is 1-64 letters, digits, - or _, got {namespace!r}")
        with self._lock:
            if namespace in self._indexes:
                self._indexes.move_to_end(namespace)
                return self._indexes[namespace]
            index = HistoryIndex(**self._shape)
            path = self.path(namespace)
            if path is not None and path.exists():
                try:
                    index.load(path, vocab_size=self.vocab_size)
                except DamagedHistory as e:
                    self.warn(f"{e}; starting an empty history")
                    index = HistoryIndex(**self._shape)
            self._indexes[namespace] = index
            while len(self._indexes) > self.max_namespaces:
                dropped, old = self._indexes.popitem(last=False)
                self._save(dropped, old)
            return index

    def drafter(self, namespace: str = "default", *, min_match: int | None = None) -> HistoryDrafter:
        return HistoryDrafter(
            self.index(namespace),
            speculation=self.speculation,
            min_match=min_match,
            keep_prompts=self.keep_prompts,
            lock=self._lock,
        )

    def describe(self, namespace: str) -> dict:
        """What one namespace's index holds (nothing is made or read for it here)."""
        with self._lock:
            index = self._indexes.get(namespace)
            return {  # plain ints: numpy's do not go into JSON
                "documents": int(index.documents) if index is not None else 0,
                "slots": int(index.size) if index is not None else 0,
                "bytes": int(index.nbytes) if index is not None else 0,
                "limit_tokens": int(self.limit_tokens),
            }

    def save(self) -> None:
        """Every namespace held, to `folder` (nothing without one)."""
        with self._lock:
            for namespace, index in self._indexes.items():
                self._save(namespace, index)

    def _save(self, namespace: str, index: HistoryIndex) -> None:
        path = self.path(namespace)
        if path is not None:
            index.save(path)
