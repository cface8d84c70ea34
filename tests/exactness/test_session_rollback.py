"""What an independent review of sessions and rollback found, each kept fixed: a second
Ctrl-C during the first one's cleanup, a session used with another pair or by two streams
at once, Ctrl-C in plain decoding keeping the cache, KV options a model cannot take, round
marks that pinned whole KV buffers, a verify interrupted mid-update, and a refused chat
message that dropped earlier turns."""

from __future__ import annotations

import pytest

import mlxspec
from mlxspec import Prefill, Round
from mlxspec.decoding.caches import CacheOptions
from mlxspec.errors import MlxspecError
from mlxspec.generation import Session
from tests.conftest import emitted_ids, fresh_standard

PROMPT = list(range(30, 42))


def test_a_second_ctrl_c_while_the_first_is_handled_is_noticed_by_the_next_call(load_pair, monkeypatch):
    """Wrong state, then wrong tokens. A first Ctrl-C lands in Cursor.catch_up after the
    chunk's forward (the cache holds it) but before `self.tokens += chunk` (here: in the
    `self.cache.state` read of `mx.eval(self.cache.state)`); atomic()'s handler calls
    invalidate() -> reset() -> CacheOptions.make(), and a second Ctrl-C landing there (a user
    pressing it twice) escapes the handler with the old cache kept and `tokens` short of it.
    The next call sees an extension, feeds only its new ids on top of the unrecorded rows, and
    emits what another history would.

    Fix: build the new state first and assign it without a call in between
    (`self.cache, self.tokens, self.pending, self.checkpoints = cache, [], [], []` after the
    make()), and have sync() reset a cursor whose cache.length (or any part's offset)
    disagrees with len(tokens)."""
    from mlxspec.decoding import caches

    pair = load_pair("qwen3_next")  # recurrent state: no exact trim back, so the handler resets
    session = Session(pair)
    target = session.target
    target.sync(PROMPT)
    real_state, real_make = caches.ModelCache.state, caches.CacheOptions.make
    signals = []

    def state(self):
        if not signals:
            signals.append("after the forward")
            raise KeyboardInterrupt
        return real_state.fget(self)

    def make(self, *args, **kwargs):
        if len(signals) == 1:
            signals.append("in the handler's make_cache")
            raise KeyboardInterrupt
        return real_make(self, *args, **kwargs)

    monkeypatch.setattr(caches.ModelCache, "state", property(state))
    monkeypatch.setattr(caches.CacheOptions, "make", make)
    with pytest.raises(KeyboardInterrupt):
        target.catch_up()
    monkeypatch.undo()
    assert len(signals) == 2
    # the second interrupt can leave cache and cursor apart; the next call must notice
    out, _ = emitted_ids(pair, PROMPT + [5], session, gamma=0, max_tokens=8)
    assert out == fresh_standard(pair, PROMPT + [5], 8)
    assert target.cache.holds(len(target.tokens))


def test_a_session_is_used_with_its_own_pair_only(load_pair):
    """Wrong tokens, silently. stream(pair_b, session=Session(pair_a)) decodes with pair_a's
    models (the session's cursors) but pair_b's tokenizer, end-of-sequence ids, vocabulary
    check and context length. Fix: in stream(), `if session.pair is not pair: raise
    InvalidOption(...)` (or take the pair from the session)."""
    a, b = load_pair("llama"), load_pair("qwen3")
    session = Session(a)
    try:
        got = mlxspec.generate(b, PROMPT, max_tokens=8, gamma=3, session=session).tokens
    except MlxspecError:
        return  # refused: fine
    assert got == mlxspec.generate(b, PROMPT, max_tokens=8, gamma=3).tokens


def test_two_live_streams_on_one_session(load_pair):
    """Wrong tokens, once. A stream keeps no state of its own between rounds: everything is
    in the session's cursors. A second call on the same session while the first stream is
    suspended (a notebook holding `g = stream(...)`, a UI starting a new reply before closing
    the old) moved the cursors to the second prompt; the first stream then resumed on the
    second's caches and emitted ids of another history. Now the second stream takes the
    session over: the first is closed (its clean-up runs before the second reads anything)
    and yields nothing more; both outputs are a fresh decode's."""
    pair = load_pair("llama")
    session = Session(pair)
    first = mlxspec.stream(pair, PROMPT, max_tokens=16, gamma=2, session=session)
    emitted = []
    for event in first:
        if isinstance(event, Round):
            emitted += event.emitted
            break
    second = mlxspec.generate(pair, [100, 101, 102, 103], max_tokens=6, gamma=2, session=session)
    assert second.tokens == fresh_standard(pair, [100, 101, 102, 103], 6)
    assert list(first) == []
    assert emitted == fresh_standard(pair, PROMPT, 16)[: len(emitted)]
    third = mlxspec.generate(pair, PROMPT, max_tokens=16, gamma=2, session=session)
    assert third.tokens == fresh_standard(pair, PROMPT, 16)


