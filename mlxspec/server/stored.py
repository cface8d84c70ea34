"""The responses kept for `previous_response_id`: each one's conversation (the items it was
asked with, earlier ones included, and the items it answered), under the API key that made
it, so that a response's id read by another key is not found. Bounded by count and by bytes,
the least recently used dropped first; kept in memory only (a restart forgets them). Plain
Python, used on the event loop alone.
"""

from __future__ import annotations

import json
from collections import OrderedDict

MB = 1 << 20
MOST_RESPONSES = 1000
MOST_BYTES = 64 * MB


class StoredResponses:
    def __init__(self, *, most: int = MOST_RESPONSES, most_bytes: int = MOST_BYTES):
        self.most, self.most_bytes = most, most_bytes
        self._kept: OrderedDict[tuple[str, str], tuple[list[dict], int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, namespace: str, response_id: str, items: list[dict]) -> None:
        """Keep a response's conversation; one larger than the whole store is not kept."""
        size = len(json.dumps(items, ensure_ascii=False).encode())
        if size > self.most_bytes:
            return
        if (old := self._kept.pop((namespace, response_id), None)) is not None:
            self.bytes -= old[1]
        self._kept[(namespace, response_id)] = (items, size)
        self.bytes += size
        while len(self._kept) > self.most or self.bytes > self.most_bytes:
            _, (_, dropped) = self._kept.popitem(last=False)
            self.bytes -= dropped

    def get(self, namespace: str, response_id: str) -> list[dict] | None:
        """The conversation up to and with that response, or None (unknown to this key)."""
        key = (namespace, response_id)
        if key not in self._kept:
            return None
        self._kept.move_to_end(key)
        return list(self._kept[key][0])
