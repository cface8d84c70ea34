"""The target writes the draft's training data: its own answers to the corpus prompts
(greedy for most, sampled at temperature 0.7 for the rest), with its top-K log-probabilities
at every answer token, so the draft learns the target's distributions where the target
actually goes, not on text it would never write.

    python demos/smollm2_draft/teacher.py --target FOLDER --out DIR --prompts 4000

Batched, 64 answers of similar prompt length at once (on a CPU one step of 64 costs little
more than a few steps of one). Shards of 256 answers are written as they finish, so
a stopped run keeps what it made and `--resume` goes on from there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from demos.smollm2_draft.corpus import build_prompts  # noqa: E402

TOP_K = 32
SHARD = 256


def generate_batch(model, prompts: list[list[int]], *, temps: list[float], max_tokens: int, eos: set[int], key):
    """Answers to prompts of similar length, all at once: left-padded into mlx-lm's
    BatchKVCache (which masks the padding). Returns per prompt (ids, top ids, top log-probs)."""
    from mlx_lm.models.cache import BatchKVCache

    width = max(len(p) for p in prompts)
    padding = [width - len(p) for p in prompts]
    cache = [BatchKVCache(padding) for _ in model.layers]
    inputs = mx.array([[0] * pad + p for pad, p in zip(padding, prompts)], dtype=mx.uint32)
    temperature = mx.array([[max(t, 1e-6)] for t in temps])
    greedy = mx.array([t == 0 for t in temps])
    logits = model(inputs, cache=cache)[:, -1, :]
    answers = [[] for _ in prompts]
    tops = [([], []) for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_tokens):
        # top-K of the logits is top-K of the log-probabilities; sampled answers draw from
        # that top-K (a top-32 sampler: the data need not be the full temperature-0.7 law)
        top = mx.argpartition(-logits, TOP_K - 1, axis=-1)[:, :TOP_K]
        values = mx.take_along_axis(logits, top, axis=-1).astype(mx.float32) - mx.logsumexp(
            logits.astype(mx.float32), axis=-1, keepdims=True
        )
        key, sub = mx.random.split(key)
        pick = mx.where(greedy, mx.argmax(values, axis=-1), mx.random.categorical(values / temperature, key=sub))
        token = mx.take_along_axis(top, pick[:, None], axis=-1)[:, 0]
        values = values.astype(mx.float16)
        logits = model(token[:, None].astype(mx.uint32), cache=cache)[:, -1, :]
        mx.async_eval(logits)  # the next step runs while this one is read back
        for i, (t, ids, lp) in enumerate(zip(token.tolist(), np.array(top), np.array(values))):
            if done[i]:
                continue
            answers[i].append(t)
            tops[i][0].append(ids)
            tops[i][1].append(lp)
            done[i] = t in eos
        if all(done):
            break
    return [(a, np.stack(ids), np.stack(lp)) for a, (ids, lp) in zip(answers, tops)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target's mlx-lm folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--sampled-share", type=float, default=0.3, help="answers sampled at temperature 0.7")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    import mlx_lm

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = mlx_lm.load(args.target)
    eos = set(tokenizer.eos_token_ids)
    prompts = build_prompts(args.prompts, seed=args.seed)
    done = {int(p.stem.split("-")[1]) for p in out.glob("shard-*.npz")}
    rng = np.random.default_rng(args.seed)
    key = mx.random.key(args.seed)
    started, tokens_made = time.perf_counter(), 0
    for shard in range(0, len(prompts), SHARD):
        index = shard // SHARD
        sampled = rng.random(SHARD) < args.sampled_share  # drawn for every shard, so a resume repeats the split
        key, shard_key = mx.random.split(key)
        if index in done:
            continue
        chunk = prompts[shard : shard + SHARD]
        encoded = [
            list(tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True))
            for p in chunk
        ]
        results = [None] * len(chunk)
        order = sorted(range(len(chunk)), key=lambda i: len(encoded[i]))  # similar lengths: little padding
        for b in range(0, len(order), args.batch):
            group = order[b : b + args.batch]
            shard_key, batch_key = mx.random.split(shard_key)
            made = generate_batch(
                model,
                [encoded[i] for i in group],
                temps=[0.7 if sampled[i] else 0.0 for i in group],
                max_tokens=args.max_tokens,
                eos=eos,
                key=batch_key,
            )
            for i, result in zip(group, made):
                results[i] = result
                tokens_made += len(result[0])
            rate = tokens_made / (time.perf_counter() - started)
            print(
                f"shard {index}, batch {b // args.batch}: {tokens_made} answer tokens so far, {rate:.0f} tok/s",
                flush=True,
            )
        _save(
            out / f"shard-{index:04d}.npz",
            chunk,
            encoded,
            sampled[: len(chunk)],
            [r[0] for r in results],
            [r[1] for r in results],
            [r[2] for r in results],
        )
    (out / "teacher.json").write_text(json.dumps({**vars(args), "top_k": TOP_K, "tokens": tokens_made}, indent=2))


def _save(path: Path, chunk, encoded, sampled, answers, top_ids, top_lp) -> None:
    lengths = [len(a) for a in answers]
    np.savez(
        path.with_suffix(".partial.npz"),
        prompt_ids=np.concatenate([np.array(e, dtype=np.int32) for e in encoded]),
        prompt_lengths=np.array([len(e) for e in encoded], dtype=np.int32),
        answer_ids=np.concatenate([np.array(a, dtype=np.int32) for a in answers]),
        answer_lengths=np.array(lengths, dtype=np.int32),
        top_ids=np.concatenate(top_ids).astype(np.int32),
        top_logprobs=np.concatenate(top_lp),
        sampled=np.array(sampled, dtype=bool),
        categories=np.array([p["category"] for p in chunk]),
    )
    path.with_suffix(".partial.npz").rename(path)


if __name__ == "__main__":
    main()
