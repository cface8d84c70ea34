"""The responses kept for previous_response_id (server/stored.py): bounded by count and by
bytes, least recently used forgotten first, each key's apart and within its own bounds."""

from __future__ import annotations

from mlxspec.server.stored import ITEM_BYTES, StoredResponses, size_of

ITEM = [{"type": "message", "role": "user", "content": "x" * 100}]
SIZE = size_of(ITEM)


def put(stored, namespace, response_id, items=ITEM):
    stored.put(namespace, response_id, items, size=size_of(items))


def test_an_item_counts_its_json_and_what_holding_it_costs():
    assert SIZE == len('{"type": "message", "role": "user", "content": "' + "x" * 100 + '"}') + ITEM_BYTES


def test_the_least_recently_used_goes_first_when_the_count_is_reached():
    stored = StoredResponses(most=2, most_bytes=10 * SIZE)
    put(stored, "a", "r1")
    put(stored, "a", "r2")
    assert stored.get("a", "r1") == (ITEM, SIZE)  # r1 used: r2 is now the oldest
    put(stored, "a", "r3")
    assert stored.get("a", "r2") is None and stored.get("a", "r1") == (ITEM, SIZE) and len(stored) == 2


def test_bytes_bound_the_store_and_one_too_large_is_not_kept():
    stored = StoredResponses(most=100, most_bytes=2 * SIZE)
    for name in ("r1", "r2", "r3"):
        put(stored, "a", name)
    assert [stored.get("a", n) is not None for n in ("r1", "r2", "r3")] == [False, True, True]
    assert stored.bytes_of("a") == 2 * SIZE
    put(stored, "a", "big", ITEM * 3)
    assert stored.get("a", "big") is None and stored.bytes_of("a") == 2 * SIZE


def test_another_key_does_not_find_a_response():
    stored = StoredResponses()
    put(stored, "a", "r1")
    assert stored.get("b", "r1") is None and stored.get("a", "r1") == (ITEM, SIZE)


def test_one_key_s_requests_never_push_out_another_s_responses():
    """The bounds were the store's: a thousand small requests from one key emptied it of
    another's (review finding). Each key has its own."""
    stored = StoredResponses(most=3, most_bytes=100 * SIZE)
    put(stored, "b", "kept")
    for i in range(50):
        put(stored, "a", f"r{i}")
    assert stored.get("b", "kept") == (ITEM, SIZE) and stored.bytes_of("a") == 3 * SIZE
