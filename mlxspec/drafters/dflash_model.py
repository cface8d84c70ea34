"""A DFlash block drafter (arXiv 2602.06036) in the layout z-lab publishes.

A few Qwen3-style decoder layers fill a block of mask tokens after the target's newest id in
ONE forward. The block is the newest id followed by `block_size - 1` mask ids, embedded by
the target's own embedding; its keys and values sit after extra context keys and values made
from the target's hidden states at every position it has read (several of its layers,
concatenated, projected by `fc`, normed by `hidden_norm`). Within the block attention is
bidirectional (`is_causal` false, the published default); block position i > 0 predicts the
id at its own position. The target's LM head reads the normed output. The forward follows
z-lab/dflash `dflash/model_mlx.py` (DFlashAttention, DFlashDraftModel) and its torch twin
`dflash/model.py` (Qwen3DFlashAttention), as mlx-vlm's `speculative/dflash.py` loads them:

    context = hidden_norm(fc(concat(target hidden states)))       one row per position read
    per layer:  h = h + attn(input_layernorm(h), context)          context keys: k_norm(k_proj(context)),
                h = h + mlp(post_attention_layernorm(h))           no input_layernorm; q/k normed per head
    logits = target_lm_head(norm(h)) * output_multiplier          (softcapped when the config says)

A drafter may score over part of the target's ids instead (an mlxspec extension, written by
`train-draft --kind dflash`; z-lab's drafters have none): `draft_vocab_size` in the config,
its own `lm_head.weight` over those ids and the EAGLE-3 layout's `d2t` (target id minus
draft id) beside it. Gemma 3's LM head reads 262,144 ids, more weight than the rest of the
model: on this project's 2-core CPU (float32) a block forward over the whole vocabulary took
76-78 ms against a target step's 119-126 ms (c 0.60-0.65), and over 8,192 ids 5-6 ms
(c 0.04-0.05; demos/dflash_vocab_cost.py).

The context keys and values are cached (one row per position); the block's are not, so the
drafter's cache only ever holds rows for ids the target has read. `target_layer_ids` count
the layers' *outputs* (the reference hooks a layer's output; torch reads hidden_states[i+1]):
id i is the hidden state entering layer i + 1, the last layer's output entering the final
norm (capture.install_outputs).

Files: `config.json` naming `DFlashDraftModel` (Qwen3 fields, `block_size` at the top or in
`dflash_config`, `num_target_layers`, `dflash_config: {target_layer_ids, mask_token_id}`),
weights `fc`, `hidden_norm`, `layers.N.*`, `norm` (a `model.` prefix allowed; `lm_head` and
`d2t` with a draft vocabulary). The config's
`auto_map` (the published folders carry one for transformers) is ignored: mlxspec reads the
config and the weights itself and never imports the folder's code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import IncompatibleHead, ModelLoadError
from .eagle3_head import (
    MAX_POSITIONS,
    MAX_WIDTH,
    MLP,
    _check_rope,
    _Fields,
    config_object,
    draft_id_weights,
    layer_fields,
    load_checked,
    names_architecture,
    read_draft_ids,
    read_weights,
    renamed,
    target_embedding,
)
from .eagle3_head import Attention as HeadAttention

ARCHITECTURE = "DFlashDraftModel"
MAX_LAYERS = 64
MAX_BLOCK = 256


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    block_size: int  # the block's length: its first id and block_size - 1 mask ids
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    is_causal: bool = False  # within the block: the published drafters attend both ways
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    draft_vocab_size: int | None = None  # ids it scores, its own lm_head's; None: the target's whole vocabulary

    @property
    def feature_width(self) -> int:
        return self.hidden_size * len(self.target_layer_ids)


def is_dflash_folder(path: Path) -> bool:
    return names_architecture(path, (ARCHITECTURE,))


def read_config(path: Path) -> DFlashConfig:
    """A DFlash config.json, each field checked before a module is built from it: one line
    naming the field that is missing or out of range."""
    file = Path(path) / "config.json"
    raw = config_object(file, "a DFlash config")
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        raise ModelLoadError(f"{file}: a DFlash config needs dflash_config (target_layer_ids, mask_token_id)")
    field = _Fields(file, raw, raw | dflash, what="a DFlash config")  # dflash_config's first, as the reference reads
    layer_types = raw.get("layer_types") or ["full_attention"]
    if not isinstance(layer_types, list) or set(layer_types) != {"full_attention"}:
        raise ModelLoadError(
            f"{file}: layer_types {layer_types!r}: only full_attention drafter layers are supported "
            "(sliding_attention ones are not yet)"
        )
    hidden, heads, kv_heads, vocab = field.attention()
    mask = dflash.get("mask_token_id", raw.get("mask_token_id"))
    if mask is None:
        raise ModelLoadError(f"{file}: a DFlash config needs dflash_config.mask_token_id (the block's mask id)")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < vocab:
        raise ModelLoadError(f"{file}: mask_token_id is {mask!r}, not an id below vocab_size {vocab}")
    ids = dflash.get("target_layer_ids", raw.get("target_layer_ids"))
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelLoadError(f"{file}: target_layer_ids is {ids!r}, not a list of layer numbers")
    if any(i < 0 for i in ids):
        raise ModelLoadError(f"{file}: target_layer_ids {ids} holds a negative layer number")
    rope = raw.get("rope_scaling") or raw.get("rope_parameters")  # transformers 5 writes rope_parameters
    theta = rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0
    softcap = dflash.get("final_logit_softcapping", raw.get("final_logit_softcapping"))
    config = DFlashConfig(
        hidden_size=hidden,
        intermediate_size=field.size("intermediate_size", most=8 * MAX_WIDTH),
        num_hidden_layers=field.size("num_hidden_layers", most=MAX_LAYERS),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=field.size("head_dim", most=MAX_WIDTH, default=hidden // heads),
        vocab_size=vocab,
        block_size=_block_size(file, field),
        target_layer_ids=tuple(ids),
        mask_token_id=mask,
        num_target_layers=None if raw.get("num_target_layers") is None else field.size("num_target_layers", most=4096),
        rms_norm_eps=field.positive("rms_norm_eps", 1e-6),
        rope_theta=field.positive("rope_theta", theta),
        rope_scaling=rope,
        max_position_embeddings=field.size("max_position_embeddings", most=MAX_POSITIONS, default=32768),
        attention_bias=field.switch("attention_bias"),
        is_causal=field.switch("is_causal"),
        input_embedding_scale=field.positive("input_embedding_scale", 1.0),
        output_multiplier=field.positive("output_multiplier", 1.0),
        final_logit_softcapping=None if softcap is None else field.positive("final_logit_softcapping", 1.0),
        draft_vocab_size=field.size("draft_vocab_size", most=vocab) if field.given("draft_vocab_size") else None,
    )
    _check_rope(file, config)
    return config


def _block_size(file: Path, field: _Fields) -> int:
    size = field.size("block_size", most=MAX_BLOCK, default=16)
    if size < 2:
        raise ModelLoadError(f"{file}: block_size is {size}: a block holds the newest id and at least one mask")
    return size


def check_fits(config: DFlashConfig, *, target_config: dict, target_layers: int, name: str) -> None:
    """IncompatibleHead naming the field that does not fit the target (an mlx-lm config dict
    of `target_layers` decoder layers)."""
    text = target_config.get("text_config") or target_config
    hidden, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    if config.hidden_size != hidden:
        raise IncompatibleHead(f"{name}: hidden_size is {config.hidden_size}, the target's is {hidden}")
    if config.vocab_size != vocab:
        raise IncompatibleHead(f"{name}: vocab_size is {config.vocab_size}, the target's is {vocab}")
    if any(i >= target_layers for i in config.target_layer_ids):
        raise IncompatibleHead(
            f"{name}: target_layer_ids {list(config.target_layer_ids)} do not fit a target of {target_layers} layers"
        )
    if config.num_target_layers is not None and config.num_target_layers != target_layers:
        raise IncompatibleHead(
            f"{name}: num_target_layers is {config.num_target_layers}, the target has {target_layers} layers"
        )


class Attention(HeadAttention):
    """An EAGLE-3 head's attention over the layer's own width, with Qwen3's per-head q and k
    norms; its block after the cached context."""

    def __init__(self, config: DFlashConfig):
        super().__init__(config, width=config.hidden_size)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.causal = config.is_causal

    def _heads(self, t: mx.array, n: int, norm=None) -> mx.array:
        b, length, _ = t.shape
        t = t.reshape(b, length, n, self.head_dim)
        return (norm(t) if norm is not None else t).transpose(0, 2, 1, 3)

    def remember(self, context: mx.array, cache) -> None:
        """Cache the keys and values of new context rows (B, S, hidden), at positions
        cache.offset .. (no input norm: the reference projects the normed context as it is)."""
        keys = self.rope(self._heads(self.k_proj(context), self.kv_heads, self.k_norm), offset=cache.offset)
        cache.update_and_fetch(keys, self._heads(self.v_proj(context), self.kv_heads))

    def __call__(self, x: mx.array, cache) -> mx.array:
        """x (B, L, hidden): the block, right after the context `cache` holds; its own keys
        and values are not cached."""
        b, length, _ = x.shape
        start = cache.offset
        queries = self.rope(self._heads(self.q_proj(x), self.heads, self.q_norm), offset=start)
        keys = self.rope(self._heads(self.k_proj(x), self.kv_heads, self.k_norm), offset=start)
        values = self._heads(self.v_proj(x), self.kv_heads)
        if start:
            context_keys, context_values = cache.keys_and_values()
            keys = mx.concatenate([context_keys, keys], axis=2)
            values = mx.concatenate([context_values, values], axis=2)
        mask = None
        if self.causal and length > 1:
            from mlx_lm.models.base import create_causal_mask

            mask = create_causal_mask(length, offset=start)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))

    def packed(self, x: mx.array, context: mx.array, cache, layout) -> mx.array:
        """A packed batch's read (PackedBlock in dflash.py): x (rows, K, hidden) each lane's
        block, context (rows, width - K, hidden) the context rows it reads with it; both are
        written to `cache` as one read of `width` rows, each at the position `layout` gives
        it, and the block's rows attend as its mask says (its context, the new context rows,
        the block). The block's columns are left for the lane to forget."""
        from ..decoding.tree_attention import rotate_at, rotate_rows

        b, length, _ = x.shape
        both = mx.concatenate([x, context], axis=1)  # block rows first: where every read has them
        keys = rotate_at(self.rope, self._heads(self.k_proj(both), self.kv_heads, self.k_norm), layout)
        values = self._heads(self.v_proj(both), self.kv_heads)
        positions = layout.fresh_positions().reshape(b, -1)[:, :length].reshape(-1)  # the block's
        queries = rotate_rows(self.rope, self._heads(self.q_proj(x), self.heads, self.q_norm), positions)
        mask = layout.mask_for(cache)[..., :length, :]
        keys, values = cache.update_and_fetch(keys, values)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


