"""Choosing each round's draft length from what the run has measured: `--gamma auto`.

The controller keeps, with recent rounds weighted more:
- the acceptance rate at each draft position, given the earlier ones were accepted;
- the draft's seconds per proposed token;
- the target's verify time as a function of the tokens it reads, T(k) = a + b k, fitted
  by weighted least squares on the rounds seen (k varies as gamma does).

It picks the gamma that maximises expected emitted tokens per second,

    E[tau](gamma) / (gamma * draft_step + T(gamma + 1)),   E[tau] = 1 + sum_k prod_{i<=k} a_i,

gamma = 0 (plain decoding, one token per T(1)) included. Positions never tried borrow the
last measured rate. It keeps probing: one position beyond the current choice now and then,
and, while plain decoding wins, a short draft every `probe_every` tokens, so it comes back
when the text turns predictable. A pure function of its observations: no clocks, no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Controller:
    max_gamma: int = 8
    decay: float = 0.92  # weight of the past per observation
    probe_every: int = 16  # while gamma 0 is best: try drafting again after this many tokens
    prior_acceptance: float = 0.6
    prior_slope: float = 0.05  # T(k) = a (1 + prior_slope (k - 1)) until two sizes are seen

    acceptance: list[float | None] = field(default_factory=list)
    draft_step: float | None = None
    _fit: list[float] = field(default_factory=lambda: [0.0] * 5)  # weighted sums: w, wk, wt, wkk, wkt
    _since_probe: int = 0
    _rounds: int = 0

    # --- observations ---------------------------------------------------------------
    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float, verified_tokens: int, emitted: int) -> None:
        """One round: `drafted` proposals of which `accepted` leading ones passed, and a
        verify pass over `verified_tokens` ids. A plain decoding step is drafted=0,
        verified_tokens=1."""
        self._rounds += 1
        for i in range(min(accepted + 1, drafted)):
            hit = 1.0 if i < accepted else 0.0
            while len(self.acceptance) <= i:
                self.acceptance.append(None)
            old = self.acceptance[i]
            self.acceptance[i] = hit if old is None else self.decay * old + (1 - self.decay) * hit
        if drafted:
            step = draft_seconds / drafted
            self.draft_step = step if self.draft_step is None else self.decay * self.draft_step + (1 - self.decay) * step
        if verify_seconds > 0 and verified_tokens > 0:
            self._fit = [self.decay * s for s in self._fit]
            k, t = float(verified_tokens), verify_seconds
            for i, v in enumerate((1.0, k, t, k * k, k * t)):
                self._fit[i] += v
        self._since_probe = 0 if drafted else self._since_probe + emitted

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
        total, reach = 1.0, 1.0
        for rate in self.position_rates(gamma):
            reach *= rate
            total += reach
        return total

    def throughput(self, gamma: int) -> float | None:
        """Expected emitted tokens per second at this gamma; None before any timing."""
        verify = self.verify_time(gamma + 1)
        if verify is None or (gamma and self.draft_step is None):
            return None
        return self.expected_tokens(gamma) / (gamma * (self.draft_step or 0.0) + verify)

    # --- the decision -----------------------------------------------------------------
    def best(self) -> int:
        scores = {g: self.throughput(g) for g in range(self.max_gamma + 1)}
        if any(v is None for v in scores.values()):
            return min(4, self.max_gamma)  # nothing timed yet: a moderate start
        return max(scores, key=lambda g: (scores[g], -g))

    def choose(self) -> int:
        best = self.best()
        if best == 0:
            return 1 if self._since_probe >= self.probe_every else 0
        if best < self.max_gamma and self._rounds % 8 == 7:
            return best + 1  # learn the next position's rate
        return best
