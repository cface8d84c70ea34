"""mlxspec against mlx-lm's own speculative generation, same pair, prompts, γ and sampling,
greedy and at temperature 1, in one process.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') \
        python demos/compare_mlx_lm.py [--target T --draft D] [--gamma 4] [--max-tokens 128] [--repeats 3]

Prints, per temperature: tokens/s of mlxspec and of mlx-lm (speculative and plain), their
ratio, and both acceptance rates (accepted / tested). mlx-lm accepts a draft token only
when the target's own independent sample equals it, so at temperature > 0 it accepts less.
With no models named, the bundled tiny pair.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.measure.bench import BenchConfig, run_bench  # noqa: E402
from mlxspec.measure.prompts import suite  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    args = parser.parse_args()

    pair = mlxspec.load_pair(args.target, args.draft)
    config = BenchConfig(
        prompts=suite(quick=True),
        gammas=[args.gamma],
        temps=[0.0, 1.0],
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        peers=True,
    )
    report = run_bench(pair, config)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return
    print(
        f"pair: {pair.description}   γ {args.gamma}   {args.max_tokens} tokens x {len(config.prompts)} prompts "
        f"x {args.repeats} repeats"
    )
    print(f"machine: {report.machine['platform']}   mlx {report.machine['mlx']}   mlx-lm {report.machine['mlx_lm']}")
    print(f"cost model: c = {report.costs.c:.3f}, v(k) = {' '.join(f'{v:.2f}' for v in report.costs.verify_curve)}")
    columns = [("T", 4), ("mlxspec spec", 13), ("mlx-lm spec", 12), ("ratio", 6), ("α mlxspec", 10), ("α mlx-lm", 9)]
    columns += [("mlxspec std", 12), ("mlx-lm std", 11), ("speedup", 8), ("predicted", 10)]
    header = " ".join(f"{name:>{width}}" for name, width in columns)
    print(header)
    for s in (s for s in report.settings if s.category == "all"):
        print(
            f"{s.temp:>4g} {s.speculative_tps:>13.1f} {s.peer_speculative_tps:>12.1f} {s.vs_peer:>6.2f} "
            f"{s.stats.acceptance_rate:>10.3f} {s.peer_acceptance_rate:>9.3f} {s.standard_tps:>12.1f} "
            f"{s.peer_standard_tps:>11.1f} "
            f"{s.speedup:>7.2f}x {s.predicted_speedup:>9.2f}x"
        )


if __name__ == "__main__":
    main()
