"""Write GGUF files from tiny mlx-lm models, the way llama.cpp's converter does, so the
importer can be checked against a model whose every weight is known.

Independent of the importer: tensor names come from gguf-py's own name map (llama.cpp's),
the q/k row permutation is llama.cpp's for llama-family rope, Gemma's norms are written as
1 + w, and the vocabulary is written as a byte-level BPE ("gpt2") token list with merges.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "gemma3_text": "GEMMA3"}


def permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of q/k rows for its rope (convert_hf_to_gguf.py)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def write_gguf(
    model_dir: Path,
    out: Path,
    *,
    types: dict[str, str] | None = None,
    architecture: str | None = None,
    file_type: str | None = None,
) -> Path:
    """`types`: GGML type per kind of tensor ("matrix", "embedding"), F32 by default; norms
    and biases stay F32 as llama.cpp keeps them. `architecture` overrides the name written;
    `file_type` (a gguf.LlamaFileType name, e.g. MOSTLY_Q4_0) is declared as llama.cpp does."""
    import gguf
    import mlx.core as mx

    model_dir, types = Path(model_dir), types or {}
    from mlx_lm.utils import _get_classes

    config = json.loads((model_dir / "config.json").read_text())
    args = _get_classes(config)[1].from_dict(config)  # the model's settings, defaults included
    model_type = config["model_type"]
    arch_name = architecture or ("gemma3" if model_type == "gemma3_text" else model_type)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, ARCHS[model_type]), args.num_hidden_layers)
    writer = gguf.GGUFWriter(out, arch_name)
    heads = args.num_attention_heads
    kv_heads = args.num_key_value_heads or heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // heads
    writer.add_block_count(args.num_hidden_layers)
    if file_type:
        writer.add_file_type(int(gguf.LlamaFileType[file_type]))
    writer.add_context_length(args.max_position_embeddings or 1024)
    writer.add_embedding_length(args.hidden_size)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(args.rms_norm_eps)
    writer.add_rope_freq_base(args.rope_theta)
    if model_type == "gemma3_text":
        writer.add_sliding_window(args.sliding_window)
        writer.add_sliding_window_pattern(args.sliding_window_pattern)
        writer.add_rope_freq_base_swa(args.rope_local_base_freq)
    _write_vocabulary(writer, model_dir, config)

    weights = mx.load(str(model_dir / "model.safetensors"))
    for hf_name, value in sorted(weights.items()):
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        array = np.array(value.astype(mx.float32))
        if model_type == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            array = permute(array, heads if "attn_q" in name else kv_heads)
        if model_type == "gemma3_text" and name.endswith("norm.weight"):
            array = array + 1.0
        kind = "embedding" if name.startswith("token_embd") else "matrix" if array.ndim == 2 else "vector"
        qtype = (
            getattr(gguf.GGMLQuantizationType, types.get(kind, "F32"))
            if kind != "vector"
            else gguf.GGMLQuantizationType.F32
        )
        data = gguf.quants.quantize(array, qtype) if qtype != gguf.GGMLQuantizationType.F32 else array
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_vocabulary(writer, model_dir: Path, config: dict) -> None:
    data = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = dict(data["model"]["vocab"])
    for added in data.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in data.get("added_tokens", []) if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    eos = config.get("eos_token_id")
    eos = eos if isinstance(eos, list) else [eos]
    writer.add_eos_token_id(eos[0])
    template = json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template")
    if template:
        writer.add_chat_template(template)
