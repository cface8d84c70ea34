"""What speculative decoding should gain, from acceptance and costs. Pure Python.

With acceptance rate alpha (each drafted token accepted independently with probability
alpha) and gamma drafts per round, a round emits E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha)
tokens on average (Leviathan et al. 2023, eq. 1). A round costs gamma draft steps (c each,
in units of one target step) and one verification of gamma + 1 tokens (v(gamma + 1) target
steps; about 1 when decoding is memory-bound). Speedup = E[tau] / (gamma * c + v).
"""

from __future__ import annotations

from collections.abc import Sequence


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_tokens_by_position(acceptance: Sequence[float]) -> float:
    """E[tau] when position i (0-based) is accepted with its own conditional rate: one token
    always, plus draft k when drafts 1..k were all accepted."""
    total, reach = 1.0, 1.0
    for rate in acceptance:
        reach *= rate
        total += reach
    return total


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """Tokens per unit of time relative to standard decoding. `v` is the cost of verifying
    gamma + 1 tokens in units of one target step."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + v)


def predicted_speedup_mean(
    alpha: float, mean_gamma: float, c: float, v: float = 1.0, plain_share: float = 0.0
) -> float:
    """The same for a run whose drafting rounds drafted `mean_gamma` on average (auto, cut
    rounds): E[tau] at the nearest whole length (at least 1), the drafting cost at the mean.
    `plain_share` of the run's rounds were plain steps (auto's fallback): one token for one
    target step each."""
    drafting = 1.0 - plain_share
    tokens = drafting * expected_tokens_per_round(alpha, max(round(mean_gamma), 1)) + plain_share
    cost = drafting * (mean_gamma * c + v) + plain_share
    return tokens / cost


def cost_ratio(draft_step: float | None, target_step: float | None) -> float | None:
    """c: the draft's seconds per proposal over the target's per step of standard decoding
    (or, where no standard run was timed, per verify pass: about one step when decoding is
    memory-bound). None without a draft model."""
    if not draft_step or not target_step:
        return None
    return draft_step / target_step


def predicted_speedup_of(stats, *, c: float, v: float = 1.0) -> float | None:
    """What the theory predicts for a measured run (a `Stats`): its alpha, its draft length
    (the fixed gamma, else the mean over the rounds that drafted: auto, rounds cut short),
    its plain steps counted as standard decoding. None before anything was tested."""
    if stats.acceptance_rate is None:
        return None
    gamma = stats.gamma if isinstance(stats.gamma, int) and stats.gamma > 0 else stats.mean_gamma
    if not gamma:
        return None
    return predicted_speedup_mean(stats.acceptance_rate, gamma, c, v, plain_share=stats.plain_share)
