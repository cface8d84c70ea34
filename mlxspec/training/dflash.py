"""Training a DFlash block drafter (arXiv 2602.06036) on train-draft's data.

The recipe is SpecForge's (sgl-project/SpecForge: `specforge/core/dflash.py`
OnlineDFlashModel, `scripts/train_dflash.py`), on the shards the EAGLE-3 path writes, the
features captured at the drafter's `target_layer_ids` (layer outputs, capture.install_outputs):

- anchors: random positions of each sequence whose next id is trained on (an answer's ids,
  or text), about one anchor per block_size - 1 trained positions; drawn from the batch's
  key (seed, epoch, batch), so a resumed run draws the same;
- a block per anchor a: the real id at a, then block_size - 1 mask ids, at positions
  a .. a + block_size - 1; its context is the target's features at positions < a (strictly:
  at inference the drafter has read the rows before the target's newest id), attended
  both ways within the block, blocks invisible to each other;
- the loss at block position k >= 1: the soft cross-entropy against the target's own
  distribution for the id at a + k (its top-32 in the shards, renormalised: the KL to it
  up to a constant), where SpecForge takes the hard id; weighted exp(-(k - 1) / γ) (the
  paper's Eq. 4, SpecForge's --loss-decay-gamma: 7 for blocks of 16, 5 for 10, 4 for 8)
  and averaged over the weights.

The drafter's layers start random (SpecForge's post_init draws them; MLX's default
initialisation here), its embedding is the target's and stays frozen, and so is its LM head
unless it scores a draft vocabulary (the ids the target writes most, as the EAGLE-3 head's):
then its own LM head starts as the target's rows for them and is trained with the layers. Its final
norm starts as the target's own (the LM head's input scale), scaled down where the first
logits spread too wide (trainer.rescale_output, as the EAGLE-3 head's). `target_layer_ids`
follow SpecForge's `build_target_layer_ids` spread (1 .. L - 3), five of them as z-lab's
published drafters read. The mask id is the tokenizer's mask token, else the first id past
the tokenizer inside the embedding (z-lab's Qwen3 drafters: 151669, the `<|MASK|>` SpecForge
adds), else the last added special token that no chat turn uses; `--mask-id` chooses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx
import numpy as np

from ..drafters.dflash_model import DFlashConfig, DFlashDraft
from ..errors import TrainingError
from .store import Example
from .trainer import MAX_WINDOW, Labels, Objective, label, rescale_output, target_final_norm, window

LAYER_IDS = 5  # target layers read, as z-lab's published drafters (Qwen3-4B/8B: [1, 9, 17, 25, 33])
DECAY = {16: 7.0, 10: 5.0, 8: 4.0}  # block size -> γ (SpecForge's suggestions)
EVAL_SEED = 20260  # held-out anchors: the same at every evaluation


def target_layer_ids(layers: int, count: int = LAYER_IDS) -> tuple[int, ...]:
    """SpecForge's `build_target_layer_ids` spread: `count` outputs from layer 1 to L - 3,
    rounded; every layer of a target too shallow for that spread."""
    start, end = 1, layers - 3
    if end <= start:
        return tuple(range(layers))
    spread = (int(round(start + i * (end - start) / (count - 1))) for i in range(count))
    return tuple(sorted(set(spread)))


def choose_mask_id(tokenizer, *, vocab_size: int, given: int | None) -> int:
    """The block's mask id: `given`, or the tokenizer's own mask token, or the first id past
    the tokenizer that the target's embedding still holds (a row no text reaches), or the
    last added special token that is no end, start or padding id and no chat turn uses.
    TrainingError in one line when there is none."""
    if given is not None:
        if not 0 <= given < vocab_size:
            raise TrainingError(f"--mask-id {given} is not an id of the target's {vocab_size}")
        return given
    vocab = tokenizer.get_vocab()
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    for name in (getattr(inner, "mask_token", None), "<mask>", "<|MASK|>"):
        if isinstance(name, str) and vocab.get(name, vocab_size) < vocab_size:
            return vocab[name]
    if len(vocab) < vocab_size and max(vocab.values()) < len(vocab):
        return len(vocab)
    used = set(tokenizer.eos_token_ids) | {getattr(inner, n, None) for n in ("bos_token_id", "pad_token_id")}
    template = str(getattr(inner, "chat_template", None) or "")
    added = getattr(inner, "added_tokens_decoder", {}) or {}
    spare = [i for i, t in added.items() if i not in used and i < vocab_size and str(t) not in template]
    if spare:
        return max(spare)
    raise TrainingError(
        "the target's tokenizer has no mask token and no spare id for one: give --mask-id (an id its text never uses)"
    )


def new_drafter(
    model,
    target_config: dict,
    *,
    layer_ids,
    block_size: int,
    layers: int,
    mask_id: int,
    seed: int,
    vocabulary: np.ndarray | None = None,
) -> DFlashDraft:
    """A drafter shaped as the target's layers (Qwen3-style, its width, heads and rope),
    bound to its embedding and LM head; layers random, the final norm the target's. With a
    `vocabulary` (target ids, sorted) it scores those ids alone, with an LM head of its own
    that starts as the target's rows for them and is trained with the layers."""
    from ..decoding.capture import num_layers
    from ..drafters.eagle3_head import config_from_target
    from .trainer import target_output_rows

    text = target_config.get("text_config") or target_config
    base = config_from_target(target_config, draft_vocab_size=int(text["vocab_size"]), aux_layer_ids=layer_ids)
    shared = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    shared += ("vocab_size", "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings")
    config = DFlashConfig(
        **{name: getattr(base, name) for name in shared},
        num_hidden_layers=layers,
        block_size=block_size,
        target_layer_ids=tuple(layer_ids),
        mask_token_id=mask_id,
        num_target_layers=num_layers(model),
        draft_vocab_size=None if vocabulary is None else len(vocabulary),
    )
    mx.random.seed(seed)
    draft = DFlashDraft(config).bind(model)
    if vocabulary is not None:
        draft.lm_head.weight = target_output_rows(model)[mx.array(vocabulary)].astype(mx.float32)
        object.__setattr__(draft, "draft_to_target", mx.array(vocabulary.astype(np.uint32)))
    draft.norm.weight = target_final_norm(model).astype(mx.float32)
    mx.eval(draft.parameters())
    return draft


