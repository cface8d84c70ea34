"""Which way sampled tree walks went, counted through the real walk (a spy, not a stand-in)."""

from __future__ import annotations

from collections import Counter


def count_point_mass_paths(monkeypatch) -> Counter:
    """From now on, every tree round's walk is counted by whether its accepted path took a
    point mass (True) or only drawn children (False)."""
    from mlxspec.decoding import rounds, verify

    taken = Counter()

    def walk_tree(tree, logits, params, key, *, drawn=None):
        path, next_id = verify.walk_tree(tree, logits, params, key, drawn=drawn)
        spine = {child for child, _ in (drawn or {}).values()}
        taken[any(node not in spine for node in path)] += 1
        return path, next_id

    monkeypatch.setattr(rounds, "walk_tree", walk_tree)
    return taken
