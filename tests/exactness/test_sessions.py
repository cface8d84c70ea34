"""Sessions across calls: every call's ids equal a fresh standard decode of the same history.

A Session keeps both caches between calls and brings them back to the longest prefix they
share with the next prompt: a trim, a checkpoint whose ids start the prompt, or a fresh
cache. The regression below is the stale checkpoint of issue 12; the state machine walks
sessions through random sequences of calls (extend, diverge, retry, interrupt) on every
cache family, and with EAGLE-3 heads and DFlash drafters, whose rows follow the target's
history. `demos/session_fuzz.py`
runs it longer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

import mlxspec
from mlxspec import Done, Prefill, Round
from mlxspec.decoding.caches import CacheOptions
from mlxspec.drafters import DFLASH
from mlxspec.drafters.feature_rows import FeatureRows
from mlxspec.generation import Session
from tests.conftest import ARCH_SETTINGS, ctrl_c_at, emitted_ids, fresh_standard
from tests.support.dflash import fresh_block_drafts, make_dflash
from tests.support.heads import fresh_head_drafts, make_head
from tests.support.mtp_models import write_hub_model


def fresh_draft(pair, history, n, options=CacheOptions()) -> list[int]:
    """What a draft that read `history` in one block would propose greedily, `n` ids."""
    if pair.kind.name == DFLASH:
        return fresh_block_drafts(pair, history, n)
    if pair.kind.reads_features:
        return fresh_head_drafts(pair, history, n)
    model = pair.draft.model
    cache = options.make(model).layers
    logits = model(mx.array(history)[None], cache=cache)
    proposals = []
    for _ in range(n):
        proposals.append(mx.argmax(logits[0, -1]).item())
        logits = model(mx.array([[proposals[-1]]]), cache=cache)
    return proposals


def assert_drafts_fresh(pair, prompt, rounds, options=CacheOptions()) -> None:
    """Each model-drafted round proposed what a fresh draft over the same history would: a
    draft cache that lies costs only acceptance, so the output alone cannot see it."""
    history = list(prompt)
    for r in rounds:
        if r.source == "model" and r.drafted and not r.nodes:  # a tree round's drafts are not one chain
            assert list(r.drafted) == fresh_draft(pair, history, len(r.drafted), options), f"round {r.index}"
        history += r.emitted


@pytest.mark.parametrize("gamma", [0, 3])
def test_a_checkpoint_is_not_restored_after_a_trim_below_it(load_pair, gamma):
    """Issue 12, on gemma3_text (window 8). Call 1's prompt is shorter than the window: its
    prefill leaves a checkpoint at its end. Call 2 diverges before it while the window has not
    wrapped (a trim), and is too short to take a new one. Call 3 extends call 2's history but
    diverges from its cache after the wrap: the old checkpoint, which holds call 1's ids, was
    restored and the sliding layers read call 1's rows (standard decoding too)."""
    pair = load_pair("gemma3_text")
    session = Session(pair)
    first = list(range(30, 36))
    emitted_ids(pair, first, session, gamma=gamma, max_tokens=2)
    assert session.target.cache.length < 8  # not wrapped: call 2 trims
    second = first[:3] + [90, 91]
    out, rounds = emitted_ids(pair, second, session, gamma=gamma, max_tokens=12)
    assert out == fresh_standard(pair, second, 12)
    third = (second + out)[:8] + [100, 101, 102]
    out, rounds = emitted_ids(pair, third, session, gamma=gamma, max_tokens=12)
    assert out == fresh_standard(pair, third, 12)
    assert_drafts_fresh(pair, third, rounds)


