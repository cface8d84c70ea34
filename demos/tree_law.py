"""The sampled law of trees end to end, outside the engine: the real tree growth
(drafters/tree_growth.grow_tree, with its budget cut and level price), the real size cut
(Drafts.best) and the real walk (verify.walk_tree), on drafter and target logits that
depend on the whole path (a 4-id vocabulary), against the warped target's exact law of the
first two ids, chi-square at 1e-3. Written by the independent review of issue 31; the suite's
law tests (tests/exactness/test_distribution.py) run the whole engine on fewer settings.

    python demos/tree_law.py 15000     # about 10 minutes on 2 cores
"""

import hashlib
import sys
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.chisquare
from mlxspec.decoding.carry import Carry
from mlxspec.decoding.sampling import SamplingParams, warp
from mlxspec.decoding.tree import LevelPrice
from mlxspec.decoding.verify import walk_tree
from mlxspec.drafters.tree_growth import grow_tree

V = 4


def logits_for(kind, path):
    h = int(hashlib.md5((kind + repr(tuple(path))).encode()).hexdigest()[:8], 16)
    r = np.random.default_rng(h)
    return (r.normal(size=V) * 1.5).astype(np.float32)


def run(params, trials, budget, depth, width, price, best_count, seed=0):
    rng = np.random.default_rng(seed)
    counts = Counter()
    keys = mx.random.split(mx.random.key(seed), trials)
    for t in range(trials):
        dk, wk = mx.random.split(keys[t])

        def expand(growth, frontier):
            return mx.array(
                np.stack([logits_for("q", [growth.candidates[n].token for n in growth.path(c)]) for c in frontier])
            )

        drafts = grow_tree(
            mx.array(logits_for("q", [])),
            expand,
            depth=depth,
            width=width,
            budget=budget,
            carry=Carry(params=params, eos_ids=frozenset(), key=dk),
            price=price,
        )
        if best_count is not None and drafts is not None:
            # a size chosen from the values (as best_size does): here keep nodes while value > 0.2
            k = sum(1 for v in drafts.values_ranked() if v > best_count)
            drafts = drafts.best(k)
        tree = drafts.tree
        rows = [logits_for("p", [])] + [
            logits_for("p", tree.path_ids(tree.ancestors(n))) for n in range(1, len(tree) + 1)
        ]
        path, nxt = walk_tree(tree, mx.array(np.stack(rows)), params, wk, drawn=drafts.drawn())
        emitted = tree.path_ids(path) + [nxt]
        if len(emitted) == 1:
            p2 = np.array(warp(mx.array(logits_for("p", emitted)), params))
            emitted.append(int(rng.choice(V, p=p2 / p2.sum())))
        counts[tuple(emitted[:2])] += 1
    p1 = np.array(warp(mx.array(logits_for("p", [])), params))
    exp = {
        (a, b): p1[a] * np.array(warp(mx.array(logits_for("p", [a])), params))[b] for a in range(V) for b in range(V)
    }
    chi, df = 0.0, -1
    for k, e in exp.items():
        if e * trials > 5:
            chi += (counts[k] - e * trials) ** 2 / (e * trials)
            df += 1
    small = sum(counts[k] for k, e in exp.items() if e * trials <= 5)
    return chi, df, small


if __name__ == "__main__":
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    from tests.support.chisquare import critical_value

    for name, params, budget, depth, width, price, bc in [
        ("t1 plain", SamplingParams(temp=1.0), 6, 3, 2, None, None),
        ("t0.7 topk3 topp.9", SamplingParams(temp=0.7, top_k=3, top_p=0.9), 6, 3, 3, None, None),
        ("t1 budget2 gain", SamplingParams(temp=1.0), 2, 3, 3, LevelPrice(level=0.5), None),
        ("t1 best>0.2", SamplingParams(temp=1.0), 8, 3, 3, None, 0.2),
        ("t1 minp", SamplingParams(temp=1.0, min_p=0.2), 6, 3, 2, LevelPrice(level=0.3), 0.1),
        ("t1 node cost", SamplingParams(temp=1.0), 8, 4, 3, LevelPrice(level=0.1, node=0.1, calibration=(0.9,)), None),
    ]:
        chi, df, small = run(params, trials, budget, depth, width, price, bc)
        print(
            f"{name:22s} chi2={chi:8.2f} df={df} crit(1e-3)={critical_value(df, 1e-3):.1f} (cells<5 count={small})",
            flush=True,
        )
