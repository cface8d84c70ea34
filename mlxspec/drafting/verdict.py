"""Whether speculative decoding paid: one rule for every command (generate, chat, race,
bench), from what was measured. Pure Python.

The speedup is speculative decoding's tokens a second over standard decoding's, both timed
where the run timed them: race and bench time standard decoding beside it; generate and chat
time it in the run's own plain steps (γ auto's one-token target steps, standard decoding
inside the same run) once there are MIN_PLAIN_STEPS of them. Where nothing timed standard
decoding, the figure is an estimate from the run's own τ and draft cost c with a verify pass
as one target step (v = 1), and is always labelled so ("≈… est.").

The verdict reads that figure against its noise: "plain" when no draft was accepted (faster
without one accepted draft is the machine, not the method), "noise" when it differs from 1
by less than its noise band (or no band could be measured: too short to tell), else
"faster" or "slower". docs/benchmarks.md states the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from .theory import cost_ratio

PLAIN, NOISE, FASTER, SLOWER = "plain", "noise", "faster", "slower"
# the band of a figure whose noise nothing measured (an estimate; generate's plain steps, whose
# spread is not kept): a difference under 5% is not called either way
UNMEASURED_BAND = 0.05
MIN_PLAIN_STEPS = 16  # plain steps enough to time standard decoding inside a run
# measured / predicted outside this range: the cost model probably does not describe the run
PLAUSIBLE_VS_PREDICTED = (0.5, 1.5)
SHOWN_PLACES = 2  # a speedup is shown as "1.31x"
TAU_SLACK = 0.1  # a speedup above τ by more than this share is the timing's noise, not drafting's


def doubtful(vs_predicted: float | None) -> bool:
    """Measured over predicted outside PLAUSIBLE_VS_PREDICTED."""
    low, high = PLAUSIBLE_VS_PREDICTED
    return vs_predicted is not None and not low <= vs_predicted <= high


def unexplained(speedup: float | None, *, vs_predicted: float | None, tau: float | None) -> bool:
    """A speedup the run's own figures cannot explain: doubtful against the prediction (from
    α, c and v), or above τ by more than TAU_SLACK: each pass of the target gave τ tokens and
    costs at least one target step, so τ caps the speedup."""
    return doubtful(vs_predicted) or bool(speedup and tau and speedup > tau * (1 + TAU_SLACK))


def verdict(speedup: float | None, *, band: float | None, accepted: bool) -> str | None:
    """plain, noise, faster or slower (None without a speedup). `band`: the half-width of the
    noise around `speedup` (None: not measured, so nothing can be told from noise);
    `accepted`: whether any draft was accepted."""
    if speedup is None:
        return None
    # judged as every view shows it, to two places: a 1.0497 shown as "1.05x" is not called
    # "little difference" beside a 5% band
    speedup = round(speedup, SHOWN_PLACES)
    within = band is None or abs(speedup - 1) < band
    if not accepted and (within or speedup > 1):
        return PLAIN
    if within:
        return NOISE
    return FASTER if speedup > 1 else SLOWER


@dataclass(frozen=True)
class Judged:
    """One run's speedup, how it was had, and what it means."""

    speedup: float
    measured: bool  # against standard decoding timed in the run; else estimated from τ, c, v
    verdict: str

    def to_dict(self) -> dict:
        return {"speedup": self.speedup, "measured": self.measured, "verdict": self.verdict}


def estimated_speedup(stats) -> float | None:
    """The run's tokens over what its rounds cost in target steps: a drafting round γ̄ draft
    steps (c each, c = a draft step over a verify pass; prompt lookup's free) and one verify
    pass (v = 1: one target step when decoding is memory-bound), a plain step one. None from
    too few tested drafts (the α it would rest on is not shown) or no timed draft step."""
    if not stats.gamma or not stats.drafting_rounds or stats.shown_acceptance_rate is None:
        return None
    c = cost_ratio(stats.draft_step, stats.verify_step)
    if c is None and stats.lookup_rounds and not stats.model_rounds:
        c = 0.0
    if c is None:
        return None
    model_share = stats.model_rounds / stats.drafting_rounds  # the rounds whose drafts cost c each
    cost = stats.drafting_rounds * (stats.mean_gamma * c * model_share + 1.0) + stats.plain_rounds
    return stats.emitted / cost


def judge(stats) -> Judged | None:
    """A generation's (or a conversation's) verdict: measured against its own plain steps
    where it took MIN_PLAIN_STEPS of them beside drafting rounds, else estimated; None for
    standard decoding, or when neither can be had."""
    if not stats.gamma or not stats.rounds:
        return None
    standard, speculative = stats.plain_speed, stats.tokens_per_second
    measured = stats.plain_rounds >= MIN_PLAIN_STEPS and stats.drafting_rounds > 0 and standard and speculative
    speedup = speculative / standard if measured else estimated_speedup(stats)
    if speedup is None:
        return None
    return Judged(speedup, bool(measured), verdict(speedup, band=UNMEASURED_BAND, accepted=stats.accepted > 0))
