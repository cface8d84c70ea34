"""Distil a draft for SmolLM2-135M-Instruct from its own answers (teacher.py's shards).

    python demos/smollm2_draft/train.py --target FOLDER --data DIR --out mlxspec/assets/smollm2-draft

The draft is the target cut down: its 576-wide token embedding (tied to the output layer),
restricted to the 8191 ids the target writes most, two of its 30 transformer blocks, and its
final norm. It starts as that cut-down copy and is trained to match the target's
distribution at each answer token: cross-entropy against the target's top-32 probabilities
(renormalised over the ids the draft can propose) plus a tenth of the next-token loss.
Rejection sampling accepts sum(min(p, q)) of the mass, and greedy decoding accepts when the
argmax agrees; matching p is what raises both.

The last shard is held out; the card reports the draft's greedy agreement with the target
and its mass overlap at temperature 0.7 on it, along the target's own answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mlxspec.models.subset_draft import write_subset  # noqa: E402

ROWS = 8192  # the draft's vocabulary: 8191 target ids and one row for all others
HARD_WEIGHT = 0.1
TOKENS_PER_BATCH = 2048
CONTEXT = 64  # prompt ids kept before each answer: a two-block draft reads mostly what is near


def load_shards(folder: Path) -> list[dict]:
    """One dict per answer: ids (prompt + answer), prompt length, top ids and log-probs."""
    examples = []
    for path in sorted(folder.glob("shard-*.npz")):
        data = np.load(path)
        p_off = np.concatenate([[0], np.cumsum(data["prompt_lengths"])])
        a_off = np.concatenate([[0], np.cumsum(data["answer_lengths"])])
        for i in range(len(data["prompt_lengths"])):
            prompt = data["prompt_ids"][p_off[i] : p_off[i + 1]]
            answer = data["answer_ids"][a_off[i] : a_off[i + 1]]
            if len(answer) < 2:
                continue
            examples.append(
                {
                    "ids": np.concatenate([prompt, answer]).astype(np.int32),
                    "prompt": len(prompt),
                    "top_ids": data["top_ids"][a_off[i] : a_off[i + 1]],
                    "top_logprobs": data["top_logprobs"][a_off[i] : a_off[i + 1]].astype(np.float32),
                    "sampled": bool(data["sampled"][i]),
                    "category": str(data["categories"][i]),
                    "shard": path.stem,
                }
            )
    return examples


def choose_vocabulary(examples: list[dict], eos_ids: list[int], vocab_size: int) -> list[int]:
    """The ids the target writes most (answers, then prompts to break ties), eos ids first."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for e in examples:
        np.add.at(counts, e["ids"][e["prompt"] :], 1000)
        np.add.at(counts, e["ids"][: e["prompt"]], 1)
    order = [int(i) for i in np.argsort(-counts, kind="stable") if i not in eos_ids]
    return list(eos_ids) + order[: ROWS - 1 - len(eos_ids)]


def build_draft(target_folder: Path, target_ids: list[int], layers: list[int]):
    """The target cut down: subset embedding, the chosen blocks, its final norm."""
    import mlx_lm
    from mlx_lm.models import llama

    target, _ = mlx_lm.load(str(target_folder))
    config = json.loads((target_folder / "config.json").read_text())
    draft_config = {
        "model_type": "llama",
        "hidden_size": config["hidden_size"],
        "num_hidden_layers": len(layers),
        "intermediate_size": config["intermediate_size"],
        "num_attention_heads": config["num_attention_heads"],
        "num_key_value_heads": config["num_key_value_heads"],
        "head_dim": config.get("head_dim"),
        "rms_norm_eps": config["rms_norm_eps"],
        "rope_theta": config["rope_theta"],
        "vocab_size": ROWS,
        "max_position_embeddings": config["max_position_embeddings"],
        "tie_word_embeddings": True,
    }
    draft = llama.Model(llama.ModelArgs.from_dict(draft_config))
    weights = dict(tree_flatten(target.parameters()))
    embed = weights["model.embed_tokens.weight"]
    rows = embed[mx.array(target_ids)]
    new = {
        "model.embed_tokens.weight": mx.concatenate([rows, embed.mean(axis=0, keepdims=True)]),
        "model.norm.weight": weights["model.norm.weight"],
    }
    for j, i in enumerate(layers):
        prefix = f"model.layers.{i}."
        new.update({f"model.layers.{j}." + k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)})
    draft.update(tree_unflatten(list(new.items())))
    mx.eval(draft.parameters())
    return draft, draft_config


