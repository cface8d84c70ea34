"""Many generations in one batch (mlxspec.batching, decoding/packed.py, decoding/batch.py):
each answer is the one that request gets alone. Greedy ids identical across families
(sliding windows that wrap, a quantized target, heads, prompt lookup, trees); seeded sampled
ids identical at a fixed gamma and tree (each request's own keys); a randomized walk of
requests joining and leaving a batch at random rounds, sessions continued inside it; the
law of every row under sampling against the exact one; and the harness catching a lane that
keeps what it should forget."""

from __future__ import annotations

import contextlib
import os
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from greenlet import greenlet
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mlxspec
from mlxspec.batching import Lanes, generate_many, why_not
from mlxspec.decoding import engine, packed
from mlxspec.decoding.batch import Batch
from mlxspec.decoding.caches import CacheOptions, CacheRollbackError, Mark
from mlxspec.decoding.events import Round
from mlxspec.decoding.packed import Lane, PackedCache
from mlxspec.generation import Session
from mlxspec.grammar import GrammarSpec
from tests.exactness.test_distribution import (
    LENGTH,
    PROMPT,
    RUNS,
    SETTINGS,
    exact_law,
    fits,
    policy,
    small_pair,  # noqa: F401 - a fixture
)
from tests.models.test_eagle3 import Heads

PROMPTS = [list(range(10 + i, 22 + 3 * i)) for i in range(4)]
MAX_TOKENS = 24
PACKED = ["llama", "qwen3", "gemma2", "phi3", "gemma3_text", "llama_sliding"]
ALONE = ["qwen3_next", "mamba", "deepseek_v32"]  # recurrent state, MLA: one after another
# the random walk's sequences: derandomized, so CI runs the same ones; more, not derandomized,
# with MLXSPEC_BATCH_WALKS=N (how the walk was explored before landing)
WALKS = int(os.environ.get("MLXSPEC_BATCH_WALKS", 12))


def alone(pair, prompts, **options) -> list[list[int]]:
    return [mlxspec.generate(pair, p, max_tokens=MAX_TOKENS, **options).tokens for p in prompts]


def batched(pair, prompts, **options) -> tuple[list[list[int]], Batch]:
    batch = Batch()
    results = generate_many(pair, prompts, max_tokens=MAX_TOKENS, batch=batch, **options)
    return [r.tokens for r in results], batch


