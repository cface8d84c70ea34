"""How big a tree to verify: each round, the number of nodes that maximises expected tokens
per second, from the drafter's confidences and what a verify of that many ids costs here
(the round sizes its tree with decoding/tree.py's `best_size`; here the calibration it reads).

The drafter ranks its candidates best first, each with v, its probability of the whole path
to it (the product of its confidences along the way); any prefix of that ranking is a tree.
A node is on the accepted path with probability about v: the target's choice is the node's
id at every step of the path (its argmax; under sampling a draw from p, which the drafter's
q approximates). So a tree of the first k candidates emits, in expectation,

    E[tau](k) = 1 + sum_{i<k} c_d(i) v_i

where c_d corrects the drafter's confidence at depth d by what rounds have shown (a drafter
is seldom calibrated: EAGLE-2 reports its head's confidence close to the acceptance rate,
and a draft model trained apart may be far from it). The round costs its drafting (spent
before sizing) and a verify of pending + k ids: k maximises E[tau](k) / (drafting + T(pending
+ k) + overhead), as EAGLE-2 and DDTree size their trees under a budget. A steep verify
curve (a CPU's, a small model's) gives a few nodes, about a chain; a flat one (a memory-bound
step) a wide tree. Plain values only: the controller hands the costs over in the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PRIOR_CALIBRATION = 0.8  # before any round: a drafter's confidence a little above its acceptance
PRIOR_WEIGHT = 2.0  # how many rounds' worth the prior counts at each depth


@dataclass
class TreeCalibration:
    """Per depth, how often the accepted path reached it against how often the drafter's
    confidences said it would (the sum of v over the tree's nodes at that depth: at most
    one of them is on the path)."""

    decay: float = 0.95
    _reached: list[float] = field(default_factory=list)
    _predicted: list[float] = field(default_factory=list)

    def observe(self, *, predicted: Sequence[float], reached: int) -> None:
        """`predicted[d - 1]`: the summed v of the verified tree's depth-d nodes; `reached`:
        the accepted path's length."""
        for d, p in enumerate(predicted, start=1):
            while len(self._predicted) < d:
                self._predicted.append(PRIOR_WEIGHT)
                self._reached.append(PRIOR_WEIGHT * PRIOR_CALIBRATION)
            self._predicted[d - 1] = self.decay * self._predicted[d - 1] + p
            self._reached[d - 1] = self.decay * self._reached[d - 1] + (reached >= d)

    def factors(self, depth: int) -> list[float]:
        """The correction at depths 1..depth (an unseen depth borrows the deepest seen)."""
        out, last = [], PRIOR_CALIBRATION
        for d in range(depth):
            if d < len(self._predicted) and self._predicted[d] > 0:
                last = self._reached[d] / self._predicted[d]
            out.append(last)
        return out
