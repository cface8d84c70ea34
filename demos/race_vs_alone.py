"""Does the race report the speedup you would measure running each method alone?

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') \
        python demos/race_vs_alone.py [--max-tokens 200] [--repeats 5] [--gamma 4]

For each repeat: one race (the two generators alternating, each on its own clock), then
standard and speculative decoding each alone, on the same prompt and pair (the bundled
one unless --target/--draft). Prints the speedups and their ratio (race / alone).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.cli.race import DEFAULT_CODE_PROMPT  # noqa: E402
from mlxspec.measure import race as racing  # noqa: E402
from mlxspec.measure import sides  # noqa: E402
from mlxspec.options import Options  # noqa: E402

PROMPT = DEFAULT_CODE_PROMPT  # what `mlxspec race` shows a code model by default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--gamma", default="4")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--temp", type=float, default=0.0)
    args = parser.parse_args()
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)

    pair = mlxspec.load_pair(args.target, args.draft)
    options = dict(max_tokens=args.max_tokens, temp=args.temp, raw=True, seed=0)
    mlxspec.generate(pair, PROMPT, gamma=gamma, **{**options, "max_tokens": 16})  # warm-up
    raced, alone = [], []
    for _ in range(args.repeats):
        *_, (standard, speculative) = racing.race(pair, PROMPT, Options.build(gamma=gamma, **options))
        raced.append(sides.speedup(standard, speculative))
        base = mlxspec.generate(pair, PROMPT, gamma=0, **options).stats.tokens_per_second
        spec = mlxspec.generate(pair, PROMPT, gamma=gamma, **options).stats.tokens_per_second
        alone.append(spec / base)
        print(f"race {raced[-1]:.3f}x   alone {alone[-1]:.3f}x")
    r, a = statistics.median(raced), statistics.median(alone)
    print(
        f"median: race {r:.3f}x, alone {a:.3f}x, race/alone {r / a:.3f} ({pair.description}, γ {gamma}, "
        f"{args.max_tokens} tokens)"
    )


if __name__ == "__main__":
    main()
