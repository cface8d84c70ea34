"""What the engine yields. Plain Python values only (ids, counts, seconds, text), so views,
tests and scripts consume them without touching MLX.

Vocabulary (as in vLLM's rejection sampler): *drafted* ids are proposed by the draft;
*accepted* ones passed the rule; after the first rejection a *recovered* id is drawn from
the residual; when every draft passed, a *bonus* id comes from the target's last row. The
*emitted* ids of a round are the accepted drafts followed by the recovered or bonus id.
Standard decoding is a round with nothing drafted: its one id is a plain *target* sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..stats import Stats
from .plan import MODEL

ACCEPTED, RECOVERED, BONUS, TARGET = "accepted", "recovered", "bonus", "target"


@dataclass(frozen=True)
class Prefill:
    prompt_tokens: int  # tokens in the prompt
    processed_tokens: int  # of which fed to the models now (the rest were cached)
    seconds: float


@dataclass(frozen=True)
class Round:
    index: int
    gamma: int  # draft length asked for this round (0: standard decoding)
    drafted: tuple[int, ...]
    accepted: int  # leading drafted ids the rule accepted
    emitted: tuple[int, ...]  # ids appended to the output (cut at end-of-sequence or a stop)
    draft_seconds: float | None  # None when the round was not timed apart (one host wait)
    verify_seconds: float | None
    seconds: float  # the whole round, bookkeeping included
    pieces: tuple[str, ...] = ()  # text of each emitted id, once detokenized
    discarded: str = ""  # text of the drafts thrown away (the first rejected one and after)
    source: str = MODEL  # who proposed (plan.py): the draft model, lookup, the history, or "target"
    early_stop: bool = False  # the draft stopped short of gamma, unsure of its next id
    # A tree round: `drafted` is the accepted path and, where the walk stopped, the first
    # child tried there; `nodes` all the nodes verified, `branches` the paths not taken.
    nodes: int = 0
    branches: tuple[tuple[int, ...], ...] = ()

    @property
    def tested(self) -> int:
        """Drafts the rule looked at: every one up to and including the first rejection."""
        return min(self.accepted + 1, len(self.drafted))

    @property
    def fates(self) -> tuple[str, ...]:
        """accepted / recovered / bonus / target for each emitted id."""
        if not self.drafted:
            last = TARGET
        else:
            last = BONUS if self.accepted == len(self.drafted) else RECOVERED
        fates = [ACCEPTED] * self.accepted + [last]
        return tuple(fates[: len(self.emitted)])

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class ContextTrimmed:
    """Before a chat reply: the oldest turns were dropped to fit the target's context."""

    dropped_turns: int
    context_length: int


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "eos", "length", "stop", "context" or "interrupted"
    stats: Stats
    text: str = ""  # text held back until the end (a possible start of a stop string)
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop")
