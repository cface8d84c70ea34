"""Speculative and standard decoding as generators of events, over token ids.

The loop is Leviathan et al.'s (arXiv 2211.17192, Algorithm 1), with the choices a fixed
algorithm leaves open handed to a drafting policy (drafting/): each round the policy plans
how many ids to draft, from the draft model or prompt lookup, as a chain or a tree, and
where the draft may stop; the round (rounds.py, one for chains and trees) proposes,
verifies every proposal in one target pass and keeps the accepted path in both caches;
the policy observes the outcome. A policy may also plan a stretch of plain
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
from .carry import Carry
from .cursor import TOKEN, Cursor
from .events import Prefill, Round
from .plan import TARGET, Outcome, Planner
from .rounds import run_round
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
    carry = Carry(params=params, eos_ids=eos_ids, key=key, grammar=grammar)
    # mlx-lm's generation stream: on Metal, work queued here overlaps the host's.
    with mx.stream(generation_stream):
        yield prefill(target, drafter if policy else None, prompt)
        if policy is None:
            return (yield from standard(target, carry, max_tokens=max_tokens))
        policy.observe_prefill()
        return (yield from speculative(target, drafter, carry, policy=policy, max_tokens=max_tokens))


def speculative(target, drafter, carry: Carry, *, policy: Planner, max_tokens: int) -> Iterator[Round]:
    produced = rounds = 0
    eos_ids = carry.eos_ids
    while produced < max_tokens:
        carry, this_round = carry.split()
        plan = policy.plan(remaining=max_tokens - produced)
        if plan.plain:  # plain decoding wins for now: a pipelined stretch
            for event in standard(target, this_round, max_tokens=plan.plain, index=rounds):
                policy.observe_plain(event.emitted[0], event.seconds)
                if drafter is not None:
                    drafter.hear(event.emitted)
                produced, rounds = produced + 1, rounds + 1
                yield event
                if event.emitted[0] in eos_ids:
                    return "eos"
            continue
        outcome = run_round(target, drafter, plan, this_round)  # a chain's or a tree's
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


def standard(target: Cursor, carry: Carry, *, max_tokens: int, index: int = 0) -> Iterator[Round]:
    """The target alone, through the same sampling code; returns "eos" or "length".
    Pipelined as mlx-lm's generate_step is: the step for token t+1 is queued before token t
    is read, so the host's graph building overlaps the device's work and the baseline is as
    fast as plain mlx-lm. Under a grammar (constrained) only the forward for t+1 is queued
    before token t is read: the draw waits for the mask, which the host computes meanwhile."""
    steps = plain if carry.grammar is None else constrained
    return (yield from steps(target, carry, max_tokens=max_tokens, index=index))


def plain(target: Cursor, carry: Carry, *, max_tokens: int, index: int = 0) -> Iterator[Round]:
    keys = _keys(carry.key)
    params = carry.params

    def step(inputs: mx.array) -> mx.array:
        return pick(target.forward(inputs)[-1], params, next(keys))[0].astype(TOKEN)

    history = target.history  # plus each id read back: what the cache holds or will read
    y = _first(target, history, step)
    for produced in range(1, max_tokens + 1):
        start = time.perf_counter()
        queued = produced < max_tokens
        with target.atomic(history):
            if queued:
                following = step(y[None])
                mx.async_eval(following)
            token = y.item()
            _keep(target, history, token, queued=queued)
        yield _plain_round(index + produced - 1, token, time.perf_counter() - start)
        if token in carry.eos_ids:
            return "eos"
        if queued:
            y = following
    return "length"


def constrained(target: Cursor, carry: Carry, *, max_tokens: int, index: int = 0) -> Iterator[Round]:
    keys, grammar = _keys(carry.key), carry.grammar
    params = carry.params

    def forward(inputs: mx.array) -> mx.array:
        logits = target.forward(inputs)[-1]
        mx.async_eval(logits)  # the device runs it while the host computes the mask
        return logits

    def draw(logits: mx.array, step_key: mx.array) -> mx.array:
        return pick(constrain(logits, grammar.allowed()), params, step_key)[0].astype(TOKEN)

    history = target.history
    y = _first(target, history, lambda inputs: draw(forward(inputs), next(keys)))
    for produced in range(1, max_tokens + 1):
        start = time.perf_counter()
        queued = produced < max_tokens
        with target.atomic(history):
            if queued:
                logits, following_key = forward(y[None]), next(keys)
            token = y.item()
            grammar.consume(token)
            grammar.forget_below(grammar.depth)
            if queued and token not in carry.eos_ids:  # after the end the grammar allows nothing
                following = draw(logits, following_key)
                mx.async_eval(following)
            _keep(target, history, token, queued=queued)
        yield _plain_round(index + produced - 1, token, time.perf_counter() - start)
        if token in carry.eos_ids:
            return "eos"
        if queued:
            y = following
    return "length"


def _keys(key: mx.array) -> Iterator[mx.array]:
    """One key per step, split off the last: key, sub = split(key), again and again."""
    while True:
        key, sub = mx.random.split(key)
        yield sub


def _first(target: Cursor, history: list[int], step) -> mx.array:
    """The target reads its pending ids; the first id is queued."""
    with target.atomic(history):
        fed = list(target.pending)
        target.pending = []
        y = step(mx.array(fed, dtype=TOKEN))
        mx.async_eval(y)
        target.tokens += fed
    return y


def _keep(target: Cursor, history: list[int], token: int, *, queued: bool) -> None:
    """An id read back: in the history; read by the target already (queued) or still pending."""
    history.append(token)
    if queued:
        target.tokens.append(token)
    else:
        target.pending = [token]


def _plain_round(index: int, token: int, seconds: float) -> Round:
    return Round(
        index=index,
        gamma=0,
        drafted=(),
        accepted=0,
        emitted=(token,),
        draft_seconds=None,
        verify_seconds=None,
        seconds=seconds,
        source=TARGET,
    )