# ---------------------------------------------------------------- the training forward


def _attend(attn, x: mx.array, context: mx.array, anchors: mx.array) -> mx.array:
    """One layer's attention for every block at once, as the drafter's own Attention reads
    a block after its cached context (dflash_model.py). x (B, N·S, hidden): N blocks of S
    rows; context (B, W, hidden): hidden_norm(fc(features)) at window positions 0 .. W - 1;
    anchors (B, N) int32: block n's first position. -> (B, N·S, hidden)."""
    b, width, _ = context.shape
    n = anchors.shape[1]
    s = x.shape[1] // n
    heads, kv, dim = attn.heads, attn.kv_heads, attn.head_dim
    keys = attn.rope(attn._heads(attn.k_proj(context), kv, attn.k_norm))  # positions 0 .. W - 1
    values = attn._heads(attn.v_proj(context), kv)

    def blocks(t: mx.array, count: int, norm=None) -> mx.array:
        """(B, N·S, count·dim) -> (B·N, count, S, dim), each block rotated from its anchor."""
        t = t.reshape(b * n, s, count, dim)
        t = norm(t) if norm is not None else t
        return t.transpose(0, 2, 1, 3)

    offsets = anchors.reshape(-1)
    q = attn.rope(blocks(attn.q_proj(x), heads, attn.q_norm), offset=offsets)
    k = attn.rope(blocks(attn.k_proj(x), kv, attn.k_norm), offset=offsets)
    v = blocks(attn.v_proj(x), kv)
    if heads != kv:
        rep = heads // kv
        keys, values, k, v = (mx.repeat(t, rep, axis=1) for t in (keys, values, k, v))
    q = q * attn.scale
    # (B, h, N·S, W): each block sees the context strictly before its anchor
    q_rows = q.reshape(b, n, heads, s, dim).transpose(0, 2, 1, 3, 4).reshape(b, heads, n * s, dim)
    seen = mx.arange(width)[None, None, :] < anchors[:, :, None]  # (B, N, W)
    seen = mx.repeat(seen, s, axis=1)[:, None]  # (B, 1, N·S, W)
    outer = mx.where(seen, q_rows @ keys.swapaxes(-1, -2), -mx.inf)
    inner = q @ k.swapaxes(-1, -2)  # (B·N, h, S, S): within the block, both ways
    if attn.causal:
        inner = inner + mx.triu(mx.full((s, s), -mx.inf), k=1)
    inner = inner.reshape(b, n, heads, s, s).transpose(0, 2, 1, 3, 4).reshape(b, heads, n * s, s)
    weights = mx.softmax(mx.concatenate([outer, inner], axis=-1), axis=-1, precise=True)
    out = weights[..., :width] @ values  # (B, h, N·S, dim)
    within = weights[..., width:].reshape(b, heads, n, s, s) @ v.reshape(b, n, heads, s, dim).transpose(0, 2, 1, 3, 4)
    out = out + within.reshape(b, heads, n * s, dim)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n * s, heads * dim))


