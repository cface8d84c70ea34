"""A conversation over one Session: messages, per-turn statistics, and both models' caches
kept between turns.

Each turn renders the whole conversation through the chat template and hands the ids to the
engine with the session; the session keeps the longest prefix its caches already hold and
reads only the rest (the template's new suffix, plus whatever the template rewrote, such as
a reply's thinking section). When the conversation outgrows the target's context, the
oldest turns are dropped and the rest is read again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .caches import CacheOptions
from .errors import InvalidOption, PromptTooLong
from .events import ContextTrimmed, Done, Prefill, Round
from .generation import Session, check_drafting, encode_messages, stream
from .options import Options
from .pairs import Pair
from .stats import Stats

# A conversation samples by default, as chat front ends do.
CHAT_OPTIONS = Options.build(temp=0.7, top_p=0.95, max_tokens=512)


@dataclass
class Turn:
    user: str
    assistant: str
    stats: Stats
    prompt_tokens: int
    reused_tokens: int
    finish_reason: str


@dataclass
class Conversation:
    pair: Pair
    system: str | None = None
    settings: Options = CHAT_OPTIONS
    cache_options: CacheOptions = CacheOptions()

    def __post_init__(self):
        self.session = Session(self.pair, cache_options=self.cache_options)
        self.turns: list[Turn] = []
        self.totals = Stats()
        self._dropped = 0  # leading turns no longer in the model's view

    def messages(self, user: str | None = None) -> list[dict]:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for turn in self.turns[self._dropped :]:
            messages += [{"role": "user", "content": turn.user}, {"role": "assistant", "content": turn.assistant}]
        if user is not None:
            messages.append({"role": "user", "content": user})
        return messages

    def encode(self, user: str) -> list[int]:
        return encode_messages(self.pair.tokenizer, self.messages(user))

    def _fit(self, user: str) -> tuple[list[int], int]:
        """Ids for the next turn, dropping the oldest turns while they do not fit."""
        context = self.pair.target.context_length
        ids = self.encode(user)
        dropped = 0
        # room for the reply: max tokens, but never more than half the context
        reserve = min(self.settings.max_tokens, context // 2) if context else 0
        while context and len(ids) + reserve > context and self._dropped < len(self.turns):
            self._dropped += 1
            dropped += 1
            ids = self.encode(user)
        if context and len(ids) >= context:
            self._dropped -= dropped  # a refused message drops no earlier turn
            raise PromptTooLong(
                f"this message alone has {len(ids)} tokens and {self.pair.target.label} reads at most {context}"
            )
        return ids, dropped

    def reply(self, user: str) -> Iterator[Prefill | Round | Done | ContextTrimmed]:
        """The reply's events. A KeyboardInterrupt thrown in at a yield (Ctrl-C while the
        caller printed) ends it like one inside the engine: the turn is kept as far as it got
        and a Done("interrupted") follows."""
        if not user.strip():
            raise InvalidOption("the message is empty")
        ids, dropped = self._fit(user)
        if dropped:
            yield ContextTrimmed(dropped, self.pair.target.context_length)
        options = self.settings
        if self.pair.draft is None and not self.pair.ngram:
            options = options.replace(gamma=0)
        pieces, reused, turn = [], 0, Stats()
        events = stream(self.pair, ids, options, session=self.session)
        try:
            for event in events:
                if isinstance(event, Prefill):
                    reused = event.prompt_tokens - event.processed_tokens
                    turn.add_prefill(event)
                elif isinstance(event, Round):
                    pieces.append(event.text)
                    turn.add_round(event, tokens=sum(t not in self.pair.eos_ids for t in event.emitted))
                elif isinstance(event, Done):
                    pieces.append(event.text)
                    self._end_turn(Turn(user, "".join(pieces), event.stats, len(ids), reused, event.finish_reason))
                yield event
        except KeyboardInterrupt:
            events.close()
            stats = turn.frozen("interrupted")
            self._end_turn(Turn(user, "".join(pieces), stats, len(ids), reused, "interrupted"))
            yield Done("interrupted", stats)

    def _end_turn(self, turn: Turn) -> None:
        self.turns.append(turn)
        self.totals = self.totals.merge(turn.stats)

    def undo(self) -> Turn | None:
        """Forget the last turn (None if there is none). The caches keep what they hold: the
        next reply brings them back to the turns before it (a trim, or the checkpoint the
        undone turn's prompt started from), as for any prompt."""
        if not self.turns:
            return None
        turn = self.turns.pop()
        self._dropped = min(self._dropped, len(self.turns))
        return turn

    def reset(self) -> None:
        self.turns.clear()
        self._dropped = 0
        self.session.reset()
        self.totals = Stats()

    def update(self, **changes) -> None:
        """Change settings (as `Options.build` takes them); refused values leave the
        settings as they were."""
        candidate = self.settings.replace(**changes)
        check_drafting(self.pair, candidate)
        self.settings = candidate

    def transcript(self) -> dict:
        return {
            "target": self.pair.target.name,
            "draft": self.pair.draft.name if self.pair.draft else None,
            "system": self.system,
            "settings": self.settings.to_dict(),
            "turns": [
                {
                    "user": t.user,
                    "assistant": t.assistant,
                    "finish_reason": t.finish_reason,
                    "prompt_tokens": t.prompt_tokens,
                    "reused_tokens": t.reused_tokens,
                    "stats": t.stats.to_dict(),
                }
                for t in self.turns
            ],
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        try:
            path.write_text(json.dumps(self.transcript(), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            raise InvalidOption(f"cannot write {path}: {e.strerror}") from None
        return path
