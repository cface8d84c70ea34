"""What limits a head that `mlxspec train-draft` trained: its data, its vocabulary, or its chain.

    python demos/eagle3/limits.py RUN_DIR [--examples 48] [--c 0.04] [--v 1.00,1.03,1.15,1.06]

Reads a finished run (its `data/` shards and the head written beside them; the shards stay
in the run folder) and prints, on the run's held-out answers and on as many of its training
answers:

- greedy agreement per draft position, conditional as in the model card: a head much better
  on the answers it trained on than on held-out ones has memorised them (data-limited); one
  no better on either is limited by its size or its training time;
- the draft vocabulary's coverage: how often the target's argmax is an id the head can
  propose at all, the ceiling on its position-1 agreement;
- a one-token prompt lookup on the same positions (the id that followed the latest earlier
  occurrence of the current id): where that is higher than the head, the text repeats itself
  and the head has not learned to copy;
- with `--c` (draft cost over a target step) and `--v` (verify cost of k tokens, k = 1, 2,
  ..., in target steps, as `mlxspec bench` prints them), the α one would need at each γ for
  the issue's bars (1.5x, 1.3x), beside what the head reaches.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np

from mlxspec.drafters.eagle3_head import load_head, target_embedding
from mlxspec.drafting.theory import predicted_speedup
from mlxspec.training.store import load_shards
from mlxspec.training.trainer import draft_index, evaluate, label


def coverage(examples, index: np.ndarray) -> float:
    """Share of answer positions whose target argmax the draft vocabulary holds."""
    inside = total = 0
    for e in examples:
        argmax = e.top_ids[e.train_from : len(e.ids) - 1, 0]
        inside += int((index[argmax] >= 0).sum())
        total += len(argmax)
    return inside / max(total, 1)


def lookup_agreement(examples) -> float:
    """A one-token prompt lookup's greedy agreement with the target's argmax on answer positions."""
    hits = total = 0
    for e in examples:
        ids = e.ids.tolist()
        latest: dict[int, int] = {}
        for i, token in enumerate(ids[:-1]):
            if i >= e.train_from:
                seen = latest.get(token)
                hits += int(seen is not None and ids[seen + 1] == e.top_ids[i, 0])
                total += 1
            latest[token] = i
    return hits / max(total, 1)


def needed_alpha(goal: float, *, c: float, v: list[float]) -> dict[int, float | None]:
    """The smallest α (to 0.01) at which γ drafts a round give `goal`, per γ."""
    out = {}
    for gamma in range(1, len(v)):  # v[k - 1]: k tokens verified at once; γ drafts verify γ + 1
        found = next(
            (a / 100 for a in range(1, 100) if predicted_speedup(a / 100, gamma, c, v[gamma]) >= goal),
            None,
        )
        out[gamma] = found
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--examples", type=int, default=48, help="training answers read")
    parser.add_argument("--c", type=float, help="draft cost per proposal over a target step")
    parser.add_argument("--v", help="verify cost of k = 1, 2, ... tokens in target steps, comma-separated")
    args = parser.parse_args()

    target, _ = mlx_lm.load(json.loads((args.run / "run.json").read_text())["target"])
    head = load_head(args.run, dtype=mx.float32)
    head.share_embedding(target_embedding(target))
    steps = 3
    examples = load_shards(args.run / "data")
    vocab_size = 1 + max(int(np.max(np.array(head.draft_to_target))), *(int(e.top_ids.max()) for e in examples))
    index = draft_index(np.array(head.draft_to_target), vocab_size)

    held = [e for e in examples if e.held_out and e.train_from > 0]
    rng = np.random.default_rng(0)
    pool = [e for e in examples if not e.held_out and e.train_from > 0]
    trained = [pool[i] for i in rng.permutation(len(pool))[: args.examples]]

    print(f"{args.run}: {len(examples)} examples; read {len(held)} held-out and {len(trained)} trained-on answers")
    for name, chosen in (("held out", held), ("trained on", trained)):
        figures = evaluate(head, chosen, [label(e, index) for e in chosen], steps)
        alpha = " / ".join(f"{a:.3f}" for a in figures["alpha"])
        print(
            f"  {name:<11} α per position {alpha}   Σmin(p,q) {figures['expected_acceptance']:.3f}"
            f"   vocabulary covers {coverage(chosen, index):.3f}"
            f"   one-token lookup {lookup_agreement(chosen):.3f}"
        )
    if args.c is not None and args.v:
        v = [float(x) for x in args.v.split(",")]
        for goal in (1.5, 1.3):
            need = needed_alpha(goal, c=args.c, v=v)
            row = "  ".join(f"γ{g} {a:.2f}" if a else f"γ{g} –" for g, a in need.items())
            print(f"  α needed for {goal}x (c {args.c}):  {row}")


if __name__ == "__main__":
    main()
