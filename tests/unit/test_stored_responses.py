"""The responses kept for previous_response_id (server/stored.py): bounded by count and by
bytes, least recently used forgotten first, each key's apart."""

from __future__ import annotations

import json

from mlxspec.server.stored import StoredResponses

ITEM = [{"type": "message", "role": "user", "content": "x" * 100}]
SIZE = len(json.dumps(ITEM).encode())


def test_the_least_recently_used_goes_first_when_the_count_is_reached():
    stored = StoredResponses(most=2, most_bytes=10 * SIZE)
    stored.put("a", "r1", ITEM)
    stored.put("a", "r2", ITEM)
    assert stored.get("a", "r1") == ITEM  # r1 used: r2 is now the oldest
    stored.put("a", "r3", ITEM)
    assert stored.get("a", "r2") is None and stored.get("a", "r1") == ITEM and len(stored) == 2


def test_bytes_bound_the_store_and_one_too_large_is_not_kept():
    stored = StoredResponses(most=100, most_bytes=2 * SIZE)
    for name in ("r1", "r2", "r3"):
        stored.put("a", name, ITEM)
    assert [stored.get("a", n) is not None for n in ("r1", "r2", "r3")] == [False, True, True]
    assert stored.bytes == 2 * SIZE
    stored.put("a", "big", ITEM * 3)
    assert stored.get("a", "big") is None and stored.bytes == 2 * SIZE


def test_another_key_does_not_find_a_response():
    stored = StoredResponses()
    stored.put("a", "r1", ITEM)
    assert stored.get("b", "r1") is None and stored.get("a", "r1") == ITEM
