"""The benchmark: standard and speculative decoding (and mlx-lm's own, as a peer) over a
prompt suite and a sweep of draft lengths and temperatures, with the cost model measured
on this machine and the speedup it predicts.

Timing rules: every method runs in this process on the same prompts and seeds; a warm-up
run of each method comes first and is not counted; decode speed excludes prompt processing
(mlx-lm's runs get a cache already holding the prompt, as mlxspec's prefill is timed apart);
each setting repeats and reports the median speed, the repeats of a prompt's settings taken
in turn so that a slow spell of the machine is shared out.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import mlx.core as mx

from . import costs as cost_model
from .generation import encode_prompt, generate
from .pairs import Pair
from .prompts import BenchPrompt
from .theory import predicted_speedup_mean, run_shape

STANDARD, SPECULATIVE = "standard", "speculative"
MLXSPEC, MLX_LM = "mlxspec", "mlx-lm"


@dataclass
class BenchConfig:
    prompts: list[BenchPrompt]
    gammas: list[int | str]  # draft lengths, or "auto"
    temps: list[float]
    max_tokens: int = 128
    repeats: int = 3
    peers: bool = True
    seed: int = 0
    raw: bool = False

    def __post_init__(self) -> None:
        # a value named twice ("--gamma 2,2") is one setting, run and reported once
        self.gammas = list(dict.fromkeys(self.gammas))
        self.temps = list(dict.fromkeys(self.temps))


@dataclass
class Run:
    """One prompt under one setting, all repeats pooled (speed: the median)."""

    prompt: str
    category: str
    method: str  # mlxspec or mlx-lm
    mode: str  # standard or speculative
    gamma: int | str
    temp: float
    tokens: int  # per repeat, median
    tokens_per_second: float  # median over repeats
    repeat_tokens_per_second: list[float]
    decode_seconds: float  # summed over repeats
    generated: int  # summed over repeats
    prefill_seconds: float | None
    rounds: int
    accepted: int
    tested: int
    position_accepted: list[int]
    position_tested: list[int]
    peak_memory_gb: float | None
    drafted: int = 0
    ngram_rounds: int = 0
    plain_rounds: int = 0
    early_stops: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.tested if self.tested else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.generated / self.rounds if self.rounds else None


@dataclass
class Setting:
    """One temperature and gamma, aggregated over prompts (speeds: total tokens over total
    time, so long answers weigh more than short ones)."""

    temp: float
    gamma: int | str
    category: str  # "all" or one category
    standard_tps: float
    speculative_tps: float
    acceptance_rate: float | None
    tokens_per_round: float | None
    per_position: list[float | None]
    predicted_speedup: float | None
    peer_speculative_tps: float | None = None
    peer_standard_tps: float | None = None
    peer_acceptance_rate: float | None = None
    mean_gamma: float | None = None  # drafts per round (the controller's mean for auto)
    ngram_rounds: int = 0
    plain_rounds: int = 0
    early_stops: int = 0

    @property
    def speedup(self) -> float:
        return self.speculative_tps / self.standard_tps if self.standard_tps else 0.0

    @property
    def vs_predicted(self) -> float | None:
        return self.speedup / self.predicted_speedup if self.predicted_speedup else None

    @property
    def vs_peer(self) -> float | None:
        return self.speculative_tps / self.peer_speculative_tps if self.peer_speculative_tps else None


@dataclass
class BenchReport:
    machine: dict
    pair: dict
    config: dict
    costs: cost_model.Costs
    runs: list[Run] = field(default_factory=list)
    settings: list[Setting] = field(default_factory=list)
    seconds: float = 0.0

    def best(self, temp: float, category: str = "all") -> Setting | None:
        candidates = [s for s in self.settings if s.temp == temp and s.category == category]
        return max(candidates, key=lambda s: s.speedup, default=None)

    def to_dict(self) -> dict:
        temps = sorted({s.temp for s in self.settings})
        return {
            "machine": self.machine,
            "pair": self.pair,
            "config": self.config,
            "costs": self.costs.to_dict(),
            "settings": [
                {**asdict(s), "speedup": s.speedup, "vs_predicted": s.vs_predicted, "vs_peer": s.vs_peer}
                for s in self.settings
            ],
            "recommended_gamma": {str(t): self.best(t).gamma for t in temps if self.best(t)},
            "runs": [
                {**asdict(r), "acceptance_rate": r.acceptance_rate, "tokens_per_round": r.tokens_per_round}
                for r in self.runs
            ],
            "seconds": self.seconds,
        }


def machine_info() -> dict:
    import importlib.metadata as metadata

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "mlx": metadata.version("mlx"),
        "mlx_lm": metadata.version("mlx-lm"),
        "mlxspec": metadata.version("mlxspec"),
        "device": str(mx.default_device()),
    }
    try:
        info.update({k: v for k, v in mx.device_info().items() if isinstance(v, (str, int, float))})
    except Exception:
        pass
    return info


def plan_size(config: BenchConfig) -> int:
    """How many generations the sweep runs (for the progress bar)."""
    per_temp = 1 + len(config.gammas)
    if config.peers:
        per_temp += 1 + len(_peer_gammas(config))
    return len(config.prompts) * len(config.temps) * per_temp * config.repeats


def _peer_gammas(config: BenchConfig) -> list[int]:
    """mlx-lm has fixed draft lengths only."""
    return [g for g in config.gammas if isinstance(g, int)]


def run_bench(pair: Pair, config: BenchConfig, on_step: Callable[[str], None] | None = None) -> BenchReport:
    step = on_step or (lambda description: None)
    t0 = time.perf_counter()
    encoded = [encode_prompt(pair, p.prompt, raw=config.raw) for p in config.prompts]

    step("warm-up")
    _warm_up(pair, encoded[0], config)
    step("cost model")
    measured = cost_model.measure(pair, encoded[0])
    report = BenchReport(
        machine=machine_info(),
        pair={"target": pair.target.name, "draft": pair.draft.name if pair.draft else None},
        config={k: v for k, v in asdict(config).items() if k != "prompts"} | {"prompts": [p.name for p in config.prompts]},
        costs=measured,
    )
    for prompt, ids in zip(config.prompts, encoded):
        for temp in config.temps:
            report.runs += _interleaved(pair, prompt, ids, temp, config, step)
    report.settings = summarize(report.runs, measured, config)
    report.seconds = time.perf_counter() - t0
    return report


def _warm_up(pair: Pair, ids: list[int], config: BenchConfig) -> None:
    """Once per method, mode and temperature: the first call of each compiles kernels (and
    mlx-lm's compiled samplers), which must not count."""
    from .peers import mlx_lm_generate

    for temp in config.temps:
        for gamma in [0, *config.gammas]:
            generate(pair, ids, max_tokens=8, gamma=gamma, temp=temp, seed=0)
        for gamma in [0, *_peer_gammas(config)[-1:]] if config.peers else []:
            mlx_lm_generate(pair, ids, max_tokens=8, gamma=gamma, temp=temp)


def _interleaved(pair, prompt, ids, temp, config, step) -> list[Run]:
    """Every setting of one prompt and temperature, repeats taken in turn (setting A, B, C,
    then A, B, C again): this machine has slow spells lasting seconds, and taking turns
    spreads them over all settings instead of landing on one."""
    from .peers import mlx_lm_generate

    settings = [(MLXSPEC, g) for g in [0, *config.gammas]]
    if config.peers:
        settings += [(MLX_LM, g) for g in [0, *_peer_gammas(config)]]
    results = {setting: [] for setting in settings}
    for r in range(config.repeats):
        seed = config.seed + r
        for method, gamma in settings:
            mode = SPECULATIVE if gamma else STANDARD
            step(f"{prompt.name} · {method} {mode} γ{gamma} T{temp}")
            mx.reset_peak_memory()
            if method == MLXSPEC:
                result = generate(pair, ids, max_tokens=config.max_tokens, gamma=gamma, temp=temp, seed=seed).stats
            else:
                result = mlx_lm_generate(pair, ids, max_tokens=config.max_tokens, gamma=gamma, temp=temp, seed=seed)
            results[(method, gamma)].append((result, mx.get_peak_memory() / 1e9))
    return [
        (_mlxspec_run if method == MLXSPEC else _peer_run)(prompt, gamma, temp, results[(method, gamma)])
        for method, gamma in settings
    ]


def _mlxspec_run(prompt, gamma, temp, results) -> Run:
    stats = [s for s, _ in results]
    positions = max(len(s.position_tested) for s in stats)
    return Run(
        prompt=prompt.name,
        category=prompt.category,
        method=MLXSPEC,
        mode=SPECULATIVE if gamma else STANDARD,
        gamma=gamma,
        temp=temp,
        tokens=int(_median_produced(s.tokens for s in stats)),
        tokens_per_second=_median_produced(s.tokens_per_second for s in stats),
        repeat_tokens_per_second=[s.tokens_per_second or 0.0 for s in stats],
        decode_seconds=sum(s.decode_seconds for s in stats),
        generated=sum(s.tokens for s in stats),
        prefill_seconds=statistics.median(s.prefill_seconds for s in stats),
        rounds=sum(s.rounds for s in stats),
        accepted=sum(s.accepted for s in stats),
        tested=sum(s.tested for s in stats),
        position_accepted=[sum(s.position_accepted[i] for s in stats if i < len(s.position_accepted)) for i in range(positions)],
        position_tested=[sum(s.position_tested[i] for s in stats if i < len(s.position_tested)) for i in range(positions)],
        peak_memory_gb=max(m for _, m in results),
        drafted=sum(s.drafted for s in stats),
        ngram_rounds=sum(s.ngram_rounds for s in stats),
        plain_rounds=sum(s.plain_rounds for s in stats),
        early_stops=sum(s.early_stops for s in stats),
    )


def _median_produced(values) -> float:
    """Median over the repeats that produced tokens (their speeds, or token counts): a
    sampled run may end on its first token (end-of-sequence), which says nothing of speed."""
    measured = [v for v in values if v]
    return statistics.median(measured) if measured else 0.0


def _peer_run(prompt, gamma, temp, results) -> Run:
    peers = [p for p, _ in results]
    return Run(
        prompt=prompt.name,
        category=prompt.category,
        method=MLX_LM,
        mode=SPECULATIVE if gamma else STANDARD,
        gamma=gamma,
        temp=temp,
        tokens=int(_median_produced(len(p.tokens) for p in peers)),
        tokens_per_second=_median_produced(p.tokens_per_second for p in peers),
        repeat_tokens_per_second=[p.tokens_per_second for p in peers],
        decode_seconds=sum(p.seconds for p in peers),
        generated=sum(len(p.tokens) for p in peers),
        prefill_seconds=None,
        rounds=sum(p.rounds for p in peers),
        accepted=sum(p.accepted for p in peers),
        tested=sum(p.tested for p in peers),
        position_accepted=[],
        position_tested=[],
        peak_memory_gb=max(m for _, m in results),
    )


def summarize(runs: list[Run], costs: cost_model.Costs, config: BenchConfig) -> list[Setting]:
    settings = []
    categories = ["all"] + sorted({r.category for r in runs})
    for category in categories:
        chosen = [r for r in runs if category in ("all", r.category)]
        for temp in config.temps:
            standard = _speed(chosen, MLXSPEC, 0, temp)
            peer_standard = _speed(chosen, MLX_LM, 0, temp)
            for gamma in config.gammas:
                spec_runs = [r for r in chosen if r.method == MLXSPEC and r.gamma == gamma and r.temp == temp]
                accepted, tested = sum(r.accepted for r in spec_runs), sum(r.tested for r in spec_runs)
                alpha = accepted / tested if tested else None
                rounds = sum(r.rounds for r in spec_runs)
                positions = max((len(r.position_tested) for r in spec_runs), default=0)
                per_position = []
                for i in range(positions):
                    a = sum(r.position_accepted[i] for r in spec_runs if i < len(r.position_accepted))
                    t = sum(r.position_tested[i] for r in spec_runs if i < len(r.position_tested))
                    per_position.append(a / t if t else None)
                peer_runs = [r for r in chosen if r.method == MLX_LM and r.gamma == gamma and r.temp == temp]
                peer_tested = sum(r.tested for r in peer_runs)
                drafted, plain = sum(r.drafted for r in spec_runs), sum(r.plain_rounds for r in spec_runs)
                mean_gamma = drafted / rounds if rounds else None
                predicted = None
                if alpha is not None and costs.target_step > 0 and drafted:
                    g, plain_share = run_shape(drafted, rounds, plain, gamma if isinstance(gamma, int) else None)
                    predicted = predicted_speedup_mean(
                        alpha, g, costs.c, costs.verify_cost(round(g) + 1), plain_share=plain_share
                    )
                settings.append(
                    Setting(
                        temp=temp,
                        gamma=gamma,
                        category=category,
                        standard_tps=standard or 0.0,
                        speculative_tps=_speed(chosen, MLXSPEC, gamma, temp) or 0.0,
                        acceptance_rate=alpha,
                        tokens_per_round=sum(r.generated for r in spec_runs) / rounds if rounds else None,
                        per_position=per_position,
                        predicted_speedup=predicted,
                        peer_speculative_tps=_speed(chosen, MLX_LM, gamma, temp),
                        peer_standard_tps=peer_standard,
                        peer_acceptance_rate=sum(r.accepted for r in peer_runs) / peer_tested if peer_tested else None,
                        mean_gamma=mean_gamma,
                        ngram_rounds=sum(r.ngram_rounds for r in spec_runs),
                        plain_rounds=sum(r.plain_rounds for r in spec_runs),
                        early_stops=sum(r.early_stops for r in spec_runs),
                    )
                )
    return settings


def _speed(runs: list[Run], method: str, gamma: int | str, temp: float) -> float | None:
    """Total tokens over total time, each prompt counted at its median speed."""
    chosen = [r for r in runs if r.method == method and r.gamma == gamma and r.temp == temp and r.tokens_per_second]
    if not chosen:
        return None
    seconds = sum(r.tokens / r.tokens_per_second for r in chosen if r.tokens_per_second)
    return sum(r.tokens for r in chosen) / seconds if seconds else None
