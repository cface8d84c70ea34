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

SEED_LIMIT = 2**64  # MLX's random keys take an unsigned 64-bit seed


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
        if not isinstance(self.gamma, Auto) and (
            isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 0
        ):
            raise InvalidOption(f"gamma (draft length) must be a whole number >= 0 or 'auto', got {self.gamma!r}")
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
        if not isinstance(self.tree, Auto) and (
            isinstance(self.tree, bool) or not isinstance(self.tree, int) or self.tree < 0
        ):
            raise InvalidOption(f"tree (nodes per round) must be a whole number >= 0 or 'auto', got {self.tree!r}")
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
            gamma=parse_gamma(gamma),
            sampling=SamplingParams(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p),
            seed=seed,
            stop=tuple(stop or ()),
            ngram=ngram,
            draft_min_p=parse_draft_min_p(draft_min_p),
            raw=raw,
            system=system,
            think=think,
            grammar=grammar,
            tree=parse_tree(tree),
            history=history,
        )

    def replace(self, **changes) -> Options:
        """A copy with some values changed, given as `build` takes them (temp=, gamma="auto")."""
        sampling = {k: changes.pop(k) for k in ("temp", "top_p", "top_k", "min_p") if k in changes}
        if sampling:
            changes["sampling"] = dataclasses.replace(self.sampling, **sampling)
        if "gamma" in changes:
            changes["gamma"] = parse_gamma(changes["gamma"])
        if "tree" in changes:
            changes["tree"] = parse_tree(changes["tree"])
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
            "gamma": _label(self.gamma),
            **dataclasses.asdict(self.sampling),
            "seed": self.seed,
            "stop": list(self.stop),
            "ngram": self.ngram,
            "draft_min_p": _label(self.draft_min_p),
            "tree": _label(self.tree),
            "history": self.history,
            "raw": self.raw,
            "system": self.system,
            "think": self.think,
            "grammar": self.grammar.describe() if self.grammar else None,
        }


def _label(value) -> int | float | str:
    return "auto" if isinstance(value, Auto) else value


def parse_gamma(value) -> int | Auto:
    """A draft length: a whole number >= 0, or "auto"."""
    if isinstance(value, Auto) or (isinstance(value, str) and value.strip().lower() == "auto"):
        return AUTO
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOption(f"gamma (draft length) must be a whole number >= 0 or 'auto', got {value!r}")
    return value


def parse_tree(value) -> int | Auto:
    """Tree nodes per round: a whole number >= 0 (0: chains), or "auto"."""
    if isinstance(value, Auto) or (isinstance(value, str) and value.strip().lower() == "auto"):
        return AUTO
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOption(f"tree (nodes per round) must be a whole number >= 0 or 'auto', got {value!r}")
    return value


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
