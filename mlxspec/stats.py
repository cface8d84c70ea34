"""The statistics of a generation, or of many merged (a chat session, a bench setting), and
the figures derived from them, each defined once. Plain Python: views read them freely.

- acceptance rate alpha = accepted / tested, a draft being tested when every earlier one of
  its round was accepted (vLLM's and Leviathan et al.'s alpha), not accepted / drafted;
- tokens per round tau = ids emitted / rounds, end-of-sequence ids included (>= 1 always);
- mean gamma = proposals per drafting round (plain steps excluded; a tree's depth; its nodes
  are counted apart, nodes per tree round);
  a tree round's drafts tested at each depth are the path's and, where it stopped, the
  first child tried there, so alpha per position is the rate at which a round's accepted
  path went one deeper;
- the draft step and the verify pass, in seconds, from the rounds timed apart;
- a repeating answer: the share of its ids that continue, with the REPEAT_SPAN ids before
  them, a run the same ids already made; prompt lookup's speedup on such an answer is the
  loop's, not one to expect on text that moves on (`lookup_on_repetition`);
- with the target split across ranks, the transfers between them while decoding: each
  round (and each plain step) is one target forward, whose transfers are counted at load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# who proposed a round's ids, as events name it
_SOURCES = {"model": "model_rounds", "ngram": "ngram_rounds", "history": "history_rounds", "target": "plain_rounds"}
# fewer drafts tested than this and alpha is not shown: two or three tries say nothing of it
MIN_TESTED_FOR_ALPHA = 8
# Prompt lookup copies text the context already holds. On an answer stuck in a loop ("A lone
# steed, a lone steed, ...") it accepts nearly every draft: every command says so when most
# accepted drafts came from lookup and most of the answer repeats what it already wrote.
REPEAT_SPAN = 4  # an id repeats the answer when it and the ids before it appeared in this order earlier
MOSTLY = 0.5


def repeated_tokens(ids: list[int], span: int = REPEAT_SPAN) -> int:
    """How many of `ids` continue, with the `span` ids before them, a run the same ids already
    made earlier."""
    seen, repeated = set(), 0
    for i in range(span, len(ids)):
        run = tuple(ids[i - span : i + 1])
        repeated += run in seen
        seen.add(run)
    return repeated


@dataclass
class Stats:
    prompt_tokens: int = 0  # tokens in the prompt(s)
    prefill_tokens: int = 0  # of which read now (the rest were in the session's caches)
    tokens: int = 0  # generated tokens, end-of-sequence excluded
    emitted: int = 0  # ids the rounds emitted, end-of-sequence included
    rounds: int = 0
    drafted: int = 0
    tested: int = 0
    accepted: int = 0
    position_tested: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    timed_rounds: int = 0  # rounds whose drafting and verifying were timed apart
    timed_drafted: int = 0  # proposals of the draft model in them
    draft_seconds: float = 0.0  # of the timed rounds, drafting by the draft model
    verify_seconds: float = 0.0  # of the timed rounds
    model_rounds: int = 0  # rounds drafted by the draft model
    ngram_rounds: int = 0  # rounds proposed by prompt lookup
    history_rounds: int = 0  # rounds proposed from the history of earlier prompts and answers
    plain_rounds: int = 0  # rounds with nothing drafted (plain target steps)
    plain_seconds: float = 0.0  # of the decode seconds, the plain steps': standard decoding measured in the run
    lookup_accepted: int = 0  # accepted drafts that prompt lookup proposed (the text's own, or the history's)
    repeated: int = 0  # emitted ids that repeat the answer (repeated_tokens), set by whoever holds its ids
    early_stops: int = 0  # rounds the draft cut short (draft min-p)
    tree_rounds: int = 0  # rounds that verified a tree
    tree_nodes: int = 0  # the nodes those trees held
    transfers: int = 0  # cross-rank transfers while decoding, on rank 0 (a target split across ranks)
    generations: int = 0
    gamma: int | str = 0  # the setting: a draft length, or "auto"
    seed: int | None = None
    finish_reason: str | None = None
    chains_only: str | None = None  # why a tree asked for (--tree N) was drafted as chains

    # --- accumulating ---------------------------------------------------------------
    def add_prefill(self, event) -> None:
        self.generations += 1
        self.prompt_tokens += event.prompt_tokens
        self.prefill_tokens += event.processed_tokens
        self.prefill_seconds += event.seconds

    def add_round(self, event, *, tokens: int | None = None) -> None:
        """`tokens`: how many of the round's ids count as output (end-of-sequence excluded)."""
        self.rounds += 1
        self.emitted += len(event.emitted)
        self.tokens += len(event.emitted) if tokens is None else tokens
        self.drafted += event.gamma if event.nodes else len(event.drafted)  # a tree: its depth
        self.tested += event.tested
        self.accepted += event.accepted
        self.decode_seconds += event.seconds
        if event.draft_seconds is not None:
            self.timed_rounds += 1
            self.verify_seconds += event.verify_seconds
            if event.source == "model":  # prompt lookup drafts at no cost worth a figure
                self.timed_drafted += event.gamma if event.nodes else len(event.drafted)  # a tree: its levels
                self.draft_seconds += event.draft_seconds
        setattr(self, _SOURCES[event.source], getattr(self, _SOURCES[event.source]) + 1)
        if event.source == "target":
            self.plain_seconds += event.seconds
        elif event.source in ("ngram", "history"):
            self.lookup_accepted += event.accepted
        self.early_stops += event.early_stop
        if event.nodes:
            self.tree_rounds += 1
            self.tree_nodes += event.nodes
        for i in range(event.tested):
            if i >= len(self.position_tested):
                self.position_tested.append(0)
                self.position_accepted.append(0)
            self.position_tested[i] += 1
            self.position_accepted[i] += i < event.accepted

    def merge(self, other: Stats) -> Stats:
        """Both together: counts and seconds added; the labels kept where they agree."""
        merged = Stats()
        for f in dataclasses.fields(Stats):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("position_tested", "position_accepted"):
                value = [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)))]
            elif f.name in ("gamma", "seed", "finish_reason", "chains_only"):
                value = a if a == b else None if f.name != "gamma" else "mixed"
            else:
                value = a + b
            setattr(merged, f.name, value)
        return merged

    @classmethod
    def combine(cls, items) -> Stats:
        items = list(items)
        total = items[0] if items else Stats()
        for item in items[1:]:
            total = total.merge(item)
        return total

    def frozen(self, finish_reason: str | None = None) -> Stats:
        """A copy that later rounds do not change."""
        return dataclasses.replace(
            self,
            position_tested=list(self.position_tested),
            position_accepted=list(self.position_accepted),
            finish_reason=finish_reason if finish_reason is not None else self.finish_reason,
        )

    # --- derived figures --------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.tested if self.tested else None

    @property
    def shown_acceptance_rate(self) -> float | None:
        """alpha where enough drafts were tested for it to mean something, else None."""
        return self.acceptance_rate if self.tested >= MIN_TESTED_FOR_ALPHA else None

    @property
    def decoded_plainly(self) -> bool:
        """Every round a plain target step: nothing drafted, so nothing to credit or blame."""
        return self.rounds > 0 and self.plain_rounds == self.rounds

    @property
    def tokens_per_round(self) -> float | None:
        return self.emitted / self.rounds if self.rounds else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 and self.tokens else None

    @property
    def drafting_rounds(self) -> int:
        return self.rounds - self.plain_rounds

    @property
    def mean_gamma(self) -> float | None:
        return self.drafted / self.drafting_rounds if self.drafting_rounds else None

    @property
    def lookup_rounds(self) -> int:
        """Rounds proposed by lookup: in the current text, or in the history index."""
        return self.ngram_rounds + self.history_rounds

    @property
    def nodes_per_tree(self) -> float | None:
        """Nodes a tree round verified, on average."""
        return self.tree_nodes / self.tree_rounds if self.tree_rounds else None

    @property
    def plain_share(self) -> float:
        """The share of rounds that were plain steps (auto's fallback)."""
        return self.plain_rounds / self.rounds if self.rounds else 0.0

    @property
    def plain_speed(self) -> float | None:
        """Tokens a second of the run's plain steps (one target step, one token each)."""
        return self.plain_rounds / self.plain_seconds if self.plain_seconds > 0 else None

    @property
    def repeated_share(self) -> float:
        """The share of the emitted ids that repeat the answer."""
        return self.repeated / self.emitted if self.emitted else 0.0

    @property
    def lookup_on_repetition(self) -> bool:
        """Most accepted drafts came from prompt lookup, on an answer that mostly repeats itself:
        a speedup that is the loop's, not one to expect on text that moves on."""
        accepted = self.accepted
        return bool(accepted) and self.lookup_accepted > MOSTLY * accepted and self.repeated_share > MOSTLY

    @property
    def draft_step(self) -> float | None:
        """Seconds per proposal of the draft model, over the rounds timed apart."""
        return self.draft_seconds / self.timed_drafted if self.timed_drafted else None

    @property
    def verify_step(self) -> float | None:
        """Seconds per verify pass, over the rounds timed apart."""
        return self.verify_seconds / self.timed_rounds if self.timed_rounds else None

    @property
    def transfers_per_token(self) -> float | None:
        """What matters on a network: each transfer waits at least one round trip."""
        return self.transfers / self.tokens if self.transfers and self.tokens else None

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [a / t if t else None for a, t in zip(self.position_accepted, self.position_tested)]

    def to_dict(self) -> dict:
        derived = (
            "acceptance_rate",
            "tokens_per_round",
            "tokens_per_second",
            "mean_gamma",
            "draft_step",
            "verify_step",
            "per_position_acceptance",
            "transfers_per_token",
            "nodes_per_tree",
            "lookup_on_repetition",
        )
        return {**dataclasses.asdict(self), **{name: getattr(self, name) for name in derived}}
