"""Sessions across calls: every call's ids equal a fresh standard decode of the same history.

A Session keeps both caches between calls and brings them back to the longest prefix they
share with the next prompt: a trim, a checkpoint whose ids start the prompt, or a fresh
cache. The regression below is the stale checkpoint of issue 12; the state machine walks
sessions through random sequences of calls (extend, diverge, retry, interrupt) on every
cache family. `demos/session_fuzz.py` runs it longer.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

import mlxspec
from mlxspec import Round
from mlxspec.caches import CacheOptions
from mlxspec.generation import Session


def emitted_ids(pair, prompt, session, **options) -> tuple[list[int], list[Round]]:
    """The ids a call emits (end-of-sequence included) and its rounds."""
    rounds = [e for e in mlxspec.stream(pair, prompt, session=session, **options) if isinstance(e, Round)]
    return [t for r in rounds for t in r.emitted], rounds


def fresh_standard(pair, prompt, max_tokens, options=CacheOptions()) -> list[int]:
    return emitted_ids(pair, prompt, Session(pair, cache_options=options), gamma=0, max_tokens=max_tokens)[0]


def fresh_draft(pair, history, n, options=CacheOptions()) -> list[int]:
    """What a draft that read `history` in one block would propose greedily, `n` ids."""
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
        if r.source == "model" and r.drafted:
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
