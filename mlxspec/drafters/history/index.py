"""The history index: documents of token ids in a bounded ring, with hash chains of their
n-grams, and the longest earlier match of a context's suffix (the package's docstring says
what it follows from SuffixDecoding and what it does differently)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import read_documents, write_documents
from .hashing import BASE_POWERS, FEW, INVERSE_POWERS, MASK, MIX, MOST_MATCH, SPREAD, hashes, prefix_sums
from .proposals import Proposal, Speculation, grow, tally

END = -1  # opens every document in the ring: no match reads back past it, no continuation on
DEFAULT_LIMIT_TOKENS = 1 << 20  # 46 MB per namespace (footprint())
MAX_MATCH = 32  # longest suffix compared (Arctic keeps 64 of match and speculation together)
MIN_MATCH = 2  # shorter matches are guesses
MAX_OCCURRENCES = 256  # chain steps per query: the newest occurrences of a common suffix
RECENT_TURNS = 4  # a new prompt is compared with this many latest prompts and answers (kept whole)
_FIRST_CAPACITY = 1 << 8  # then doubled as needed: a request's own index stays small
_MOST_LIMIT = 1 << 31  # chain links are uint32 distances
_CHUNK = 1 << 16  # new ids linked per numpy pass
_OFFSET_BITS = 17  # a position within a pass (under 2 * _CHUNK)


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
        if not 1 <= min_match <= max_match <= MOST_MATCH or max_occurrences < 1:
            raise ValueError(f"need 1 <= min_match <= max_match <= {MOST_MATCH} and max_occurrences >= 1")
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
        lengths, tokens = self.arrays()
        return [d.tolist() for d in np.split(tokens, np.cumsum(lengths)[:-1])] if len(lengths) else []

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The documents kept as (documents,) int64 lengths and their ids one after another,
        int32: what a file holds (copies, so a save can write them while the index goes on)."""
        slots = self._tokens[np.arange(self._first, self._end) % self._capacity]
        markers = np.flatnonzero(slots == END)
        headless = [-1] if len(slots) and slots[0] != END else []  # the oldest document's beginning is gone
        bounds = np.concatenate([headless, markers, [len(slots)]]).astype(np.int64)
        lengths = (np.diff(bounds) - 1).astype("<i8")
        return lengths, slots[slots != END].astype("<i4")

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
        if self._end - since <= FEW:
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
        prefix = prefix_sums(window)
        for i, n in enumerate(self.orders):
            at = fresh[runs >= n]
            if len(at):
                self._chain(i, window_start + at, self._bucket(hashes(prefix, n, at)))

    def _link_few(self, window: list[int], window_start: int, since: int) -> None:
        """_link for the few ids of a round, in plain Python (numpy's overhead would cost more
        than the work): the same prefix sums, hashes and links."""
        prefix, runs, total, run = [], [], 0, 0
        for at, token in enumerate(window):
            total = (total + ((token + 1) * MIX & MASK) * INVERSE_POWERS[at]) & MASK
            run = 0 if token == END else run + 1
            prefix.append(total)
            runs.append(run)
        shift, capacity = int(self._shift), self._capacity
        for at in range(since - window_start, len(window)):
            position = window_start + at
            for order, n in enumerate(self.orders):
                if runs[at] < n:
                    break  # a marker (or the window's start) is nearer than this order
                hashed = (BASE_POWERS[at] * (prefix[at] - (prefix[at - n] if at >= n else 0))) & MASK
                bucket = ((hashed * SPREAD) & MASK) >> shift
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
        return ((hashes * np.uint64(SPREAD)) >> self._shift).astype(np.int64)

    # --- querying -------------------------------------------------------------------------
    def match(self, context: Iterable[int]) -> Match | None:
        """The earlier occurrences of the context's longest suffix that something followed,
        each with its match length (at least the highest order that occurred, at most
        max_match): found through that order's chain, newest first."""
        context = _checked(context)[-self.max_match :]
        if len(context) < self.min_match or not self._starts:
            return None
        window = context.astype(np.int64)
        prefix, last = prefix_sums(window), np.array([len(window) - 1])
        for i in reversed(range(len(self.orders))):
            n = self.orders[i]
            if len(window) < n:
                continue
            bucket = int(self._bucket(hashes(prefix, n, last))[0])
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
            continuations = tally(self._continuations(positions, budget))
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
        """The documents kept, as a history file (files.py)."""
        write_documents(path, *self.arrays())

    def load(self, path: Path, *, vocab_size: int | None = None) -> None:
        """Add the documents of a file `save` wrote; DamagedHistory (one line) if it is not
        sound (or holds an id at or past `vocab_size`), and then nothing is added."""
        self.add_documents(read_documents(path, vocab_size=vocab_size))

    def add_documents(self, documents: Iterable[np.ndarray]) -> None:
        """Documents one after another (read from a file)."""
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
