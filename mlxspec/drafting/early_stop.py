"""Learning the draft's early stop (`--draft-min-p auto`): stop a round's drafting when the
draft's top probability for its next proposal falls below a threshold, chosen by replaying
recent rounds.

Every model round reads back the draft's confidence in each proposal (no extra host wait:
the values come back with the round's outcome). The learner keeps the last rounds drafted
without a threshold and replays them under each candidate: a round is cut at its first
confidence below the threshold, keeps the accepted ids before the cut plus the target's own
next id, and costs one draft forward more (the one that computed the confidence) and a host
wait per draft step (a prior of a quarter step until waiting rounds are measured). A
threshold turns on only when it beats never stopping by a margin; while on, every 8th round
drafts without it, so the evidence stays complete.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .timing import LineFit, RoundTimes, proportional

THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
EVIDENCE_NEEDED, EVIDENCE_KEPT = 24, 64  # rounds with every confidence seen
OPEN_ROUND_EVERY = 8
MARGIN = 1.02  # a threshold must beat never stopping by this much
PRIOR_WAIT = 0.25  # a host wait per draft step, in draft steps, until one is measured
REPLAY_EVERY = 4  # rounds between replays (a replay costs about a round's bookkeeping)


@dataclass
class StopLearner:
    times: RoundTimes  # the run's cost model (shared with the draft-length controller)
    threshold: float = 0.0  # the learned threshold (0: never stop)
    _open: deque = field(default_factory=lambda: deque(maxlen=EVIDENCE_KEPT), repr=False)
    _waiting: LineFit = field(init=False, repr=False)  # draft time of rounds that waited, by forwards
    _since_open: int = 0
    _observed: int = 0

    def __post_init__(self) -> None:
        self._waiting = LineFit(self.times.decay, proportional)

    def next_threshold(self) -> float:
        """The draft's min-p for the next round."""
        self._since_open += 1
        if self.threshold == 0 or self._since_open >= OPEN_ROUND_EVERY:
            self._since_open = 0
            return 0.0
        return self.threshold

    def observe(
        self,
        *,
        threshold: float,
        confidences: tuple[float, ...],
        accepted: int,
        forwards: int,
        draft_seconds: float | None,
    ) -> None:
        """A model round drafted under `threshold`: the draft's confidence in each proposal,
        how many the target accepted, and (when it waited at each step) its forwards and time."""
        if threshold > 0:
            if forwards and draft_seconds is not None:
                self._waiting.add(forwards, draft_seconds)
        elif confidences:
            self._open.append((tuple(confidences), accepted))
        self._observed += 1
        if len(self._open) >= EVIDENCE_NEEDED and self._observed % REPLAY_EVERY == 0:
            self.threshold = self._best_threshold()

    def _wait_per_forward(self) -> float | None:
        """The extra cost of waiting for the confidence at a draft step."""
        step = (self.times.draft_time(2) or 0.0) - (self.times.draft_time(1) or 0.0)
        seen = self._waiting.mean()
        if seen is None:
            return PRIOR_WAIT * step
        forwards, seconds = seen
        plain = self.times.draft_time(forwards)
        return None if plain is None else max(seconds - plain, 0.0) / forwards

    def _best_threshold(self) -> float:
        wait = self._wait_per_forward()
        longest = max(len(c) for c, _ in self._open) + 1
        draft = [self.times.draft_time(x) if x else 0.0 for x in range(longest + 1)]
        verify = [self.times.verify_time(x + 1) for x in range(longest + 1)]
        if wait is None or None in draft or None in verify:
            return 0.0

        def rate(threshold: float) -> float:
            tokens = seconds = 0.0
            for confidences, accepted in self._open:
                cut = next((i for i, q in enumerate(confidences) if q < threshold), len(confidences))
                forwards = cut + (cut < len(confidences))
                tokens += min(accepted, cut) + 1
                seconds += draft[forwards] + verify[cut] + self.times.overhead
                if threshold > 0:
                    seconds += forwards * wait
            return tokens / seconds

        never = rate(0.0)
        best = max(THRESHOLDS, key=rate)
        return best if rate(best) > MARGIN * never else 0.0
