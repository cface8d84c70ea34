"""Build small models in mlx-lm's on-disk format: a byte-level BPE tokenizer trained with
`tokenizers`, and random-weight models of real mlx-lm architectures.

The tests run the real engine on these (no mocks), the benchmarks use them for cost curves
and for a deliberately useless draft, and the bundled pair's recipe reuses the tokenizer code.
Everything written here loads back with `mlx_lm.load`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Tiny configurations of real mlx-lm architectures. Each covers a cache layout the engine
# must roll back: plain KV caches, rotating sliding-window caches that wrap (window 8),
# and array (recurrent state) caches.
_COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1024,
}
ARCHITECTURES: dict[str, dict] = {
    "llama": {**_COMMON, "model_type": "llama", "tie_word_embeddings": False},
    # heads 32 wide, the smallest group mx.quantize takes: for quantized KV caches
    "llama_kv32": {**_COMMON, "model_type": "llama", "head_dim": 32, "tie_word_embeddings": False},
    "qwen2": {**_COMMON, "model_type": "qwen2", "tie_word_embeddings": False},
    "qwen3": {**_COMMON, "model_type": "qwen3", "head_dim": 16, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "gemma2": {
        **_COMMON,
        "model_type": "gemma2",
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
    },
    "phi3": {**_COMMON, "model_type": "phi3"},
    "gemma3_text": {
        **_COMMON,
        "model_type": "gemma3_text",
        "num_hidden_layers": 3,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
    },
    "llama_sliding": {
        **_COMMON,
        "model_type": "llama",
        "tie_word_embeddings": False,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
    },
    "qwen3_next": {
        **_COMMON,
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 64,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "full_attention_interval": 2,
        "tie_word_embeddings": False,
    },
    "mamba": {
        "model_type": "mamba",
        "hidden_size": 64,
        "intermediate_size": 128,
        "state_size": 8,
        "num_hidden_layers": 2,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": 4,
        "tie_word_embeddings": False,
    },
    # CacheList layers: two KV caches (MLA and its indexer) ...
    "deepseek_v32": {
        "model_type": "deepseek_v32",
        "hidden_size": 64,
        "index_head_dim": 16,
        "index_n_heads": 2,
        "index_topk": 8,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "qk_nope_head_dim": 16,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 1024,
    },
    # ... a recurrent state with a sliding window or a KV cache ...
    "baichuan_m1": {
        "model_type": "baichuan_m1",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_swa_attention_heads": 4,
        "num_swa_key_value_heads": 2,
        "rope_theta": 10000.0,
        "sliding_window": 8,
        "sliding_window_layers": [0],
        "conv_window": 2,
        "rms_norm_eps": 1e-5,
    },
    # ... and a Mamba-2 state beside attention.
    "falcon_h1": {
        "model_type": "falcon_h1",
        "hidden_size": 64,
        "head_dim": 16,
        "intermediate_size": 128,
        "mamba_d_conv": 4,
        "mamba_d_head": 16,
        "mamba_d_ssm": 64,
        "mamba_d_state": 8,
        "mamba_n_heads": 4,
        "mamba_n_groups": 1,
        "mamba_chunk_size": 16,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    # Llama 4's chunked attention (ChunkedKVCache): a cache type mlxspec refuses.
    "llama4": {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "attention_bias": False,
            "attention_chunk_size": 8,
            "head_dim": 16,
            "hidden_size": 64,
            "interleave_moe_layer_step": 1,
            "intermediate_size": 64,
            "intermediate_size_mlp": 128,
            "max_position_embeddings": 1024,
            "num_attention_heads": 4,
            "num_experts_per_tok": 1,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "num_local_experts": 2,
            "rms_norm_eps": 1e-5,
            "rope_scaling": None,
            "rope_theta": 10000.0,
            "use_qk_norm": True,
        },
    },
}


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: Path,
    *,
    chat_template: str | None = CHATML_TEMPLATE,
    eos: str = ENDOFTEXT,
) -> None:
    """Train a byte-level BPE tokenizer and save it as mlx-lm (transformers) expects.

    The config names `PreTrainedTokenizerFast` so that any transformers version reads it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    if chat_template:
        config["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps({"eos_token": eos, "pad_token": ENDOFTEXT}, indent=2))


def tokenizer_size(tokenizer_dir: Path) -> int:
    data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) + 1


def copy_tokenizer(src: Path, dst: Path) -> None:
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(src) / name).exists():
            (dst / name).write_bytes((Path(src) / name).read_bytes())


def build_model(
    arch: str | dict,
    out_dir: Path,
    *,
    tokenizer_dir: Path,
    vocab_size: int | None = None,
    seed: int = 0,
    head_scale: float = 1.0,
    quantize_bits: int | None = None,
    eos_token_ids: list[int] | None = None,
    overrides: dict | None = None,
    like: Path | None = None,
    noise: float = 0.0,
):
    """Write a random-weight model of `arch` with the given tokenizer to `out_dir`.

    `head_scale` multiplies the output projection: random init gives near-uniform logits,
    and tests of the acceptance rule want sharp, distinct distributions. `like` starts from
    another saved model of the same architecture and adds Gaussian `noise` (relative to each
    weight's scale): a draft that agrees with its target often but not always, which is
    what exercises the rewinds. Returns the model.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    config = copy.deepcopy(ARCHITECTURES[arch] if isinstance(arch, str) else arch)
    config.update(overrides or {})
    config["vocab_size"] = vocab_size or tokenizer_size(tokenizer_dir)
    if isinstance(config.get("text_config"), dict):
        config["text_config"]["vocab_size"] = config["vocab_size"]
    if eos_token_ids is not None:
        config["eos_token_id"] = eos_token_ids
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if like is not None:
        _copy_with_noise(model, Path(like), noise, seed)
    elif head_scale != 1.0:
        _scale_output_head(model, head_scale)
    mx.eval(model.parameters())
    if quantize_bits:
        model, config = quantize_model(model, config, group_size=32, bits=quantize_bits)
    out_dir = Path(out_dir)
    save_model(out_dir, model)
    save_config(dict(config), out_dir / "config.json")
    copy_tokenizer(tokenizer_dir, out_dir)
    assert tree_flatten(model.parameters())
    return model


def _scale_output_head(model, scale: float) -> None:
    """Scale whichever matrix produces the logits (a separate head or tied embeddings)."""
    from mlx.utils import tree_flatten, tree_unflatten

    params = dict(tree_flatten(model.parameters()))
    heads = [k for k in params if k.endswith("lm_head.weight")]
    if not heads:
        heads = [k for k in params if k.endswith(("embed_tokens.weight", "embeddings.weight"))]
    if not heads:
        raise ValueError("no output head found to scale")
    model.update(tree_unflatten([(k, params[k] * scale) for k in heads]))


def _copy_with_noise(model, source: Path, noise: float, seed: int) -> None:
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    weights = mx.load(str(Path(source) / "model.safetensors"))
    keys = mx.random.split(mx.random.key(seed), len(weights))
    noisy = []
    for i, (name, w) in enumerate(sorted(weights.items())):
        if noise and mx.issubdtype(w.dtype, mx.floating) and w.ndim >= 2:
            scale = mx.sqrt(mx.mean(w.astype(mx.float32) ** 2))
            w = (w + noise * scale * mx.random.normal(w.shape, key=keys[i])).astype(w.dtype)
        noisy.append((name, w))
    model.update(tree_unflatten(noisy))
