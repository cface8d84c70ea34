"""What each supported GGUF architecture becomes in mlx-lm: its config.json, the name of
each tensor, and the two ways llama.cpp's converter changed the weights.

- llama-family rope: llama.cpp permutes the rows of q and k so its interleaved rope can
  run on them; mlx-lm's llama uses the Hugging Face layout, so the permutation is undone
  (`unpermute_rows`). Qwen2/Qwen3 and Gemma 3 are stored unpermuted.
- Gemma's RMSNorm scales by 1 + w; llama.cpp stores 1 + w, mlx-lm (as Hugging Face) w.

Gemma 3's GGUF lacks three settings; llama.cpp's built-in values are used: every 6th
layer global (the rest a sliding window), a local rope base of 10000, and attention
scaled by the head size (by hidden size / heads for the 27B).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...errors import ModelLoadError

Metadata = dict


class UnsupportedGGUF(ModelLoadError):
    """A GGUF file of an architecture, tensor or quantization type mlxspec cannot import."""


# GGUF tensor names (after `blk.N.`) and their Hugging Face / mlx-lm names.
_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 has four norms per block: ffn_norm is the one before the feed-forward network.
_GEMMA3_BLOCK = {
    **_BLOCK,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class Architecture:
    name: str  # general.architecture in the GGUF
    config: Callable[[Metadata], dict]
    block_names: dict[str, str]
    rope_permuted: bool = False  # q/k rows permuted for llama.cpp's rope
    norm_offset: float = 0.0  # norms stored as norm_offset + w

    def tensor_name(self, gguf_name: str) -> str | None:
        """The mlx-lm name of a GGUF tensor; None for tensors mlx-lm computes itself."""
        stem, _, kind = gguf_name.rpartition(".")  # kind: weight or bias
        if stem == "rope_freqs":
            return None  # llama 3 rope factors: recomputed from config.json's rope_scaling
        if stem in _TOP:
            return f"{_TOP[stem]}.{kind}"
        parts = stem.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in self.block_names:
            return f"model.layers.{parts[1]}.{self.block_names[parts[2]]}.{kind}"
        raise UnsupportedGGUF(f"tensor {gguf_name} of a {self.name} GGUF has no place in mlx-lm's {self.name} model")

    def permutation_heads(self, gguf_name: str, meta: Metadata) -> int | None:
        """For q and k of a permuted family, the head count the rows were permuted with."""
        if not self.rope_permuted:
            return None
        if gguf_name.endswith("attn_q.weight"):
            return _get(meta, self.name, "attention.head_count")
        if gguf_name.endswith("attn_k.weight"):
            return _get(meta, self.name, "attention.head_count_kv", _get(meta, self.name, "attention.head_count"))
        return None

    def is_norm(self, gguf_name: str) -> bool:
        return gguf_name.endswith("norm.weight")


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation on an array whose first axis is the output rows
    (a float matrix, or the weight, scales or biases of a quantized one)."""
    n = rows.shape[0]
    return rows.reshape(heads, n // heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _get(meta: Metadata, arch: str, key: str, default=None):
    value = meta.get(f"{arch}.{key}", default)
    if value is None:
        raise UnsupportedGGUF(f"the GGUF has no {arch}.{key}, which a {arch} model needs")
    return value


def _common(meta: Metadata, arch: str, model_type: str) -> dict:
    heads = _get(meta, arch, "attention.head_count")
    hidden = _get(meta, arch, "embedding_length")
    config = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": _get(meta, arch, "block_count"),
        "intermediate_size": _get(meta, arch, "feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _get(meta, arch, "attention.head_count_kv", heads),
        "head_dim": _get(meta, arch, "attention.key_length", hidden // heads),
        "rms_norm_eps": float(_get(meta, arch, "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_get(meta, arch, "rope.freq_base", 10000.0)),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "max_position_embeddings": _get(meta, arch, "context_length", 4096),
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(_get(meta, arch, "rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise UnsupportedGGUF(f"rope scaling {scaling!r} in a {arch} GGUF is not supported")
    return config


def _llama(meta: Metadata) -> dict:
    return _common(meta, "llama", "llama")


def _qwen2(meta: Metadata) -> dict:
    return _common(meta, "qwen2", "qwen2")


def _qwen3(meta: Metadata) -> dict:
    return _common(meta, "qwen3", "qwen3")


def _gemma3(meta: Metadata) -> dict:
    config = _common(meta, "gemma3", "gemma3_text")
    layers = config["num_hidden_layers"]
    big = layers == 62  # the 27B scales attention by hidden size / heads
    config.update(
        rms_norm_eps=float(_get(meta, "gemma3", "attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_get(meta, "gemma3", "rope.freq_base", 1_000_000.0)),
        rope_local_base_freq=float(_get(meta, "gemma3", "rope.freq_base_swa", 10_000.0)),
        sliding_window=_get(meta, "gemma3", "attention.sliding_window", 512),
        sliding_window_pattern=_sliding_pattern(meta.get("gemma3.attention.sliding_window_pattern", 6), layers),
        query_pre_attn_scalar=config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"],
    )
    scaling = config.pop("rope_scaling", None)
    if scaling is not None:  # mlx-lm's gemma3_text reads the Hugging Face spelling
        config["rope_scaling"] = {"type": scaling["rope_type"], "factor": scaling["factor"]}
    return config


def _sliding_pattern(value, layers: int) -> int:
    """Every how many layers one is global: stored as that number, or (newer converters) as
    one flag per layer, true where the layer slides."""
    if isinstance(value, int):
        return value
    flags = [bool(v) for v in value]
    period = flags.index(False) + 1 if False in flags else layers + 1
    if flags != [(i + 1) % period != 0 for i in range(len(flags))]:
        raise UnsupportedGGUF(
            "the GGUF's sliding-window layers do not repeat with one period, as mlx-lm's gemma3 needs"
        )
    return period


ARCHITECTURES = {
    "llama": Architecture("llama", _llama, _BLOCK, rope_permuted=True),
    "qwen2": Architecture("qwen2", _qwen2, _BLOCK),
    "qwen3": Architecture("qwen3", _qwen3, _BLOCK),
    "gemma3": Architecture("gemma3", _gemma3, _GEMMA3_BLOCK, norm_offset=1.0),
}


def architecture(meta: Metadata) -> Architecture:
    name = meta.get("general.architecture")
    if name not in ARCHITECTURES:
        known = ", ".join(ARCHITECTURES)
        raise UnsupportedGGUF(f"GGUF architecture {name!r} is not supported (supported: {known})")
    return ARCHITECTURES[name]


# Llama 3.x stores its rope scaling only as precomputed factors (rope_freqs.weight); these
# are the published settings, recognised by the factors they produce.
_LLAMA3_SCALINGS = (
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)


def llama3_rope_factors(scaling: dict, head_dim: int, base: float) -> np.ndarray:
    """The per-frequency divisors llama.cpp stores for a llama3 rope scaling."""
    freqs = base ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelength = 2 * math.pi / freq
        if wavelength < old / high:
            factors.append(1.0)
        elif wavelength > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors)


def rope_scaling_from_factors(factors: np.ndarray, config: dict) -> dict:
    for scaling in _LLAMA3_SCALINGS:
        expected = llama3_rope_factors(scaling, config["head_dim"], config["rope_theta"])
        if expected.shape == factors.shape and np.allclose(expected, factors, rtol=1e-3):
            return dict(scaling)
    raise UnsupportedGGUF("the GGUF's rope_freqs do not match a known llama 3 rope scaling")