def batches(examples: list[dict], to_row: np.ndarray, rng: np.random.Generator, *, tokens: int = TOKENS_PER_BATCH):
    """Batches of similar length (little padding), in random order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["ids"]) + rng.random())
    groups, group, longest = [], [], 0
    for i in order:
        longest = max(longest, len(examples[i]["ids"]))
        if group and longest * (len(group) + 1) > tokens:
            groups.append(group)
            group, longest = [], len(examples[i]["ids"])
        group.append(i)
    groups.append(group)
    rng.shuffle(groups)
    for group in groups:
        yield make_batch([examples[i] for i in group], to_row)


def make_batch(chosen: list[dict], to_row: np.ndarray) -> tuple[mx.array, ...]:
    """inputs (B, T); for each position predicting an answer id: the target's top rows and
    their probabilities renormalised over the subset (B, T, K), the id's row (B, T), masks."""
    width = max(len(e["ids"]) for e in chosen) - 1
    k = chosen[0]["top_ids"].shape[1]
    inputs = np.zeros((len(chosen), width), dtype=np.int32)
    rows = np.zeros((len(chosen), width, k), dtype=np.int32)
    probs = np.zeros((len(chosen), width, k), dtype=np.float32)
    hard = np.zeros((len(chosen), width), dtype=np.int32)
    soft_mask = np.zeros((len(chosen), width), dtype=np.float32)
    hard_mask = np.zeros((len(chosen), width), dtype=np.float32)
    other = ROWS - 1
    for b, e in enumerate(chosen):
        ids = e["ids"]
        inputs[b, : len(ids) - 1] = to_row[ids[:-1]]
        start = e["prompt"] - 1  # the position whose output is the first answer id
        n = len(ids) - e["prompt"]
        top_rows = to_row[e["top_ids"][:n]]
        p = np.exp(e["top_logprobs"][:n]) * (top_rows != other)
        total = p.sum(axis=-1, keepdims=True)
        rows[b, start : start + n] = np.where(top_rows != other, top_rows, 0)
        probs[b, start : start + n] = p / np.maximum(total, 1e-9)
        soft_mask[b, start : start + n] = total[:, 0] > 0
        answer_rows = to_row[ids[e["prompt"] :]]
        hard[b, start : start + n] = np.where(answer_rows != other, answer_rows, 0)
        hard_mask[b, start : start + n] = answer_rows != other
    return tuple(mx.array(a) for a in (inputs, rows, probs, hard, soft_mask, hard_mask))


def loss_fn(model, inputs, rows, probs, hard, soft_mask, hard_mask):
    logits = model(inputs)[..., : ROWS - 1].astype(mx.float32)  # the "other" row is never proposed
    logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    soft = -(probs * mx.take_along_axis(logq, rows, axis=-1)).sum(axis=-1)
    nll = -mx.take_along_axis(logq, hard[..., None], axis=-1)[..., 0]
    return ((soft * soft_mask).sum() + HARD_WEIGHT * (nll * hard_mask).sum()) / mx.maximum(soft_mask.sum(), 1)


