"""DFlash block drafters for tiny targets, in the published layout on disk: random, or fitted
for a few seconds to the target's own greedy continuations of given prompts (the paper's
recipe in miniature: random anchor positions, a block of mask ids after each, the target's
next ids as labels), so that some drafts are accepted and some rejected."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from tests.support.heads import _continuations, part_of_vocabulary


def make_dflash(
    target_dir: Path,
    out_dir: Path,
    *,
    fit_steps: int = 0,
    fit_prompts: list[list[int]] = (),
    seed: int = 0,
    layer_ids: tuple[int, ...] | None = None,
    block_size: int = 8,
    layers: int = 1,
    mask_token_id: int = 1,
    draft_vocab: float = 1.0,
    causal: bool = False,
) -> Path:
    """A drafter for the mlx-lm model at `target_dir`, written to `out_dir`, reading the
    outputs of `layer_ids` (default: every layer of the tiny target). `draft_vocab` < 1: it
    scores that share of the target's ids (heads.part_of_vocabulary) with its own LM head,
    which starts as the target's rows for them. `causal`: its block attends causally (the
    config's `is_causal`; the published drafters attend both ways)."""
    import mlx_lm

    from mlxspec.decoding import capture
    from mlxspec.drafters.dflash_model import DFlashConfig, DFlashDraft, save_draft
    from mlxspec.training.trainer import draft_index, target_output_rows

    model, tokenizer = mlx_lm.load(str(target_dir))
    config = json.loads((Path(target_dir) / "config.json").read_text())
    text = config.get("text_config") or config
    count = capture.num_layers(model)
    ids = tuple(layer_ids if layer_ids is not None else range(count))
    taps = capture.install_outputs(model, ids)
    hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    draft_config = DFlashConfig(
        hidden_size=hidden,
        intermediate_size=int(text["intermediate_size"]),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        vocab_size=int(text["vocab_size"]),
        block_size=block_size,
        target_layer_ids=ids,
        mask_token_id=mask_token_id,
        num_target_layers=count,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(text.get("max_position_embeddings") or 1024),
        is_causal=causal,
    )
    rng = np.random.default_rng(seed)
    sequences, features = _continuations(model, taps, [list(p) for p in fit_prompts], rng) if fit_steps else ([], [])
    vocab = int(text["vocab_size"])
    kept = part_of_vocabulary(draft_vocab, vocab=vocab, eos=tokenizer.eos_token_ids, sequences=sequences, rng=rng)
    if len(kept) < vocab:
        draft_config = replace(draft_config, draft_vocab_size=len(kept))
    mx.random.seed(seed)
    draft = DFlashDraft(draft_config).bind(model)
    if len(kept) < vocab:
        draft.lm_head.weight = target_output_rows(model)[mx.array(kept)].astype(mx.float32)
        object.__setattr__(draft, "draft_to_target", mx.array(kept, dtype=mx.uint32))
    if fit_steps:
        to_row = draft_index(kept, vocab)
        _fit(draft, sequences, features, to_row, first=len(fit_prompts[0]) - 1, steps=fit_steps, rng=rng)
    mx.eval(draft.parameters())
    save_draft(draft, out_dir)
    if causal:  # the published layout's writer leaves the default (both ways) unsaid
        written = json.loads((Path(out_dir) / "config.json").read_text())
        (Path(out_dir) / "config.json").write_text(json.dumps(written | {"is_causal": True}))
    return Path(out_dir)


def _fit(draft, sequences, features, to_row: np.ndarray, *, first: int, steps: int, rng) -> None:
    """Cross-entropy on the ids after a random anchor: the context is the target's features
    before the anchor, the block the anchor's id and mask ids (`to_row`: each target id's
    row in the drafter's vocabulary, -1 outside it, not learnt)."""
    size, mask = draft.config.block_size, draft.config.mask_token_id
    ids = np.stack(sequences)
    hidden = mx.stack(features)
    optimizer = optim.Adam(learning_rate=3e-3)

    def loss_fn(draft, anchor):
        block = mx.array(np.concatenate([ids[:, anchor : anchor + 1], np.full((len(ids), size - 1), mask)], axis=1))
        labels = mx.array(to_row[ids[:, anchor + 1 : anchor + size]])
        cache = draft.make_cache()
        draft.read_context(hidden[:, :anchor], cache)
        logits = draft(block, cache)[:, 1:]
        learnt = labels >= 0
        losses = nn.losses.cross_entropy(logits, mx.maximum(labels, 0), reduction="none")
        return (losses * learnt).sum() / mx.maximum(learnt.sum(), 1)

    step = nn.value_and_grad(draft, loss_fn)
    for _ in range(steps):
        anchor = int(rng.integers(first, ids.shape[1] - size + 1))
        _, grads = step(draft, anchor)
        optimizer.update(draft, grads)
        mx.eval(draft.parameters(), optimizer.state)


def fresh_block_drafts(pair, history: list[int], n: int) -> list[int]:
    """What a DFlash drafter that read `history`'s rows in one block proposes greedily: the
    argmax of the block's first `n` mask positions after history's last id."""
    from mlxspec.decoding import capture

    model, draft = pair.target.model, pair.draft.model
    model(mx.array([history[:-1]]))
    cache = draft.make_cache()
    draft.read_context(capture.taps_of(model).take(), cache)
    config = draft.config
    block = mx.array([[history[-1]] + [config.mask_token_id] * (config.block_size - 1)])
    drafted = mx.argmax(draft(block, cache)[0, 1 : n + 1], axis=-1)
    return (drafted if draft.draft_to_target is None else draft.draft_to_target[drafted]).tolist()
