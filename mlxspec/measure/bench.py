"""The benchmark: standard and speculative decoding (and mlx-lm's own, as a peer) over a
prompt suite and a sweep of draft lengths and temperatures, with the cost model measured
on this machine and the speedup it predicts.

Timing rules: every method runs in this process on the same prompts and seeds; a warm-up
run of each method comes first and is not counted; decode speed excludes prompt processing
(mlx-lm's runs get a cache already holding the prompt, as mlxspec's prefill is timed apart);
each setting repeats and reports the median speed, the repeats of a prompt's settings taken
in turn so that a slow spell of the machine is shared out.

A `Run` is one prompt under one setting: its labels and one `Stats` per repeat. A `Setting`
is one temperature and draft length over a category of prompts: its labels and its runs.
Every figure (speed, alpha, tau, the prediction) is derived from those, in one place each.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from ..drafting.theory import predicted_speedup_of
from ..drafting.verdict import unexplained
from ..drafting.verdict import verdict as decide
from ..generation import encode_prompt, generate
from ..models.pairs import Pair
from ..models.presets import shown_name
from ..options import Options, label, parse_gamma, parse_tree
from ..stats import Stats
from . import costs as cost_model
from .prompts import BenchPrompt

STANDARD, SPECULATIVE = "standard", "speculative"
MLXSPEC, MLX_LM = "mlxspec", "mlx-lm"


@dataclass
class BenchConfig:
    prompts: list[BenchPrompt]
    gammas: list[int | str]  # draft lengths, or "auto"
    temps: list[float]
    trees: list[int | str] = field(default_factory=lambda: ["auto"])  # tree nodes per round (0: chains), or "auto"
    max_tokens: int = 128
    repeats: int = 3
    peers: bool = True
    seed: int = 0
    raw: bool = False

    def __post_init__(self) -> None:
        # read as Options reads them ("4", 4, "auto"; within its bounds), "auto" kept as text;
        # a value named twice ("--gamma 2,2") is one setting, run and reported once
        self.gammas = list(dict.fromkeys(label(parse_gamma(g)) for g in self.gammas))
        self.temps = list(dict.fromkeys(self.temps))
        self.trees = list(dict.fromkeys(label(parse_tree(t)) for t in self.trees))


@dataclass
class Run:
    """One prompt under one setting: a Stats per repeat."""

    prompt: str
    category: str
    method: str  # mlxspec or mlx-lm
    gamma: int | str  # 0: standard decoding
    temp: float
    tree: int | str = 0  # tree nodes per round (0: chains)
    repeats: list[Stats] = field(default_factory=list)
    peak_memory_gb: float | None = None

    @property
    def mode(self) -> str:
        return SPECULATIVE if self.gamma else STANDARD

    @property
    def stats(self) -> Stats:
        return Stats.combine(self.repeats)

    @property
    def produced(self) -> list[Stats]:
        """The repeats that generated tokens: a sampled run may end on its first token (an
        end-of-sequence), which says nothing of speed."""
        return [s for s in self.repeats if s.tokens_per_second]

    @property
    def tokens_per_second(self) -> float | None:
        """The median over the repeats that produced tokens."""
        return statistics.median(s.tokens_per_second for s in self.produced) if self.produced else None

    @property
    def tokens(self) -> int:
        return int(statistics.median(s.tokens for s in self.produced)) if self.produced else 0

    def to_dict(self) -> dict:
        stats = self.stats
        return {
            "prompt": self.prompt,
            "category": self.category,
            "method": self.method,
            "mode": self.mode,
            "gamma": self.gamma,
            "tree": self.tree,
            "temp": self.temp,
            "tokens": self.tokens,
            "tokens_per_second": self.tokens_per_second,
            "repeat_tokens_per_second": [s.tokens_per_second or 0.0 for s in self.repeats],
            "acceptance_rate": stats.acceptance_rate,
            "tokens_per_round": stats.tokens_per_round,
            "peak_memory_gb": self.peak_memory_gb,
            "stats": stats.to_dict(),
        }


def speed(runs: list[Run]) -> float | None:
    """Total tokens over total time, each prompt counted at its median speed; prompts that
    produced nothing are left out (not counted as slow)."""
    measured = [r for r in runs if r.tokens_per_second]
    seconds = sum(r.tokens / r.tokens_per_second for r in measured)
    return sum(r.tokens for r in measured) / seconds if seconds else None


def repeat_speed(runs: list[Run], repeat: int) -> float | None:
    """Total tokens over total time of one repeat across the runs (a pass over the prompts)."""
    taken = [r.repeats[repeat] for r in runs if len(r.repeats) > repeat and r.repeats[repeat].tokens_per_second]
    seconds = sum(s.decode_seconds for s in taken)
    return sum(s.tokens for s in taken) / seconds if seconds else None


@dataclass
class Setting:
    """One temperature and gamma over a category of prompts ("all" for every prompt)."""

    temp: float
    gamma: int | str
    category: str
    standard: list[Run]
    speculative: list[Run]
    peer_standard: list[Run]
    peer_speculative: list[Run]
    costs: cost_model.Costs
    tree: int | str = 0

    @property
    def label(self) -> str:
        """e.g. "3", "auto", "auto, tree 16", "3, chain": the draft length, and the tree where
        it is not the default (auto)."""
        return str(self.gamma) + tree_label(self.tree)

    @property
    def stats(self) -> Stats:
        return Stats.combine([r.stats for r in self.speculative])

    @property
    def standard_tps(self) -> float | None:
        return speed(self.standard)

    @property
    def speculative_tps(self) -> float | None:
        return speed(self.speculative)

    @property
    def speedup(self) -> float | None:
        standard, speculative = self.standard_tps, self.speculative_tps
        return speculative / standard if standard and speculative else None

    @property
    def repeat_speedups(self) -> list[float]:
        """The speedup of each repeat alone: how far the same setting moves from pass to pass."""
        repeats = max((len(r.repeats) for r in self.speculative), default=0)
        pairs = [(repeat_speed(self.standard, i), repeat_speed(self.speculative, i)) for i in range(repeats)]
        return [spec / std for std, spec in pairs if std and spec]

    @property
    def spread(self) -> float | None:
        """Half the range of the repeats' speedups: the run's own noise (None under two repeats)."""
        speedups = self.repeat_speedups
        return (max(speedups) - min(speedups)) / 2 if len(speedups) >= 2 else None

    @property
    def verdict(self) -> str | None:
        """ "plain" (no draft accepted: standard decoding under another name), "noise" (the
        speedup differs from 1 by less than the repeats' spread, or one repeat measured no
        spread), "faster", "slower": drafting/verdict.py's rule, the repeats' spread its band."""
        accepted = not (self.stats.rounds and not self.stats.accepted)
        return decide(self.speedup, band=self.spread, accepted=accepted)

    @property
    def predicted_speedup(self) -> float | None:
        stats = self.stats
        if self.costs.target_step <= 0 or not stats.drafted:
            return None
        gamma = stats.gamma if isinstance(stats.gamma, int) and stats.gamma else stats.mean_gamma or 1
        c = self.costs.c if stats.model_rounds else 0.0  # prompt lookup drafts for nothing
        read = stats.nodes_per_tree if stats.tree_rounds else gamma  # a tree verifies its nodes
        return predicted_speedup_of(stats, c=c, v=self.costs.verify_cost(round(read) + 1))

    @property
    def vs_predicted(self) -> float | None:
        return self.speedup / self.predicted_speedup if self.speedup and self.predicted_speedup else None

    @property
    def unexplained(self) -> bool:
        """Outside what the run's own α, τ, c and v explain (drafting/verdict.unexplained)."""
        tau = self.stats.tokens_per_round if self.stats.drafted else None
        return unexplained(self.speedup, vs_predicted=self.vs_predicted, tau=tau)

    @property
    def replicated(self) -> bool:
        """Two repeats or more: a spread measured, without which nothing is recommended."""
        return self.spread is not None

    @property
    def peer_speculative_tps(self) -> float | None:
        return speed(self.peer_speculative)

    @property
    def peer_standard_tps(self) -> float | None:
        return speed(self.peer_standard)

    @property
    def peer_acceptance_rate(self) -> float | None:
        return (
            Stats.combine([r.stats for r in self.peer_speculative]).shown_acceptance_rate
            if self.peer_speculative
            else None
        )

    @property
    def vs_peer(self) -> float | None:
        ours, theirs = self.speculative_tps, self.peer_speculative_tps
        return ours / theirs if ours and theirs else None

    def to_dict(self) -> dict:
        stats = self.stats
        return {
            "temp": self.temp,
            "gamma": self.gamma,
            "tree": self.tree,
            "category": self.category,
            "standard_tps": self.standard_tps,
            "speculative_tps": self.speculative_tps,
            "speedup": self.speedup,
            "speedup_spread": self.spread,  # half the range of the repeats' speedups
            "verdict": self.verdict,  # plain, noise, faster, slower
            "acceptance_rate": stats.acceptance_rate,
            "tokens_per_round": stats.tokens_per_round,
            "per_position": stats.per_position_acceptance,
            "mean_gamma": stats.mean_gamma,
            "ngram_rounds": stats.ngram_rounds,
            "history_rounds": stats.history_rounds,
            "tree_rounds": stats.tree_rounds,
            "nodes_per_tree": stats.nodes_per_tree,
            "plain_rounds": stats.plain_rounds,
            "early_stops": stats.early_stops,
            "predicted_speedup": self.predicted_speedup,
            "vs_predicted": self.vs_predicted,
            "unexplained": self.unexplained,  # outside what its α, τ, c and v explain
            "peer_speculative_tps": self.peer_speculative_tps,
            "peer_standard_tps": self.peer_standard_tps,
            "peer_acceptance_rate": self.peer_acceptance_rate,
            "vs_peer": self.vs_peer,
        }


