"""How each round's proposals are planned: a fixed or adaptive draft length, from the draft
model or prompt lookup, with an optional early stop. Pure Python (no MLX): policies see the
plain numbers of each round's outcome."""

from ..decoding.plan import MODEL, NGRAM, TARGET, Outcome, Plan
from ..drafters.lookup import NGramIndex, PromptLookup
from .controller import Controller, ControllerConfig
from .policy import AUTO, Auto, Policy

__all__ = [
    "AUTO",
    "Auto",
    "Controller",
    "ControllerConfig",
    "MODEL",
    "NGRAM",
    "NGramIndex",
    "Outcome",
    "Plan",
    "Policy",
    "PromptLookup",
    "TARGET",
]
