"""What a tree can turn into tokens: a head's top-k coverage per depth, on prompts it never
trained on.

    python demos/eagle3/coverage.py --pair gemma3-270m [--temp 0,0.7] [--max-tokens 64] [--depth 4]
    python demos/eagle3/coverage.py --target T --draft HEAD --corpus sharegpt [--prompts 64]

With --corpus (`sharegpt` or a file, as train-draft reads it) the prompts are the corpus's
held-out ones in the file's order (conversations.held_out_prompts: conversations that
`train-draft --corpus` never trains on, by a rule on their own text), each a user turn with
the turns before it, shortened as train-draft shortens them; else the bench suite's.

For each prompt of the bench suite (outside the heads' training prompts), the target writes
its answer (its argmax at temperature 0, a draw at 0.7). At every position the head then
drafts as a tree would: its first step from the target's features there, each later step
chained on its own output and the *target's* id at the step before (the branch a tree keeps
when the target's id is among its children). Coverage at depth d and k: how often the
target's next id is among the head's k most probable there, given the path so far was
right. A chain accepts about the k = 1 column; a tree with k children per node about the
k-th (greedy; under sampling the column is the chance that the target's draw is a child).

Under sampling it also gives, from the target's own distribution p and the head's q at each
of those positions, what a node of each kind accepts in expectation (the bound a tree can
reach there): a chain's drawn child, sum min(p, q); k point masses (the head's top k),
their mass under p; and a tree's node as mlxspec grows it under sampling, one child drawn
from q, tried first, then k - 1 point masses (the head's top ids but the drawn one) tried on
what is left, sum min(p, q) + sum over x of q(x) (1 - min(1, p(x)/q(x))) r(others of x),
r = norm(max(0, p - q)) (verify.py says why).
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from mlxspec.decoding import capture
from mlxspec.decoding.sampling import SamplingParams, warp
from mlxspec.measure.prompts import SUITE
from mlxspec.models.pairs import load_pair

KS = (1, 2, 3, 4)


def answer(pair, prompt: list[int], *, temp: float, tokens: int, seed: int) -> list[int]:
    import mlxspec

    return mlxspec.generate(pair, prompt, max_tokens=tokens, gamma=0, temp=temp, seed=seed).tokens


def expected_acceptance(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(3, len(KS)): at one node, over the target's ids, what a drawn child accepts (every
    column the same), what the top k point masses accept, and what a drawn child with k - 1
    point masses beside it accepts (module docstring), float64."""
    p, q = p.astype(np.float64), q.astype(np.float64)
    overlap = np.minimum(p, q)
    alpha = overlap.sum()
    excess = np.maximum(p - q, 0)
    r = excess / excess.sum() if excess.sum() > 0 else p
    order = np.argsort(-q)[: max(KS) + 1]
    out = np.zeros((3, len(KS)))
    out[0] = alpha
    reject = q - overlap  # q(x) (1 - min(1, p(x)/q(x))): the chance x is drawn and rejected
    for j, k in enumerate(KS):
        out[1, j] = p[order[:k]].sum()
        # the drawn x's siblings are the top k - 1 but x: where x is among the top k - 1 they
        # are the top k without it, else the top k - 1
        top = order[: k - 1]
        beside = r[top].sum()
        extra = (reject.sum() - reject[top].sum()) * beside
        extra += sum(reject[x] * (beside - r[x] + r[order[k - 1]]) for x in top)
        out[2, j] = alpha + extra
    return out


