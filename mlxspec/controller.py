"""Choosing each round's draft length from what the run has measured: `--gamma auto`.

The controller keeps, with recent observations weighted more:
- the acceptance rate at each draft position, given the earlier ones were accepted;
- the draft's seconds per proposed token (the c of the cost model, in seconds);
- the target's verify time as a function of the tokens it reads, T(k) = a + b k, fitted by
  weighted least squares over speculative rounds (k varies as gamma does);
- a round's remaining overhead (bookkeeping, rewinds), and the seconds of a plain
  (pipelined) decoding step.

It picks the gamma that maximises expected emitted tokens per second,

    E[tau](gamma) / (gamma * draft_step + T(gamma + 1) + overhead),
    E[tau] = 1 + sum_k prod_{i<=k} a_i,

against 1 / plain_step for gamma = 0 (plain decoding). Positions never tried borrow the last
measured rate. It keeps probing: one position beyond the current choice now and then, and,
while plain decoding wins, a short draft after a stretch of plain tokens, weighted as fresh
evidence; the stretch doubles after each probe that changes nothing (32 tokens, up to 512) and
shrinks back when a probe pays, so the controller returns when the text turns predictable
without paying for probes while it does not. A pure function of its observations: no clocks, no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .theory import expected_tokens_by_position

_MIN_STRETCH, _MAX_STRETCH = 32, 512


@dataclass
class Controller:
    max_gamma: int = 8
    start_gamma: int = 4  # before anything is timed (a preset's recommendation)
    decay: float = 0.92  # weight of the past per observation
    prior_acceptance: float = 0.6
    prior_slope: float = 0.05  # T(k) = a (1 + prior_slope (k - 1)) until two sizes are seen
    probe_every: int = _MIN_STRETCH  # plain tokens between probes (grows while probes fail)

    acceptance: list[float | None] = field(default_factory=list)
    draft_step: float | None = None
    overhead: float = 0.0
    plain_step: float | None = None
    _fit: list[float] = field(default_factory=lambda: [0.0] * 5)  # weighted sums: w, wk, wt, wkk, wkt
    _since_probe: int = 0
    _rounds: int = 0
    _probing: bool = False

    probe_gamma: int = 2
    probe_weight: float = 0.5  # a probe is fresh evidence after a stretch without drafting

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
    ) -> None:
        """One round: `drafted` proposals of which `accepted` leading ones passed, a verify
        pass over `verified_tokens` ids, `seconds` for the whole round. A plain decoding step
        is drafted=0 with its time as `verify_seconds`."""
        seconds = draft_seconds + verify_seconds if seconds is None else seconds
        if drafted == 0:
            self.plain_step = self._blend(self.plain_step, seconds)
            self._since_probe += emitted
            return
        self._rounds += 1
        keep = 1 - self.probe_weight if self._probing else self.decay
        for i in range(min(accepted + 1, drafted)):
            hit = 1.0 if i < accepted else 0.0
            while len(self.acceptance) <= i:
                self.acceptance.append(None)
            old = self.acceptance[i]
            self.acceptance[i] = hit if old is None else keep * old + (1 - keep) * hit
        self.draft_step = self._blend(self.draft_step, draft_seconds / drafted)
        self.overhead = self._blend(self.overhead, max(seconds - draft_seconds - verify_seconds, 0.0))
        if verify_seconds > 0 and verified_tokens > 0:
            self._fit = [self.decay * s for s in self._fit]
            k, t = float(verified_tokens), verify_seconds
            for i, v in enumerate((1.0, k, t, k * k, k * t)):
                self._fit[i] += v
        if self._probing:  # the probe round's verdict sets the next stretch
            self._probing = False
            paid = self.best() > 0
            self.probe_every = _MIN_STRETCH if paid else min(self.probe_every * 2, _MAX_STRETCH)
        self._since_probe = 0

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    # --- the model ------------------------------------------------------------------
    def verify_time(self, tokens: int) -> float | None:
        w, wk, wt, wkk, wkt = self._fit
        if w <= 0:
            return None
        mean_k, mean_t = wk / w, wt / w
        spread = wkk / w - mean_k**2
        if spread > 1e-6:
            slope = max((wkt / w - mean_k * mean_t) / spread, 0.0)
            intercept = mean_t - slope * mean_k
            if intercept > 0:
                return intercept + slope * tokens
        # one size seen so far: scale it with the prior slope
        base = mean_t / (1 + self.prior_slope * (mean_k - 1))
        return base * (1 + self.prior_slope * (tokens - 1))

    def position_rates(self, gamma: int) -> list[float]:
        rates, last = [], self.prior_acceptance
        for i in range(gamma):
            rate = self.acceptance[i] if i < len(self.acceptance) and self.acceptance[i] is not None else last
            rates.append(rate)
            last = rate
        return rates

    def expected_tokens(self, gamma: int) -> float:
        return expected_tokens_by_position(self.position_rates(gamma))

    def round_time(self, gamma: int) -> float | None:
        verify = self.verify_time(gamma + 1)
        if verify is None or self.draft_step is None:
            return None
        return gamma * self.draft_step + verify + self.overhead

    def throughput(self, gamma: int) -> float | None:
        """Expected emitted tokens per second at this gamma; None before it can be told."""
        if gamma == 0:
            step = self.plain_step if self.plain_step is not None else self.verify_time(1)
            return 1.0 / step if step else None
        time = self.round_time(gamma)
        return self.expected_tokens(gamma) / time if time else None

    def plain_stretch(self) -> int:
        """Plain tokens to decode before the next probe."""
        return max(self.probe_every - self._since_probe, 1)

    # --- the decision -----------------------------------------------------------------
    def best(self) -> int:
        scores = {g: self.throughput(g) for g in range(self.max_gamma + 1)}
        if any(v is None for v in scores.values()):
            return min(self.start_gamma, self.max_gamma)  # nothing timed yet
        return max(scores, key=lambda g: (scores[g], -g))

    def choose(self) -> int:
        best = self.best()
        if best == 0:
            if self._since_probe >= self.probe_every:
                self._probing = True
                return min(self.probe_gamma, self.max_gamma)
            return 0
        if best < self.max_gamma and self._rounds % 16 == 15:
            return best + 1  # learn the next position's rate
        return best
