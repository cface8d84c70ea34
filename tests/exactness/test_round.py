"""One round for chains and trees (decoding/rounds.py): a chain is the tree whose nodes each
have one child, so the same ids proposed as a chain (the vectorised rule, one wait) and as a
trie (the walk over the tree) keep the same path, leave the same cache (Cursor.keep_path,
the one rollback) and emit the same ids."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.decoding.carry import Carry
from mlxspec.decoding.plan import Plan
from mlxspec.decoding.rounds import run_round
from mlxspec.decoding.sampling import SamplingParams
from mlxspec.decoding.tree import TokenTree
from tests.exactness.test_tree_attention import cursor_for, prompt_of, read_prompt

GREEDY = Carry(params=SamplingParams(), eos_ids=frozenset(), key=mx.random.key(0))


def greedy_ids(pair, prompt: list[int], count: int) -> list[int]:
    """The target's own next `count` ids, read one at a time."""
    cursor = cursor_for(pair)
    read_prompt(cursor, prompt)
    ids, fed = [], list(cursor.pending)
    for _ in range(count):
        ids.append(int(mx.argmax(cursor.forward(mx.array(fed, dtype=mx.uint32))[-1]).item()))
        fed = ids[-1:]
    return ids


def after_round(pair, prompt: list[int], plan: Plan):
    """A round of `plan` on a fresh cursor: its outcome, the cursor's ids, and the target's
    logits for its next id read from the cache the round left."""
    cursor = cursor_for(pair)
    read_prompt(cursor, prompt)
    outcome = run_round(cursor, None, plan, GREEDY)
    tokens, pending = list(cursor.tokens), list(cursor.pending)
    logits = cursor.forward(mx.array(cursor.pending, dtype=mx.uint32))[-1]
    return outcome, tokens, pending, np.array(logits.astype(mx.float32))


@pytest.mark.parametrize("arch", ["llama", "llama_sliding", "gemma3_text"])
@pytest.mark.parametrize("right", [0, 2, 4])  # drafts the target agrees with, leading
def test_a_chain_read_as_a_tree_keeps_what_the_chain_keeps(load_pair, arch, right):
    pair = load_pair(arch)
    prompt = prompt_of(1, 9, pair.target.width)
    own = greedy_ids(pair, prompt, 5)
    proposal = [*own[:4]]
    if right < 4:
        proposal[right] = (own[right] + 1) % pair.target.width  # one the target rejects
    proposal = tuple(proposal)
    chain = after_round(pair, prompt, Plan(proposal=proposal))
    tree = after_round(pair, prompt, Plan(proposal_tree=TokenTree.chain(proposal)))
    assert chain[0].nodes == 0 and tree[0].nodes == 4  # the fast path, and the walk
    assert chain[0].accepted == tree[0].accepted == right
    assert chain[0].emitted == tree[0].emitted == tuple(own[: right + 1])
    assert chain[1:3] == tree[1:3] == (prompt + own[:right], [own[right]])
    np.testing.assert_allclose(chain[3], tree[3], atol=1e-4)
