"""A conversation over one Session: messages, per-turn statistics, and both models' caches
kept between turns.

The token history is append-only where the template allows it: a turn's ids are the ids the
session already holds (the last prompt and the reply's ids as generated) followed by the
template's rendering of what comes after the reply (its closing, the new user message, the
generation prompt). Re-tokenizing the reply's text could give other ids than the ones
generated (a BPE merges across the boundary, a space moves), and the session would read the
reply again. Whether the template allows it is checked as text: the conversation rendered
with the new turn must start with the previous prompt's rendering plus the reply. Where it
does not (a template that rewrites history, such as Qwen3's dropping earlier thinking), or
the reply's ids do not spell its text (a stop string cut it), the turn is rendered whole and
the session keeps the longest prefix its caches hold, and the turn says so (`appended`).
Models without a chat template get a plain transcript, append-only by construction. When
the conversation outgrows the target's context, the oldest turns are dropped and the rest is
read again.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .decoding.caches import CacheOptions
from .decoding.events import ContextTrimmed, Done, Prefill, Round
from .errors import InvalidOption, PromptTooLong
from .generation import Session, check_drafting, stream
from .models.pairs import Pair
from .models.presets import shown_name
from .models.templates import render
from .options import Options
from .stats import Stats, repeated_tokens
from .text import check_text, opens_thinking
from .tool_calls import split_tool_calls, tool_format

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
    appended: bool = False  # its prompt extended the previous turn's ids (else rendered whole)
    # the rendering (text) and ids of the conversation up to the end of this reply, for the
    # next turn to append to; None where the reply's ids do not spell its text
    held: tuple[str, tuple[int, ...]] | None = None


@dataclass
class Conversation:
    pair: Pair
    system: str | None = None
    settings: Options = CHAT_OPTIONS
    cache_options: CacheOptions = CacheOptions()
    # a prompt_cache.PromptCache: its system prompt, its text the start of the first message,
    # its caches the session's to begin with (and after /reset)
    prompt_cache: object = None

    def __post_init__(self):
        self.session = Session(self.pair, cache_options=self.cache_options)
        self.turns: list[Turn] = []
        self._dropped = 0  # leading turns no longer in the model's view
        self.prompt_opens_thinking = False  # the last prompt ended inside a <think> block
        self.preamble = ""  # what the first message starts with (a cached document)
        if self.prompt_cache is not None:
            if self.prompt_cache.raw:
                raise InvalidOption(
                    f"{self.prompt_cache.path} holds a raw prompt and chat renders a conversation: make it without "
                    "--raw, for a model with a chat template"
                )
            self.system = self.prompt_cache.system
            self.preamble = self.prompt_cache.user
            self._restore()

    def _restore(self) -> None:
        from .prompt_cache import store as prompt_cache

        prompt_cache.restore(self.prompt_cache, self.session)

    def messages(self, user: str | None = None) -> list[dict]:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for i, turn in enumerate(self.turns[self._dropped :], start=self._dropped):
            content = self.preamble + turn.user if i == 0 else turn.user
            messages += [{"role": "user", "content": content}, {"role": "assistant", "content": turn.assistant}]
        if user is not None:
            messages.append({"role": "user", "content": user if self.turns else self.preamble + user})
        return messages

    def render(self, messages: list[dict]) -> str:
        """The conversation as text, ready for the assistant's reply: the chat template's, or
        for a model without one (e.g. the bundled code pair) a plain transcript whose
        assistant lines are the replies verbatim after "Assistant:", as they were generated."""
        tokenizer = self.pair.tokenizer
        if tokenizer.has_chat_template:
            extra = {} if self.settings.think is None else {"enable_thinking": self.settings.think}
            return render(tokenizer, messages, tokenize=False, **extra)
        lines = [
            f"Assistant:{m['content']}" if m["role"] == "assistant" else f"{m['role'].capitalize()}: {m['content']}"
            for m in messages
        ]
        return "\n\n".join(lines) + "\n\nAssistant:"

    def encode(self, user: str) -> list[int]:
        """The ids of the next turn's prompt (see the module's docstring)."""
        return self._encode(user)[0]

    def _encode(self, user: str) -> tuple[list[int], str, bool]:
        """The prompt's ids, its rendering, and whether it extends the ids the last turn left."""
        text = self.render(self.messages(user))
        held = self.turns[-1].held if self.turns and len(self.turns) > self._dropped else None
        if not self.turns and self.prompt_cache is not None:  # the first message follows the cached start
            held = self.prompt_cache.text, self.prompt_cache.ids
        if held is not None and text.startswith(held[0]):
            return list(held[1]) + self._tokens(text[len(held[0]) :]), text, True
        return self._tokens(text, whole=True), text, False

    def _tokens(self, text: str, *, whole: bool = False) -> list[int]:
        tokenizer = self.pair.tokenizer
        if whole and not tokenizer.has_chat_template:
            return list(tokenizer.encode(text))  # a plain transcript starts as a raw prompt does
        return list(tokenizer.encode(text, add_special_tokens=False))

    def _held(self, text: str, ids: list[int], reply: list[int], assistant: str, finish_reason: str):
        """What the next turn may append to: this prompt's rendering plus the reply, and the
        ids that spell it, when the reply's ids (end-of-sequence left out: the template closes
        the turn) spell exactly the text that was shown."""
        while reply and reply[-1] in self.pair.eos_ids:
            reply = reply[:-1]
        if finish_reason == "stop" or any(t in self.pair.eos_ids for t in reply):
            return None
        tokenizer, context = self.pair.tokenizer, ids[-4:]
        before = tokenizer.decode(context, skip_special_tokens=False)
        after = tokenizer.decode(context + reply, skip_special_tokens=False)
        if not after.startswith(before) or after[len(before) :] != assistant:
            return None
        return text + assistant, tuple(ids + reply)

    def _fit(self, user: str) -> tuple[list[int], str, bool, int]:
        """The next turn's prompt (as `_encode`), dropping the oldest turns while it does not
        fit; and how many were dropped."""
        context = self.pair.target.context_length
        ids, text, appended = self._encode(user)
        dropped = 0
        # room for the reply: max tokens, but never more than half the context
        reserve = min(self.settings.max_tokens, context // 2) if context else 0
        while context and len(ids) + reserve > context and self._dropped < len(self.turns):
            self._dropped += 1
            dropped += 1
            ids, text, appended = self._encode(user)
        if context and len(ids) >= context:
            self._dropped -= dropped  # a refused message drops no earlier turn
            raise PromptTooLong(
                f"this message alone has {len(ids)} tokens and {self.pair.target.label} reads at most {context}"
            )
        return ids, text, appended, dropped

    def reply(self, user: str) -> Iterator[Prefill | Round | Done | ContextTrimmed]:
        """The reply's events. A KeyboardInterrupt thrown in at a yield (Ctrl-C while the
        caller printed) ends it like one inside the engine: the turn is kept as far as it got
        and a Done("interrupted") follows."""
        if not user.strip():
            raise InvalidOption("the message is empty")
        check_text(user, "the message")  # bytes that were not UTF-8 (a Latin-1 pipe): refused, the chat goes on
        ids, text, appended, dropped = self._fit(user)
        if dropped:
            yield ContextTrimmed(dropped, self.pair.target.context_length)
        self.prompt_opens_thinking = opens_thinking(self.pair.tokenizer.decode(ids[-4:], skip_special_tokens=False))
        options = self.settings
        if self.pair.draft is None and not self.pair.ngram:
            options = options.replace(gamma=0)
        pieces, reply, reused, turn = [], [], 0, Stats()

        def end(stats: Stats, reason: str) -> None:
            assistant = "".join(pieces)
            held = self._held(text, ids, reply, assistant, reason)
            self._end_turn(Turn(user, assistant, stats, len(ids), reused, reason, appended, held))

        events = stream(self.pair, ids, options, session=self.session)
        try:
            for event in events:
                if isinstance(event, Prefill):
                    reused = event.prompt_tokens - event.processed_tokens
                    turn.add_prefill(event)
                elif isinstance(event, Round):
                    pieces.append(event.text)
                    reply += event.emitted
                    turn.add_round(event, tokens=sum(t not in self.pair.eos_ids for t in event.emitted))
                elif isinstance(event, Done):
                    pieces.append(event.text)
                    end(event.stats, event.finish_reason)
                yield event
        except KeyboardInterrupt:
            events.close()
            turn.repeated = repeated_tokens(reply)
            stats = turn.frozen("interrupted")
            end(stats, "interrupted")
            yield Done("interrupted", stats)

    def tool_calls(self) -> list:
        """The tool calls in the last reply (tool_calls.ToolCall), as mlx-lm reads the model's
        format; none where it knows no format for it."""
        format = tool_format(self.pair.tokenizer)
        if not self.turns or format is None:
            return []
        return split_tool_calls(self.turns[-1].assistant, format)[1]

    def retry(self) -> Iterator[Prefill | Round | Done | ContextTrimmed]:
        """The last reply again: the last turn forgotten and its message answered anew (a
        sampled reply differs; at temperature 0 it is the same). Nothing to retry: InvalidOption."""
        turn = self.undo()
        if turn is None:
            raise InvalidOption("nothing to retry: no reply yet")
        return self.reply(turn.user)

    def _end_turn(self, turn: Turn) -> None:
        self.turns.append(turn)

    @property
    def totals(self) -> Stats:
        """The conversation as it stands: its turns' statistics (an undone or retried reply no
        longer counts)."""
        return functools.reduce(Stats.merge, (turn.stats for turn in self.turns), Stats())

    def undo(self) -> Turn | None:
        """Forget the last turn (None if there is none). The caches keep what they hold: the
        next reply brings them back to the turns before it (a trim, or the checkpoint the
        undone turn's prompt started from), as for any prompt."""
        if not self.turns:
            return None
        turn = self.turns.pop()
        self._dropped = min(self._dropped, len(self.turns))
        return turn

    def set_system(self, system: str | None) -> None:
        """A new system prompt (None: none), which starts a new conversation."""
        check_text(system, "the system prompt")
        self.system = system
        self.reset()

    def reset(self) -> None:
        self.turns.clear()
        self._dropped = 0
        self.session.reset()
        if self.prompt_cache is not None:
            self._restore()

    def update(self, **changes) -> None:
        """Change settings (as `Options.build` takes them); refused values leave the
        settings as they were."""
        candidate = self.settings.replace(**changes)
        check_drafting(self.pair, candidate)
        self.settings = candidate

    def transcript(self) -> dict:
        return {
            "target": shown_name(self.pair.target.name),
            "draft": shown_name(self.pair.draft.name) if self.pair.draft else None,
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
        if not path.parent.is_dir():
            raise InvalidOption(f"cannot write {path}: no folder {path.parent}")
        if path.is_dir():
            raise InvalidOption(f"{path} is a folder: give a file name")
        try:
            path.write_text(json.dumps(self.transcript(), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            raise InvalidOption(f"cannot write {path}: {e.strerror}") from None
        return path
