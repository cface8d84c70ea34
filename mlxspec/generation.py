"""The public generation API: text in, events (or a result) out.

`stream` wraps the engine's token-level rounds with prompt building, detokenization, stop
strings and statistics; `generate` collects a stream into a result. A `Session` keeps both
models' caches between calls (chat): each call reads only what the cache does not hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import secrets
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import generation_stream, wired_limit

from .decoding import capture, engine
from .decoding.caches import CacheOptions
from .decoding.cursor import Cursor
from .decoding.drafter import Drafter
from .decoding.events import Done, Prefill, Round
from .drafters.history import DEFAULT_NAMESPACE, HistoryStore
from .drafters.lookup import PromptLookup
from .drafting import Controller, ControllerConfig, Policy
from .drafting.shape import tree_shape
from .errors import InvalidOption
from .grammar import Matcher, matcher_for
from .models.pairs import Pair, fit_context
from .options import AUTO, Options, label
from .stats import Stats, repeated_tokens
from .text import StopFilter, TextStream, check_text

Event = Prefill | Round | Done
SESSION_HISTORY_TOKENS = 1 << 18  # a session's own history index: a long chat's worth (11 MB at most)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]  # generated ids, end-of-sequence excluded
    prompt_tokens: int
    stats: Stats
    finish_reason: str

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


class Session:
    """Both models' caches, kept across generations, and (for gamma="auto") what the draft
    length controller has learnt of this pair. One session per conversation.

    Each call brings both caches back to the longest prefix they share with its prompt (a
    trim, a checkpoint whose ids start the prompt, or a fresh cache) and reads the rest: what
    a call emits is what a fresh session would emit for the same ids (cursor.Cursor says
    why). `cache_options` (a sliding `max_kv_size`, quantized KV) apply to both models."""

    def __init__(
        self,
        pair: Pair,
        *,
        cache_options: CacheOptions = CacheOptions(),
        controller: Controller | None = None,
        history: HistoryStore | None = None,
    ):
        """`controller`: what another session learnt of this pair, shared (a server's
        conversations, one generation at a time); default: a fresh one. `history`: the index
        of earlier prompts and answers that prompt lookup also drafts from (options.history),
        shared (a server's, one namespace per API key); default: this session's own, so a
        chat's later turns draft from its earlier ones."""
        self.pair = pair
        self.controller = controller or Controller(
            ControllerConfig(start_gamma=pair.gamma_hint, draft_weight=pair.draft_weight)
        )
        self.history = history or HistoryStore(limit_tokens=SESSION_HISTORY_TOKENS)
        self.target, self.draft = make_cursors(pair, cache_options=cache_options)
        if cache_options.kv_bits is not None:
            for cursor in filter(None, (self.target, self.draft)):
                if isinstance(cursor, Cursor):
                    _check_runs(cursor, cache_options)
        self._live = None  # a weak reference to the stream now on it: its cursors are that stream's

    def claim(self, events: Iterator[Event]) -> None:
        """A new stream takes the session. One left open (its consumer stopped reading, or
        raised mid-loop) is closed first: its clean-up runs now, on the caches it left, and
        never later on caches the new stream is using."""
        earlier = self._live() if self._live is not None else None
        if earlier is not None:
            earlier.close()
        self._live = weakref.ref(events)

    def reset(self) -> None:
        self.target.reset()
        if self.draft:
            self.draft.reset()


def make_cursors(pair: Pair, *, cache_options: CacheOptions) -> tuple[Cursor, Drafter | None]:
    """The target's cursor and the drafter its kind makes over it (models/kinds.py): a draft
    model's own cursor, or a head that reads the target's features (the target's cursor
    then keeps them)."""
    width, kind = pair.target.width, pair.kind
    target = Cursor(
        pair.target.model,
        f"target {pair.target.name}",
        width,
        width,
        cache_options=cache_options,
        taps=capture.taps_of(pair.target.model) if kind is not None and kind.reads_features else None,
    )
    if kind is None:
        return target, None
    return target, kind.drafter(pair.draft, target, name=f"draft {pair.draft.name}", cache_options=cache_options)


def _check_runs(cursor: Cursor, cache_options: CacheOptions) -> None:
    """Quantized KV caches fail at the first forward when a model's head size does not split
    into their groups: find out now, in one line, not mid-generation."""
    try:
        mx.eval(cursor.model(mx.array([[0]]), cache=cache_options.make(cursor.model, cursor.name).layers))
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InvalidOption(f"{cursor.name} cannot run with {cache_options.kv_bits}-bit KV caches: {reason}") from None


def encode_prompt(
    pair: Pair, prompt: str | Sequence[int], *, raw: bool = False, system: str | None = None, think: bool | None = None
) -> list[int]:
    """Token ids for a prompt: ids pass through; text goes through the chat template unless
    `raw` or the tokenizer has none."""
    if not isinstance(prompt, str):
        return [token_id(t, where=f"prompt[{i}]") for i, t in enumerate(prompt)]
    if not raw and pair.templated:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return apply_template(pair.tokenizer, messages, think=think)
    return list(pair.tokenizer.encode(prompt))


def token_id(value, *, where: str) -> int:
    """An id as given (an int, a numpy integer); a float or a bool is refused, never truncated."""
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError):
            return operator.index(value)
    raise InvalidOption(f"token ids are whole numbers: {where} is {value!r}")