class DecoderLayer(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, cache) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), cache)
        return h + self.mlp(self.post_attention_layernorm(h))

    def packed(self, x: mx.array, context: mx.array, cache, layout) -> mx.array:
        h = x + self.self_attn.packed(self.input_layernorm(x), context, cache, layout)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    """The drafter's layers; the embedding is the target's (`bind`), and so is the LM head
    unless it scores a draft vocabulary with its own."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.feature_width, config.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = [DecoderLayer(config) for _ in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        object.__setattr__(self, "_embed", None)
        object.__setattr__(self, "_lm_head", None)
        # draft id -> target id; None: its ids are the target's
        object.__setattr__(self, "draft_to_target", None)
        if config.draft_vocab_size is not None:
            self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
            object.__setattr__(self, "draft_to_target", mx.arange(config.draft_vocab_size, dtype=mx.uint32))

    def bind(self, target_model) -> DFlashDraft:
        """Read ids with the target's embedding table (unscaled, as the reference's raw
        embedding) and score with its LM head (its tied embedding where it has none), or
        with its own over a draft vocabulary."""
        embedding = target_embedding(target_model)
        inner = getattr(target_model, "language_model", target_model)
        head = getattr(inner, "lm_head", None)
        object.__setattr__(self, "_embed", embedding)
        object.__setattr__(self, "_lm_head", head if head is not None else embedding.as_linear)
        return self

    @property
    def scores(self):
        """The LM head the normed output is read by: its own, or the target's."""
        return self.lm_head if self.config.draft_vocab_size is not None else self._lm_head

    def make_cache(self) -> list:
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in self.layers]

    def why_not_packed(self) -> str | None:
        """None where a batch packs it (dflash.py: PackedBlock): a rotary embedding that places
        each row at its own position; else why each lane drafts alone."""
        from ..decoding.tree_attention import why_not_rope

        return why_not_rope(self.layers[0].self_attn.rope)

    def read_context(self, features: mx.array, cache: list) -> None:
        """The target's features (B, S, feature width) at the S positions after those
        `cache` holds, which it then holds too: one row per layer."""
        context = self.hidden_norm(self.fc(features))
        for layer, layer_cache in zip(self.layers, cache):
            layer.self_attn.remember(context, layer_cache)

    def __call__(self, block: mx.array, cache: list) -> mx.array:
        """block (B, L) ids, after the context `cache` holds -> logits (B, L, its vocab)."""
        h = self._embed(block) * self.config.input_embedding_scale
        for layer, layer_cache in zip(self.layers, cache):
            h = layer(h, layer_cache)
        return self._logits(h)

    def read_packed(self, ids: mx.array, features: mx.array, cache: list, layout) -> mx.array:
        """A packed batch's read: each row's block (its first block_size ids) and after it
        the context rows it reads (`features` there; zeros beside the block), in one forward
        over the batch's cache -> the block's logits (rows, block_size, its vocab). Every
        row's columns are kept; the lane forgets the block's (dflash.py)."""
        size = self.config.block_size
        h = self._embed(ids[:, :size]) * self.config.input_embedding_scale
        context = self.hidden_norm(self.fc(features[:, size:]))
        for layer, layer_cache in zip(self.layers, cache):
            h = layer.packed(h, context, layer_cache, layout)
        return self._logits(h)

    def _logits(self, h: mx.array) -> mx.array:
        logits = self.scores(self.norm(h)) * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return logits if cap is None else mx.tanh(logits / cap) * cap