# Every cache family the engine rolls back: (architecture, weight bits, cache options).
FAMILIES = {
    "KVCache": ("llama", None, CacheOptions()),
    "QuantizedKVCache": ("llama_kv32", 4, CacheOptions(kv_bits=4, kv_group_size=32)),
    "RotatingKVCache": ("gemma3_text", None, CacheOptions()),  # window 8 beside KV layers
    "RotatingKVCache kept": ("qwen3", None, CacheOptions(max_kv_size=12)),  # 4 kept, 8 rotating
    "ArraysCache": ("mamba", None, CacheOptions()),
    "ArraysCache+KVCache": ("qwen3_next", None, CacheOptions()),
    "CacheList KV+KV": ("deepseek_v32", None, CacheOptions()),
    "CacheList window+state": ("baichuan_m1", None, CacheOptions()),
    "CacheList state+KV": ("falcon_h1", None, CacheOptions()),
}
# EAGLE-3 heads (fitted a little to their target, so that rounds both accept and reject) on a
# plain target and on one whose window of 8 wraps: (target architecture, cache options).
HEAD_FAMILIES = {
    "KVCache, EAGLE-3 head": ("llama", CacheOptions()),
    "RotatingKVCache, EAGLE-3 head": ("gemma3_text", CacheOptions()),
    # Qwen3.5's own MTP head (tests/support/mtp_models.py): its KV cache beside the target's
    # gated-delta state (restored from snapshots) and attention KV (trimmed)
    "ArraysCache, Qwen3.5 MTP head": ("mtp:qwen3_5", CacheOptions()),
    # GLM-4.7-Flash's nextn layer: MLA's KV cache, the embedding zeroed at the head's row 0
    "KVCache, GLM nextn head": ("mtp:glm4_moe_lite", CacheOptions()),
    # DFlash block drafters: context rows of the target's features, the block never cached
    "KVCache, DFlash drafter": ("dflash:llama", CacheOptions()),
    "RotatingKVCache, DFlash drafter": ("dflash:gemma3_text", CacheOptions()),
}
# Rotating caches both trim (before wrapping, after a block) and restore (after single
# steps), where a stale checkpoint can hide: they get more sequences. With checkpoints
# restored by length alone (issue 12's bug) both fail within 48 (the negative control below
# walks twice as many, with nothing timed, in a process of its own).
# (demos/session_fuzz.py walks them longer; these sizes keep CI inside its half hour)
SEQUENCES = {"RotatingKVCache": 24, "RotatingKVCache kept": 24}
SEQUENCES_ELSEWHERE = 8
MODES = {
    "standard": dict(gamma=0),
    **{f"gamma {g}": dict(gamma=g) for g in range(1, 7)},
    "auto": dict(gamma="auto"),
    "ngram": dict(gamma=3, ngram=True),
    "auto+ngram": dict(gamma="auto", ngram=True),
    # trees (where the target reads them: chains elsewhere) from the drafter and lookup's tries
    "tree 6": dict(gamma=3, tree=6),
    "tree auto+ngram": dict(gamma="auto", tree="auto", ngram=True),
    "ngram, no history": dict(gamma=3, ngram=True, history=False),
}
EDGE = 4  # cuts are tried around multiples of this: the kept tokens (4), windows (8, 12)
# How a call may be cut short: the consumer closes the stream, or throws Ctrl-C into it,
# after k rounds; or a Ctrl-C lands at the n-th function call inside mlxspec or mlx-lm
# (a call makes some 500 to 3500).
INTERRUPTS = st.one_of(
    st.none(),
    st.none(),
    st.tuples(st.sampled_from(["close", "throw"]), st.integers(0, 3)),
    st.tuples(st.just("ctrl-c"), st.integers(1, 3000)),
)


@dataclass(frozen=True)
class Call:
    mode: str
    max_tokens: int
    interrupt: tuple[str, int] | None


# Short calls too: a window that has not wrapped yet trims, one that has may not.
CALLS = st.builds(Call, st.sampled_from(list(MODES)), st.integers(1, 12), INTERRUPTS)
FRESH_IDS = st.lists(st.integers(3, 400), min_size=1, max_size=6)  # 0-2: special tokens