def apply_template(
    tokenizer, messages: list[dict], *, think: bool | None = None, tools: list | None = None
) -> list[int]:
    """The chat template's ids for `messages`, ready for the assistant's reply. `think`:
    enable_thinking for templates that read it (Qwen3's think unless told not to)."""
    extra = {} if think is None else {"enable_thinking": think}
    if tools:
        extra["tools"] = tools
    from .models.templates import render

    return render(tokenizer, messages, **extra)


def encode_messages(
    tokenizer, messages: list[dict], *, think: bool | None = None, tools: list | None = None
) -> list[int]:
    """Ids for a conversation, ready for the assistant's reply: the chat template's, or for a
    tokenizer without one (the bundled code pair) a plain transcript, "Role: content" blocks
    ending in "Assistant:"."""
    if tokenizer.has_chat_template:
        return apply_template(tokenizer, messages, think=think, tools=tools)
    if tools:
        raise InvalidOption("tools need a chat template to be shown to the model, and this tokenizer has none")
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return list(tokenizer.encode("\n\n".join(lines) + "\n\nAssistant:"))


def options_of(options: Options | None, overrides: dict) -> Options:
    """`options` with keyword overrides (as `Options.build` takes them), or built from those."""
    if options is None:
        return Options.build(**overrides)
    return options.replace(**overrides) if overrides else options


def looks_up(pair: Pair, options: Options) -> bool:
    """Whether prompt lookup proposes: the options say so, else the pair does (--draft ngram)."""
    return pair.ngram if options.ngram is None else options.ngram


def check_drafting(pair: Pair, options: Options) -> None:
    """Refuse speculative options for a pair with nothing to draft with."""
    if options.speculative and pair.draft is None and not looks_up(pair, options):
        raise InvalidOption(
            "speculative decoding needs a draft model or prompt lookup: name a --draft, use --draft ngram, or "
            "--no-draft"
        )


def drafting_policy(
    pair: Pair, session: Session, options: Options, ids: list[int], *, namespace: str = DEFAULT_NAMESPACE
) -> Policy | None:
    """How this generation drafts, or None for standard decoding. Prompt lookup reads the
    session's history index too (under `namespace`) unless options.history is off."""
    if not options.speculative:
        return None
    check_drafting(pair, options)
    ngram = looks_up(pair, options)
    # beside a draft model only long matches are worth proposing: shorter ones are guesses the model makes better
    min_match = 3 if session.draft is not None else None
    if not ngram:
        lookup = None
    elif options.history:
        lookup = session.history.drafter(namespace, min_match=min_match).begin(ids)
    else:
        lookup = PromptLookup(ids, min_match=min_match)
    return Policy(
        gamma=options.gamma,
        stop=options.draft_min_p,
        controller=session.controller,
        lookup=lookup,
        draft_model=session.draft is not None,
        shape=tree_shape(
            target=session.target,
            drafter=session.draft,
            tree=options.tree,
            greedy=options.sampling.greedy,
            gamma_auto=options.gamma is AUTO,
        ),
    )


def stream(
    pair: Pair,
    prompt: str | Sequence[int],
    options: Options | None = None,
    *,
    session: Session | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    **overrides,
) -> Iterator[Event]:
    """Yields Prefill, then a Round per round (with each emitted id's text in `pieces`), then
    Done. Options (an `Options`, or its values as keywords: max_tokens=256, gamma="auto",
    temp, top_p, top_k, min_p, seed, stop, ngram, draft_min_p, raw, system): gamma=0 is
    standard decoding with the same sampler; gamma="auto" chooses each round's draft length
    (plain decoding included) from what the run measures; `ngram=True` adds prompt-lookup
    proposals (alone when the pair has no draft model); `draft_min_p` stops a round's
    drafting when the draft's top probability falls below it ("auto": learned). Ctrl-C ends
    the stream with Done("interrupted"), the session still usable. A later stream on the
    same session closes this one."""
    if session is not None and session.pair is not pair:
        raise InvalidOption("this session belongs to another pair: make one for this pair (Session(pair))")
    events = _stream(pair, prompt, options_of(options, overrides), session, namespace)
    if session is not None:
        session.claim(events)
    return events


