"""The public generation API: text in, events (or a result) out.

`stream` wraps the engine's token-level rounds with prompt building, detokenization, stop
strings and statistics; `generate` collects a stream into a result. A `Session` keeps both
models' caches between calls (chat): each call reads only what the cache does not hold.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass
from typing import Iterator, Sequence

import mlx.core as mx
from mlx_lm.generate import generation_stream, wired_limit

from . import engine
from .caches import CacheOptions
from .errors import InvalidOption, PromptTooLong
from .events import Done, Prefill, Round, Stats, StatsCollector
from .pairs import Pair
from .sampling import SamplingParams
from .text import StopFilter, TextStream

Event = Prefill | Round | Done


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
    a call emits is what a fresh session would emit for the same ids (engine.Cursor says
    why). `cache_options` (a sliding `max_kv_size`, quantized KV) apply to both models."""

    def __init__(self, pair: Pair, *, cache_options: CacheOptions = CacheOptions()):
        from .controller import Controller

        self.pair = pair
        self.controller = Controller(start_gamma=pair.gamma_hint)
        width = pair.target.width
        self.target = engine.Cursor(
            pair.target.model, f"target {pair.target.name}", pair.target.width, width, cache_options=cache_options
        )
        self.draft = (
            engine.Cursor(pair.draft.model, f"draft {pair.draft.name}", pair.draft.width, width, cache_options=cache_options)
            if pair.draft
            else None
        )

    def reset(self) -> None:
        self.target.reset()
        if self.draft:
            self.draft.reset()


def encode_prompt(pair: Pair, prompt: str | Sequence[int], *, raw: bool = False, system: str | None = None) -> list[int]:
    """Token ids for a prompt: ids pass through; text goes through the chat template unless
    `raw` or the tokenizer has none."""
    if not isinstance(prompt, str):
        return [int(t) for t in prompt]
    tokenizer = pair.tokenizer
    if not raw and tokenizer.has_chat_template:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return list(tokenizer.encode(prompt))


def parse_gamma(gamma) -> int | str:
    """A draft length: a whole number >= 0, or "auto"."""
    if gamma == "auto":
        return gamma
    if isinstance(gamma, str) and gamma.strip().isdigit():
        return int(gamma)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
        raise InvalidOption(f"gamma (draft length) must be a whole number >= 0 or 'auto', got {gamma!r}")
    return gamma


def parse_draft_min_p(value) -> float | str:
    """The draft's early-stop threshold: a number in [0, 1) (0: off), or "auto" (learned)."""
    if value == "auto":
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or not 0 <= number < 1:
        raise InvalidOption(f"draft min-p must be in [0, 1) or 'auto', got {value!r}")
    return number


def check_options(
    pair: Pair | None, gamma, max_tokens: int, xtc_probability: float = 0.0, ngram: bool = False, draft_min_p=0.0
) -> int | str:
    """Refuse options the engine cannot honour exactly (`pair` None: what can be checked
    before the models are loaded); returns gamma parsed."""
    gamma = parse_gamma(gamma)
    if gamma != 0 and pair is not None and pair.draft is None and not ngram:
        raise InvalidOption("speculative decoding needs a draft model (or n-gram drafting): name one, or use gamma 0")
    parse_draft_min_p(draft_min_p)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidOption(f"max tokens must be a whole number >= 1, got {max_tokens}")
    if xtc_probability:
        raise InvalidOption(
            "XTC sampling cannot be kept exact: it removes top tokens at random per step, so the "
            "target's distribution is not a fixed function of its logits"
        )
    return gamma


