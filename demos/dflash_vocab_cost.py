"""What a DFlash block forward costs beside a target step, scoring the target's whole
vocabulary or a draft vocabulary, on one target in one run; with --training, what a
training step costs a trained position too.

    python demos/dflash_vocab_cost.py [--target MODEL] [--draft-vocab 8192] [--rounds 3] [--training]

Builds two random drafters for the target as `train-draft --kind dflash` starts them (one
layer, blocks of 8, five target layers read): one over the whole vocabulary (the published
drafters' layout) and one over the first `--draft-vocab` ids (what is scored costs the same
whichever ids they are). Times each with bench's cost model (`measure.costs.measure`: a
target step, and the drafter's block forward after reading the prompt), the two in turn for
`--rounds` rounds, and prints c = block / step for each. --training: one training step of
`training/dflash.py`'s objective (forward, backward, AdamW) over random features of the
target's shape, about 380 trained positions a batch, for each drafter.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from mlxspec.models.pairs import Pair, load_pair  # noqa: E402

DEFAULT_TARGET = str(Path.home() / ".cache/mlxspec-tests/models/gemma-3-270m-q4_k_m-float32")
PROMPT = "The history of the Roman empire begins with the founding of the city"


def drafter_pair(target: str, vocabulary: np.ndarray | None, folder: Path) -> Pair:
    """The target beside a random drafter written to `folder` and loaded as --draft does."""
    import mlx_lm

    from mlxspec.decoding.capture import num_layers
    from mlxspec.drafters.dflash_model import save_draft
    from mlxspec.training.dflash import choose_mask_id, new_drafter, target_layer_ids

    model, tokenizer, config = mlx_lm.load(target, return_config=True)
    vocab = (config.get("text_config") or config)["vocab_size"]
    draft = new_drafter(
        model, config, layer_ids=target_layer_ids(num_layers(model)), block_size=8, layers=1,
        mask_id=choose_mask_id(tokenizer, vocab_size=vocab, given=None), seed=0, vocabulary=vocabulary,
    )  # fmt: skip
    save_draft(draft, folder)
    return load_pair(target, str(folder))


def training_cost(pair: Pair, *, rounds: int) -> tuple[float, int]:
    """Median seconds of one training step of the drafter in `pair` on random data, and the
    positions it trained."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from mlxspec.training.dflash import DFlashObjective
    from mlxspec.training.store import Example
    from mlxspec.training.trainer import draft_index

    draft, vocab = pair.draft.model, pair.target.width
    index = None if draft.draft_to_target is None else draft_index(np.array(draft.draft_to_target), vocab)
    rng = np.random.default_rng(0)
    width = draft.config.feature_width
    example = Example(
        ids=rng.integers(10, 8000, 384).astype(np.int32), features=rng.standard_normal((384, width)).astype(np.float16),
        top_ids=rng.integers(10, 8000, (384, 32)).astype(np.int32), top_probs=np.full((384, 32), 1 / 32, np.float16),
        train_from=0, held_out=False, greedy=True,
    )  # fmt: skip
    objective = DFlashObjective(
        block_size=draft.config.block_size, mask_id=draft.config.mask_token_id, vocab_size=vocab, draft_index=index
    )
    batch = objective.batch([example], [objective.labels(example)], key=(1,))
    optimizer = optim.AdamW(learning_rate=1e-4)
    step = nn.value_and_grad(draft, lambda b: objective.loss(draft, b, 0.0))
    times = []
    for _ in range(rounds + 1):
        started = time.perf_counter()
        _, grads = step(batch)
        optimizer.update(draft, grads)
        mx.eval(draft.parameters(), optimizer.state)
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[len(times[1:]) // 2], batch["trained"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--training", action="store_true", help="also time a training step")
    args = parser.parse_args()
    from mlxspec.measure.costs import measure

    folder = Path(tempfile.mkdtemp())
    pairs = {
        "whole vocabulary": drafter_pair(args.target, None, folder / "whole"),
        f"{args.draft_vocab} ids": drafter_pair(args.target, np.arange(args.draft_vocab), folder / "part"),
    }
    prompt = list(pairs["whole vocabulary"].tokenizer.encode(PROMPT))
    print(f"{args.target}: a target step and a block forward (blocks of 8), medians of 7")
    for number in range(args.rounds):
        for name, pair in pairs.items():
            c = measure(pair, prompt, max_tokens=2, repeats=7)
            print(
                f"  round {number + 1}  {name:<18} step {c.target_step * 1e3:6.1f} ms  "
                f"block {c.draft_step * 1e3:6.1f} ms  c {c.draft_step / c.target_step:.3f}",
                flush=True,
            )
    if args.training:
        print("a training step (forward, backward, AdamW), medians")
        for name, pair in pairs.items():
            seconds, positions = training_cost(pair, rounds=args.rounds)
            print(
                f"  {name:<18} {seconds:6.2f} s for {positions} positions: "
                f"{seconds / positions * 1e3:5.2f} ms a position"
            )


if __name__ == "__main__":
    main()