@dataclass
class Family:
    """One cache family's pair, options, fresh decodes already made, and what ran."""

    name: str
    pair: object
    options: CacheOptions
    fresh: dict = field(default_factory=dict)
    tally: Counter = field(default_factory=Counter)
    # the first call that failed, as it failed: hypothesis replays a failure to shrink it, and
    # where a replay draws differently it reports only that (FlakyStrategyDefinition)
    first_failure: str | None = None

    def standard(self, prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in self.fresh:
            self.fresh[key] = fresh_standard(self.pair, prompt, max_tokens, self.options)
        return self.fresh[key]


def load_family(load_pair, name: str, *, factory=None) -> Family:
    if name in HEAD_FAMILIES:
        arch, options = HEAD_FAMILIES[name]
        return Family(name, head_pair(factory, arch), options)
    arch, bits, options = FAMILIES[name]
    return Family(name, load_pair(arch, bits), options)


def head_pair(factory, arch: str):
    """The tests' target of `arch` beside a head fitted to its continuations of a few prompts
    (`mtp:FAMILY`: a model of that family with its own MTP head, the head so fitted)."""
    prompts = [list(range(10, 22)), list(range(40, 52)), [7, 8, 9] * 4]  # of one length: fitted as a batch
    if arch.startswith("mtp:"):
        family = arch.removeprefix("mtp:")
        out = factory.root / f"{family}-mtp-sessions"
        if not (out / "config.json").exists():
            write_hub_model(
                family,
                out,
                tokenizer_dir=factory.tokenizer_dir,
                eos_token_ids=factory.eos,
                fit_steps=100,
                fit_prompts=prompts,
            )
        return mlxspec.load_pair(str(out), "mtp")
    if arch.startswith("dflash:"):
        family = arch.removeprefix("dflash:")
        target = factory.model(f"{family}-target", arch=family, seed=1, head_scale=ARCH_SETTINGS[family][0])
        out = factory.root / f"{family}-dflash-sessions"
        if not (out / "config.json").exists():
            make_dflash(target, out, fit_steps=150, fit_prompts=prompts, seed=3)
        return mlxspec.load_pair(str(target), str(out))
    target = factory.model(f"{arch}-target", arch=arch, seed=1, head_scale=ARCH_SETTINGS[arch][0])
    out = factory.root / f"{arch}-eagle3-sessions"
    if not (out / "config.json").exists():
        make_head(target, out, draft_vocab=0.5, fit_steps=150, fit_prompts=prompts, seed=3)
    return mlxspec.load_pair(str(target), str(out))


class SessionWalk(RuleBasedStateMachine):
    """One session through a random sequence of calls. Each call's emitted ids must be a fresh
    standard decode's of the same prompt (its first ids, when the call was interrupted), each
    drafted round what a fresh draft would propose, and both cursors truthful after it."""

    def __init__(self, family: Family):
        super().__init__()
        self.family = family
        self.session = Session(family.pair, cache_options=family.options)
        self.histories: list[list[int]] = []  # after each call: its prompt and what it emitted
        self.prompt_ends: list[int] = []

    @property
    def history(self) -> list[int]:
        return self.histories[-1]

    @initialize(prompt=st.lists(st.integers(3, 400), min_size=1, max_size=10), call=CALLS)
    def start(self, prompt, call):
        self.run(prompt, call)

    @rule(data=st.data(), call=CALLS)
    def extend(self, data, call):
        """The next turn: the history so far and new ids (none: go on generating)."""
        new = data.draw(st.one_of(st.just([]), self.new_ids()), label="new")
        self.run(self.history + new, call)

    @rule(data=st.data(), call=CALLS)
    def diverge_near_an_edge(self, data, call):
        """Cut the history around where earlier prompts ended (their prefills' checkpoints are
        one id before) or around a window's edge, and go on with other ids."""
        n = len(self.history)
        edges = {e + d for e in self.prompt_ends[-3:] for d in (-2, -1, 0, 1)}
        edges |= {e + d for e in range(EDGE, n + 1, EDGE) for d in (-1, 0, 1)}
        cut = data.draw(st.sampled_from(sorted(e for e in edges if 0 <= e <= n) or [0]), label="cut")
        self.run(self.history[:cut] + data.draw(self.new_ids(), label="new"), call)

    @rule(data=st.data(), call=CALLS)
    def diverge(self, data, call):
        """Cut the history anywhere and go on with other ids."""
        cut = data.draw(st.integers(0, len(self.history)), label="cut")
        self.run(self.history[:cut] + data.draw(self.new_ids(), label="new"), call)

    @rule(call=CALLS)
    def retry(self, call):
        """The last prompt again (chat's /retry)."""
        self.run(self.histories[-1][: self.prompt_ends[-1]], call)

    @precondition(lambda self: len(self.histories) >= 2)
    @rule(data=st.data(), call=CALLS)
    def undo(self, data, call):
        """Back to the history before the last call, and on from there (chat's /undo)."""
        self.histories.pop()
        self.prompt_ends.pop()
        self.run(self.history + data.draw(self.new_ids(), label="new"), call)

    def new_ids(self):
        """Fresh ids, or a quote of the history (something for prompt lookup to find)."""
        history = self.history
        quote = st.integers(0, len(history) - 1).flatmap(lambda i: st.integers(1, 8).map(lambda k: history[i : i + k]))
        return st.one_of(FRESH_IDS, quote)

    def teardown(self):
        self.family.tally["sequences"] += bool(self.histories)

    def run(self, prompt: list[int], call: Call) -> None:
        try:
            self.call(prompt, call)
        except Exception:
            self.family.first_failure = self.family.first_failure or traceback.format_exc()
            raise

    def call(self, prompt: list[int], call: Call) -> None:
        family, session = self.family, self.session
        resync = how_sync_goes(session.target, prompt)
        outcome = consume(family.pair, session, prompt, call)
        expected = family.standard(prompt, call.max_tokens)
        emitted = outcome.emitted
        assert emitted == (expected[: len(emitted)] if outcome.interrupted else expected), (call, prompt)
        assert_drafts_fresh(family.pair, prompt, outcome.rounds, family.options)
        for cursor in filter(None, (session.target, session.draft)):
            assert_truthful(cursor)
        family.tally["calls"] += 1
        if outcome.interrupted:
            family.tally[f"interrupted: {call.interrupt[0]}"] += 1
        if outcome.landed:
            family.tally[f"ctrl-c in {outcome.landed}"] += 1
        if outcome.prefill is not None:  # the call got past its prefill
            family.tally[f"sync: {resync}"] += 1
        self.histories.append(prompt + emitted)
        self.prompt_ends.append(len(prompt))


def consume(pair, session, prompt, call: Call):
    """Run one call as a consumer would, interrupting it as `call` says."""
    kind, at = call.interrupt or (None, None)
    emitted, rounds, prefill, interrupted = [], [], None, False
    events = mlxspec.stream(pair, prompt, session=session, max_tokens=call.max_tokens, **MODES[call.mode])
    with ctrl_c_at(at if kind == "ctrl-c" else None) as landed:
        try:
            for event in events:
                if isinstance(event, Prefill):
                    prefill = event
                elif isinstance(event, Round):
                    rounds.append(event)
                    emitted += event.emitted
                elif isinstance(event, Done):
                    interrupted = event.finish_reason == "interrupted"
                    break
                if kind in ("close", "throw") and len(rounds) == at:
                    if kind == "throw":
                        assert events.throw(KeyboardInterrupt).finish_reason == "interrupted"
                    events.close()
                    interrupted = True
                    break
        except KeyboardInterrupt:  # it landed outside the stream's own handler
            interrupted = True
    return Outcome(emitted, rounds, prefill, interrupted, landed[0] if landed else None)


@dataclass
class Outcome:
    emitted: list[int]  # end-of-sequence included
    rounds: list[Round]
    prefill: Prefill | None  # None: cut short before its prefill was done
    interrupted: bool
    landed: str | None  # the module a Ctrl-C was raised in


def how_sync_goes(cursor, prompt: list[int]) -> str:
    """How the target's cache will come back to the prompt (for the tally)."""
    tokens, cache = cursor.tokens, cursor.cache
    common = 0
    while common < min(len(tokens), len(prompt) - 1) and tokens[common] == prompt[common]:
        common += 1
    if common == len(tokens):
        return "extended"
    if cache.can_trim_to(common):
        return "trimmed"
    return "restored a checkpoint" if cursor._checkpoint_within(prompt[:common]) else "read again"


def assert_truthful(cursor) -> None:
    if isinstance(cursor, FeatureRows):
        # a drafter over the target's features follows it lazily: what it keeps after
        # aligning (as its next use does first) is one row per position of the target's
        # history, no more
        cursor._align()
        assert cursor.rows <= cursor.target_rows
        assert len(cursor.ids) == (cursor.rows + cursor.reads_ahead if cursor.rows else 0) or not cursor.rows
        assert cursor.ids == cursor.target.history[: len(cursor.ids)]
        return
    assert cursor.cache.length == len(cursor.tokens)
    cursor.cache._check()  # every layer holds as many tokens
    for checkpoint in cursor.checkpoints:
        assert checkpoint.mark.length == len(checkpoint.ids)


WALKS = settings(
    max_examples=SEQUENCES_ELSEWHERE,
    stateful_step_count=8,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],  # not explain: it traces too
)