def evaluate(model, examples: list[dict], to_row: np.ndarray, target_ids: np.ndarray) -> dict:
    """Along the target's answers: how often the draft's argmax is the target's (greedy
    acceptance), and sum(min(p, q)) at temperature 0.7 over the target's top ids (the mass
    rejection sampling accepts), with p from the target's top-32 renormalised."""
    agree = total = 0
    overlap = 0.0
    for e in examples:
        batch = make_batch([e], to_row)
        logits = model(batch[0])[0, ..., : ROWS - 1].astype(mx.float32)
        n = len(e["ids"]) - e["prompt"]
        start = e["prompt"] - 1
        guess = np.array(mx.argmax(logits[start : start + n], axis=-1))
        best = e["top_ids"][:n][np.arange(n), np.argmax(e["top_logprobs"][:n], axis=-1)]
        agree += int((target_ids[guess] == best).sum())
        total += n
        q = mx.softmax(logits[start : start + n] / 0.7, axis=-1)
        top_rows = to_row[e["top_ids"][:n]]
        p = np.exp(e["top_logprobs"][:n] / 0.7)
        p /= p.sum(axis=-1, keepdims=True)
        q_top = np.array(mx.take_along_axis(q, mx.array(np.where(top_rows < ROWS - 1, top_rows, 0)), axis=-1)) * (
            top_rows < ROWS - 1
        )
        overlap += float(np.minimum(p, q_top).sum())
    return {"greedy_agreement": agree / total, "overlap_t07": overlap / total, "tokens": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", default="0,1", help="the target's blocks the draft starts from")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-only", action="store_true", help="evaluate the untrained cut-down copy")
    parser.add_argument("--init", help="continue from this saved draft (its rows and weights), not a cut-down copy")
    args = parser.parse_args()

    target_folder = Path(args.target)
    tconfig = json.loads((target_folder / "config.json").read_text())
    eos = tconfig["eos_token_id"] if isinstance(tconfig["eos_token_id"], list) else [tconfig["eos_token_id"]]
    examples = load_shards(Path(args.data))
    last = max(e["shard"] for e in examples)
    train = [e for e in examples if e["shard"] != last]
    held = [e for e in examples if e["shard"] == last][:96]
    if args.init:  # the saved draft's rows: the subset is part of its weights
        target_ids = json.loads((Path(args.init) / "subset_vocab.json").read_text())["target_ids"]
    else:
        target_ids = choose_vocabulary(train, eos, tconfig["vocab_size"])
    to_row = np.full(tconfig["vocab_size"], ROWS - 1, dtype=np.int32)
    to_row[np.array(target_ids)] = np.arange(len(target_ids))
    held_tokens = np.concatenate([e["ids"][e["prompt"] :] for e in held])
    coverage = float((to_row[held_tokens] != ROWS - 1).mean())
    answer_tokens = sum(len(e["ids"]) - e["prompt"] for e in train)
    print(
        f"{len(train)} training answers ({answer_tokens} answer tokens), {len(held)} held out; "
        f"the subset covers {coverage:.4f} of held-out answer tokens",
        flush=True,
    )

    layers = [int(x) for x in args.layers.split(",")]
    model, config = build_draft(target_folder, target_ids, layers)
    if args.init:
        model.load_weights(str(Path(args.init) / "model.safetensors"))
        model.set_dtype(mx.float32)
        previous = json.loads((Path(args.init) / "training.json").read_text())
    ids_array = np.array(target_ids)
    before = evaluate(model, held, to_row, ids_array)
    print(f"cut-down copy of layers {layers}: {before}", flush=True)
    if args.eval_only:
        return

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = sum(1 for _ in batches(train, to_row, np.random.default_rng(0)))
    total_steps = int(steps_per_epoch * args.epochs)
    warmup = max(total_steps // 20, 1)
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(1e-6, args.lr, warmup),
            optim.cosine_decay(args.lr, total_steps - warmup, args.lr * 0.05),
        ],
        [warmup],
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    step_fn = nn.value_and_grad(model, loss_fn)
    started, step, seen = time.perf_counter(), 0, 0
    history = []
    while step < total_steps:
        for batch in batches(train, to_row, rng):
            loss, grads = step_fn(model, *batch)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            optimizer.update(model, grads)
            mx.eval(loss, model.parameters(), optimizer.state)
            step += 1
            seen += int(batch[0].size)
            if step % 50 == 0 or step == total_steps:
                rate = seen / (time.perf_counter() - started)
                print(f"step {step}/{total_steps} loss {loss.item():.4f} · {rate:.0f} tok/s", flush=True)
            if step % 400 == 0:
                history.append({"step": step, **evaluate(model, held[:32], to_row, ids_array)})
                print(history[-1], flush=True)
            if step >= total_steps:
                break
    after = evaluate(model, held, to_row, ids_array)
    minutes = (time.perf_counter() - started) / 60
    print(f"trained: {after} in {minutes:.1f} min", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.set_dtype(mx.bfloat16)  # half the package; mlxspec runs it in float32 on a CPU
    mx.save_safetensors(
        str(out / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"}
    )
    (out / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}, indent=2) + "\n")
    write_subset(out, target_ids, tconfig["vocab_size"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((target_folder / name).read_bytes())
    report = {
        "continues": previous if args.init else None,
        "layers_from_target": layers,
        "rows": ROWS,
        "train_answers": len(train),
        "train_answer_tokens": answer_tokens,
        "tokens_seen": seen,
        "steps": total_steps,
        "epochs": args.epochs,
        "lr": args.lr,
        "minutes": round(minutes, 1),
        "held_out_answers": len(held),
        "subset_coverage": coverage,
        "before": before,
        "after": after,
        "history": history,
    }
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
