"""Where a round's time goes, chain against tree: the target's forward, and the rule after it
(the chain's warp of its rows and `speculative_sample`, the tree's `walk_tree`), per round,
from one sampled generation each. The forward is waited for before the rule, so the two are
timed apart (a real round queues them together, so its total is a little lower).

    python demos/tree_round_cost.py --pair gemma3-270m --temp 0.7 --tree 0,4,8

Under sampling the walk warps and draws a full row at each node it reaches, a host wait
each; the chain's rule warps all its rows in one graph and draws once (verify.py).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import mlx.core as mx

import mlxspec
from mlxspec.decoding import rounds
from mlxspec.decoding.events import Round

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def timed(seconds: dict):
    """Wrap the rules as the round loop calls them, adding each part's seconds: the chain's
    rule is the warp of its rows and speculative_sample, the tree's the walk (which warps
    the rows it reaches)."""
    walk, chain_rule, warp = rounds.walk_tree, rounds.speculative_sample, rounds.warp
    started = {}

    def walk_tree(tree, logits, params, key, **kw):
        start = time.perf_counter()
        mx.eval(logits)
        read = time.perf_counter()
        out = walk(tree, logits, params, key, **kw)
        seconds["forward"] += read - start
        seconds["rule"] += time.perf_counter() - read
        seconds["nodes"] += len(tree)
        return out

    def warp_rows(logits, params):
        start = time.perf_counter()
        mx.eval(logits)
        started["rule"] = time.perf_counter()
        seconds["forward"] += started["rule"] - start
        return warp(logits, params)

    def speculative_sample(drafted, draft_probs, target_probs, key):
        accepted, next_id = chain_rule(drafted, draft_probs, target_probs, key)
        mx.eval(accepted, next_id)
        seconds["rule"] += time.perf_counter() - started.pop("rule")
        seconds["nodes"] += drafted.shape[0]
        return accepted, next_id

    rounds.walk_tree, rounds.speculative_sample, rounds.warp = walk_tree, speculative_sample, warp_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="gemma3-270m")
    parser.add_argument("--temp", type=float, default=0.7)
    parser.add_argument("--tree", default="0,4,8", help="tree sizes (0: a chain)")
    parser.add_argument("--gamma", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    pair = mlxspec.load_pair(pair=args.pair, ngram=False)
    seconds = defaultdict(float)
    timed(seconds)
    print(f"{args.pair}, temperature {args.temp}, γ {args.gamma}: per verified round, in ms")
    print("setting    rounds  tokens  seconds  forward  rule  nodes")
    for size in (int(s) for s in args.tree.split(",")):
        seconds.clear()
        start = time.perf_counter()
        events = mlxspec.stream(
            pair, PROMPT, max_tokens=args.max_tokens, temp=args.temp, seed=1, tree=size, gamma=args.gamma
        )
        verified = [e for e in events if isinstance(e, Round) and e.drafted]
        total = time.perf_counter() - start
        n = max(len(verified), 1)
        tokens = sum(len(e.emitted) for e in verified)
        print(
            f"{'chain' if size == 0 else f'tree {size}':9} {len(verified):7} {tokens:7} {total:8.1f} "
            f"{1000 * seconds['forward'] / n:8.0f} {1000 * seconds['rule'] / n:5.1f} {seconds['nodes'] / n:6.1f}"
        )


if __name__ == "__main__":
    main()
