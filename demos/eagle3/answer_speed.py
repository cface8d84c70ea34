"""How fast train-draft's answers are made: the one pass it makes (training/answers.py: the
forwards that write each answer keep the taps and distributions) against the two it made
before (mlx-lm's BatchGenerator writes the answers, then a teacher-forced prefill reads
prompt and answer again for them), on the same prompts, interleaved.

    python demos/eagle3/answer_speed.py --target MODEL [--corpus sharegpt] [--prompts 32]
        [--batch 32] [--max-tokens 96] [--repeats 2]

The prompts are the corpus's user turns (with the turns before them) from its 200th
conversation on, in the target's chat template, as the data stage reads them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mlxspec.decoding.capture import install, num_layers
from mlxspec.training.answers import SAMPLED_SHARE, write_answers
from mlxspec.training.conversations import load_corpus, prompts_of
from mlxspec.training.data import MAX_PROMPT, Pace, prefill
from mlxspec.training.sequences import encode_prompts
from mlxspec.training.settings import load_target
from mlxspec.training.shape import TargetShape


def two_passes(model, taps, prompts, *, max_tokens: int, eos: list[int], batch: int, vocab_size: int):
    """The answers by mlx-lm's BatchGenerator, then read again teacher-forced: (answer ids,
    seconds generating, seconds reading)."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    greedy = np.random.default_rng(0).random(len(prompts)) >= SAMPLED_SHARE
    mx.random.seed(0)
    hot, cold = make_sampler(temp=0.7), make_sampler(temp=0.0)
    started = time.perf_counter()
    generator = BatchGenerator(
        model, max_tokens=max_tokens, stop_tokens=[[t] for t in eos], completion_batch_size=batch, prefill_batch_size=4
    )
    try:
        uids = generator.insert(prompts, samplers=[cold if g else hot for g in greedy])
        answers = {uid: [] for uid in uids}
        while True:
            reading, responses = generator.next()
            if not reading and not responses:
                break
            for r in responses:
                answers[r.uid].append(int(r.token))
    finally:
        generator.close()
    written = time.perf_counter()
    sequences = [p + answers[uid] for p, uid in zip(prompts, uids)]
    prefill(model, taps, sequences, vocab_size=vocab_size)
    return [answers[uid] for uid in uids], written - started, time.perf_counter() - written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--corpus", default="sharegpt")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    target = load_target(args.target)
    model, tokenizer = target.model, target.tokenizer
    shape = TargetShape.of(target.config, num_layers(model))
    taps = install(model, shape.aux)
    turns = [p for c in load_corpus(args.corpus).conversations[200:] for p in prompts_of(c)][: args.prompts]
    prompts = [p for p in encode_prompts(tokenizer, turns, limit=MAX_PROMPT) if 0 < len(p) <= MAX_PROMPT]
    eos = sorted(set(tokenizer.eos_token_ids))
    print(f"{len(prompts)} prompts, {np.mean([len(p) for p in prompts]):.0f} ids on average; "
          f"batches of {args.batch}, up to {args.max_tokens} new ids")  # fmt: skip
    for repeat in range(1, args.repeats + 1):
        answers, writing, reading = two_passes(
            model, taps, prompts, max_tokens=args.max_tokens, eos=eos, batch=args.batch, vocab_size=shape.vocab_size
        )
        before = sum(map(len, answers))
        started = time.perf_counter()
        made = write_answers(
            model,
            taps,
            prompts,
            max_tokens=args.max_tokens,
            eos=eos,
            seed=0,
            batch=args.batch,
            pace=Pace(),
            vocab_size=shape.vocab_size,
        )
        one = time.perf_counter() - started
        now = sum(len(m.ids) for m in made if m is not None)
        two = writing + reading
        print(
            f"repeat {repeat}: two passes {before} ids in {two:.1f} s ({writing:.1f} writing, {reading:.1f} reading "
            f"again), {before / two:.1f} ids/s; one pass {now} ids in {one:.1f} s, {now / one:.1f} ids/s: "
            f"{(now / one) / (before / two):.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
