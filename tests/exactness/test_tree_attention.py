"""A tree read in one forward gives every node the logits its path gives read as a chain,
and the cache kept for the accepted path decodes on as if that path had been read alone:
on tiny random models of every family that takes trees, sliding windows wrapping inside
the block included, and with quantized KV caches."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.decoding.caches import CacheOptions
from mlxspec.decoding.cursor import Cursor, path_rows
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
    block = len(pending) + len(tree)
    mark = cursor.cache.mark(reads=block)
    cursor.forward_tree(mx.array(tree.ids), tree)
    kept = path_rows(len(pending), path)
    assert cursor.keep_path(block=block, kept=kept, ids=pending + tree.path_ids(path), mark=mark) == []
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


# rope_scaling of each kind mlx-lm builds: (config, whether its rows take their own positions)
ROPE_SCALINGS = [
    (None, True),
    ({"type": "linear", "factor": 2.0}, True),
    (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        True,
    ),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, True),
    (
        {
            "type": "longrope",
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 64,
        },
        True,
    ),
    ({"type": "dynamic", "factor": 2.0}, False),
]


@pytest.mark.parametrize("scaling, by_row", ROPE_SCALINGS, ids=lambda v: str(v)[:20])
def test_a_rope_places_tree_rows_as_single_steps_or_is_refused(scaling, by_row):
    """The rotary embeddings listed as taking a position per row give each row what a single
    step at that position gives; any other is named by why_not, and its targets draft chains."""
    from mlx_lm.models.rope_utils import initialize_rope

    from mlxspec.decoding import tree_attention

    rope = initialize_rope(8, 10000.0, False, scaling, max_position_embeddings=256)
    assert (type(rope).__name__ in tree_attention.ROPES_BY_ROW) == by_row
    if not by_row:
        return
    plain = type(rope)
    slot = tree_attention.TreeSlot()
    rope.__class__ = tree_attention._tree_rope_class(plain)
    object.__setattr__(rope, "_mlxspec_tree", slot)
    x = mx.random.normal((1, 2, 4, 8), key=mx.random.key(0))
    slot.layout = tree_attention.TreeLayout.from_parents(start=300, parents=[-1, 0, 0, 1])
    rows = rope(x, 300)
    single = [plain.__call__(rope, x[:, :, i : i + 1], p)[:, :, 0] for i, p in enumerate(slot.layout.positions)]
    assert np.allclose(np.array(rows), np.array(mx.stack(single, axis=2)), atol=1e-5)


def test_a_target_whose_rope_reads_one_offset_drafts_chains_and_stays_exact(factory):
    import mlxspec
    from mlxspec.generation import Session

    path = factory.model(
        "llama-dynamic",
        arch="llama",
        seed=1,
        head_scale=4.0,
        overrides={"rope_scaling": {"type": "dynamic", "factor": 2.0}},
    )
    pair = mlxspec.load_pair(str(path), "ngram")
    assert "DynamicNTKScalingRoPE" in Session(pair).target.why_no_trees()
    prompt = [10, 11, 12, 13, 10, 11, 12, 14, 10, 11, 12, 15, 10, 11, 12]  # several continuations: a trie
    standard = mlxspec.generate(pair, prompt, max_tokens=20, gamma=0).tokens
    for tree in ("auto", 8):
        result = mlxspec.generate(pair, prompt, max_tokens=20, gamma=4, tree=tree)
        assert result.tokens == standard and result.stats.tree_rounds == 0