def block_logits(draft: DFlashDraft, features: mx.array, blocks: mx.array, anchors: mx.array) -> mx.array:
    """The drafter's logits for every block's mask positions: features (B, W, F) the
    target's at window positions 0 .. W - 1, blocks (B, N, S) ids (an anchor's id, then
    mask ids), anchors (B, N) their first positions -> (B, N, S - 1, the ids it scores)."""
    b, n, s = blocks.shape
    config = draft.config
    context = draft.hidden_norm(draft.fc(features))
    h = draft._embed(blocks.reshape(b, n * s)) * config.input_embedding_scale
    for layer in draft.layers:
        h = h + _attend(layer.self_attn, layer.input_layernorm(h), context, anchors)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = h.reshape(b, n, s, -1)[:, :, 1:]
    logits = draft.scores(draft.norm(h)) * config.output_multiplier
    cap = config.final_logit_softcapping
    return logits if cap is None else mx.tanh(logits / cap) * cap


# ---------------------------------------------------------------- batches and the loss


def anchors_of(example: Example, labels: Labels, *, block_size: int, rng: np.random.Generator) -> np.ndarray:
    """Window-relative anchors (window() cuts an answer's prompt): positions a >= 1 whose
    next id is trained on (labels.mask at a), about one per block_size - 1 of them, sorted."""
    start, end = window(example)
    trained = np.flatnonzero(labels.mask[start : end - 1])
    valid = trained[trained >= 1]
    if not len(valid):
        return valid
    count = math.ceil(len(valid) / (block_size - 1))
    return np.sort(rng.choice(valid, size=count, replace=False))


