"""A tree read in one forward gives every node the logits its path gives read as a chain,
and the cache kept for the accepted path decodes on as if that path had been read alone:
on tiny random models of every family that takes trees, sliding windows wrapping inside
the block included, and with quantized KV caches."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.decoding.caches import CacheOptions
from mlxspec.decoding.cursor import Cursor
from mlxspec.decoding.tree import TokenTree
from tests.conftest import ARCH_SETTINGS

TREE_FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "phi3", "gemma3_text", "llama_sliding"]
CHAIN_FAMILIES = ["mamba", "qwen3_next", "falcon_h1"]

#            root
#        /    |    \
#       1     2     3
#     / |     |
#    4  5     6
#    |        |
#    7        8
#    |
#    9
PARENTS = (0, 0, 0, 1, 1, 2, 4, 6, 7)


def cursor_for(pair, *, options=CacheOptions()):
    target = pair.target
    return Cursor(target.model, "target", target.width, target.width, cache_options=options)


def read_prompt(cursor, prompt):
    cursor.sync(prompt)
    cursor.prefill()


def chain_logits(pair, prompt, path_ids, *, options=CacheOptions()) -> mx.array:
    """The target's logits after `prompt + path_ids`, read as a chain block after the prompt."""
    cursor = cursor_for(pair, options=options)
    read_prompt(cursor, prompt)
    return cursor.forward(mx.array(cursor.pending + path_ids, dtype=mx.uint32))[-1]


def random_tree(seed: int, width: int) -> TokenTree:
    rng = np.random.default_rng(seed)
    return TokenTree.of(rng.integers(3, width, len(PARENTS)), PARENTS)


def prompt_of(seed: int, length: int, width: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(100 + seed).integers(3, width, length)]


@pytest.mark.parametrize("options", [CacheOptions(), CacheOptions(kv_bits=8, kv_group_size=32)], ids=["kv", "kv8"])
@pytest.mark.parametrize("arch", TREE_FAMILIES)
@pytest.mark.parametrize("prompt_length", [5, 13])  # windows of 8: wrapping inside the block, and before it
def test_every_node_sees_what_its_path_would(load_pair, arch, prompt_length, options):
    if options.kv_bits and arch in ("gemma2", "phi3", "llama_sliding", "gemma3_text"):
        pytest.skip("quantized KV caches need 32-wide heads: the plain llama families cover them")
    pair = load_pair("llama_kv32" if options.kv_bits else arch)
    width = pair.target.width
    tree = random_tree(prompt_length, width)
    prompt = prompt_of(prompt_length, prompt_length, width)
    cursor = cursor_for(pair, options=options)
    assert cursor.why_no_trees() is None
    read_prompt(cursor, prompt)
    logits = cursor.forward_tree(mx.array(tree.ids), tree)
    for node in range(len(tree) + 1):
        expected = chain_logits(pair, prompt, tree.path_ids(tree.ancestors(node)), options=options)
        assert np.allclose(np.array(logits[node]), np.array(expected), atol=2e-4), f"node {node}"


@pytest.mark.parametrize("arch", TREE_FAMILIES)
@pytest.mark.parametrize("path", [[1, 4, 7, 9], [2, 6, 8], [3], [], [1, 5]])
def test_the_cache_kept_for_a_path_decodes_as_the_path_alone(load_pair, arch, path):
    pair = load_pair(arch)
    width = pair.target.width
    tree = random_tree(7, width)
    prompt = prompt_of(3, 6, width)
    cursor = cursor_for(pair)
    read_prompt(cursor, prompt)
    pending = list(cursor.pending)
    cursor.forward_tree(mx.array(tree.ids), tree)
    cursor.keep_tree_path(tree, path, tree.path_ids(path), pending=pending)
    assert cursor.tokens == prompt + tree.path_ids(path) and cursor.cache.holds(len(cursor.tokens))

    alone = cursor_for(pair)
    read_prompt(alone, prompt + tree.path_ids(path) + [5])
    assert alone.tokens == cursor.tokens
    follow = [5, 9, 11, 4, 20, 7, 3, 8, 12, 6]  # one id at a time, past the window of 8
    for token in follow:
        got = cursor.forward(mx.array([token], dtype=mx.uint32))[-1]
        expected = alone.forward(mx.array([token], dtype=mx.uint32))[-1]
        assert np.allclose(np.array(got), np.array(expected), atol=2e-4)


@pytest.mark.parametrize("arch", CHAIN_FAMILIES)
def test_recurrent_families_read_chains_only(load_pair, arch):
    cursor = cursor_for(load_pair(arch))
    assert "cannot hold a tree" in cursor.why_no_trees() or "chains only" in cursor.why_no_trees()


def test_a_layout_off_the_model_leaves_its_forward_as_before(load_pair):
    pair = load_pair("gemma3_text")
    prompt = prompt_of(1, 12, pair.target.width)
    before = chain_logits(pair, prompt, [4, 5, 6])
    cursor = cursor_for(pair)
    read_prompt(cursor, prompt)
    tree = random_tree(1, pair.target.width)
    cursor.forward_tree(mx.array(tree.ids), tree)
    after = chain_logits(pair, prompt, [4, 5, 6])
    assert np.array_equal(np.array(before), np.array(after))


def test_tree_settings_cover_windows():
    assert ARCH_SETTINGS["gemma3_text"] and ARCH_SETTINGS["llama_sliding"]
