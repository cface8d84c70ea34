"""Cache rollback, layer type by layer type, against a fresh cache fed the kept ids."""

from __future__ import annotations

import mlx.core as mx
import pytest

import mlxspec
from mlxspec import Done, Round
from mlxspec.decoding.caches import CacheOptions, CacheRollbackError, KeptRotatingKVCache, ModelCache, make_cache
from mlxspec.errors import InvalidOption, UnsupportedCache
from mlxspec.generation import Session
from tests.conftest import interrupt_after

IDS = list(range(30, 60))


def feed(model, cache, ids, one_by_one=False):
    chunks = [[t] for t in ids] if one_by_one else [ids]
    for chunk in chunks:
        logits = model(mx.array(chunk)[None], cache=cache.layers)
        cache.length += len(chunk)
    return logits[0, -1]


def reference(model, ids, **options):
    """Logits after `ids`, fed one by one into a fresh cache: how decoding sees them."""
    return feed(model, make_cache(model, **options), ids, one_by_one=True)


def assert_same_next(model, cache, kept, **options):
    probe = [7]
    got = feed(model, cache, probe)
    want = reference(model, kept + probe, **options)
    assert mx.allclose(got, want, atol=1e-4).item(), float(mx.abs(got - want).max())


@pytest.mark.parametrize("arch", ["gemma3_text", "llama_sliding"])
def test_wrapped_window_trims_after_a_block(load_pair, arch):
    """A multi-token block leaves a wrapped window in time order: slicing is exact."""
    model = load_pair(arch).target.model
    cache = make_cache(model)
    feed(model, cache, IDS[:20], one_by_one=True)  # window 8: wrapped twice over
    mark = cache.mark()
    feed(model, cache, IDS[20:26])  # a verify block of 6
    assert cache.rewind(22, mark) == 0  # keep 2 of the block: a plain trim
    assert cache.length == 22
    assert_same_next(model, cache, IDS[:22])


@pytest.mark.parametrize("arch", ["gemma3_text", "llama_sliding"])
def test_wrapped_window_after_single_steps_is_restored(load_pair, arch):
    """After single-token writes the overwritten rows are gone: restore the mark, re-read."""
    model = load_pair(arch).target.model
    cache = make_cache(model)
    feed(model, cache, IDS[:20], one_by_one=True)
    mark = cache.mark()
    feed(model, cache, IDS[20:24], one_by_one=True)  # draft-style steps
    assert cache.rewind(21, mark) == 1  # back to the mark; one id to read again
    assert cache.length == 20
    feed(model, cache, IDS[20:21])
    assert_same_next(model, cache, IDS[:21])


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba"])
def test_recurrent_state_is_restored_and_reread(load_pair, arch):
    model = load_pair(arch).target.model
    cache = make_cache(model)
    feed(model, cache, IDS[:10])
    mark = cache.mark()
    feed(model, cache, IDS[10:15])
    assert cache.rewind(12, mark) == 2
    feed(model, cache, IDS[10:12])
    assert_same_next(model, cache, IDS[:12])


def test_plain_kv_cache_trims(load_pair):
    model = load_pair("llama").target.model
    cache = make_cache(model)
    feed(model, cache, IDS[:10])
    mark = cache.mark()
    assert mark.states == {}  # nothing to snapshot: trimming is enough
    feed(model, cache, IDS[10:15])
    assert cache.rewind(11, mark) == 0
    assert_same_next(model, cache, IDS[:11])


def test_a_layer_that_disagrees_is_caught(load_pair):
    model = load_pair("llama").target.model
    cache = make_cache(model)
    feed(model, cache, IDS[:10])
    cache.layers[1].offset += 1  # a layer silently holding one more token
    with pytest.raises(CacheRollbackError, match="layer 1"):
        cache.trim_to(5)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next", "deepseek_v32", "baichuan_m1"])
def test_interrupted_generation_leaves_a_usable_session(load_pair, arch):
    """Ctrl-C at arbitrary moments (a real SIGINT): the stream ends with Done('interrupted')
    and the same session then generates exactly what a fresh one would."""
    pair = load_pair(arch)
    prompt = IDS[:12]
    expected = mlxspec.generate(pair, prompt + [5], max_tokens=24, gamma=3).tokens
    session = Session(pair)
    for delay in (0.002, 0.01, 0.03, 0.06):
        events = interrupt_after(
            delay, lambda: list(mlxspec.stream(pair, prompt, max_tokens=400, gamma=3, session=session))
        )
        assert events is None or isinstance(events[-1], Done)  # None: it landed outside the engine
        result = mlxspec.generate(pair, prompt + [5], max_tokens=24, gamma=3, session=session)
        assert result.tokens == expected, f"delay {delay}"


