"""Tiny random-weight models with their MTP heads, saved as the hub publishes them: norms
zero-centred, conv1d weights in the hub's shape, MoE experts unstacked, a sharded
safetensors index with the head in its own shard. mlx-lm loads the body as it would a user's
folder (its `sanitize` drops the head); mlxspec reads the head. The head can be fitted for a
few seconds to the target's own continuations, so that its proposals are right sometimes
and wrong sometimes (both rollback paths run).

Also: a float64 NumPy forward of the published MTP architecture straight from the hub's
tensors (tests/models/test_mtp.py checks the head against it)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from mlxspec.models import synthetic

_LINEAR = {
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
}
QWEN3_5_TEXT = {
    "model_type": "qwen3_5_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mtp_num_hidden_layers": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    **_LINEAR,
}
CONFIGS = {
    "qwen3_5": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": QWEN3_5_TEXT,
    },
    "qwen3_5_moe": {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            **QWEN3_5_TEXT,
            "model_type": "qwen3_5_moe_text",
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "norm_topk_prob": True,
        },
    },
    # the hub's Qwen3-Next configs say norm_topk_prob (mlx-lm's default is False)
    "qwen3_next": {**synthetic.ARCHITECTURES["qwen3_next"], "num_nextn_predict_layers": 1, "norm_topk_prob": True},
}
CONFIGS["glm4_moe_lite"] = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "model_type": "glm4_moe_lite",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "routed_scaling_factor": 1.8,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}
NEXTN = ("glm4_moe_lite",)
HUB_BODY_SHARD = "model-00001-of-00002.safetensors"
HUB_HEAD_SHARD = "model-00002-of-00002.safetensors"
ZERO_CENTRED = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")


def write_hub_model(
    family: str,
    out_dir: Path,
    *,
    tokenizer_dir: Path,
    eos_token_ids: list[int],
    seed: int = 1,
    head_scale: float = 4.0,
    fit_steps: int = 0,
    fit_prompts: list[list[int]] = (),
    with_head: bool = True,
    vocab_size: int | None = None,
    overrides: dict | None = None,
) -> Path:
    """A `family` model with its MTP head in the hub's layout at `out_dir`; `overrides` change
    its (text) config."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    from mlxspec.drafters import mtp_head

    config = copy.deepcopy(CONFIGS[family])
    vocab = vocab_size or synthetic.tokenizer_size(tokenizer_dir)
    text = config.get("text_config", config)
    text.update(overrides or {})
    text["vocab_size"] = vocab
    config["eos_token_id"] = eos_token_ids
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(copy.deepcopy(config)))
    synthetic._scale_output_head(model, head_scale)
    body = mtp_head.body_of(model)
    nextn = family in NEXTN
    head = mtp_head.build_head(body, nextn_vocab=vocab if nextn else None)
    if nextn:  # random routing biases, as trained checkpoints have
        for module in (model.model.layers[-1].mlp, head.layers[0].mlp):
            module.gate.e_score_correction_bias = 0.1 * mx.random.normal(module.gate.e_score_correction_bias.shape)
    # norms away from 1, so that a forgotten +1 (or one too many) changes the output
    _jitter_norms(head)
    head.share(embed=body.text_model.embed_tokens, output=body.logits)
    if fit_steps:
        fit_head(model, head, fit_prompts, steps=fit_steps, seed=seed)
    mx.eval(model.parameters(), head.parameters())

    body_tensors = {_hub_body_name(family, k): v for k, v in tree_flatten(model.parameters())}
    if nextn:
        body_tensors = _nextn_to_hub(body_tensors, text)
        index = text["num_hidden_layers"]
        own = {
            f"model.layers.{index}.{k}": v for k, v in tree_flatten(head.parameters()) if not k.startswith("layers.0.")
        }
        layer = {
            f"model.layers.{index}.{k[len('layers.0.') :]}": v
            for k, v in tree_flatten(head.parameters())
            if k.startswith("layers.0.")
        }
        # DeepSeek-V3 ships a copy of the embedding in its nextn layer: the body's is shared
        own[f"model.layers.{index}.embed_tokens.weight"] = body_tensors["model.embed_tokens.weight"]
        head_tensors = own | _nextn_to_hub(layer, text)
    else:
        body_tensors = _to_hub(body_tensors, family)
        head_tensors = _to_hub({f"mtp.{k}": v for k, v in tree_flatten(head.parameters())}, family, head=True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / HUB_BODY_SHARD), body_tensors, metadata={"format": "pt"})
    weight_map = {k: HUB_BODY_SHARD for k in body_tensors}
    if with_head:
        mx.save_safetensors(str(out_dir / HUB_HEAD_SHARD), head_tensors, metadata={"format": "pt"})
        weight_map |= {k: HUB_HEAD_SHARD for k in head_tensors}
    index = {"metadata": {"total_size": 0}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    synthetic.copy_tokenizer(tokenizer_dir, out_dir)
    return out_dir


def _jitter_norms(module: nn.Module) -> None:
    from mlx.utils import tree_flatten, tree_unflatten

    norms = [(k, v) for k, v in tree_flatten(module.parameters()) if k.endswith("norm.weight")]
    module.update(tree_unflatten([(k, 1.0 + 0.3 * mx.random.normal(v.shape)) for k, v in norms]))


def _hub_body_name(family: str, name: str) -> str:
    if family.startswith("qwen3_5"):
        if name.startswith("language_model.model."):
            return "model.language_model." + name[len("language_model.model.") :]
        return name[len("language_model.") :]  # lm_head
    return name


def _to_hub(tensors: dict, family: str, *, head: bool = False) -> dict:
    """mlx-lm's layout back to the hub's: norms minus 1, conv1d (C, K, 1) -> (C, 1, K), experts
    unstacked."""
    out = {}
    for name, value in tensors.items():
        short = name[len("mtp.") :] if head else name
        if value.ndim == 1 and (
            short.endswith(ZERO_CENTRED)
            or short in ("norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")
            or name.endswith("model.norm.weight")
            or name == "model.language_model.norm.weight"
        ):
            value = value - 1.0
        if name.endswith("conv1d.weight"):
            value = value.moveaxis(2, 1)
        if ".switch_mlp." in name and family == "qwen3_5_moe":  # fused: gate_up_proj (E, 2I, H), down_proj
            prefix, rest = name.split(".switch_mlp.")
            projection = rest.split(".")[0]
            if projection == "down_proj":
                out[f"{prefix}.experts.down_proj"] = value
            elif projection == "gate_proj":
                up = tensors[name.replace("gate_proj", "up_proj")]
                out[f"{prefix}.experts.gate_up_proj"] = mx.concatenate([value, up], axis=-2)
            continue
        if ".switch_mlp." in name:
            prefix, rest = name.split(".switch_mlp.")
            projection = rest.split(".")[0]
            for e in range(value.shape[0]):
                out[f"{prefix}.experts.{e}.{projection}.weight"] = value[e]
            continue
        out[name] = value
    return out


def _nextn_to_hub(tensors: dict, config: dict) -> dict:
    """mlx-lm's DeepSeek/GLM layout back to the hub's: experts unstacked, MLA's embed_q and
    unembed_out joined back into kv_b_proj (heads, nope + v, kv_lora)."""
    out = {}
    nope = config["qk_nope_head_dim"]
    for name, value in tensors.items():
        if ".switch_mlp." in name:
            prefix, rest = name.split(".switch_mlp.")
            for e in range(value.shape[0]):
                out[f"{prefix}.experts.{e}.{rest}"] = value[e]
        elif name.endswith("self_attn.embed_q.weight"):
            value_part = tensors[name.replace("embed_q", "unembed_out")]  # (heads, v, kv_lora)
            joined = mx.concatenate([value.swapaxes(-1, -2), value_part], axis=1)  # (heads, nope + v, kv_lora)
            assert joined.shape[1] == nope + config["v_head_dim"]
            out[name.replace("embed_q.weight", "kv_b_proj.weight")] = joined.reshape(-1, joined.shape[-1])
        elif not name.endswith("self_attn.unembed_out.weight"):
            out[name] = value
    return out


# -- fitting the head to the target's continuations
def continuations(model, prompts: list[list[int]], *, length: int = 40, extra: int = 6, seed: int = 0):
    """The target's greedy continuations of `prompts` (and `extra` random ones), with its
    final normed hidden state along each from one teacher-forced pass."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxspec.decoding import capture
    from mlxspec.drafters.mtp_head import HIDDEN_AFTER_NORM

    taps = capture.install_final(model, after_norm=HIDDEN_AFTER_NORM)
    rng = np.random.default_rng(seed)
    vocab = model(mx.array([[0]])).shape[-1]
    size = len(prompts[0]) if prompts else 8
    prompts = list(prompts) + [[int(i) for i in rng.integers(3, vocab, size)] for _ in range(extra)]
    sequences, hidden = [], []
    for prompt in prompts:
        ids = list(prompt)
        cache = make_prompt_cache(model)
        logits = model(mx.array([ids]), cache=cache)
        for _ in range(length):
            ids.append(int(mx.argmax(logits[0, -1]).item()))
            logits = model(mx.array([[ids[-1]]]), cache=cache)
        model(mx.array([ids]))
        sequences.append(ids)
        hidden.append(taps.take()[0])
    taps.seen.clear()
    return sequences, hidden


def fit_head(model, head, prompts, *, steps: int, seed: int = 0, lr: float = 3e-3) -> None:
    """Teach the head the target's own next-but-one ids along its continuations: rows read
    token j+1 beside hidden j and predict token j+2."""
    sequences, hidden = continuations(model, [list(p) for p in prompts], seed=seed)
    ids = mx.array([s[1:-1] for s in sequences])  # tokens j+1
    targets = mx.array([s[2:] for s in sequences])  # tokens j+2
    states = mx.stack([h[:-2] for h in hidden])  # hidden j
    states = mx.stop_gradient(states)
    optimizer = optim.Adam(learning_rate=lr)

    def loss(module):
        logits, _ = module(ids, states, None)
        return nn.losses.cross_entropy(logits, targets).mean()

    step = nn.value_and_grad(head, loss)
    for _ in range(steps):
        value, grads = step(head)
        optimizer.update(head, grads)
        mx.eval(head.parameters(), optimizer.state)


# -- the published architecture in float64, from the hub's tensors
def hub_tensors(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(Path(folder).glob("model-*.safetensors")):
        out.update({k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in mx.load(str(file)).items()})
    return out


def _rms(x, w_zero_centred, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w_zero_centred)


def _rope(x, positions, dims, base):
    """Rotate-half rope on the first `dims` features (HF's `apply_rotary_pos_emb`, partial)."""
    half = dims // 2
    inv = base ** (-np.arange(half) * 2.0 / dims)
    angles = positions[:, None] * inv[None]  # (L, half)
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]  # broadcast over heads
    x1, x2, rest = x[..., :half], x[..., half:dims], x[..., dims:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], axis=-1)


