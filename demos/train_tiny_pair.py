"""Train the bundled tiny pair: a ~4M-parameter target and a ~0.7M-parameter draft distilled
from it, both qwen3 models in mlx-lm's format, on the Python standard library's own source.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') \
        python demos/train_tiny_pair.py --out mlxspec/assets

About an hour on 2 CPU cores (MLX's CPU backend with OpenBLAS preloaded); unchanged on a Mac
(Metal), where it takes minutes. Steps:

1. Split the standard library's non-test modules into training and held-out files (by a
   hash of the path, so the split is the same everywhere); train a byte-level BPE
   tokenizer of 2048 ids on the training files.
2. Train the target on next-token prediction. It gets most of the budget: a target
   starved of tokens ends no better than its draft.
3. Distil the draft from the target: minimise KL(target || draft) on the target's full
   distributions (plus a little next-token loss), which is what raises acceptance,
   since rejection sampling accepts sum(min(p, q)) of the mass.
4. Save both (config.json, model.safetensors in float32, tokenizer files) and print the
   held-out losses for the model card.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demos.stdlib_corpus import read, split_files  # noqa: E402
from mlxspec.models import synthetic  # noqa: E402

VOCAB = 2048
SEQ = 256
BATCH = 16

TARGET = {
    "model_type": "qwen3",
    "hidden_size": 256,
    "num_hidden_layers": 5,
    "intermediate_size": 640,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
DRAFT = {
    **TARGET,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 384,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def encode_corpus(tokenizer_dir: Path, texts: list[str]) -> np.ndarray:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos = tokenizer.token_to_id(synthetic.ENDOFTEXT)
    ids = []
    for encoding in tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eos)
    return np.array(ids, dtype=np.int32)


def make_model(config: dict, seed: int):
    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_class, args_class = _get_classes({**config, "vocab_size": VOCAB})
    model = model_class(args_class.from_dict({**config, "vocab_size": VOCAB}))
    mx.eval(model.parameters())
    return model


def batches(data: np.ndarray, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(data) - SEQ - 1, size=BATCH)
        window = np.stack([data[s : s + SEQ + 1] for s in starts])
        yield mx.array(window[:, :-1]), mx.array(window[:, 1:])


def schedule(peak: float, steps: int, warmup: int = 100):
    warmup = min(warmup, steps // 4)
    return optim.join_schedules(
        [optim.linear_schedule(peak / 50, peak, warmup), optim.cosine_decay(peak, steps - warmup, peak / 10)], [warmup]
    )


def train(model, steps: int, lr: float, data: np.ndarray, loss_fn, label: str, seed: int) -> None:
    optimizer = optim.AdamW(learning_rate=schedule(lr, steps), weight_decay=0.1)
    state = [model.state, optimizer.state]

    def step(x, y):
        loss, grads = nn.value_and_grad(model, loss_fn)(x, y)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    step = mx.compile(step, inputs=state, outputs=state)
    stream = batches(data, np.random.default_rng(seed))
    t0, running = time.perf_counter(), None
    for i in range(1, steps + 1):
        x, y = next(stream)
        loss = step(x, y)
        mx.eval(state, loss)
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if i % 50 == 0 or i == steps:
            elapsed = time.perf_counter() - t0
            print(
                f"{label} step {i}/{steps}  loss {running:.3f}  {i * BATCH * SEQ / elapsed:.0f} tok/s  "
                f"{elapsed / 60:.1f} min",
                flush=True,
            )


def cross_entropy(model):
    def loss(x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    return loss


def distillation(draft, target, ce_weight: float = 0.1):
    def loss(x, y):
        teacher = mx.stop_gradient(nn.log_softmax(target(x).astype(mx.float32), axis=-1))
        student = nn.log_softmax(draft(x).astype(mx.float32), axis=-1)
        kl = (mx.exp(teacher) * (teacher - student)).sum(axis=-1).mean()
        return kl + ce_weight * nn.losses.cross_entropy(student, y, reduction="mean")

    return loss


def held_out_loss(model, data: np.ndarray, windows: int = 64) -> float:
    losses = []
    for start in np.linspace(0, len(data) - SEQ - 2, windows).astype(int):
        window = mx.array(data[start : start + SEQ + 1])[None]
        losses.append(nn.losses.cross_entropy(model(window[:, :-1]), window[:, 1:], reduction="mean").item())
    return float(np.mean(losses))


def save(model, config: dict, tokenizer_dir: Path, out: Path) -> None:
    from mlx_lm.utils import save_config, save_model

    save_model(out, model)
    save_config({**config, "vocab_size": VOCAB, "eos_token_id": [0]}, out / "config.json")
    synthetic.copy_tokenizer(tokenizer_dir, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("mlxspec/assets"))
    parser.add_argument("--target-steps", type=int, default=900)
    parser.add_argument("--draft-steps", type=int, default=700)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    train_files, held_files = split_files()
    tokenizer_dir = Path(tempfile.mkdtemp()) / "tokenizer"
    train_texts = read(train_files)
    # no chat template: these are code-completion models, prompts are read raw
    synthetic.train_tokenizer(train_texts, VOCAB, tokenizer_dir, chat_template=None)
    train_data = encode_corpus(tokenizer_dir, train_texts)
    held_data = encode_corpus(tokenizer_dir, read(held_files))
    print(
        f"{len(train_files)} training files ({len(train_data)} tokens), {len(held_files)} held out "
        f"({len(held_data)} tokens)",
        flush=True,
    )

    target = make_model(TARGET, args.seed)
    draft = make_model(DRAFT, args.seed + 1)
    for name, model in (("target", target), ("draft", draft)):
        print(f"{name}: {sum(v.size for _, v in tree_flatten(model.parameters())) / 1e6:.2f}M parameters", flush=True)

    train(target, args.target_steps, 2e-3, train_data, cross_entropy(target), "target", args.seed)
    target.freeze()
    train(draft, args.draft_steps, 3e-3, train_data, distillation(draft, target), "draft", args.seed + 1)

    report = {
        "train_files": len(train_files),
        "held_out_files": len(held_files),
        "train_tokens": int(len(train_data)),
        "held_out_tokens": int(len(held_data)),
        "target_steps": args.target_steps,
        "draft_steps": args.draft_steps,
        "tokens_per_step": BATCH * SEQ,
        "target_held_out_loss": round(held_out_loss(target, held_data), 4),
        "draft_held_out_loss": round(held_out_loss(draft, held_data), 4),
        "minutes": round((time.perf_counter() - t0) / 60, 1),
    }
    target.unfreeze()
    save(target, TARGET, tokenizer_dir, args.out / "tiny-target")
    save(draft, DRAFT, tokenizer_dir, args.out / "tiny-draft")
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