def test_interrupt_is_reported(load_pair):
    pair = load_pair("llama")
    events = interrupt_after(
        0.05, lambda: list(mlxspec.stream(pair, IDS[:12] * 8, max_tokens=100000, gamma=3, raw=True))
    )
    assert events[-1].finish_reason == "interrupted"
    assert events[-1].stats.tokens == sum(len(e.emitted) for e in events if isinstance(e, Round))


KEPT = dict(max_kv_size=12)  # the first 4 tokens kept, the newest 8 rotating


def every_position(model, layers, ids, sizes):
    """Logits (len(ids), V) with ids fed in blocks of the given sizes, in turn."""
    rows, start, turn = [], 0, 0
    while start < len(ids):
        block = ids[start : start + sizes[turn % len(sizes)]]
        rows.append(model(mx.array(block)[None], cache=layers)[0])
        start, turn = start + len(block), turn + 1
    return mx.concatenate(rows)


def test_kept_tokens_are_seen_by_every_query_of_a_block(load_pair):
    """With max_kv_size each query reads the first 4 tokens and the newest 8, whether its ids
    come one at a time (decoding) or in blocks (prefill, verify); mlx-lm's own cache with
    kept tokens does not: the negative control."""
    from mlx_lm.models.cache import make_prompt_cache

    model = load_pair("qwen3").target.model
    ids = IDS + IDS[:10]
    layers = make_cache(model, **KEPT).layers
    assert all(type(layer) is KeptRotatingKVCache and layer.keep == 4 and layer.max_size == 12 for layer in layers)
    one_by_one = every_position(model, layers, ids, [1])
    for sizes in ([2], [3, 1], [5], [9, 1, 1], [40]):
        blocks = every_position(model, make_cache(model, **KEPT).layers, ids, sizes)
        assert mx.allclose(blocks, one_by_one, atol=1e-4).item(), sizes
    mlx_lm_blocks = every_position(model, make_prompt_cache(model, 12), ids, [5])
    assert not mx.allclose(mlx_lm_blocks, one_by_one, atol=1e-4).item()


def test_kept_tokens_roll_back_after_a_block_and_after_single_steps(load_pair):
    model = load_pair("qwen3").target.model
    cache = make_cache(model, **KEPT)
    feed(model, cache, IDS[:20], one_by_one=True)  # wrapped past the kept tokens
    mark = cache.mark()
    feed(model, cache, IDS[20:26])  # a verify block: sliced back
    assert cache.rewind(22, mark) == 0
    assert_same_next(model, cache, IDS[:22], **KEPT)
    mark = cache.mark()
    feed(model, cache, IDS[23:27], one_by_one=True)  # draft steps: restored from the mark
    assert cache.rewind(24, mark) == 1
    feed(model, cache, IDS[23:24])
    assert_same_next(model, cache, IDS[:22] + [7] + IDS[23:24], **KEPT)


def test_mlx_lm_cache_with_kept_tokens_is_refused(load_pair):
    from mlx_lm.models.cache import RotatingKVCache

    with pytest.raises(UnsupportedCache, match="keep=4"):
        ModelCache([RotatingKVCache(max_size=12, keep=4)], "target t")


def test_quantized_kv_cache_rolls_back(load_pair):
    model = load_pair("llama_kv32").target.model
    options = dict(kv_bits=4, kv_group_size=32)
    cache = make_cache(model, **options)
    assert {type(layer).__name__ for layer in cache.layers} == {"QuantizedKVCache"}
    feed(model, cache, IDS[:10])
    mark = cache.mark()
    assert mark.states == {}
    feed(model, cache, IDS[10:15])
    assert cache.rewind(11, mark) == 0
    assert_same_next(model, cache, IDS[:11], **options)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_kv_size=4), "above 4"),
        (dict(max_kv_size=True), "above 4"),
        (dict(kv_bits=7), "KV bits"),
        (dict(kv_bits=4, kv_group_size=16), "group size"),
    ],
)
def test_cache_options_are_checked(load_pair, options, message):
    with pytest.raises(InvalidOption, match=message):
        make_cache(load_pair("llama").target.model, **options)
    with pytest.raises(InvalidOption, match=message):
        Session(load_pair("llama"), cache_options=CacheOptions(**options))