def reference_logits(t: dict, config: dict, ids: list[int], hidden: np.ndarray, embed_name: str, head_name: str):
    """Qwen3-Next/3.5 MTP (vLLM's `Qwen3NextMultiTokenPredictor.forward`, HF's gated
    attention), float64, rows from position 0: ids (L,) tokens j+1, hidden (L, H) -> logits
    (L, vocab) and the normed output (L, H)."""
    c = config.get("text_config", config)
    eps, heads, kv_heads, hd = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    rope = c.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))
    base = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    m = lambda name: t["mtp." + name]  # noqa: E731
    e = _rms(t[embed_name][np.array(ids)], m("pre_fc_norm_embedding.weight"), eps)
    h = _rms(hidden, m("pre_fc_norm_hidden.weight"), eps)
    x = np.concatenate([e, h], axis=-1) @ m("fc.weight").T
    p = "layers.0."
    a = _rms(x, m(p + "input_layernorm.weight"), eps)
    length = len(ids)
    qg = (a @ m(p + "self_attn.q_proj.weight").T).reshape(length, heads, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(length, heads * hd)
    k = (a @ m(p + "self_attn.k_proj.weight").T).reshape(length, kv_heads, hd)
    v = (a @ m(p + "self_attn.v_proj.weight").T).reshape(length, kv_heads, hd)
    q = _rms(q, m(p + "self_attn.q_norm.weight"), eps)
    k = _rms(k, m(p + "self_attn.k_norm.weight"), eps)
    positions = np.arange(length, dtype=np.float64)
    q, k = _rope(q, positions, int(hd * factor), base), _rope(k, positions, int(hd * factor), base)
    group = heads // kv_heads
    outs = []
    for head in range(heads):
        scores = q[:, head] @ k[:, head // group].T / np.sqrt(hd)
        scores = np.where(np.tril(np.ones((length, length), dtype=bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        outs.append((weights / weights.sum(axis=-1, keepdims=True)) @ v[:, head // group])
    attended = np.stack(outs, axis=1).reshape(length, heads * hd) * (1 / (1 + np.exp(-gate)))
    x = x + attended @ m(p + "self_attn.o_proj.weight").T
    y = _rms(x, m(p + "post_attention_layernorm.weight"), eps)
    x = x + _mlp(t, "mtp." + p + "mlp.", y, c)
    out = _rms(x, m("norm.weight"), eps)
    return out @ t[head_name].T, out


def _silu(x):
    return x / (1 + np.exp(-x))


def _mlp(t: dict, prefix: str, y: np.ndarray, c: dict) -> np.ndarray:
    def dense(p, z):
        return (_silu(z @ t[p + "gate_proj.weight"].T) * (z @ t[p + "up_proj.weight"].T)) @ t[p + "down_proj.weight"].T

    if prefix + "gate.weight" not in t:
        return dense(prefix, y)
    if prefix + "experts.gate_up_proj" in t:  # Qwen3.5-MoE's fused experts, split per expert
        gate_up, down = t[prefix + "experts.gate_up_proj"], t[prefix + "experts.down_proj"]
        middle = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            t[f"{prefix}experts.{e}.gate_proj.weight"] = gate_up[e, :middle]
            t[f"{prefix}experts.{e}.up_proj.weight"] = gate_up[e, middle:]
            t[f"{prefix}experts.{e}.down_proj.weight"] = down[e]
    # sparse MoE (Qwen3-Next): softmax router, top-k (renormalised), a gated shared expert
    router = y @ t[prefix + "gate.weight"].T
    probs = np.exp(router - router.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    top = np.argsort(-probs, axis=-1)[:, : c["num_experts_per_tok"]]
    out = np.zeros_like(y)
    for row in range(y.shape[0]):
        chosen = probs[row, top[row]]
        if c["norm_topk_prob"]:
            chosen = chosen / chosen.sum()
        for weight, expert in zip(chosen, top[row]):
            out[row] += weight * dense(f"{prefix}experts.{expert}.", y[row : row + 1])[0]
    shared = dense(prefix + "shared_expert.", y)
    return out + shared / (1 + np.exp(-(y @ t[prefix + "shared_expert_gate.weight"].T)))


def _rms_plain(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_interleaved(x, positions, base):
    """Rope on adjacent pairs (x[2i], x[2i+1]): DeepSeek's MLA (vLLM: is_neox_style=False)."""
    dims = x.shape[-1]
    inv = base ** (-np.arange(dims // 2) * 2.0 / dims)
    angles = positions[:, None] * inv[None]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def reference_nextn_logits(t: dict, c: dict, ids: list[int], hidden: np.ndarray):
    """DeepSeek-V3-style nextn layer (vLLM's `DeepSeekMultiTokenPredictorLayer`) with MLA
    attention in its naive form (kv_b_proj expanded per head) and the noaux_tc sigmoid
    router, float64, rows from position 0 -> logits (L, vocab)."""
    eps, heads = c["rms_norm_eps"], c["num_attention_heads"]
    nope, rope_dims, v_dims, lora = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    p = f"model.layers.{c['num_hidden_layers']}."
    length = len(ids)
    e = t["model.embed_tokens.weight"][np.array(ids)].copy()
    e[0] = 0.0  # position 0
    x = np.concatenate([_rms_plain(e, t[p + "enorm.weight"], eps), _rms_plain(hidden, t[p + "hnorm.weight"], eps)], -1)
    x = x @ t[p + "eh_proj.weight"].T
    a = _rms_plain(x, t[p + "input_layernorm.weight"], eps)
    s = p + "self_attn."
    q = _rms_plain(a @ t[s + "q_a_proj.weight"].T, t[s + "q_a_layernorm.weight"], eps) @ t[s + "q_b_proj.weight"].T
    q = q.reshape(length, heads, nope + rope_dims)
    compressed = a @ t[s + "kv_a_proj_with_mqa.weight"].T
    latent, k_pe = compressed[:, :lora], compressed[:, lora:]
    kv = (_rms_plain(latent, t[s + "kv_a_layernorm.weight"], eps) @ t[s + "kv_b_proj.weight"].T).reshape(
        length, heads, nope + v_dims
    )
    positions = np.arange(length, dtype=np.float64)
    q_pe = _rope_interleaved(q[..., nope:], positions, c["rope_theta"])
    k_pe = _rope_interleaved(k_pe[:, None, :], positions, c["rope_theta"])[:, 0]
    outs = []
    for h in range(heads):
        scores = (q[:, h, :nope] @ kv[:, h, :nope].T + q_pe[:, h] @ k_pe.T) / np.sqrt(nope + rope_dims)
        scores = np.where(np.tril(np.ones((length, length), dtype=bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        outs.append((weights / weights.sum(axis=-1, keepdims=True)) @ kv[:, h, nope:])
    x = x + np.stack(outs, axis=1).reshape(length, heads * v_dims) @ t[s + "o_proj.weight"].T
    y = _rms_plain(x, t[p + "post_attention_layernorm.weight"], eps)
    m = p + "mlp."

    def dense(prefix, z):
        return (_silu(z @ t[prefix + "gate_proj.weight"].T) * (z @ t[prefix + "up_proj.weight"].T)) @ t[
            prefix + "down_proj.weight"
        ].T

    scores = 1 / (1 + np.exp(-(y @ t[m + "gate.weight"].T)))
    chosen = np.argsort(-(scores + t[m + "gate.e_score_correction_bias"]), axis=-1)[:, : c["num_experts_per_tok"]]
    routed = np.zeros_like(y)
    for row in range(length):
        weights = scores[row, chosen[row]]
        weights = weights / weights.sum() * c["routed_scaling_factor"]
        for weight, expert in zip(weights, chosen[row]):
            routed[row] += weight * dense(f"{m}experts.{expert}.", y[row : row + 1])[0]
    x = x + routed + dense(m + "shared_experts.", y)
    out = _rms_plain(x, t[p + "shared_head.norm.weight"], eps)
    head = t.get(p + "shared_head.head.weight", t["lm_head.weight"])
    return out @ head.T, x
