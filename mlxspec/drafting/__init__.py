"""How each round's proposals are planned: a fixed or adaptive draft length, from the draft
model or prompt lookup, with an optional early stop, and the cost model behind the choice
(theory.py), and whether rounds read trees (shape.py, decided once). Pure Python (no
MLX): policies see the plain numbers of each round's outcome (decoding/plan.py: the Plan a
policy hands the round loop, the Outcome it hears back)."""

from .controller import Controller, ControllerConfig
from .policy import Lookup, Policy
from .shape import TreeShape, tree_shape

__all__ = ["Controller", "ControllerConfig", "Lookup", "Policy", "TreeShape", "tree_shape"]