def walk(family: Family, walks: settings) -> None:
    """Run the walks. One place for every caller: a derandomized run's seeds follow from the
    code that starts it, so the demo's --fixed run repeats this file's."""
    run_state_machine_as_test(lambda: SessionWalk(family), settings=walks)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES) + list(HEAD_FAMILIES))
def test_random_sessions_stay_exact(load_pair, factory, name, monkeypatch):
    if name in HEAD_FAMILIES:
        # fixed draft lengths for auto's timed choices: on a loaded machine they changed a
        # call's rounds between hypothesis's runs of the same choices (FlakyStrategyDefinition);
        # auto with heads is walked by demos/session_fuzz.py --timed and tests/models/test_eagle3.py
        monkeypatch.setitem(MODES, "auto", dict(gamma=3))
        monkeypatch.setitem(MODES, "auto+ngram", dict(gamma=3, ngram=True))
        monkeypatch.setitem(MODES, "tree auto+ngram", dict(gamma=3, tree=8, ngram=True))
    family = load_family(load_pair, name, factory=factory)
    walk(family, settings(WALKS, max_examples=SEQUENCES.get(name, SEQUENCES_ELSEWHERE)))
    print(f"{name}: {dict(family.tally)}")


def untimed(modes: dict) -> dict:
    """`modes` with nothing timed: fixed lengths and trees for auto's, and no learned early stop
    (it reads the draft's speed), so that a walk's rounds, and so what it draws next and which
    caches it reaches, do not depend on how loaded the machine is."""
    fixed = {
        mode: {k: (3 if k == "gamma" else 8) if v == "auto" else v for k, v in o.items()} for mode, o in modes.items()
    }
    return {mode: {**options, "draft_min_p": 0.0} for mode, options in fixed.items()}


