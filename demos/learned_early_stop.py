"""Does the draft's early stop pay on this machine? `--draft-min-p` off, set, and learned.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/learned_early_stop.py [--max-tokens 256] [--repeats 3]

For each prompt of the bench suite and each setting (draft length auto or 4; min-p 0, 0.2
or auto), greedy decoding on the bundled pair; repeats taken in turn across settings. Prints
per-prompt medians, then the mean tokens/s of each setting over the suite and its ratio to
min-p 0 at the same draft length.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.generation import encode_prompt  # noqa: E402
from mlxspec.measure.prompts import suite  # noqa: E402

SETTINGS = [("auto", 0.0), ("auto", "auto"), (4, 0.0), (4, 0.2), (4, "auto")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pair = mlxspec.load_pair()
    means = {s: [] for s in SETTINGS}
    for prompt in suite():
        ids = encode_prompt(pair, prompt.prompt)
        for gamma, min_p in SETTINGS:  # warm-up: compile every path once
            mlxspec.generate(pair, ids, max_tokens=8, gamma=gamma, draft_min_p=min_p)
        speeds = {s: [] for s in SETTINGS}
        stops = {}
        for _ in range(args.repeats):
            for gamma, min_p in SETTINGS:
                stats = mlxspec.generate(pair, ids, max_tokens=args.max_tokens, gamma=gamma, draft_min_p=min_p).stats
                speeds[(gamma, min_p)].append(stats.tokens_per_second)
                stops[(gamma, min_p)] = stats.early_stops
        cells = []
        for s in SETTINGS:
            median = statistics.median(speeds[s])
            means[s].append(median)
            cells.append(f"γ {s[0]} min-p {s[1]}: {median:5.0f} ({stops[s]} stops)")
        print(f"{prompt.name:14s} " + " | ".join(cells), flush=True)
    print("mean tok/s over the suite, and against min-p 0 at the same γ:")
    for gamma, min_p in SETTINGS:
        mean = statistics.mean(means[(gamma, min_p)])
        base = statistics.mean(means[(gamma, 0.0)])
        print(f"  γ {gamma:4} min-p {min_p!s:4}: {mean:6.1f} tok/s  {mean / base:.3f}x")


if __name__ == "__main__":
    main()