def load_draft(path: Path, *, dtype=None) -> DFlashDraft:
    """A drafter from a folder in the published layout. Raises ModelLoadError in one line."""
    path = Path(path)
    config = read_config(path)
    weights = renamed(read_weights(path, what="a DFlash drafter"), lambda name: name.removeprefix("model."), path=path)
    weights.pop("embed_tokens.weight", None)  # the target's, where a file carries a copy
    draft = DFlashDraft(config)
    if config.draft_vocab_size is None:
        weights.pop("lm_head.weight", None)  # the target's too
        if "d2t" in weights:
            raise ModelLoadError(f"{path}: d2t without draft_vocab_size in the config: which ids does it score?")
    else:
        targets = read_draft_ids(
            weights, draft_vocab_size=config.draft_vocab_size, vocab_size=config.vocab_size, path=path
        )
        if targets is None:
            raise ModelLoadError(f"{path}: draft_vocab_size {config.draft_vocab_size} needs d2t (each id's target id)")
        object.__setattr__(draft, "draft_to_target", targets)
    load_checked(draft, weights, path=path, what="a DFlash drafter", dtype=dtype)
    return draft


def config_dict(config: DFlashConfig) -> dict:
    """The published layout (z-lab's config.json fields)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        **layer_fields(config),
        "num_hidden_layers": config.num_hidden_layers,
        "block_size": config.block_size,
        "num_target_layers": config.num_target_layers,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "tie_word_embeddings": False,
        "dflash_config": {
            "target_layer_ids": list(config.target_layer_ids),
            "mask_token_id": config.mask_token_id,
        },
    } | ({} if config.draft_vocab_size is None else {"draft_vocab_size": config.draft_vocab_size})


def save_draft(draft: DFlashDraft, path: Path, *, dtype=mx.float32) -> None:
    """Write the published layout: config.json and model.safetensors."""
    from mlx.utils import tree_flatten

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = {name: value.astype(dtype) for name, value in tree_flatten(draft.parameters())}
    if draft.config.draft_vocab_size is not None:
        weights |= draft_id_weights(draft.draft_to_target, vocab_size=draft.config.vocab_size)
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config_dict(draft.config), indent=2) + "\n")
