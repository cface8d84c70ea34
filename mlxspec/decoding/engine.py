"""Speculative and standard decoding as generators of events, over token ids.

The loop is Leviathan et al.'s (arXiv 2211.17192, Algorithm 1), with the choices a fixed
algorithm leaves open handed to a drafting policy (drafting/): each round the policy plans
how many ids to draft, from the draft model or prompt lookup, and where the draft may stop;
the round drafts, verifies all drafts in one target pass and rewinds both caches
(rounds.py); the policy observes the outcome. A policy may also plan a stretch of plain
decoding, where drafting would not pay. Plans depend on the past only, so whatever a policy
chooses, every emitted id has exactly the target's distribution.

Standard decoding leaves the next step queued when it yields (pipelining); speculative
rounds end synchronised. A consumer that runs other device work between events (race)
waits for the queue first (`mx.synchronize()`) and counts that time to this generator.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx
from mlx_lm.generate import generation_stream

from ..grammar import Matcher
from .cursor import TOKEN, Cursor
from .events import Prefill, Round
from .plan import TARGET, Outcome, Planner
from .rounds import run_round, run_tree_round
from .sampling import SamplingParams, constrain, pick


def decode(
    target: Cursor,
    drafter: Cursor | None,
    prompt: list[int],
    *,
    policy: Planner | None,
    params: SamplingParams,
    max_tokens: int,
    eos_ids: frozenset[int],
    key: mx.array,
    grammar: Matcher | None = None,
) -> Iterator[Prefill | Round]:
    """Yields a Prefill, then one Round per round; returns the finish reason ("eos" or
    "length"). `policy` None: standard decoding, the target alone, through the same sampler.
    `grammar`: every id is drawn from logits it masks, in both (grammar.py)."""
    target.keep_features = policy is not None  # only a drafter reads them
    # mlx-lm's generation stream: on Metal, work queued here overlaps the host's.
    with mx.stream(generation_stream):
        yield prefill(target, drafter if policy else None, prompt)
        if policy is None:
            return (
                yield from standard(
                    target, params=params, max_tokens=max_tokens, eos_ids=eos_ids, key=key, grammar=grammar
                )
            )
        policy.observe_prefill()
        return (
            yield from speculative(
                target,
                drafter,
                policy=policy,
                params=params,
                max_tokens=max_tokens,
                eos_ids=eos_ids,
                key=key,
                grammar=grammar,
            )
        )


def speculative(
    target, drafter, *, policy: Planner, params, max_tokens: int, eos_ids, key, grammar: Matcher | None = None
) -> Iterator[Round]:
    produced = rounds = 0
    while produced < max_tokens:
        key, round_key = mx.random.split(key)
        plan = policy.plan(remaining=max_tokens - produced)
        if plan.plain:  # plain decoding wins for now: a pipelined stretch
            for event in standard(
                target,
                params=params,
                max_tokens=plan.plain,
                eos_ids=eos_ids,
                key=round_key,
                index=rounds,
                grammar=grammar,
            ):
                policy.observe_plain(event.emitted[0], event.seconds)
                if drafter is not None:
                    drafter.hear(event.emitted)
                produced, rounds = produced + 1, rounds + 1
                yield event
                if event.emitted[0] in eos_ids:
                    return "eos"
            continue
        if plan.reads_tree:
            outcome = run_tree_round(
                target, drafter, plan, params=params, key=round_key, eos_ids=eos_ids, grammar=grammar
            )
        else:
            outcome = run_round(target, drafter, plan, params=params, key=round_key, eos_ids=eos_ids, grammar=grammar)
        policy.observe_round(outcome)
        produced += len(outcome.emitted)
        yield round_event(outcome, index=rounds)
        rounds += 1
        if outcome.emitted[-1] in eos_ids:
            return "eos"
    return "length"


def round_event(outcome: Outcome, *, index: int) -> Round:
    return Round(
        index=index,
        gamma=outcome.plan.gamma,
        drafted=outcome.drafted,
        accepted=outcome.accepted,
        emitted=outcome.emitted,
        draft_seconds=outcome.draft_seconds,
        verify_seconds=outcome.verify_seconds,
        seconds=outcome.seconds + outcome.catch_up_seconds,
        source=outcome.source,
        early_stop=outcome.early_stop,
        nodes=outcome.nodes,
        branches=outcome.branches,
    )


def prefill(target: Cursor, drafter: Cursor | None, prompt: list[int]) -> Prefill:
    start = time.perf_counter()
    reused = target.sync(prompt)
    target.prefill()
    if drafter is not None:
        drafter.sync(prompt)
        drafter.prefill()
    return Prefill(len(prompt), len(prompt) - reused, time.perf_counter() - start)


def standard(
    target: Cursor,
    *,
    params: SamplingParams,
    max_tokens: int,
    eos_ids: frozenset[int],
    key: mx.array,
    index: int = 0,
    grammar: Matcher | None = None,
) -> Iterator[Round]:
    """The target alone, through the same sampling code; returns "eos" or "length".
    Pipelined as mlx-lm's generate_step is: the step for token t+1 is queued before token t
    is read, so the host's graph building overlaps the device's work and the baseline is as
    fast as plain mlx-lm. Under a grammar the forward for t+1 is queued before token t is
    read, and only the draw waits for the mask, which the host computes meanwhile."""

    def forward(inputs: mx.array) -> mx.array:
        logits = target.forward(inputs)[-1]
        if grammar is not None:
            mx.async_eval(logits)
        return logits

    def draw(logits: mx.array, step_key: mx.array) -> mx.array:
        allowed = grammar.allowed() if grammar is not None else None
        return pick(constrain(logits, allowed), params, step_key)[0].astype(TOKEN)

    def step(inputs: mx.array, step_key: mx.array) -> mx.array:
        return draw(forward(inputs), step_key)

    def next_key():
        nonlocal key
        key, sub = mx.random.split(key)
        return sub

    history = target.history  # plus each id read back: what the cache holds or will read
    with target.atomic(history):
        fed = list(target.pending)
        target.pending = []
        y = step(mx.array(fed, dtype=TOKEN), next_key())
        mx.async_eval(y)
        target.tokens += fed
    for produced in range(1, max_tokens + 1):
        start = time.perf_counter()
        queued = produced < max_tokens
        with target.atomic(history):
            if queued and grammar is None:
                following = step(y[None], next_key())
                mx.async_eval(following)
            elif queued:
                logits, following_key = forward(y[None]), next_key()
            token = y.item()
            if grammar is not None:
                grammar.consume(token)
                grammar.forget_below(grammar.depth)
                if queued and token not in eos_ids:  # after the end the grammar allows nothing
                    following = draw(logits, following_key)
                    mx.async_eval(following)
            history.append(token)
            if queued:
                target.tokens.append(token)
            else:
                target.pending = [token]
        seconds = time.perf_counter() - start
        yield Round(
            index=index + produced - 1,
            gamma=0,
            drafted=(),
            accepted=0,
            emitted=(token,),
            draft_seconds=None,
            verify_seconds=None,
            seconds=seconds,
            source=TARGET,
        )
        if token in eos_ids:
            return "eos"
        if queued:
            y = following
    return "length"
