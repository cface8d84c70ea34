"""Held-out acceptance of the smollm2 draft, measured by the engine itself: prompts the draft
never saw (the corpus builder with another seed), greedy and at temperature 0.7, a fixed γ.

    python demos/smollm2_draft/evaluate.py --target FOLDER --draft mlxspec/assets/smollm2-draft

Prints α (accepted / tested), τ and the per-position acceptance per category and overall,
and writes them to the draft's training.json under "held_out_engine".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlxspec  # noqa: E402
from demos.smollm2_draft.corpus import build_prompts  # noqa: E402
from mlxspec.stats import Stats  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--seed", type=int, default=12345, help="the corpus seed: not the one training used")
    args = parser.parse_args()

    pair = mlxspec.load_pair(args.target, args.draft)
    prompts = build_prompts(args.prompts, seed=args.seed)
    report = {}
    for temp in (0.0, 0.7):
        by_category: dict[str, list[Stats]] = {}
        for i, p in enumerate(prompts):
            result = mlxspec.generate(
                pair, p["prompt"], max_tokens=args.max_tokens, gamma=args.gamma, temp=temp, seed=i
            )
            by_category.setdefault(p["category"], []).append(result.stats)
        rows = {c: Stats.combine(s) for c, s in by_category.items()}
        rows["all"] = Stats.combine([s for group in by_category.values() for s in group])
        report[f"T{temp:g}"] = {
            c: {
                "alpha": s.acceptance_rate,
                "tau": s.tokens_per_round,
                "per_position": s.per_position_acceptance,
                "tokens": s.tokens,
            }
            for c, s in rows.items()
        }
        for c, s in rows.items():
            positions = " ".join(f"{a:.2f}" for a in s.per_position_acceptance if a is not None)
            print(f"T{temp:g} {c:17s} α {s.acceptance_rate:.3f}  τ {s.tokens_per_round:.2f}  by position {positions}")
    card = Path(args.draft) / "training.json"
    if card.exists():
        data = json.loads(card.read_text())
        data["held_out_engine"] = {
            "gamma": args.gamma,
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            **report,
        }
        card.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