@pytest.mark.parametrize("gamma", [0, "auto"])
def test_ctrl_c_in_plain_decoding_keeps_the_cache(load_pair, gamma):
    """Performance. A Ctrl-C inside _standard (where the host waits on `y.item()`, i.e. where
    a real SIGINT usually lands) or inside a prefill runs atomic() -> invalidate(): the whole
    cache and its checkpoints are dropped, so the next call (a chat's next turn) reads the
    entire history again, even on plain KV caches that a trim brings back exactly. Speculative
    rounds, by contrast, abandon() to the round's mark. Here 300 ids are re-read for a 1-id
    extension. Fix: on an exception, bring every part back to len(tokens) (ModelCache.restore
    of Mark(len(tokens)) already trims part by part, as after a mid-forward interrupt) when the
    cache has no restorable layers, or to the longest checkpoint that starts `tokens`; reset
    only when neither is possible."""
    from tests.conftest import ctrl_c_at

    pair = load_pair("llama")
    prompt = list(range(3, 303))
    session = Session(pair)
    list(mlxspec.stream(pair, prompt, max_tokens=4, gamma=0, session=session))
    if gamma == "auto":
        from tests.exactness.test_greedy import Alternating

        session.controller = Alternating()
    options = {"gamma": gamma}
    with ctrl_c_at(600) as landed:  # the 600th call inside mlxspec/mlx-lm: in mlxspec.decoding.engine, mid-decode
        events = list(mlxspec.stream(pair, prompt + [7, 8], max_tokens=40, session=session, **options))
    assert landed and events[-1].finish_reason == "interrupted"
    assert any(isinstance(e, Round) for e in events)  # past the prefill: in the plain steps
    prefill = next(
        e
        for e in mlxspec.stream(pair, prompt + [7, 8, 9], max_tokens=2, session=session, **options)
        if isinstance(e, Prefill)
    )
    assert prefill.processed_tokens < 10, f"read {prefill.processed_tokens} of {prefill.prompt_tokens} ids again"


def test_kv_bits_the_model_cannot_take_is_refused_up_front(load_pair):
    """Style/usability. CacheOptions checks kv_bits and kv_group_size against fixed lists only;
    a head dimension the group size does not divide (here 16 with the default 64) fails at
    the first forward with mlx's raw "[quantize] The last dimension ... divisible by the
    quantization group size" ValueError, mid-generation. Likewise a model with attention
    sinks (gpt_oss) fails with "Quantized SDPA does not support attention sinks". Fix: check
    the options against the model when the Session is built (mlxspec.errors.InvalidOption)."""
    pair = load_pair("llama")  # head_dim 16
    try:
        session = Session(pair, cache_options=CacheOptions(kv_bits=4))
    except MlxspecError:
        return
    with pytest.raises(MlxspecError):
        mlxspec.generate(pair, PROMPT, max_tokens=4, gamma=2, session=session)


def test_a_round_mark_does_not_pin_a_cache_lists_kv_part(load_pair):
    """Performance. ModelCache.mark() snapshots a whole CacheList layer when any part needs
    restoring: falcon_h1's CacheList(ArraysCache, KVCache) marks its KVCache buffers too. A
    live view of a buffer makes its next in-place row write (KVCache.update_and_fetch's
    slice assignment) copy the whole buffer instead of donating it: measured here, one
    1-row write into an 8192-token, 8-head, 128-wide fp16 KVCache takes 0.02 ms alone and
    3.6 ms with a live view. Every round takes a mark, so every round copies every such
    layer's whole KV cache (O(context) per round; checkpoints pin two more copies). The same
    holds for every layer under CacheOptions(max_kv_size=N) (KeptRotatingKVCache: window-
    sized copies). Fix: mark a CacheList part by part, snapshotting only the parts that
    cannot be trimmed and trimming the others back on restore (restore already trims
    part by part)."""
    import mlx.core as mx

    pair = load_pair("falcon_h1")
    cache = mlxspec.decoding.caches.make_cache(pair.target.model)
    pair.target.model(mx.array([PROMPT]), cache=cache.layers)
    cache.length = len(PROMPT)
    for mark in (cache.mark(), cache.mark(reads=5)):
        pinned = [(i, j) for i, j in mark.states if type(cache.layers[i].caches[j]).__name__ == "KVCache"]
        assert not pinned, f"parts {pinned}: the mark holds views of whole KV buffers"
        assert mark.states, "the recurrent parts must still be snapshotted"