def by_length_alone(cursor, prefix):
    """Issue 12's bug: any checkpoint no longer than the shared prefix, whatever its ids."""
    return max((c for c in cursor.checkpoints if len(c.ids) <= len(prefix)), key=lambda c: len(c.ids), default=None)


NEGATIVE_CONTROL = "MLXSPEC_NEGATIVE_CONTROL"


@pytest.mark.parametrize("name", ["RotatingKVCache", "RotatingKVCache kept"])
def test_the_walk_finds_a_stale_checkpoint(name):
    """The negative control: with checkpoints restored by length alone, the walk fails. In a
    process of its own: a Ctrl-C lands at the n-th function call, and what earlier tests left
    warm in a shared process (caches, wrapped classes) moves where, so that in a full run the
    walk could miss the bug within its budget."""
    test = f"{__file__}::test_the_walk_with_stale_checkpoints_fails[{name}]"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        env={**os.environ, NEGATIVE_CONTROL: "1"},
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:]


@pytest.mark.skipif(not os.environ.get(NEGATIVE_CONTROL), reason="run by test_the_walk_finds_a_stale_checkpoint")
@pytest.mark.parametrize("name", ["RotatingKVCache", "RotatingKVCache kept"])
def test_the_walk_with_stale_checkpoints_fails(load_pair, monkeypatch, name):
    from mlxspec.decoding.cursor import Cursor

    monkeypatch.setattr(Cursor, "_checkpoint_within", by_length_alone)
    for mode, options in untimed(MODES).items():
        monkeypatch.setitem(MODES, mode, options)
    family = load_family(load_pair, name)
    walks = settings(WALKS, max_examples=2 * SEQUENCES[name], phases=[Phase.generate])
    with pytest.raises(AssertionError):
        walk(family, walks)