def stream(
    pair: Pair,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 256,
    gamma: int | str = "auto",
    temp: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    seed: int | None = None,
    raw: bool = False,
    stop: Sequence[str] = (),
    xtc_probability: float = 0.0,
    session: Session | None = None,
    ngram: bool | None = None,
    draft_min_p: float | str = 0.0,
) -> Iterator[Event]:
    """Yields Prefill, then a Round per round (with each emitted id's text in `pieces`), then
    Done. gamma=0 is standard decoding with the same sampler; gamma="auto" chooses each
    round's draft length (plain decoding included) from what the run measures. `ngram=True`
    adds prompt-lookup proposals (alone when the pair has no draft model). `draft_min_p`
    stops a round's drafting when the draft's top probability falls below it; "auto" learns
    the threshold (off while stopping would not pay). Ctrl-C ends
    the stream with Done("interrupted"), the session still usable."""
    params = SamplingParams(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p)
    ngram = pair.ngram if ngram is None else ngram
    gamma = check_options(pair, gamma, max_tokens, xtc_probability, ngram, draft_min_p)
    if isinstance(prompt, str) and not prompt.strip():
        raise InvalidOption("the prompt is empty")
    ids = encode_prompt(pair, prompt, raw=raw)
    if not ids:
        raise InvalidOption("the prompt is empty")
    _check_ids(pair, ids)
    max_tokens, limit_reason = _fit_context(pair, len(ids), max_tokens)
    seed = secrets.randbits(31) if seed is None else seed
    session = session or Session(pair)

    collector = StatsCollector(gamma=gamma, seed=seed)
    text = TextStream(pair.tokenizer, ids[-4:])
    stops = StopFilter(tuple(stop))
    eos = pair.eos_ids
    tokens = engine.decode(
        session.target,
        session.draft,
        ids,
        gamma=gamma,
        params=params,
        max_tokens=max_tokens,
        eos_ids=eos,
        key=mx.random.key(seed),
        ngram=_ngram_index(ids) if ngram else None,
        min_p=parse_draft_min_p(draft_min_p),
        controller=session.controller if "auto" in (gamma, draft_min_p) else None,
    )
    reason = None
    with wired_limit(pair.target.model, [generation_stream]):
        try:
            while reason is None:
                try:
                    event = next(tokens)
                except StopIteration as finished:
                    reason = limit_reason if finished.value == "length" else finished.value
                    break
                if isinstance(event, Prefill):
                    collector.add_prefill(event)
                    yield event
                    continue
                event, reason = _with_text(event, text, eos, stops)
                collector.add_round(event, tokens=sum(t not in eos for t in event.emitted))
                yield event
        except KeyboardInterrupt:
            reason = "interrupted"
        finally:
            tokens.close()
    tail = "" if reason == "stop" else stops.feed(text.flush())[0] + stops.flush()
    yield Done(reason, collector.stats(reason), tail)


def _with_text(event: Round, text: TextStream, eos: frozenset[int], stops: StopFilter) -> tuple[Round, str | None]:
    """Attach each emitted id's text; cut the round at a stop string. The text ends where
    the stop string starts; the ids that spelled it stay in `emitted`."""
    if event.accepted < len(event.drafted):
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


def _ngram_index(ids: list[int]):
    from .ngram import NGramIndex

    index = NGramIndex()
    index.extend(ids)
    return index


def _check_ids(pair: Pair, ids: list[int]) -> None:
    bad = [t for t in ids if not 0 <= t < pair.target.width]
    if bad:
        raise InvalidOption(f"token id {bad[0]} is outside the target's vocabulary (0..{pair.target.width - 1})")


def _fit_context(pair: Pair, prompt_len: int, max_tokens: int) -> tuple[int, str]:
    context = pair.target.context_length
    if context is None:
        return max_tokens, "length"
    if prompt_len >= context:
        raise PromptTooLong(f"the prompt has {prompt_len} tokens and {pair.target.label} reads at most {context}")
    room = context - prompt_len
    return (max_tokens, "length") if max_tokens <= room else (room, "context")


def generate(pair: Pair, prompt: str | Sequence[int], **options) -> GenerationResult:
    """Generate to the end; options as for `stream`."""
    pieces, tokens = [], []
    eos = pair.eos_ids
    prompt_tokens = 0
    for event in stream(pair, prompt, **options):
        if isinstance(event, Prefill):
            prompt_tokens = event.prompt_tokens
        elif isinstance(event, Round):
            pieces.append(event.text)
            tokens += [t for t in event.emitted if t not in eos]
        else:
            done = event
            pieces.append(event.text)
    return GenerationResult("".join(pieces), tokens, prompt_tokens, done.stats, done.finish_reason)