def test_a_mark_pins_a_window_only_where_what_follows_may_wrap_it(load_pair):
    """A live view of a window buffer makes the next single-id write copy the whole window:
    a round's mark holds one only where the ids the round reads may wrap the window (then
    a snapshot is the only exact way back from an interrupt mid-update)."""
    import mlx.core as mx

    pair = load_pair("gemma3_text")  # window 8
    cache = mlxspec.decoding.caches.make_cache(pair.target.model)
    pair.target.model(mx.array([PROMPT]), cache=cache.layers)
    cache.length = len(PROMPT)
    assert cache.mark(reads=3).states  # already wrapped
    fresh = mlxspec.decoding.caches.make_cache(pair.target.model)
    pair.target.model(mx.array([PROMPT[:2]]), cache=fresh.layers)
    fresh.length = 2
    assert fresh.mark(reads=3).states == {}  # 2 + 3 ids stay inside the window: a trim suffices
    assert fresh.mark(reads=6).states  # 2 + 6 reach the window's edge


@pytest.mark.parametrize("arch, options", [("qwen3", CacheOptions(max_kv_size=12)), ("gemma3_text", CacheOptions())])
@pytest.mark.parametrize("steps", [0, 10], ids=["read as one block", "wrapped by single steps"])
@pytest.mark.parametrize("back_to", ["the round's mark", "the ids read"])
def test_a_block_interrupted_anywhere_rolls_back_exactly_or_not_at_all(load_pair, arch, options, steps, back_to):
    """Wrong tokens, twice. A Ctrl-C inside mlx-lm's RotatingKVCache update of a block (in
    its _temporal_order or _trim, between the keys and the values) left a layer with its
    keys grown and its values not, its counters at the old length, and, where single steps
    had wrapped the window, its keys reordered and its values not (same row counts: no
    check of the part can tell). Trimmed by its counters, the layer then fed the next
    forward rows no fresh cache has (a matmul shape error, or quietly other ids). Every
    landing point inside one 7-id forward that wraps the window, over a history read as one
    block or ended by single steps, rolled back to a round's mark (a verify) or to the ids
    read (what Cursor.recover tries first after a prefill or a catch-up): the rollback
    restores exactly what a fresh cache of the history gives, or says it cannot (the
    session then goes back to a checkpoint, or reads the history again)."""
    import mlx.core as mx

    from mlxspec.decoding.caches import CacheRollbackError, Mark
    from tests.conftest import ctrl_c_at

    model = load_pair(arch).target.model
    history = list(range(30, 30 + 8 + steps))
    block = [50, 51, 52, 53, 54, 55, 56]

    def read_history():
        cache = options.make(model)
        model(mx.array([history[:8]]), cache=cache.layers)
        for token in history[8:]:
            model(mx.array([[token]]), cache=cache.layers)
        cache.length = len(history)
        return cache

    expected = model(mx.array([[60]]), cache=read_history().layers)
    landings, refused = 0, 0
    for at in range(1, 400):
        cache = read_history()
        mark = cache.mark(reads=len(block)) if back_to == "the round's mark" else Mark(len(history))
        with ctrl_c_at(at) as landed:
            try:
                mx.eval(model(mx.array([block]), cache=cache.layers))
            except KeyboardInterrupt:
                pass
        if not landed:
            break  # past the forward's last function call
        landings += 1
        try:
            cache.restore(mark)
        except CacheRollbackError:
            refused += 1
            continue
        assert mx.allclose(model(mx.array([[60]]), cache=cache.layers), expected, atol=1e-5), f"landing {at}"
    assert landings > 20
    # a wrapped window out of time order is never trusted by its counters: only a snapshot
    # brings it back, and a mark of the ids read has none
    assert refused == landings if (back_to, steps) == ("the ids read", 10) else refused < landings


def test_a_refused_message_does_not_drop_the_earlier_turns(factory):
    """Wrong state (chat). Conversation._fit drops the oldest turns one by one while the
    prompt does not fit, incrementing self._dropped as it goes, and only then raises
    PromptTooLong when the message alone is too long. The refused message leaves every
    earlier turn dropped: the next, short message is answered as if the conversation had
    just started. Fix: count the drops in a local and commit `self._dropped` only once the
    prompt fits (after the PromptTooLong check)."""
    from mlxspec.chat import Conversation
    from mlxspec.errors import PromptTooLong
    from mlxspec.options import Options

    short = factory.model("short-chat", arch="llama", seed=1, overrides={"max_position_embeddings": 80})
    pair = mlxspec.load_pair(str(short))
    conversation = Conversation(pair, settings=Options.build(temp=0.0, top_p=1.0, max_tokens=4, gamma=0))
    list(conversation.reply("one two"))
    with pytest.raises(PromptTooLong):
        list(conversation.reply("word " * 100))
    assert conversation.messages("ok")[0]["content"] == "one two", conversation.messages("ok")