MODES = {
    "standard": dict(gamma=0),
    "chain": dict(gamma=3),
    "tree": dict(gamma=3, tree=8),
    "auto": dict(gamma="auto", tree="auto"),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("arch", PACKED)
def test_greedy_ids_in_a_batch_are_the_ids_alone(load_pair, arch, mode):
    pair = load_pair(arch)
    options = MODES[mode]
    together, batch = batched(pair, PROMPTS, **options)
    assert together == alone(pair, PROMPTS, **options)
    # it batched: the forwards read more rows than there were forwards
    assert batch.rows > 1.5 * batch.forwards > 0, (batch.rows, batch.forwards)


@pytest.mark.parametrize("mode", ["standard", "chain", "tree"])
def test_quantized_kv_caches_batch_exactly(load_pair, mode):
    """Keys and values held quantized (--kv-bits): a lane's rows are quantized once, as its
    cache alone holds them, and move between rows, asides and compactions as they are; two
    at a time over four prompts, so lanes join and leave mid-run."""
    pair = load_pair("llama_kv32")
    kv = CacheOptions(kv_bits=4, kv_group_size=32)
    options = MODES[mode]
    batch = Batch()
    results = generate_many(pair, PROMPTS, max_tokens=MAX_TOKENS, batch=batch, cache_options=kv, max_batch=2, **options)
    by_itself = [
        mlxspec.generate(pair, p, max_tokens=MAX_TOKENS, session=Session(pair, cache_options=kv), **options).tokens
        for p in PROMPTS
    ]
    assert [r.tokens for r in results] == by_itself
    assert batch.rows > 1.5 * batch.forwards > 0, (batch.rows, batch.forwards)


WINDOW = 12  # a --max-kv-size the tests' sequences pass several times over


@pytest.mark.parametrize("mode", list(MODES))
def test_a_max_kv_size_window_batches_exactly(load_pair, monkeypatch, mode):
    """Under --max-kv-size every layer of both models reads the first 4 ids and the newest
    ones, as alone: the ids are the same, two at a time over four prompts (lanes join and
    leave mid-run); and a lane's columns stay within the window, the ids a round reads and
    the drop's step (packed.DROP_EVERY), however long it runs. (Qwen3's: mlx-lm gives
    max_kv_size to models that do not build their own cache, as llama now does.)"""
    pair = load_pair("qwen3")
    window = CacheOptions(max_kv_size=WINDOW)
    options = MODES[mode]
    drop, most = PackedCache._drop_unseen, [0, 0]  # the most columns a lane held, and positions

    def measured(self):
        drop(self)
        for lane in self.lanes:
            most[:] = max(most[0], len(lane.columns)), max(most[1], lane.length)

    monkeypatch.setattr(PackedCache, "_drop_unseen", measured)
    batch = Batch()
    results = generate_many(pair, PROMPTS, max_tokens=96, batch=batch, cache_options=window, max_batch=2, **options)
    by_itself = [
        mlxspec.generate(pair, p, max_tokens=96, session=Session(pair, cache_options=window), **options).tokens
        for p in PROMPTS
    ]
    assert [r.tokens for r in results] == by_itself
    assert batch.rows > 1.5 * batch.forwards > 0, (batch.rows, batch.forwards)
    reads = 1 + 8 + 3 * 2  # a round's most: its pending id, a tree of 8, a chain's catching up
    assert most[0] <= WINDOW + packed.DROP_EVERY + packed.UNMARKED_ROLLBACK + reads < most[1], most


def test_a_lane_goes_back_no_further_than_its_window_allows(load_pair):
    """Once a lane dropped columns, a length whose next query would see them is refused:
    trim_to says False and changes nothing, restore raises; a length above it trims, and
    the lane holds what a window alone would; back into the kept ids, or empty, it trims."""
    pair = load_pair("qwen3")
    cache = PackedCache(pair.target.model, name="target", max_kv_size=WINDOW)
    lane = cache.lane()
    lane.read(mx.array(list(range(80)), dtype=mx.uint32), None)  # 80 ids: positions 0 to 79
    cache._drop_unseen()
    assert lane.dropped == 80 - packed.UNMARKED_ROLLBACK - WINDOW + 1 > 0 and lane.holds(80)
    assert lane.floor == lane.dropped + WINDOW - 1 == 80 - packed.UNMARKED_ROLLBACK
    assert not lane.trim_to(lane.floor - 1) and lane.holds(80)
    with pytest.raises(CacheRollbackError):
        lane.restore(Mark(lane.floor - 1))
    assert lane.trim_to(lane.floor) and lane.holds(lane.floor)
    # what it holds: the first 4 ids and the newest, as a window's cache alone holds them
    assert list(cache.positions[lane.row, lane.columns]) == [0, 1, 2, 3, *range(4 + lane.dropped, lane.floor)]
    assert packed.columns_of(cache.gather(lane)[0][0]) == WINDOW - 1
    assert lane.trim_to(2) and lane.holds(2) and not lane.dropped  # back into the kept ids: all there
    assert lane.trim_to(0) and lane.holds(0)  # emptied (a cursor's reset)


def test_a_conversation_under_a_window_moves_into_a_batch_and_back_as_it_is(load_pair):
    """A --max-kv-size conversation past its window (its caches hold the first ids and the
    newest) continues in a batch beside another request, then alone: each turn reads only
    its new ids, its caches moving into the batch's rows and back, and answers as a session
    that never batched."""
    pair = load_pair("qwen3")
    window = CacheOptions(max_kv_size=WINDOW)
    options = dict(max_tokens=40, gamma=3, tree=0, ngram=False, history=False)

    def turns(batched: bool) -> list:
        return [
            (r.tokens, r.stats.prefill_tokens) for r in _turns(pair, options, batched=batched, cache_options=window)
        ]

    together = turns(batched=True)
    assert together == turns(batched=False)
    # read anew: the new prompt (and the answer's last id), never the conversation again
    assert all(read <= len(PROMPTS[2 + turn]) + 1 for turn, (_, read) in enumerate(together[1:])), together


@pytest.mark.parametrize("gamma", [0, 3])
def test_a_conversation_past_its_window_that_changes_early_is_read_again_in_a_batch(load_pair, gamma):
    """A session past its window moves into a batch for a prompt that shares only its first
    ids with the conversation (a template that rewrites earlier turns): the lane cannot go back
    into what it dropped, so it is emptied and reads the prompt whole, as alone. (An empty
    lane that kept its columns once answered wrong, or failed the request beside it.)"""
    pair = load_pair("qwen3")
    window = CacheOptions(max_kv_size=WINDOW)
    options = dict(max_tokens=40, gamma=gamma, tree=0, ngram=False, history=False)
    session = Session(pair, cache_options=window)
    mlxspec.generate(pair, PROMPTS[0], session=session, **options)
    changed = PROMPTS[0][:3] + list(range(500, 510))
    within = _beside_another(pair, session, changed, options, cache_options=window)
    assert (
        within.tokens == mlxspec.generate(pair, changed, session=Session(pair, cache_options=window), **options).tokens
    )


def test_a_quantized_target_batches_exactly(load_pair):
    pair = load_pair("llama", bits=4)
    together, batch = batched(pair, PROMPTS, gamma=3, tree=8)
    assert together == alone(pair, PROMPTS, gamma=3, tree=8)
    assert batch.rows > batch.forwards


@pytest.fixture(scope="module")
def heads(factory) -> Heads:
    return Heads(factory)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_a_heads_drafts_are_one_forward_for_every_lane_and_the_drafts_alone(heads, arch):
    pair = heads.pair(arch)
    # no prompt lookup: its proposals from the text and from history are not the head's
    for options in (dict(gamma=3, tree=0), dict(gamma=3, tree=8)):
        _drafts_as_alone(pair, PROMPTS, options | dict(ngram=False, history=False))


def _drafts_as_alone(pair, prompts, options: dict) -> None:
    """In a batch each request answers as alone, and its drafter proposes what it proposes
    alone (its rows read the same context), so every request accepts the same drafts at the
    same rounds; the drafter's own forwards serve several lanes each, as the target's do."""
    batch = Batch()
    together = generate_many(pair, prompts, max_tokens=MAX_TOKENS, batch=batch, **options)
    by_itself = [mlxspec.generate(pair, p, max_tokens=MAX_TOKENS, **options) for p in prompts]
    assert [r.tokens for r in together] == [r.tokens for r in by_itself], options
    assert [(r.stats.drafted, r.stats.accepted, r.stats.rounds) for r in together] == [
        (r.stats.drafted, r.stats.accepted, r.stats.rounds) for r in by_itself
    ], options
    assert 0 < sum(r.stats.accepted for r in together) < sum(r.stats.drafted for r in together)
    name = pair.draft.name
    assert batch.rows_of[name] > 1.5 * batch.forwards_of[name] > 0, (batch.rows_of, batch.forwards_of)


LONG = [10 + (7 * i) % 300 for i in range(300)]  # past a batch's chunk: its rows read in several reads


@pytest.mark.parametrize(
    "arch, drafter",
    [("llama", {}), ("gemma3_text", {}), ("llama", dict(layers=3, causal=True))],
    ids=["llama", "gemma3_text", "llama-3-layers-causal"],
)
def test_dflash_blocks_are_one_forward_for_every_lane_and_the_drafts_alone(drafters, arch, drafter):
    """Each lane's block and the context rows it reads with it are one read of the batch's
    drafter cache (long prompts' rows in chunks, some aside); the block's columns are
    forgotten after, so every lane drafts what it drafts alone, chains and DDTrees, with
    drafters of several layers (each reads the same context) and causal blocks."""
    pair = drafters.pair(arch, **drafter)
    prompts = PROMPTS + [LONG, PROMPTS[2] + LONG[:150]]
    for options in (dict(gamma=5, tree=0), dict(gamma=5, tree=8)):
        _drafts_as_alone(pair, prompts, options | dict(ngram=False, history=False))


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_conversation_whose_head_holds_rows_continues_in_a_batch(heads, drafters, kind):
    """A session that generated alone (its head or DFlash drafter holding the
    conversation's rows) joins a batch beside another request for its next turn and leaves
    it again: its rows move into the batch's drafter cache and back, so every turn drafts
    and answers as alone."""
    pair = heads.pair("llama") if kind == "eagle3" else drafters.pair("llama")
    options = dict(max_tokens=MAX_TOKENS, gamma=3, tree=0, ngram=False, history=False)

    def turns(batched: bool) -> list:
        return [(r.tokens, r.stats.drafted, r.stats.accepted) for r in _turns(pair, options, batched=batched)]

    assert turns(batched=True) == turns(batched=False)


def _turns(pair, options: dict, *, batched: bool, cache_options=CacheOptions()) -> list:
    """Three turns of one conversation, the second in a batch beside a fresh request or not:
    each turn's result."""
    session, ids, results = Session(pair, cache_options=cache_options), list(PROMPTS[0]), []
    for turn in range(3):
        if batched and turn == 1:
            result = _beside_another(pair, session, ids, options, cache_options=cache_options)
        else:
            result = mlxspec.generate(pair, ids, session=session, **options)
        results.append(result)
        ids = ids + result.tokens + PROMPTS[2 + turn % 2]
    return results


def _beside_another(pair, session: Session, ids: list[int], options: dict, *, cache_options=CacheOptions()):
    """`session`'s generation for `ids` in a batch beside a fresh request's."""
    batch = Batch()
    lanes = Lanes(pair, batch, cache_options=cache_options)
    results = {}

    def mine():
        with lanes.joined(session):
            results["mine"] = mlxspec.generate(pair, ids, session=session, **options)

    def other():
        fresh = Session(pair, cache_options=cache_options)
        with lanes.joined(fresh):
            results["other"] = mlxspec.generate(pair, PROMPTS[1], session=fresh, **options)

    tasks = [mine, other]
    batch.run(lambda idle: [tasks.pop() for _ in range(len(tasks))], done=_raising)
    if options.get("gamma") != 0:  # the drafter's forwards shared
        assert batch.rows_of[pair.draft.name] > batch.forwards_of[pair.draft.name] > 0
    return results["mine"]


@pytest.fixture(scope="module")
def drafters(factory):
    from tests.models.test_dflash import Drafters

    return Drafters(factory)


def test_the_default_batch_reads_every_drafters_own_shape(heads, drafters, factory, load_pair):
    """--max-batch's default counts the bytes a token's keys and values take in each model
    from the model's own shape: an EAGLE-3 head (one layer, which its config does not count),
    a DFlash drafter, a draft model over a subset of the target's ids (a wrapper); none is
    taken for an unknown model (256 KiB a token, which made every preset's default 2 here)."""
    from mlxspec.batching import kv_bytes_per_token
    from mlxspec.models.subset_draft import write_subset

    def expected(config, layers: int) -> int:
        return 2 * layers * config.num_key_value_heads * config.head_dim * 4  # float32 keys and values

    head = heads.pair("llama").draft.model
    assert kv_bytes_per_token(head) == expected(head.config, 1)
    dflash = drafters.pair("llama").draft.model
    assert kv_bytes_per_token(dflash) == expected(dflash.config, dflash.config.num_hidden_layers)
    target, draft = factory.pair("llama")
    out = factory.model("llama-subset-batch", arch="llama", vocab_size=101, seed=4)
    write_subset(out, list(range(100)), load_pair("llama").target.width)
    subset = mlxspec.load_pair(str(target), str(out)).draft.model
    inner = mlxspec.load_pair(str(target), str(draft)).draft.model
    assert type(subset).__name__ == "SubsetVocabModel"
    assert kv_bytes_per_token(subset) == kv_bytes_per_token(inner) < 256 << 10


def test_heads_that_cannot_share_a_forward_draft_per_lane(heads):
    """A head whose rotary embedding takes one offset ("dynamic" NTK scaling) reads neither
    trees nor a packed batch: said, not raised from inside a forward."""
    from mlx_lm.models.rope_utils import initialize_rope

    from mlxspec.drafters.eagle3 import PackedHead

    head = heads.pair("llama").draft.model
    assert packed.why_not(PackedHead(head)) is None
    kept = head.midlayer.self_attn.rope
    try:
        head.midlayer.self_attn.rope = initialize_rope(16, 10000.0, False, {"type": "dynamic", "factor": 2.0}, 64)
        assert "DynamicNTKScalingRoPE" in packed.why_not(PackedHead(head))
        assert head.why_no_trees() is not None
    finally:
        head.midlayer.self_attn.rope = kept


def test_prompt_lookup_and_a_grammar_row_beside_free_rows(load_pair):
    pair = load_pair("llama")
    prompts = [PROMPTS[0] * 3, PROMPTS[1] * 3, "Say yes or no.", PROMPTS[2]]
    grammar = GrammarSpec("regex", "(yes|no)[a-z ]{0,30}", "--regex")
    options = [
        mlxspec.Options.build(gamma=3, ngram=True, max_tokens=MAX_TOKENS),
        mlxspec.Options.build(gamma=0, ngram=True, max_tokens=MAX_TOKENS),
        mlxspec.Options.build(gamma=3, grammar=grammar, max_tokens=MAX_TOKENS),
        mlxspec.Options.build(gamma=3, tree=8, temp=0.8, seed=3, max_tokens=MAX_TOKENS),
    ]
    batch = Batch()
    together = [r.tokens for r in generate_many(pair, prompts, options, batch=batch)]
    assert together == [mlxspec.generate(pair, p, o).tokens for p, o in zip(prompts, options)]
    assert batch.rows > batch.forwards


@pytest.mark.parametrize("arch", ALONE)
def test_families_that_cannot_share_a_forward_run_one_after_another(load_pair, arch):
    pair = load_pair(arch)
    assert why_not(pair) is not None
    together, batch = batched(pair, PROMPTS[:2], gamma=3)
    assert together == alone(pair, PROMPTS[:2], gamma=3)
    assert batch.forwards == 0


@pytest.mark.parametrize(
    "options", [dict(gamma=3), dict(gamma=3, tree=8), dict(gamma=0)], ids=["chain", "tree", "plain"]
)
@pytest.mark.parametrize("cache", [CacheOptions(), CacheOptions(max_kv_size=WINDOW)], ids=["whole", "window"])
def test_seeded_sampling_in_a_batch_gives_the_ids_alone(load_pair, options, cache):
    """A fixed gamma and tree: the drafts do not depend on timing, so each request's own keys
    give it the ids it gets alone (never the batch's keys); under a --max-kv-size window too."""
    pair = load_pair("qwen3")
    seeded = [mlxspec.Options.build(temp=1.0, seed=100 + i, max_tokens=MAX_TOKENS, **options) for i in range(4)]
    together = [r.tokens for r in generate_many(pair, PROMPTS, seeded, cache_options=cache)]
    assert together == [
        mlxspec.generate(pair, p, o, session=Session(pair, cache_options=cache)).tokens for p, o in zip(PROMPTS, seeded)
    ]


def walks(count: int):
    """The random walks' hypothesis settings: `count` derandomized sequences, or random ones
    under MLXSPEC_BATCH_WALKS."""
    return settings(
        max_examples=count,
        derandomize="MLXSPEC_BATCH_WALKS" not in os.environ,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


@walks(WALKS)
@given(data=st.data())
def test_requests_joining_and_leaving_a_batch_get_their_own_answers(load_pair, data):
    """A random stream of requests (prompts, lengths, modes, some continuing an earlier
    request's conversation in its session) through a batch smaller than them: they join as
    others leave, at whatever round that is. Each answer equals the one given alone, and a
    continued session's caches stay exact across the join and the leave."""
    arch = data.draw(st.sampled_from(["llama", "gemma3_text", "llama_sliding", "llama_kv32", "qwen3_window"]))
    event(f"family: {arch}")
    pair = load_pair("qwen3" if arch == "qwen3_window" else arch)
    kv = {  # quantized KV; a --max-kv-size window that wraps within a prompt, and drops columns
        "llama_kv32": CacheOptions(kv_bits=4, kv_group_size=32),
        "qwen3_window": CacheOptions(max_kv_size=WINDOW),
    }.get(arch, CacheOptions())
    _walk(pair, kv, data)


@walks(max(WALKS // 2, 1))
@given(data=st.data())
def test_requests_with_a_dflash_drafter_joining_and_leaving_a_batch_get_their_own_answers(drafters, data):
    """The same walk with DFlash drafters (their blocks packed across lanes, their rows
    moving into the batch's drafter cache and back with a continued session), on a full
    attention target and on one with a window that wraps."""
    arch = data.draw(st.sampled_from(["llama", "gemma3_text"]))
    event(f"family: {arch}")
    _walk(drafters.pair(arch), CacheOptions(), data)


def _walk(pair, kv: CacheOptions, data) -> None:
    """Requests drawn from `data` through one batch; each answer checked against alone."""
    count = data.draw(st.integers(2, 6))
    sessions = [Session(pair, cache_options=kv) for _ in range(2)]
    jobs = []
    for _ in range(count):
        prompt = data.draw(st.lists(st.integers(5, 300), min_size=1, max_size=30))
        mode = data.draw(st.sampled_from(list(MODES)))
        length = data.draw(st.integers(1, 20))
        session = data.draw(st.sampled_from([None, 0, 1]))
        # how much of the conversation the next prompt keeps: mostly all, or a template's rewrite
        # of earlier turns (a window past them must then read it again)
        kept = data.draw(st.sampled_from([1.0, 1.0, 0.5, 0.1]))
        beside = data.draw(st.sampled_from([True, True, False]))  # or in the session's own caches, unbatched
        jobs.append((prompt, mlxspec.Options.build(max_tokens=length, **MODES[mode]), session, kept, beside))
    limit = data.draw(st.integers(1, 4))

    answers = {}
    batch = Batch()
    lanes = Lanes(pair, batch, cache_options=kv)
    queue, running, busy = list(range(count)), set(), set()

    def task(i):
        prompt, options, which, kept, beside = jobs[i]

        def run():
            session = sessions[which] if which is not None else Session(pair, cache_options=kv)
            # a session continues: its last prompt and answer (or their first part), then the new prompt
            history = session_history.get(which, [])
            ids = history[: int(len(history) * kept)] + prompt
            try:
                with lanes.joined(session) if beside else contextlib.nullcontext():
                    result = mlxspec.generate(pair, ids, options, session=session)
            finally:
                running.discard(i)
                busy.discard(which)
            if which is not None:
                session_history[which] = ids + result.tokens
            answers[i] = (ids, result.tokens)

        return run

    session_history: dict[int, list[int]] = {}

    def admit(idle):
        started = []
        while queue and len(running) < limit:
            which = jobs[queue[0]][2]
            if which is not None and which in busy:  # one generation per session at a time
                break
            i = queue.pop(0)
            running.add(i)
            if which is not None:
                busy.add(which)
            started.append(task(i))
        return started

    def done(run, finished):
        if finished.error is not None:
            raise finished.error

    batch.run(admit, done=done)
    assert sorted(answers) == list(range(count))
    for i, (ids, tokens) in answers.items():
        assert tokens == mlxspec.generate(pair, ids, jobs[i][1], session=Session(pair, cache_options=kv)).tokens, (
            i,
            jobs[i][1],
        )


def sample_rows_in_batches(pair, params, *, runs: int, seed: int, per_batch: int = 8) -> Counter:
    """The first LENGTH ids of `runs` generations, `per_batch` at a time in one batch: rows
    drafting chains of 2, trees of 4 nodes, or nothing, side by side, each with its own key."""
    counts = Counter()
    for first in range(0, runs, per_batch):
        batch = Batch()
        lanes = Lanes(pair, batch)
        tasks = [
            _sampling_row(pair, lanes, params, seed + i, i, counts) for i in range(first, min(first + per_batch, runs))
        ]
        batch.run(lambda idle, tasks=tasks: [tasks.pop() for _ in range(len(tasks))], done=_raising)
    assert sum(counts.values()) == runs  # every generation counted: none failed on the way
    return counts


def test_a_standard_decoding_lane_counts_in_the_batchs_gate(load_pair):
    """The gate weighs the whole batch's tokens per second: a γ 0 lane's tokens count beside a
    `--gamma auto` lane's (drafting makes it wait too), so its windows close on every lane's
    tokens. Alone, the auto lane's 24 ids never fill a window of three lanes (36 ids)."""
    pair = load_pair("llama")
    controller = Session(pair).controller
    batch = Batch()
    lanes = Lanes(pair, batch)
    results = {}

    def lane(i: int, gamma):
        def run():
            session = Session(pair, controller=controller)
            with lanes.joined(session, auto=gamma == "auto"):
                results[i] = mlxspec.generate(pair, PROMPTS[i], session=session, max_tokens=MAX_TOKENS, gamma=gamma)

        return run

    tasks = [lane(0, "auto"), lane(1, 0), lane(2, 0)]
    batch.run(lambda idle: [tasks.pop() for _ in range(len(tasks))], done=_raising)
    assert [results[i].tokens for i in range(3)] == alone(pair, PROMPTS[:3], gamma=0)
    assert controller.batch.windows >= 1
    assert {size for size, _ in controller.batch.rates} == {3}
    assert controller.batch._readers == 0  # every prompt's reading ended


def test_a_standard_decoding_lane_that_started_alone_counts_once_others_join(load_pair, monkeypatch):
    """A γ 0 lane that started alone (the first request of a burst) counts its tokens in the
    gate as soon as others share its forwards: drafting makes it wait as well."""
    pair = load_pair("llama")
    controller = Session(pair).controller
    batch = Batch()
    lanes = Lanes(pair, batch)
    results, runners, heard = {}, {}, Counter()
    count = controller.batch.count

    def counting(tokens: int) -> None:  # the gate's own count, and whose tokens it heard
        heard[greenlet.getcurrent()] += tokens
        count(tokens)

    monkeypatch.setattr(controller.batch, "count", counting)

    def lane(i: int, gamma):
        def run():
            runners[i] = greenlet.getcurrent()
            session = Session(pair, controller=controller)
            with lanes.joined(session, auto=gamma == "auto"):
                results[i] = mlxspec.generate(pair, PROMPTS[i], session=session, max_tokens=MAX_TOKENS, gamma=gamma)

        return run

    waves = [[lane(0, 0)], [], [], [lane(1, "auto"), lane(2, 0)]]  # the others a few forwards later
    batch.run(lambda idle: waves.pop(0) if waves else [], done=_raising)
    assert [results[i].tokens for i in range(3)] == alone(pair, PROMPTS[:3], gamma=0)
    assert heard[runners[0]] > 0 and heard[runners[2]] > 0


def _raising(task, finished) -> None:
    if finished.error is not None:
        raise finished.error


def _sampling_row(pair, lanes: Lanes, params, seed: int, i: int, counts: Counter):
    modes = [(2, 0), (2, 4), (0, 0)]  # chains of 2, trees of 4 nodes, nothing drafted

    def run():
        session = Session(pair)
        gamma, tree = modes[i % len(modes)]
        emitted = []
        with lanes.joined(session):
            for event in engine.decode(
                session.target,
                session.draft,
                PROMPT,
                policy=policy(session, gamma, tree),
                params=params,
                max_tokens=LENGTH,
                eos_ids=frozenset(),
                key=mx.random.key(seed),
            ):
                if isinstance(event, Round):
                    emitted += event.emitted
        counts[tuple(emitted)] += 1

    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", ["temp1", "temp0.7-top_p0.9"])
def test_every_row_of_a_batch_has_the_targets_law(small_pair, name):  # noqa: F811 - the fixture
    params = SETTINGS[name]
    law = exact_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(sample_rows_in_batches(small_pair, params, runs=RUNS, seed=7000), law)
    assert ok, f"{name}: chi2 {statistic:.1f} > {threshold:.1f}"


@pytest.mark.slow
def test_harness_rejects_a_lane_that_keeps_what_it_forgets(small_pair, monkeypatch):  # noqa: F811
    """A lane whose forgotten columns (rejected drafts) stay in what its queries see gives
    later ids the wrong context: the same test must fail (and every run still completes)."""
    trim_to, sees = Lane.trim_to, PackedCache._sees

    def trim_keeping_ghosts(self, length):
        self.ghosts = getattr(self, "ghosts", []) + self.columns[length:]
        return trim_to(self, length)

    def seeing_ghosts(self, lane, block, window):
        columns, seen = sees(self, lane, block, window)
        ghosts = np.array(getattr(lane, "ghosts", []), dtype=np.int64)
        ghosts = ghosts[ghosts < self.columns]  # a compaction drops them
        context = len(columns) - block.earlier
        shown = np.concatenate([columns[:context], ghosts, columns[context:]])
        visible = np.concatenate([seen[:, :context], np.ones((len(seen), len(ghosts)), bool), seen[:, context:]], 1)
        return shown, visible

    monkeypatch.setattr(Lane, "trim_to", trim_keeping_ghosts)
    monkeypatch.setattr(PackedCache, "_sees", seeing_ghosts)
    monkeypatch.setattr(packed, "_aside_of", lambda reads, rows: [])  # an aside copies `columns` alone
    params = SETTINGS["temp1"]
    law = exact_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(sample_rows_in_batches(small_pair, params, runs=RUNS // 2, seed=7000), law)
    assert not ok, f"a lane without holes passed: chi2 {statistic:.1f} <= {threshold:.1f}"


def test_an_interrupt_inside_a_compaction_leaves_the_batch_exact(load_pair, monkeypatch):
    """Ctrl-C while the cache is being compacted (its new buffers built, not yet in place):
    the generations end interrupted, and the same lanes then serve new ones exactly."""
    pair = load_pair("llama")
    monkeypatch.setattr(packed, "COMPACT_SLACK", 0)  # compact as soon as holes pass the live columns
    commit, calls = PackedCache._commit, []

    def interrupted_once(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(PackedCache, "_commit", interrupted_once)
    batch = Batch()
    lanes = Lanes(pair, batch)
    first = [_generation(pair, lanes, p, mlxspec.Options.build(gamma=3, max_tokens=MAX_TOKENS)) for p in PROMPTS]
    with pytest.raises(KeyboardInterrupt):
        batch.run(lambda idle, tasks=first: [tasks.pop() for _ in range(len(tasks))])
    assert len(calls) >= 2
    answers = {}
    again = [
        _generation(pair, lanes, p, mlxspec.Options.build(gamma=3, max_tokens=MAX_TOKENS), answers) for p in PROMPTS
    ]
    batch.run(lambda idle, tasks=again: [tasks.pop() for _ in range(len(tasks))], done=_raising)
    assert [answers[tuple(p)] for p in PROMPTS] == alone(pair, PROMPTS, gamma=3)


def test_a_lone_lanes_long_prompt_is_read_in_chunks_by_its_feature_drafter(heads, drafters, monkeypatch):
    """A lane alone in its batch (a server's single request) reads a long prompt's rows in
    chunks of at most the target's prefill step, not in one read whose mask grows with the
    square of the prompt: a DFlash drafter's and an EAGLE-3 head's."""
    from mlxspec.decoding.cursor import PREFILL_STEP

    forward, widest = PackedCache.forward, Counter()

    def measured(self, reads):
        for read in reads:
            widest[self.name] = max(widest[self.name], read.ids.shape[0])
        return forward(self, reads)

    monkeypatch.setattr(PackedCache, "forward", measured)
    prompt = (LONG * 3)[: PREFILL_STEP + 200]
    for pair in (drafters.pair("llama"), heads.pair("llama")):
        [result] = generate_many(pair, [prompt], max_tokens=4, gamma=3, ngram=False, history=False)
        assert result.tokens == mlxspec.generate(pair, prompt, max_tokens=4, gamma=0).tokens
        block = pair.draft.model.config.block_size if pair.draft.kind == "dflash" else 0
        assert 0 < widest[pair.draft.name] <= PREFILL_STEP + block, widest


@pytest.mark.parametrize("where", ["inside the second layer", "between the read and the forget"])
def test_an_interrupt_inside_a_dflash_read_leaves_every_session_exact(drafters, monkeypatch, where):
    """Ctrl-C inside the packed forward of every lane's DFlash block (after its first layer
    wrote its columns: the batch's run ends, every generation interrupted), or after a
    lane's read returned and before it forgot the block's columns (that generation ends
    interrupted, as Ctrl-C ends it alone, and the others go on): every drafter's rows are
    then those read afresh from its target's features, and the same sessions, in the same
    lanes, answer exactly as alone, their rows again those read afresh."""
    from mlxspec.drafters import dflash_model

    pair = drafters.pair("llama", layers=2)
    calls = []
    if where == "inside the second layer":
        forward = dflash_model.DecoderLayer.packed

        def interrupted(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 2 * 7:  # the second layer of the seventh forward
                raise KeyboardInterrupt
            return forward(self, *args, **kwargs)

        monkeypatch.setattr(dflash_model.DecoderLayer, "packed", interrupted)
    else:
        forget = Lane.keep_block_rows

        def interrupted(self, count, kept):
            if self.packed.name == pair.draft.name:
                calls.append(1)
                if len(calls) == 7:
                    raise KeyboardInterrupt
            return forget(self, count, kept)

        monkeypatch.setattr(Lane, "keep_block_rows", interrupted)
    batch = Batch()
    lanes = Lanes(pair, batch)
    sessions = [Session(pair) for _ in PROMPTS]
    options = mlxspec.Options.build(gamma=5, tree=8, max_tokens=MAX_TOKENS)
    ended = {}
    first = [_generation(pair, lanes, p, options, ended, session=s, reasons=True) for p, s in zip(PROMPTS, sessions)]
    if where == "inside the second layer":
        with pytest.raises(KeyboardInterrupt):
            batch.run(lambda idle, tasks=first: [tasks.pop() for _ in range(len(tasks))])
    else:
        batch.run(lambda idle, tasks=first: [tasks.pop() for _ in range(len(tasks))], done=_raising)
        assert sorted(ended.values()) == ["interrupted", "length", "length", "length"], ended
    assert len(calls) >= 7
    for session in sessions:
        _dflash_rows_read_afresh(pair, session.draft)
    answers = {}
    again = [_generation(pair, lanes, p, options, answers, session=s) for p, s in zip(PROMPTS, sessions)]
    batch.run(lambda idle, tasks=again: [tasks.pop() for _ in range(len(tasks))], done=_raising)
    assert [answers[tuple(p)] for p in PROMPTS] == alone(pair, PROMPTS, gamma=0)
    for session in sessions:
        _dflash_rows_read_afresh(pair, session.draft)


def _dflash_rows_read_afresh(pair, drafter) -> None:
    """The DFlash drafter's rows (its own cache's) are those a fresh cache reads from its
    target's features of the same ids."""
    from mlxspec.decoding import capture

    assert drafter.ids == drafter.target.history[: drafter.rows]
    if not drafter.rows:
        return
    pair.target.model(mx.array([drafter.ids]))
    fresh = pair.draft.model.make_cache()
    pair.draft.model.read_context(capture.taps_of(pair.target.model).take(), fresh)
    for held, read in zip(drafter.cache, fresh):
        for a, b in zip(held.keys_and_values(), read.keys_and_values()):
            assert a.shape == b.shape and mx.allclose(a, b, atol=1e-4).item()


def _generation(pair, lanes: Lanes, prompt, options, answers: dict | None = None, *, session=None, reasons=False):
    """A task: the prompt's generation in a lane, its ids (or its finish reason) put in `answers`."""

    def run():
        running = session if session is not None else Session(pair)
        with lanes.joined(running):
            result = mlxspec.generate(pair, prompt, options, session=running)
        if answers is not None:
            answers[tuple(prompt)] = result.finish_reason if reasons else result.tokens

    return run


def test_a_batchs_columns_stay_bounded_by_its_longest_lane(load_pair, monkeypatch):
    """Holes (rejected drafts, trees' other branches, padding) are dropped as they outgrow
    the live columns: before every forward the cache holds at most twice the longest lane's
    columns and the slack, whatever was rejected on the way."""
    pair = load_pair("llama")
    together, seen = PackedCache._together, []

    def measured(self, reads):
        longest = max(lane.length for lane in self.lanes)
        seen.append((self.columns, longest))
        assert self.columns <= 2 * longest + packed.COMPACT_SLACK + packed.CHUNK, (self.columns, longest)
        return together(self, reads)

    monkeypatch.setattr(PackedCache, "_together", measured)
    generate_many(pair, PROMPTS, max_tokens=64, gamma=4, tree=8, temp=1.0, seed=1)
    assert any(later < earlier for (earlier, _), (later, _) in zip(seen, seen[1:]))  # it compacted