def coverage(pair, ids: list[int], start: int, *, depth: int, params: SamplingParams):
    """(depth, len(KS)) hits, (depth,) positions tried, and under sampling (depth, 3, len(KS))
    summed expected acceptances (expected_acceptance), over the answer ids[start:]."""
    model, head = pair.target.model, pair.draft.model
    target_logits = model(mx.array([ids]))[0]
    features = capture.taps_of(model).take()[0]
    to_target = None if head.draft_to_target is None else np.array(head.draft_to_target)
    hits = np.zeros((depth, len(KS)))
    tried = np.zeros(depth)
    expected = np.zeros((depth, 3, len(KS)))
    for t in range(start - 1, len(ids) - 1):  # the head drafts the id at t + 1 from position t
        cache = KVCache()
        logits, out = head(mx.array([ids[1 : t + 1]]), features[None, :t], cache)
        row, hidden = logits[0, -1], out[:, -1:]
        for d in range(depth):
            if t + 1 + d >= len(ids):
                break
            probs = np.array(warp(row, params) if not params.greedy else mx.softmax(row.astype(mx.float32)))
            order = np.argsort(-probs)[: max(KS)]
            order = order if to_target is None else to_target[order]
            truth = ids[t + 1 + d]
            tried[d] += 1
            for j, k in enumerate(KS):
                hits[d, j] += truth in order[:k]
            if not params.greedy:
                p = np.array(warp(target_logits[t + d], params))
                q = probs if to_target is None else np.bincount(to_target, weights=probs, minlength=p.shape[0])
                expected[d] += expected_acceptance(p, q)
            logits, out = head(mx.array([[truth]]), hidden, cache, chained=True)
            row, hidden = logits[0, -1], out[:, -1:]
    return hits, tried, expected


def prompt_ids(pair, *, corpus: str | None, count: int) -> list[list[int]]:
    """The prompts as the target reads them: `count` held-out prompts of `corpus` (those
    train-draft would ask, within its prompt limit), or the bench suite's."""
    if corpus:
        from mlxspec.training.conversations import held_out_prompts, load_corpus
        from mlxspec.training.data import MAX_PROMPT
        from mlxspec.training.sequences import encode_prompts

        asked = encode_prompts(
            pair.tokenizer, held_out_prompts(load_corpus(corpus)), raw=not pair.templated, limit=MAX_PROMPT
        )
        return [p for p in asked if 0 < len(p) <= MAX_PROMPT][:count]
    if not pair.templated:
        return [list(pair.tokenizer.encode(bench.prompt)) for bench in SUITE]
    from mlxspec.generation import encode_prompt

    return [encode_prompt(pair, bench.prompt) for bench in SUITE]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="gemma3-270m")
    parser.add_argument("--temp", default="0,0.7")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--target", help="a target (with --draft: a head of your own) instead of --pair")
    parser.add_argument("--draft")
    parser.add_argument("--corpus", help="the held-out prompts of this corpus (sharegpt or a file)")
    parser.add_argument("--prompts", type=int, default=64, help="with --corpus: how many of them")
    args = parser.parse_args()
    pair = load_pair(args.target, args.draft) if args.target else load_pair(pair=args.pair)
    prompts = prompt_ids(pair, corpus=args.corpus, count=args.prompts)
    name = args.pair if not args.target else f"{args.target} + {args.draft}"
    print(f"{len(prompts)} prompts: " + (f"held out of --corpus {args.corpus}" if args.corpus else "the bench suite"))
    for temp in (float(t) for t in args.temp.split(",")):
        params = SamplingParams(temp=temp)
        hits, tried = np.zeros((args.depth, len(KS))), np.zeros(args.depth)
        expected = np.zeros((args.depth, 3, len(KS)))
        for i, prompt in enumerate(prompts):
            ids = prompt + answer(pair, prompt, temp=temp, tokens=args.max_tokens, seed=i)
            h, n, e = coverage(pair, ids, len(prompt), depth=args.depth, params=params)
            hits, tried, expected = hits + h, tried + n, expected + e
        print(f"{name}, temperature {temp}: the target's next id among the head's top k, by depth")
        print("depth  " + "  ".join(f"k={k}" for k in KS) + "  positions")
        for d in range(args.depth):
            rates = "  ".join(f"{hits[d, j] / max(tried[d], 1):.2f}" for j in range(len(KS)))
            print(f"{d + 1:>5}  {rates}  {int(tried[d])}")
        if not params.greedy:
            print("expected acceptance at a node, by depth: a drawn child | k point masses | drawn + k - 1 beside it")
            for d in range(args.depth):
                n = max(tried[d], 1)
                rows = ["  ".join(f"{expected[d, kind, j] / n:.2f}" for j in range(len(KS))) for kind in (1, 2)]
                print(f"{d + 1:>5}  {expected[d, 0, 0] / n:.2f} | {rows[0]} | {rows[1]}")


if __name__ == "__main__":
    main()
