"""The engine against standard decoding: greedy ids identical, the sampled law exactly the
target's, sessions, trees, grammars, caches and rollback, two ranks."""