def _stream(
    pair: Pair, prompt: str | Sequence[int], options: Options, session: Session | None, namespace: str
) -> Iterator[Event]:
    if isinstance(prompt, str) and not prompt.strip():
        raise InvalidOption("the prompt is empty")
    check_text(prompt if isinstance(prompt, str) else None, "the prompt")
    check_text(options.system, "the system prompt")
    ids = encode_prompt(pair, prompt, raw=options.raw, system=options.system, think=options.think)
    if not ids:
        raise InvalidOption("the prompt is empty")
    check_ids(pair, ids)
    max_tokens, limit_reason = fit_context(pair, len(ids), options.max_tokens)
    seed = secrets.randbits(31) if options.seed is None else options.seed
    session = session or Session(pair)
    policy = drafting_policy(pair, session, options, ids, namespace=namespace)
    grammar = grammar_for(pair, options)

    stats = Stats(gamma=label(options.gamma), seed=seed)
    if policy is not None:
        stats.chains_only = policy.shape.chains_only
    text = TextStream(pair.tokenizer, ids[-4:])
    stops = StopFilter(options.stop)
    eos = pair.eos_ids
    tokens = engine.decode(
        session.target,
        session.draft,
        ids,
        policy=policy,
        params=options.sampling,
        max_tokens=max_tokens,
        eos_ids=eos,
        key=mx.random.key(seed),
        grammar=grammar,
    )
    reason, answer = None, []
    # in a batch (attributes read, not calls: alone, a generation makes the calls it made
    # before, where the session walk's counted Ctrl-C lands), the gate hears of the prompt's
    # reading (the others' windows stall meanwhile) and of a γ 0 lane's tokens
    gate = session.controller.batch
    reading = gate.live > 1
    with wired_limit(pair.target.model, [generation_stream]):
        try:
            if reading:
                gate.reading(1)
            while reason is None:
                try:
                    event = next(tokens)
                except StopIteration as finished:
                    reason = limit_reason if finished.value == "length" else finished.value
                    break
                if isinstance(event, Prefill):
                    if reading:
                        gate.reading(-1)
                        reading = False
                    stats.add_prefill(event)
                    yield event
                    continue
                event, reason = _with_text(event, text, eos, stops)
                stats.add_round(event, tokens=sum(t not in eos for t in event.emitted))
                # the gate weighs every lane's tokens (a policy counts its own), a γ 0 lane's too once
                # others join it (a lane that started alone, as the first of a burst does)
                if policy is None and gate.live > 1:
                    gate.count(len(event.emitted))
                answer += event.emitted
                yield event
        except KeyboardInterrupt:
            reason = "interrupted"
        finally:
            tokens.close()
            if reading:  # interrupted while reading its prompt
                gate.reading(-1)
            if policy is not None and hasattr(policy.lookup, "end"):
                policy.lookup.end()  # the prompt and what was answered join the history
    tail = "" if reason == "stop" else stops.feed(text.flush())[0] + stops.flush()
    if pair.target.shard is not None:  # every round and plain step is one target forward
        stats.transfers = stats.rounds * pair.target.shard.transfers_per_forward
    stats.repeated = repeated_tokens(answer)
    yield Done(reason, stats.frozen(reason), tail, stops.matched if reason == "stop" else None)


def grammar_for(pair: Pair, options: Options) -> Matcher | None:
    """A fresh matcher for this reply's grammar, or None. Each reply starts the grammar
    anew; within it the matcher follows the ids kept (rounds.py rolls it back with the
    caches), so a session reused after an interrupted reply starts from a clean state."""
    if options.grammar is None:
        return None
    return matcher_for(options.grammar, pair.tokenizer, width=pair.target.width, eos_ids=pair.eos_ids)


def _with_text(event: Round, text: TextStream, eos: frozenset[int], stops: StopFilter) -> tuple[Round, str | None]:
    """Attach each emitted id's text; cut the round at a stop string. The text ends where
    the stop string starts; the ids that spelled it stay in `emitted`."""
    if event.branches:  # a tree: the paths it did not take, each from where it left the path
        event = dataclasses.replace(event, discarded=" / ".join(text.decode(list(b)) for b in event.branches))
    elif event.accepted < len(event.drafted):
        event = dataclasses.replace(event, discarded=text.decode(list(event.drafted[event.accepted :])))
    pieces, kept = [], []
    for token in event.emitted:
        kept.append(token)
        if token in eos:
            pieces.append("")
            break
        piece, stopped = stops.feed(text.add(token))
        pieces.append(piece)
        if stopped:
            return dataclasses.replace(event, emitted=tuple(kept), pieces=tuple(pieces)), "stop"
    return dataclasses.replace(event, emitted=tuple(kept), pieces=tuple(pieces)), None


def check_ids(pair: Pair, ids: list[int]) -> None:
    """Refuse a prompt id the target has no row for (the API's and the server's one check)."""
    width = pair.target.width
    if (bad := next((t for t in ids if not 0 <= t < width), None)) is not None:
        raise InvalidOption(f"token id {bad} is outside the target's vocabulary (0..{width - 1})")


def generate(
    pair: Pair,
    prompt: str | Sequence[int],
    options: Options | None = None,
    *,
    session: Session | None = None,
    **overrides,
) -> GenerationResult:
    """Generate to the end; options as for `stream`."""
    pieces, tokens = [], []
    eos = pair.eos_ids
    prompt_tokens = 0
    for event in stream(pair, prompt, options, session=session, **overrides):
        if isinstance(event, Prefill):
            prompt_tokens = event.prompt_tokens
        elif isinstance(event, Round):
            pieces.append(event.text)
            tokens += [t for t in event.emitted if t not in eos]
        else:
            done = event
            pieces.append(event.text)
    return GenerationResult("".join(pieces), tokens, prompt_tokens, done.stats, done.finish_reason)
