"""One request's drafter: proposals from its own prompt and answer and from its namespace's
history (SuffixDecoding's two trees, as Arctic Inference's `SuffixDecodingCache.speculate`
compares its per-request and global ones)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from ...decoding.plan import HISTORY, NGRAM
from ...decoding.tree import TokenTree
from .index import MAX_MATCH, MIN_MATCH, HistoryIndex
from .proposals import Proposal, Speculation


class HistoryDrafter:
    """Proposals for one request at a time: from its own prompt and answer (`local`) and from
    its namespace's history; the better scored wins, the local one on a tie.

    Mirrors lookup.PromptLookup (`chain(gamma)` the most frequent path, `trie(max_nodes)`
    every continuation, `hear(ids)`, `source`) and adds `query` (the proposal with its scores), and a request's
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

    def chain(self, gamma: int) -> tuple[int, ...]:
        """Up to `gamma` ids: the most frequent path (a chain, as prompt lookup proposes)."""
        found = self.query(gamma, chain=True) if gamma > 0 else None
        return found.tree.ids if found else ()

    def trie(self, max_nodes: int) -> TokenTree | None:
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
