"""Choosing each round's draft length from what the run has measured: `--gamma auto`.

The controller keeps, with recent observations weighted more:
- the acceptance rate at each draft position, given the earlier ones were accepted;
- the draft's time for a round of gamma proposals, D(gamma) = d0 + c gamma (c, the cost model's
  draft step, in seconds; d0 the round's fixed cost: the wait for the drafts, reading the ids
  the last round emitted);
- the target's verify time as a function of the tokens it reads, T(k) = a + b k;
  both lines fitted by weighted least squares over speculative rounds (k varies as gamma does);
- a round's remaining overhead (bookkeeping, rewinds), and the seconds of a plain
  (pipelined) decoding step.

It picks the gamma that maximises expected emitted tokens per second,

    E[tau](gamma) / (D(gamma) + T(gamma + 1) + overhead),
    E[tau] = 1 + sum_k prod_{i<=k} a_i,

against 1 / plain_step for gamma = 0 (plain decoding).

Early on: each position's rate starts from the prior as one pseudo-observation, so one lucky
round does not send gamma to the maximum; unless the first round's first proposal was
rejected, the second round tries another size, so both lines are fitted; gamma grows at most
one position beyond those tried (an untried position borrows the last measured rate). A
pipelined plain step can be much cheaper than a one-token verify, so plain decoding is not
judged before it is timed: while no draft length is clearly ahead of the verify-based guess,
a short plain stretch times it.

It keeps probing: one position beyond the current choice now and then, and, while plain
decoding wins, a short draft after a stretch of plain tokens, weighted as fresh evidence. The
stretch doubles after each probe that changes nothing (32 tokens, up to 512) and shrinks back
when a probe pays; a probe whose proposals were all accepted is followed by another at once.
So the controller returns when the text turns predictable without paying for probes while it
does not. A pure function of its observations: no clocks, no MLX.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from .theory import expected_tokens_by_position

_MIN_STRETCH, _MAX_STRETCH = 32, 512
_TIMING_STRETCH = 6  # plain tokens that time a pipelined step (the first one starts the pipeline)
_PLAIN_DOUBT = 1.5  # a pipelined step may be up to this much faster than a one-token verify

# the learned early stop (draft min-p "auto")
_THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
_STOP_EVIDENCE = 24, 64  # rounds with every confidence seen: needed, kept
_OPEN_ROUND_EVERY = 8  # with a threshold on, every 8th round drafts without one (full evidence)
_STOP_MARGIN = 1.02  # a threshold must beat never stopping by this much
_PRIOR_WAIT = 0.25  # a host wait per draft step, in draft steps, until one is measured


def _proportional(n: float, t: float, x: float) -> float:
    return t * x / n


def _prior_line(slope: float, k: float, t: float, x: float) -> float:
    """T(x) through the one size seen, (k, t), with a relative slope."""
    return t / (1 + slope * (k - 1)) * (1 + slope * (x - 1))


@dataclass
class LineFit:
    """y = a + b x by least squares, each older observation weighted down by `decay`. Until
    two sizes are seen (or when the fit says something unphysical: a negative intercept),
    `at` scales the mean observation with `fallback(mean_x, mean_y, x)`."""

    decay: float
    fallback: Callable[[float, float, float], float]
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # w, wx, wy, wxx, wxy

    def add(self, x: float, y: float) -> None:
        self._sums = [self.decay * s for s in self._sums]
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            self._sums[i] += v

    @property
    def fitted(self) -> bool:
        """Two sizes or more seen: the line is measured, not guessed."""
        w, wx, _, wxx, _ = self._sums
        return w > 0 and wxx / w - (wx / w) ** 2 > 1e-6

    def mean(self) -> tuple[float, float] | None:
        w, wx, wy = self._sums[:3]
        return (wx / w, wy / w) if w > 0 else None

    def at(self, x: float) -> float | None:
        w, wx, wy, wxx, wxy = self._sums
        if w <= 0:
            return None
        mean_x, mean_y = wx / w, wy / w
        spread = wxx / w - mean_x**2
        if spread > 1e-6:
            slope = max((wxy / w - mean_x * mean_y) / spread, 0.0)
            intercept = mean_y - slope * mean_x
            if intercept >= 0:
                return intercept + slope * x
        return self.fallback(mean_x, mean_y, x)


@dataclass
class Controller:
    max_gamma: int = 8
    start_gamma: int = 4  # before anything is timed (a preset's recommendation)
    decay: float = 0.92  # weight of the past per observation
    prior_acceptance: float = 0.6
    prior_slope: float = 0.05  # T(k) = a (1 + prior_slope (k - 1)) until two sizes are seen
    probe_every: int = _MIN_STRETCH  # plain tokens between probes (grows while probes fail)

    acceptance: list[float] = field(default_factory=list)
    _seen: list[int] = field(default_factory=list)  # observations per position
    overhead: float = 0.0
    plain_step: float | None = None
    _since_probe: int = 0
    _rounds: int = 0
    _plains: int = 0
    _probing: bool = False
    _probe_again: bool = False

    probe_gamma: int = 2
    probe_weight: float = 0.5  # a probe is fresh evidence after a stretch without drafting

    # fitted lines; one draft size seen: proportional to the proposals (the fixed part counted
    # per token, which errs towards shorter drafts); one verify size: the prior slope
    _draft: LineFit = field(init=False, repr=False)
    _verify: LineFit = field(init=False, repr=False)
    # the learned early stop: rounds drafted without a threshold (every confidence seen), and
    # the draft's time when it waits for each confidence (by draft forwards)
    _open_rounds: deque = field(init=False, repr=False)
    _waiting: LineFit = field(init=False, repr=False)
    _threshold: float = field(default=0.0, init=False)
    _since_open: int = field(default=0, init=False, repr=False)
    _stop_observations: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self._draft = LineFit(self.decay, _proportional)
        self._verify = LineFit(self.decay, partial(_prior_line, self.prior_slope))
        self._open_rounds = deque(maxlen=_STOP_EVIDENCE[1])
        self._waiting = LineFit(self.decay, _proportional)

    # --- observations ---------------------------------------------------------------
    def observe(
        self,
        drafted: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        verified_tokens: int,
        emitted: int,
        seconds: float | None = None,
        waited: bool = False,
    ) -> None:
        """One round: `drafted` proposals of which `accepted` leading ones passed, a verify
        pass over `verified_tokens` ids, `seconds` for the whole round. A plain decoding step
        is drafted=0 with its time as `verify_seconds`. `waited`: the draft waited for its
        confidence at every step (an early-stop threshold was on); its time is kept apart."""
        seconds = draft_seconds + verify_seconds if seconds is None else seconds
        if drafted == 0:
            self._plains += 1
            self.plain_step = self._blend(self.plain_step, seconds, self._plains)
            self._since_probe += emitted
            return
        self._rounds += 1
        if not self._probing:
            self._probe_again = False
        keep = 1 - self.probe_weight if self._probing else self.decay
        for i in range(min(accepted + 1, drafted)):
            hit = 1.0 if i < accepted else 0.0
            while len(self.acceptance) <= i:
                self.acceptance.append(self.prior_acceptance)
                self._seen.append(0)
            # a running mean (the prior counting once) until the decay takes over
            self._seen[i] += 1
            weight = max(1 / (self._seen[i] + 1), 1 - keep)
            self.acceptance[i] += weight * (hit - self.acceptance[i])
        if not waited:
            self._draft.add(drafted, draft_seconds)
        self.overhead = self._blend(self.overhead, max(seconds - draft_seconds - verify_seconds, 0.0), self._rounds)
        if verify_seconds > 0 and verified_tokens > 0:
            self._verify.add(verified_tokens, verify_seconds)
        if self._probing:  # the probe round's verdict sets the next stretch
            self._probing = False
            # every proposal accepted: the text may have turned predictable, and one short
            # round cannot outweigh the past on its own, so probe again at once
            self._probe_again = accepted == drafted
            paid = self.best() > 0 or self._probe_again
            self.probe_every = _MIN_STRETCH if paid else min(self.probe_every * 2, _MAX_STRETCH)
        self._since_probe = 0

    def observe_empty(self, verified_tokens: int, verify_seconds: float) -> None:
        """A round that proposed nothing (the draft stopped at once, or prompt lookup found no
        match): a verify pass, not a pipelined plain step."""
        if verify_seconds > 0 and verified_tokens > 0:
            self._verify.add(verified_tokens, verify_seconds)
        if self._probing:  # a probe that proposed nothing changed nothing
            self._probing = False
            self.probe_every = min(self.probe_every * 2, _MAX_STRETCH)
            self._since_probe = 0

    def _blend(self, old: float | None, new: float, seen: int) -> float:
        """A running mean over the first observations, then a decaying one."""
        if old is None:
            return new
        return old + max(1 / seen, 1 - self.decay) * (new - old)

    # --- the model ------------------------------------------------------------------
    def verify_time(self, tokens: int) -> float | None:
        return self._verify.at(tokens)

    def draft_time(self, gamma: int) -> float | None:
        return self._draft.at(gamma)

    def position_rates(self, gamma: int) -> list[float]:
        rates, last = [], self.prior_acceptance
        for i in range(gamma):
            rate = self.acceptance[i] if i < len(self.acceptance) else last
            rates.append(rate)
            last = rate
        return rates

    def expected_tokens(self, gamma: int) -> float:
        return expected_tokens_by_position(self.position_rates(gamma))

    def round_time(self, gamma: int) -> float | None:
        verify, draft = self.verify_time(gamma + 1), self.draft_time(gamma)
        if verify is None or draft is None:
            return None
        return draft + verify + self.overhead

    def throughput(self, gamma: int) -> float | None:
        """Expected emitted tokens per second at this gamma; None before it can be told."""
        if gamma == 0:
            step = self.plain_step if self.plain_step is not None else self.verify_time(1)
            return 1.0 / step if step else None
        time = self.round_time(gamma)
        return self.expected_tokens(gamma) / time if time else None

    def plain_stretch(self) -> int:
        """Plain tokens to decode before the next probe (or, before plain decoding has been
        timed, just enough to time it)."""
        if self.plain_step is None:
            return _TIMING_STRETCH
        return max(self.probe_every - self._since_probe, 1)

    def _plain_untimed_may_win(self, best: int) -> bool:
        guess, drafting = self.verify_time(1), self.throughput(best)
        return self.plain_step is None and None not in (guess, drafting) and drafting < _PLAIN_DOUBT / guess

    # --- the decision -----------------------------------------------------------------
    def best(self) -> int:
        reach = min(len(self.acceptance) + 1, self.max_gamma)
        scores = {g: self.throughput(g) for g in range(reach + 1)}
        if any(v is None for v in scores.values()):
            return min(self.start_gamma, self.max_gamma)  # nothing timed yet
        return max(scores, key=lambda g: (scores[g], -g))

    def choose(self) -> int:
        if self._rounds == 1 and not self._draft.fitted and self.start_gamma > 1 and self.acceptance[0] > 0.5:
            # the first round's leading draft was accepted: a second size, so that both lines
            # are fitted early (after a rejection, plain decoding is timed first)
            return self.start_gamma // 2
        best = self.best()
        if best > 0 and self._plain_untimed_may_win(best):
            return 0  # a short plain stretch (plain_stretch) times it
        if best == 0:
            if self._since_probe >= self.probe_every or self._probe_again:
                self._probe_again = False
                self._probing = True
                return min(self.probe_gamma, self.max_gamma)
            return 0
        if best < self.max_gamma and self._rounds % 16 == 15:
            return best + 1  # learn the next position's rate
        return best

    # --- the learned early stop ---------------------------------------------------------
    def stop_threshold(self) -> float:
        """The draft's min-p for the next round: 0 (never stop) unless stopping has been
        shown to pay; even then every few rounds draft without it, so the evidence about
        lower thresholds stays complete."""
        self._since_open += 1
        if self._threshold == 0 or self._since_open >= _OPEN_ROUND_EVERY:
            self._since_open = 0
            return 0.0
        return self._threshold

    def observe_confidences(
        self, threshold: float, confidences: list[float], accepted: int, forwards: int, draft_seconds: float
    ) -> None:
        """A model round's confidences (the draft's top probability for each proposal), how
        many proposals the target accepted, and, for a round that waited at each step
        (`threshold` > 0), its draft forwards and time."""
        if threshold > 0:
            if forwards:
                self._waiting.add(forwards, draft_seconds)
        elif confidences:
            self._open_rounds.append((tuple(confidences), accepted))
        self._stop_observations += 1
        # chosen again every few rounds (a replay costs about a round's bookkeeping)
        if len(self._open_rounds) >= _STOP_EVIDENCE[0] and self._stop_observations % 4 == 0:
            self._threshold = self._best_threshold()

    def _wait_per_forward(self) -> float | None:
        """The extra cost of waiting for the confidence at a draft step."""
        step = (self.draft_time(2) or 0.0) - (self.draft_time(1) or 0.0)
        seen = self._waiting.mean()
        if seen is None:
            return _PRIOR_WAIT * step
        forwards, seconds = seen
        plain = self.draft_time(forwards)
        return None if plain is None else max(seconds - plain, 0.0) / forwards

    def _best_threshold(self) -> float:
        """The threshold that would have given the most tokens per second over the recent
        rounds drafted without one, replayed: cut each at its first confidence below the
        threshold (the draft then ran one forward more, waiting at each), keep the accepted
        ids before the cut, plus the target's own next id. 0 unless one beats never stopping
        by a margin."""
        wait = self._wait_per_forward()
        longest = max(len(c) for c, _ in self._open_rounds) + 1
        draft = [self.draft_time(x) if x else 0.0 for x in range(longest + 1)]
        verify = [self.verify_time(x + 1) for x in range(longest + 1)]
        if wait is None or None in draft or None in verify:
            return 0.0

        def rate(threshold: float) -> float:
            tokens = seconds = 0.0
            for confidences, accepted in self._open_rounds:
                cut = next((i for i, q in enumerate(confidences) if q < threshold), len(confidences))
                forwards = cut + (cut < len(confidences))
                tokens += min(accepted, cut) + 1
                seconds += draft[forwards] + verify[cut] + self.overhead
                if threshold > 0:
                    seconds += forwards * wait
            return tokens / seconds

        never = rate(0.0)
        best = max(_THRESHOLDS, key=rate)
        return best if rate(best) > _STOP_MARGIN * never else 0.0

