"""A batch's drafter forwards packed (every lane's draft in one forward) against each lane
drafting alone (its own forwards; the target's still shared), on the same prompts.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/batch_drafter_packing.py --pair gemma3-270m --draft DIR [--prompts 4] [--gamma 4]

`generate_many` over the bench suite's first `--prompts` prompts at a fixed γ (chains; no
prompt lookup, no history), the two ways taking turns within each repeat: aggregate tokens
per second (median of the repeats) and the drafter's batched forwards against the reads
they served. Lanes drafting alone is the drafter kind with its packing hook removed
(models/kinds.py: `Kind.packed`), which is what a kind that cannot pack gets. Every
answer of the two ways is checked identical.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.batching import generate_many  # noqa: E402
from mlxspec.decoding.batch import Batch  # noqa: E402
from mlxspec.measure.prompts import suite  # noqa: E402
from mlxspec.models import kinds  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="gemma3-270m")
    parser.add_argument("--draft", help="the draft in place of the preset's (a DFlash drafter's folder)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pair = mlxspec.load_pair(pair=args.pair, draft=args.draft, ngram=False)
    texts = [p.prompt for p in suite()][: args.prompts]
    packed = pair.kind
    if packed is None or packed.packed is None:
        raise SystemExit(f"{pair.draft.name if pair.draft else 'no draft'}: its kind does not pack")
    ways = {"packed": packed, "alone": dataclasses.replace(packed, packed=None)}
    speeds: dict[str, list[float]] = {name: [] for name in ways}
    answers: dict[str, list] = {}
    try:
        for repeat in range(args.repeats):
            for name, kind in ways.items():
                kinds.KINDS[kind.name] = kind
                batch = Batch()
                start = time.perf_counter()
                results = generate_many(
                    pair, texts, max_tokens=args.max_tokens, gamma=args.gamma, tree=0, history=False, batch=batch
                )
                wall = time.perf_counter() - start
                tokens = sum(len(r.tokens) for r in results)
                speeds[name].append(tokens / wall)
                answers.setdefault(name, [r.tokens for r in results])
                draft = pair.draft.name
                forwards = (
                    f"{batch.forwards_of[draft]} drafter forwards for {batch.rows_of[draft]} reads"
                    if name == "packed"
                    else "each lane's drafter forwards its own"
                )
                print(f"{name:6s} repeat {repeat + 1}: {tokens / wall:.1f} tok/s, {forwards}", flush=True)
    finally:
        kinds.KINDS[packed.name] = packed
    if answers["packed"] != answers["alone"]:
        raise SystemExit("the answers differ between the two ways")
    median = {name: statistics.median(v) for name, v in speeds.items()}
    print(
        f"packed {median['packed']:.1f} tok/s, alone {median['alone']:.1f}: {median['packed'] / median['alone']:.2f}x"
    )


if __name__ == "__main__":
    main()
