"""What the engine yields. Plain Python values only (ids, counts, seconds, text), so views,
tests and scripts consume them without touching MLX.

Vocabulary (as in vLLM's rejection sampler): *drafted* ids are proposed by the draft;
*accepted* ones passed the rule; after the first rejection a *recovered* id is drawn from
the residual; when every draft passed, a *bonus* id comes from the target's last row. The
*emitted* ids of a round are the accepted drafts followed by the recovered or bonus id.
Standard decoding is a round with nothing drafted: its one id is a plain *target* sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    draft_seconds: float
    verify_seconds: float
    seconds: float  # the whole round, bookkeeping included
    pieces: tuple[str, ...] = ()  # text of each emitted id, once detokenized
    discarded: str = ""  # text of the drafts thrown away (the first rejected one and after)
    source: str = "model"  # who proposed: "model", "ngram", or "target" (nothing drafted)
    early_stop: bool = False  # the draft stopped short of gamma, unsure of its next id

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
class Stats:
    prompt_tokens: int
    tokens: int  # generated tokens (end-of-sequence excluded)
    rounds: int
    drafted: int
    tested: int
    accepted: int
    acceptance_rate: float | None  # accepted / tested; None without drafts
    tokens_per_round: float | None
    per_position_acceptance: list[float | None]  # position i: accepted / tested there
    position_accepted: list[int]
    position_tested: list[int]
    prefill_seconds: float
    decode_seconds: float
    draft_seconds: float
    verify_seconds: float
    tokens_per_second: float | None
    gamma: int | str  # "auto" when the controller chose per round
    mean_gamma: float | None = None  # drafts proposed per round
    model_rounds: int = 0  # rounds drafted by the draft model
    ngram_rounds: int = 0  # rounds proposed by prompt lookup
    plain_rounds: int = 0  # rounds with nothing drafted (plain target steps)
    early_stops: int = 0  # rounds the draft cut short (draft min-p)
    seed: int | None = None
    finish_reason: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class StatsCollector:
    """Accumulates rounds into Stats; views use it for live figures."""

    prompt_tokens: int = 0
    gamma: int | str = 0
    seed: int | None = None
    prefill_seconds: float = 0.0
    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    tested: int = 0
    accepted: int = 0
    decode_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    position_tested: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)
    early_stops: int = 0

    def add_prefill(self, event: Prefill) -> None:
        self.prompt_tokens = event.prompt_tokens
        self.prefill_seconds += event.seconds

    def add_round(self, event: Round, tokens: int | None = None) -> None:
        """`tokens`: how many of the round's ids count as output (end-of-sequence excluded)."""
        self.rounds += 1
        self.tokens += len(event.emitted) if tokens is None else tokens
        self.drafted += len(event.drafted)
        self.tested += event.tested
        self.accepted += event.accepted
        self.decode_seconds += event.seconds
        self.draft_seconds += event.draft_seconds
        self.verify_seconds += event.verify_seconds
        self.sources[event.source] = self.sources.get(event.source, 0) + 1
        self.early_stops += event.early_stop
        for i in range(event.tested):
            if i >= len(self.position_tested):
                self.position_tested.append(0)
                self.position_accepted.append(0)
            self.position_tested[i] += 1
            self.position_accepted[i] += i < event.accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.tested if self.tested else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def plain_rounds(self) -> int:
        return self.sources.get("target", 0)

    def stats(self, finish_reason: str | None = None) -> Stats:
        return Stats(
            prompt_tokens=self.prompt_tokens,
            tokens=self.tokens,
            rounds=self.rounds,
            drafted=self.drafted,
            tested=self.tested,
            accepted=self.accepted,
            acceptance_rate=self.acceptance_rate,
            tokens_per_round=self.tokens_per_round,
            per_position_acceptance=[a / t if t else None for a, t in zip(self.position_accepted, self.position_tested)],
            position_accepted=list(self.position_accepted),
            position_tested=list(self.position_tested),
            prefill_seconds=self.prefill_seconds,
            decode_seconds=self.decode_seconds,
            draft_seconds=self.draft_seconds,
            verify_seconds=self.verify_seconds,
            tokens_per_second=self.tokens_per_second,
            gamma=self.gamma,
            mean_gamma=self.drafted / self.rounds if self.rounds else None,
            model_rounds=self.sources.get("model", 0),
            ngram_rounds=self.sources.get("ngram", 0),
            plain_rounds=self.plain_rounds,
            early_stops=self.early_stops,
            seed=self.seed,
            finish_reason=finish_reason,
        )


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "eos", "length", "stop", "context" or "interrupted"
    stats: Stats
    text: str = ""  # text held back until the end (a possible start of a stop string)
