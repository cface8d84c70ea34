"""The responses kept for `previous_response_id`: each one's conversation (the items it was
asked with, earlier ones included, and the items it answered), under the API key that made
it, so that a response's id read by another key is not found. Items are kept in their
plain form (responses.plain_item: the fields the translation reads, nothing a client added),
and each key has its own bounds, by count and by size, the least recently used dropped
first, so one key's requests never push another's responses out; kept in memory only (a
restart forgets them). Plain Python, used on the event loop alone: sizes are counted where
the items are made (the offload thread), never by serialising a conversation here.
"""

from __future__ import annotations

import json
from collections import OrderedDict

MB = 1 << 20
MOST_RESPONSES = 1000  # a key's
MOST_BYTES = 64 * MB  # a key's, items counted as their JSON and ITEM_BYTES each
# what a kept item costs beyond its JSON (a dict and its strings' headers), so that a
# conversation of many empty items is counted near what it holds in memory
ITEM_BYTES = 256


def size_of(items: list[dict]) -> int:
    """What `items` count against a key's bytes."""
    return sum(len(json.dumps(item, ensure_ascii=False).encode()) + ITEM_BYTES for item in items)


class StoredResponses:
    def __init__(self, *, most: int = MOST_RESPONSES, most_bytes: int = MOST_BYTES):
        self.most, self.most_bytes = most, most_bytes
        self._kept: dict[str, OrderedDict[str, tuple[list[dict], int]]] = {}  # namespace -> id -> (items, size)
        self._bytes: dict[str, int] = {}

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._kept.values())

    def bytes_of(self, namespace: str) -> int:
        return self._bytes.get(namespace, 0)

    def put(self, namespace: str, response_id: str, items: list[dict], *, size: int) -> None:
        """Keep a response's conversation (`size`: size_of(items), counted by the caller); one
        larger than a key's whole share is not kept."""
        if size > self.most_bytes:
            return
        kept = self._kept.setdefault(namespace, OrderedDict())
        if (old := kept.pop(response_id, None)) is not None:
            self._bytes[namespace] -= old[1]
        kept[response_id] = (items, size)
        self._bytes[namespace] = self._bytes.get(namespace, 0) + size
        while len(kept) > self.most or self._bytes[namespace] > self.most_bytes:
            _, (_, dropped) = kept.popitem(last=False)
            self._bytes[namespace] -= dropped

    def get(self, namespace: str, response_id: str) -> tuple[list[dict], int] | None:
        """The conversation up to and with that response and its size, or None (unknown to
        this key)."""
        kept = self._kept.get(namespace)
        if kept is None or response_id not in kept:
            return None
        kept.move_to_end(response_id)
        items, size = kept[response_id]
        return list(items), size
