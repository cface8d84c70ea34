"""Everything a generation takes besides the pair and the prompt, validated in one place and
used by the API, every command and the server: sampling, the draft length, max tokens, stop
strings, the seed and how to draft.

`Options.build(...)` reads values as people and command lines give them ("auto", "4",
0.7); an `Options` that exists is valid. Bad values raise `InvalidOption` with one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .decoding.sampling import SamplingParams
from .errors import InvalidOption
from .grammar import GrammarSpec
from .text import ascii_digits

SEED_LIMIT = 2**64  # MLX's random keys take an unsigned 64-bit seed
# The most a request or a command may ask for, where a bigger value stops paying and only
# holds the machine (issue 39: γ 1500 with a tree of 50,000 kept a server busy for minutes):
# - γ: eight times the longest `--gamma auto` drafts (ControllerConfig.max_gamma, 8); a
#   chain's 64th proposal is reached in α^64 of rounds (0.1% at α 0.9, 4% at 0.95), and
#   each proposal costs a draft step and a verified id whether it is reached or not.
# - tree: eight times what `--tree auto` verifies (TREE_AUTO_MAX, 32) and four times
#   EAGLE-2's 60 on a GPU; a tree's yield grows with the log of its size, its verify with
#   the size, and every curve in docs/results/trees.md favours trees of 8 to 32 nodes.
MOST_GAMMA = 64
MOST_TREE = 256
GAMMA_WHY = "longer chains only cost time (a 64th proposal is reached in 0.1% of rounds at α 0.9)"
TREE_WHY = "bigger trees cost more to verify than their extra branches bring (auto verifies at most 32)"


@dataclass(frozen=True)
class Auto:
    """A setting chosen as the run goes (the controller's draft length, the learned stop)."""

    def __repr__(self) -> str:
        return "auto"


AUTO = Auto()


@dataclass(frozen=True, kw_only=True)
class Options:
    max_tokens: int = 256
    gamma: int | Auto = AUTO  # a fixed draft length (0: standard decoding), or chosen per round
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None  # None: a fresh one per generation
    stop: tuple[str, ...] = ()  # stop at the first of these texts
    ngram: bool | None = None  # prompt-lookup proposals; None: the pair's default (draft="ngram")
    draft_min_p: float | Auto = 0.0  # the draft's early stop (0: never), or learned
    raw: bool = False  # the prompt as it is, no chat template
    system: str | None = None  # a system prompt for the chat template
    think: bool | None = None  # enable_thinking for templates that take it; None: the template's default
    grammar: GrammarSpec | None = None  # what the reply must match (constrained decoding)
    # at most this many proposals verified per round as a tree (0: a chain), or sized per
    # round (auto: a head's and prompt lookup's trees; beside a separate draft model, chains)
    tree: int | Auto = AUTO
    history: bool = True  # prompt lookup reads the session's (server's) earlier prompts and answers too

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidOption(f"max tokens must be a whole number >= 1, got {self.max_tokens!r}")
        object.__setattr__(self, "gamma", parse_gamma(self.gamma))
        if not isinstance(self.draft_min_p, Auto) and not (
            isinstance(self.draft_min_p, (int, float))
            and not isinstance(self.draft_min_p, bool)
            and 0 <= self.draft_min_p < 1
        ):
            raise InvalidOption(f"draft min-p must be in [0, 1) or 'auto', got {self.draft_min_p!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < SEED_LIMIT
        ):
            raise InvalidOption(f"seed must be a whole number from 0 to 2^64 - 1, got {self.seed!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidOption("stop takes a list of texts")
        if any(not s for s in self.stop):
            raise InvalidOption("a stop text is empty: give the text to stop at")
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidOption("sampling must be SamplingParams")
        object.__setattr__(self, "tree", parse_tree(self.tree))
        if not isinstance(self.history, bool):
            raise InvalidOption(f"history is on (True) or off (False), got {self.history!r}")
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise InvalidOption("grammar must be a GrammarSpec (GrammarSpec.json_schema(...), ...)")

    @classmethod
    def build(
        cls,
        *,
        max_tokens: int = 256,
        gamma: int | str | Auto = "auto",
        temp: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop=(),
        ngram: bool | None = None,
        draft_min_p: float | str | Auto = 0.0,
        raw: bool = False,
        system: str | None = None,
        think: bool | None = None,
        xtc_probability: float = 0.0,
        grammar: GrammarSpec | None = None,
        tree: int | str | Auto = AUTO,
        history: bool = True,
    ) -> Options:
        """Options from the values a person types: gamma and draft_min_p may be "auto" or
        numbers as text."""
        if xtc_probability:
            raise InvalidOption(
                "XTC sampling cannot be kept exact: it removes top tokens at random per step, so the "
                "target's distribution is not a fixed function of its logits"
            )
        return cls(
            max_tokens=max_tokens,
            gamma=gamma,
            sampling=SamplingParams(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p),
            seed=seed,
            stop=tuple(stop or ()),
            ngram=ngram,
            draft_min_p=parse_draft_min_p(draft_min_p),
            raw=raw,
            system=system,
            think=think,
            grammar=grammar,
            tree=tree,
            history=history,
        )

    def replace(self, **changes) -> Options:
        """A copy with some values changed, given as `build` takes them (temp=, gamma="auto")."""
        sampling = {k: changes.pop(k) for k in ("temp", "top_p", "top_k", "min_p") if k in changes}
        if sampling:
            changes["sampling"] = dataclasses.replace(self.sampling, **sampling)
        if "draft_min_p" in changes:
            changes["draft_min_p"] = parse_draft_min_p(changes["draft_min_p"])
        if "stop" in changes:
            changes["stop"] = tuple(changes["stop"] or ())
        return dataclasses.replace(self, **changes)

    @property
    def speculative(self) -> bool:
        return self.gamma != 0

    def to_dict(self) -> dict:
        return {
            "max_tokens": self.max_tokens,
            "gamma": label(self.gamma),
            **dataclasses.asdict(self.sampling),
            "seed": self.seed,
            "stop": list(self.stop),
            "ngram": self.ngram,
            "draft_min_p": label(self.draft_min_p),
            "tree": label(self.tree),
            "history": self.history,
            "raw": self.raw,
            "system": self.system,
            "think": self.think,
            "grammar": self.grammar.describe() if self.grammar else None,
        }


def label(value) -> int | float | str:
    """A setting as reports name it: "auto", or its value."""
    return "auto" if isinstance(value, Auto) else value


def parse_gamma(value) -> int | Auto:
    """A draft length: a whole number from 0 (standard decoding) to MOST_GAMMA, or "auto"."""
    return parse_count(value, what="gamma (draft length)", most=MOST_GAMMA, why=GAMMA_WHY)


def parse_tree(value) -> int | Auto:
    """Tree nodes per round: a whole number from 0 (chains) to MOST_TREE, or "auto"."""
    return parse_count(value, what="tree (nodes per round)", most=MOST_TREE, why=TREE_WHY)


def parse_count(value, *, what: str, most: int, why: str) -> int | Auto:
    """A count as a person types it ("4", " auto ") or as a value (4, AUTO): a whole number
    from 0 to `most`, or "auto". Text counts in ASCII digits alone: `str.isdigit` also takes
    "²" (which `int` refuses) and `int` takes "١٢" (12), neither of which anyone means."""
    given = value
    if isinstance(value, str):
        word = value.strip()
        if word.lower() == "auto":
            return AUTO
        if ascii_digits(word):
            # more digits than `most` has is too many, however many (int() refuses past 4300)
            value = int(word) if len(word.lstrip("0")) <= len(str(most)) else most + 1
    if isinstance(value, Auto):
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOption(f"{what} must be a whole number from 0 to {most} or 'auto', got {value!r}")
    if value > most:
        raise InvalidOption(f"{what} must be at most {most}, got {_shown(given)}: {why}")
    return value


def _shown(value) -> str:
    text = str(value).strip()
    return text if len(text) <= 24 else f"{text[:20]}… ({len(text)} digits)"


def parse_draft_min_p(value) -> float | Auto:
    """The draft's early-stop threshold: a number in [0, 1) (0: off), or "auto" (learned)."""
    if isinstance(value, Auto) or (isinstance(value, str) and value.strip().lower() == "auto"):
        return AUTO
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or not 0 <= number < 1:
        raise InvalidOption(f"draft min-p must be in [0, 1) or 'auto', got {value!r}")
    return number
