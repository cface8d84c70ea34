"""A GGUF's vocabulary as a Hugging Face `tokenizers` tokenizer, id for id.

Two kinds of vocabulary are read:
- "gpt2": byte-level BPE (SmolLM, Qwen2/3, Llama 3): the tokens and merges are stored;
  only the pre-tokenizer (how text is split before BPE) is named by `tokenizer.ggml.pre`
  and has to be rebuilt from llama.cpp's definitions of those names.
- "llama": SentencePiece (Gemma, Llama 2, Mistral): tokens with scores. SentencePiece's
  BPE merges the adjacent pair whose union scores highest, which is BPE with merges ranked
  by the merged token's score, so the merges are rebuilt from the scores; unknown
  characters fall back to byte tokens. (A Unigram model round-trips too, but splits text
  into other ids than the model was trained on.)

Control tokens become special added tokens, user-defined ones (Gemma's runs of newlines,
its HTML tags) added tokens matched whole, as SentencePiece matches them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .architectures import Metadata, UnsupportedGGUF

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), by the name the GGUF gives.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BPE_PRE = {"default", "gpt-2", "smollm", "qwen2", "llama-bpe", "llama3"}

# Tokens that end a turn, besides the declared end-of-sequence id (an instruct model ends its reply with one).
END_MARKERS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>")


@dataclass
class TokenizerFiles:
    tokenizer_json: str
    config: dict  # tokenizer_config.json
    eos_ids: list[int]
    bos_id: int | None


def build(meta: Metadata, *, context_length: int | None = None) -> TokenizerFiles:
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise UnsupportedGGUF("the GGUF has no vocabulary (tokenizer.ggml.tokens)")
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(meta, tokens)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(meta, tokens, types)
    else:
        raise UnsupportedGGUF(
            f"GGUF tokenizer type {kind!r} is not supported (supported: gpt2 byte-level BPE, llama SentencePiece)"
        )

    from tokenizers import AddedToken

    added = [
        AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
        for i in range(len(tokens))
        if types[i] in (CONTROL, USER_DEFINED)
    ]
    tokenizer.add_tokens(added)

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and token("bos") is not None
    if add_bos:
        from tokenizers import processors

        bos = token("bos")
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "unk_token": token("unknown"),
        "pad_token": token("padding") or token("eos"),
        "add_bos_token": add_bos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length or 1 << 20,
    }
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return TokenizerFiles(tokenizer.to_str(), config, _eos_ids(meta, tokens, types), bos_id if add_bos else None)


def _eos_ids(meta: Metadata, tokens: list[str], types: list[int]) -> list[int]:
    """The declared end-of-sequence id, end-of-turn ids, and control tokens that end a
    turn or a document (an instruct model ends its reply with its end-of-turn token)."""
    ids = [meta.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    ids += [i for i, t in enumerate(tokens) if t in END_MARKERS and types[i] == CONTROL]
    return sorted({i for i in ids if isinstance(i, int) and 0 <= i < len(tokens)})


def _byte_level_bpe(meta: Metadata, tokens: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _BPE_PRE:
        raise UnsupportedGGUF(f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_BPE_PRE))})")
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    llama3 = pre in ("llama-bpe", "llama3")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=llama3))
    if pre in ("qwen2", "llama-bpe", "llama3"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT if llama3 else _QWEN2_SPLIT), behavior="isolated")
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    elif pre == "smollm":  # digits one by one, then GPT-2's split
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(meta: Metadata, tokens: list[str], types: list[int]):
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = list(meta.get("tokenizer.ggml.scores") or [])
    if len(scores) != len(tokens):
        raise UnsupportedGGUF("the GGUF's SentencePiece vocabulary has no scores to rebuild its merges from")
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t for t, kind in zip(tokens, types) if kind == NORMAL}
    merges = []
    for piece, i in vocab.items():
        if types[i] != NORMAL or len(piece) < 2:
            continue
        # SentencePiece merges normal pieces only (bytes are a fallback, never merged)
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))]
        merges += [(scores[i], vocab[a], vocab[b], a, b) for a, b in splits if a in mergeable and b in mergeable]
    # highest-scoring union first; ties by the pieces' ids, as SentencePiece's extractor does
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    unknown = meta.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[(a, b) for _, _, _, a, b in merges],
            unk_token=tokens[unknown] if isinstance(unknown, int) else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps = ([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")]
    tokenizer.normalizer = normalizers.Sequence(steps)
    pieces = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(pieces + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tokenizer