@dataclass
class BenchReport:
    machine: dict
    pair: dict
    config: dict
    costs: cost_model.Costs
    runs: list[Run] = field(default_factory=list)
    settings: list[Setting] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what could not be measured, and why
    estimated_seconds: float | None = None  # what the plan was estimated to take, after the cost model

    def best(self, temp: float, category: str = "all") -> Setting | None:
        # a setting that decoded plainly is standard decoding: never the one to recommend
        candidates = [
            s for s in self.settings if s.temp == temp and s.category == category and s.speedup and s.verdict != "plain"
        ]
        return max(candidates, key=lambda s: s.speedup, default=None)

    def recommended(self, temp: float) -> Setting | None:
        """The best setting at `temp`, where its repeats measured a spread and its own figures
        explain it: no recommendation rests on one run, or on a figure the run cannot explain."""
        best = self.best(temp)
        return best if best is not None and best.replicated and not best.unexplained else None

    def to_dict(self) -> dict:
        temps = sorted({s.temp for s in self.settings})
        return {
            "machine": self.machine,
            "pair": self.pair,
            "config": self.config,
            "costs": self.costs.to_dict(),
            "settings": [s.to_dict() for s in self.settings],
            "recommended_gamma": {str(t): self.recommended(t).gamma for t in temps if self.recommended(t)},
            "runs": [r.to_dict() for r in self.runs],
            "seconds": self.seconds,
            "estimated_seconds": self.estimated_seconds,
            "notes": self.notes,
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
    return len(config.prompts) * len(config.temps) * len(_settings(config)) * config.repeats


def tree_label(tree: int | str, *, sep: str = ", ") -> str:
    """How a setting's tree reads after its γ: nothing for the default (auto), "chain" for 0."""
    return "" if tree == "auto" else f"{sep}chain" if tree == 0 else f"{sep}tree {tree}"


def _settings(config: BenchConfig) -> list[tuple[str, int | str, int | str]]:
    """(method, gamma, tree) of each generation a prompt gets per temperature and repeat."""
    settings = [(MLXSPEC, 0, 0)] + [(MLXSPEC, g, t) for g in config.gammas for t in config.trees]
    return settings + ([(MLX_LM, g, 0) for g in [0, *_peer_gammas(config)]] if config.peers else [])


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def plan_text(config: BenchConfig) -> str:
    """The sweep in words, e.g. '5 prompts × 1 temperature × 2 settings (standard, γ auto) × 1
    repeat = 10 generations of up to 64 tokens'."""
    names = [
        ("standard" if not g else f"γ {g}" + (tree_label(t, sep=" ") if m == MLXSPEC else ""))
        + (" (mlx-lm)" if m == MLX_LM else "")
        for m, g, t in _settings(config)
    ]
    return (
        f"{_counted(len(config.prompts), 'prompt')} × {_counted(len(config.temps), 'temperature')} × "
        f"{_counted(len(names), 'setting')} ({', '.join(names)}) × {_counted(config.repeats, 'repeat')} = "
        f"{_counted(plan_size(config), 'generation')} of up to {config.max_tokens} tokens"
    )


def estimated_seconds(config: BenchConfig, costs: cost_model.Costs, prompt_tokens: list[int]) -> float:
    """The sweep's time as if every generation were standard decoding at the measured target
    step, its prompt read in passes of the verify curve's width: an estimate (drafting that
    pays makes it shorter, drafting that does not, longer)."""
    width = len(costs.verify_curve)
    prefill = sum(-(-n // width) for n in prompt_tokens) * costs.verify_cost(width) * costs.target_step
    per_pass = config.max_tokens * costs.target_step * len(prompt_tokens)
    runs = len(config.temps) * len(_settings(config)) * config.repeats
    return runs * (per_pass + prefill)


def _peer_gammas(config: BenchConfig) -> list[int]:
    """mlx-lm has fixed draft lengths only."""
    return [g for g in config.gammas if isinstance(g, int)]


def run_bench(
    pair: Pair,
    config: BenchConfig,
    on_step: Callable[..., None] | None = None,
    *,
    on_note: Callable[[str], None] | None = None,
) -> BenchReport:
    """The sweep. `on_step(description)` before each generation of the plan, and
    `on_step(description, counted=False)` before the warm-up and the cost model (not among
    the plan's generations); `on_note(line)` as soon as there is something to say: the plan,
    what cannot be measured and why, the estimated time."""
    step = on_step or (lambda description, counted=True: None)
    say = on_note or (lambda line: None)
    started = time.perf_counter()
    encoded = [encode_prompt(pair, p.prompt, raw=config.raw) for p in config.prompts]
    notes = peer_notes(pair, config)
    for line in [f"plan: {plan_text(config)}", *notes]:
        say(line)

    step("warm-up", counted=False)
    for line in _warm_up(pair, encoded[0], config):  # mlx-lm may refuse the pair only when it runs
        notes.append(line)
        say(line)
    step("cost model", counted=False)
    measured = cost_model.measure(pair, encoded[0])
    estimate = estimated_seconds(config, measured, [len(ids) for ids in encoded])
    say(
        f"estimated {_duration(estimate)} from here (a target step takes {measured.target_step * 1e3:.0f} ms: "
        f"{config.max_tokens} tokens a generation, as if each were standard decoding)"
    )
    report = BenchReport(
        machine=machine_info(),
        pair={"target": shown_name(pair.target.name), "draft": shown_name(pair.draft.name) if pair.draft else None}
        | ({"drafting": pair.drafting} if pair.drafting else {}),
        config={k: v for k, v in asdict(config).items() if k != "prompts"}
        | {"prompts": [p.name for p in config.prompts]},
        costs=measured,
        notes=notes,
    )
    for prompt, ids in zip(config.prompts, encoded):
        for temp in config.temps:
            report.runs += _interleaved(pair, prompt, ids, temp, config, step)
    report.settings = summarize(report.runs, measured, config)
    report.seconds = time.perf_counter() - started
    report.estimated_seconds = estimate
    return report


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def peer_notes(pair: Pair, config: BenchConfig) -> list[str]:
    """Turns the peer off, with the reason, where mlx-lm cannot draft for this pair."""
    if config.peers and pair.draft is None:
        config.peers = False
        return ["mlx-lm not measured: it has no prompt-lookup drafting to compare with"]
    if config.peers and pair.kind is not None and pair.kind.reads_features:
        config.peers = False  # mlx-lm drafts with a separate model only
        return [f"mlx-lm not measured: it cannot draft with an {pair.draft.kind} head (only with a separate model)"]
    return []


def _warm_up(pair: Pair, ids: list[int], config: BenchConfig) -> list[str]:
    """Once per method, mode and temperature: the first call of each compiles kernels (and
    mlx-lm's compiled samplers), which must not count. Turns the peer off, with a note,
    where mlx-lm refuses the pair."""
    from .peers import PeerUnavailable, mlx_lm_generate

    notes = []
    for temp in config.temps:
        for _, gamma, tree in [s for s in _settings(config) if s[0] == MLXSPEC]:
            generate(pair, ids, max_tokens=8, gamma=gamma, tree=tree, temp=temp, seed=0)
        for gamma in [0, *_peer_gammas(config)[-1:]] if config.peers else []:
            try:
                mlx_lm_generate(pair, ids, max_tokens=8, gamma=gamma, temp=temp)
            except PeerUnavailable as e:
                config.peers = False
                return [f"mlx-lm not measured: {e}"]
    return notes


def _interleaved(pair, prompt, ids, temp, config, step) -> list[Run]:
    """Every setting of one prompt and temperature, repeats taken in turn (setting A, B, C,
    then A, B, C again): this machine has slow spells lasting seconds, and taking turns
    spreads them over all settings instead of landing on one."""
    from .peers import PeerUnavailable, mlx_lm_generate

    runs = {
        (method, gamma, tree): Run(prompt.name, prompt.category, method, gamma, temp, tree)
        for method, gamma, tree in _settings(config)
    }
    for repeat in range(config.repeats):
        seed = config.seed + repeat
        for (method, gamma, tree), run in runs.items():
            step(f"{prompt.name} · {method} {run.mode} γ{gamma}{tree_label(tree, sep=' ') if gamma else ''} T{temp}")
            mx.reset_peak_memory()
            options = Options.build(max_tokens=config.max_tokens, gamma=gamma, tree=tree, temp=temp, seed=seed)
            if method == MLXSPEC:
                stats = generate(pair, ids, options).stats
            else:
                try:
                    stats = mlx_lm_generate(
                        pair, ids, max_tokens=config.max_tokens, gamma=gamma, temp=temp, seed=seed
                    ).stats
                except PeerUnavailable:  # this prompt (a window it wraps), not the others
                    continue
            run.repeats.append(stats)
            run.peak_memory_gb = max(run.peak_memory_gb or 0.0, mx.get_peak_memory() / 1e9)
    return list(runs.values())


def summarize(runs: list[Run], costs: cost_model.Costs, config: BenchConfig) -> list[Setting]:
    settings = []
    for category in ["all"] + sorted({r.category for r in runs}):
        chosen = [r for r in runs if category in ("all", r.category)]
        for temp in config.temps:

            def of(method: str, gamma, tree=0, chosen=chosen, temp=temp) -> list[Run]:
                return [
                    r for r in chosen if r.method == method and r.gamma == gamma and r.tree == tree and r.temp == temp
                ]

            for gamma in config.gammas:
                for tree in config.trees:
                    settings.append(
                        Setting(
                            temp,
                            gamma,
                            category,
                            of(MLXSPEC, 0),
                            of(MLXSPEC, gamma, tree),
                            of(MLX_LM, 0),
                            of(MLX_LM, gamma) if gamma != "auto" and tree in (0, "auto") else [],
                            costs,
                            tree=tree,
                        )
                    )
    return settings