@dataclass
class DFlashObjective(Objective):
    """The recipe above, for a drafter of `block_size` over the target's whole vocabulary,
    or over a draft vocabulary (`draft_index`: each target id's row, -1 outside it; the
    labels renormalised over the ids inside, as the EAGLE-3 head's)."""

    block_size: int
    mask_id: int
    vocab_size: int
    draft_index: np.ndarray | None = None

    @property
    def decay(self) -> float:
        return DECAY.get(self.block_size, self.block_size / 2)

    @property
    def scored(self) -> int:
        """Ids the drafter scores at each position."""
        return self.vocab_size if self.draft_index is None else int((self.draft_index >= 0).sum())

    @property
    def group(self) -> int:
        """Examples read at once outside training: about half a GB of float32 logits at
        most (every scored id at each position: Gemma 3's whole 262,144, one example)."""
        return max(1, min(8, 2**27 // (self.scored * MAX_WINDOW)))

    @cached_property
    def _index(self) -> np.ndarray:
        return np.arange(self.vocab_size) if self.draft_index is None else self.draft_index

    @cached_property
    def _to_target(self) -> np.ndarray | None:
        """The target id of each of the drafter's ids; None where they are the target's."""
        return None if self.draft_index is None else np.flatnonzero(self.draft_index >= 0)

    def labels(self, example: Example) -> Labels:
        return label(example, self._index)

    def batch(self, examples: list[Example], labels: list[Labels], *, key: tuple[int, ...]) -> dict:
        rng = np.random.default_rng(list(key))
        chosen = [anchors_of(e, lab, block_size=self.block_size, rng=rng) for e, lab in zip(examples, labels)]
        return self._batch(examples, labels, chosen)

    def _batch(self, examples: list[Example], labels: list[Labels], chosen: list[np.ndarray]) -> dict:
        s, k = self.block_size, examples[0].top_ids.shape[1]
        spans = [window(e) for e in examples]
        width = max(b - a for a, b in spans)
        n = max(1, max(len(c) for c in chosen))
        rows = len(examples)
        features = np.zeros((rows, width, examples[0].features.shape[1]), np.float32)
        blocks = np.full((rows, n, s), self.mask_id, np.int32)
        anchors = np.ones((rows, n), np.int32)  # a padded block: anchor 1, nothing to learn
        label_ids = np.zeros((rows, n, s - 1, k), np.int32)
        label_probs = np.zeros((rows, n, s - 1, k), np.float32)
        weights = np.zeros((rows, n, s - 1), np.float32)
        argmax = np.full((rows, n, s - 1), -1, np.int64)  # the target's, where trained; else -1
        follows = np.zeros((rows, n, s - 1), bool)  # the data's id there is the target's argmax
        raw = np.zeros((rows, n, k), np.float32)  # the target's top probabilities at block position 1
        decay = np.exp(-np.arange(s - 1) / self.decay)
        for r, (e, lab, (a, b), picks) in enumerate(zip(examples, labels, spans, chosen)):
            features[r, : b - a] = e.features[a:b]
            for j, anchor in enumerate(picks):
                at = a + anchor  # the anchor's position in the example
                blocks[r, j, 0], anchors[r, j] = e.ids[at], anchor
                got = np.arange(at, min(at + s - 1, b - 1))  # rows whose distribution a block position learns
                m = len(got)
                trained = lab.mask[got]
                label_ids[r, j, :m], label_probs[r, j, :m] = lab.ids[got], lab.probs[got]
                weights[r, j, :m] = trained * decay[:m]
                argmax[r, j, :m] = np.where(trained, e.top_ids[got, 0], -1)
                follows[r, j, :m] = e.ids[got + 1] == e.top_ids[got, 0]
                # over the ids the drafter scores: label_ids there are its own, others none
                raw[r, j] = np.where(lab.inside[at], e.top_probs[at].astype(np.float32), 0.0)
        return {
            "features": mx.array(features),
            "blocks": mx.array(blocks),
            "anchors": mx.array(anchors),
            "label_ids": mx.array(label_ids),
            "label_probs": mx.array(label_probs),
            "weights": mx.array(weights),
            "trained": int((weights > 0).sum()),
            "argmax": argmax,
            "follows": follows,
            "raw_probs": raw,
        }

    def loss(self, model, batch: dict, fraction: float) -> mx.array:
        logits = block_logits(model, batch["features"], batch["blocks"], batch["anchors"])
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        ce = -(batch["label_probs"] * mx.take_along_axis(logp, batch["label_ids"], axis=-1)).sum(-1)
        weights = batch["weights"]
        return (ce * weights).sum() / mx.maximum(weights.sum(), 1e-6)

    def positions(self, batch: dict, fraction: float) -> int:
        return batch["trained"]

    def evaluate(self, model, examples: list[Example], labels: list[Labels]) -> dict:
        """Greedy agreement per block position, conditional as a greedy chain verifies it
        (position k counted where positions before it agreed and the data went on as the
        target's argmax), and at position 1 sum(min(p, q)) at temperature 1 over the
        target's top ids; on anchors drawn the same at every evaluation."""
        depth = self.block_size - 1
        reached, agreed = np.zeros(depth), np.zeros(depth)
        overlap, overlap_n = 0.0, 0
        rng = np.random.default_rng(EVAL_SEED)
        for start in range(0, len(examples), self.group):
            group = examples[start : start + self.group]
            group_labels = labels[start : start + self.group]
            chosen = [anchors_of(e, lab, block_size=self.block_size, rng=rng) for e, lab in zip(group, group_labels)]
            if not any(len(c) for c in chosen):
                continue
            batch = self._batch(group, group_labels, chosen)
            logits = block_logits(model, batch["features"], batch["blocks"], batch["anchors"])
            drafted = mx.argmax(logits, axis=-1)
            first = mx.softmax(logits[:, :, 0].astype(mx.float32), axis=-1)
            q_at = mx.take_along_axis(first, batch["label_ids"][:, :, 0], axis=-1)
            mx.eval(drafted, q_at)
            drafted, want = np.array(drafted), batch["argmax"]
            if self._to_target is not None:  # the drafter's ids as the target's
                drafted = self._to_target[drafted]
            alive = np.ones(want.shape[:2], bool)
            for d in range(depth):
                alive = alive & (want[..., d] >= 0)
                hit = drafted[..., d] == want[..., d]
                reached[d] += alive.sum()
                agreed[d] += (alive & hit).sum()
                alive = alive & hit & batch["follows"][..., d]
            valid = want[..., 0] >= 0
            overlap += float(np.minimum(batch["raw_probs"], np.array(q_at)).sum(-1)[valid].sum())
            overlap_n += int(valid.sum())
        alpha = [float(a / r) if r else 0.0 for a, r in zip(agreed, reached)]
        return {"alpha": alpha, "expected_acceptance": overlap / max(overlap_n, 1), "positions": int(reached[0])}

    def calibrate(self, model, examples: list[Example]) -> float:
        chosen = examples[: self.group]
        batch = self.batch(chosen, [self.labels(e) for e in chosen], key=(EVAL_SEED,))
        return rescale_output(model.norm, block_logits(model, batch["features"], batch["blocks"], batch["anchors"]))
