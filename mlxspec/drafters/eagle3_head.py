"""An EAGLE-3 draft head (Li et al., arXiv 2503.01840) in the layout its trainers publish.

One decoder layer reads, at each position j, the embedding of token j+1 beside a fusion of
three of the target's hidden states at j (low, middle, high: `fc`, 3·hidden -> hidden), and
predicts token j+2 over a reduced vocabulary. Chained, it reads its own pre-norm output in
place of the fused features. The forward follows vLLM's `llama_eagle3.py` and SafeAILab's
EAGLE (`eagle/model/cnets.py`):

    residual = fc(features)                       (or its own last output, already hidden-wide)
    x = concat(input_layernorm(embed(token)), hidden_norm(residual))   -> 2·hidden
    residual = residual + self_attn(x)            q, k, v read 2·hidden
    out = residual + mlp(post_attention_layernorm(residual))           (pre-norm: fed back)
    logits = lm_head(norm(out))                   over draft_vocab_size ids; id i is target
                                                  id i + d2t[i]

Files: `config.json` with `architectures: ["LlamaForCausalLMEagle3"]` (EAGLE, SpecForge) or
`["Eagle3Speculator"]` (speculators, the layer config under `transformer_layer_config`),
weights `fc`, `midlayer.*` (or `layers.0.*`; either with a `model.` prefix), `norm`,
`lm_head`, `d2t`, `t2d`, and `embed_tokens` when the head does not share the target's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ModelLoadError

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3Speculator")
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...] | None  # None: EAGLE-3's default for the target's depth
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    attention_bias: bool = False
    norm_before_residual: bool = False  # speculators: the residual taken after hidden_norm
    extra: dict = field(default_factory=dict)  # what else the file said (kept when re-saved)

    @property
    def feature_width(self) -> int:
        return self.target_hidden_size * len(self.aux_layer_ids or (0, 0, 0))  # three by default

    @property
    def num_hidden_layers(self) -> int:
        return 1  # EAGLE-3's one decoder layer (read_config refuses any other count)


# fields only a draft head's config has: a folder with them and no head architecture named is
# a head that does not say what it is, not a model without a tokenizer
HEAD_FIELDS = ("draft_vocab_size", "eagle_config", "eagle_aux_hidden_state_layer_ids", "transformer_layer_config")


def unnamed_head(config: dict) -> str | None:
    """For a config with a head's fields but no head architecture: what to say; else None."""
    fields = [key for key in HEAD_FIELDS if key in config]
    if not fields:
        return None
    named = config.get("architectures")
    return (
        f"has a draft head's {fields[0]}, but its architectures ({named!r}) name neither "
        f"{' nor '.join(ARCHITECTURES)}: an EAGLE-3 head's config.json says which it is"
    )


def is_head_folder(path: Path) -> bool:
    return names_architecture(path, ARCHITECTURES)


def names_architecture(path: Path, architectures: tuple[str, ...]) -> bool:
    """Whether the folder's config.json lists one of `architectures` (what a kind's files say
    they are)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        named = json.loads(config.read_text()).get("architectures") or ()
        return isinstance(named, list) and any(a in architectures for a in named if isinstance(a, str))
    except (ValueError, OSError, AttributeError):  # not JSON, or not an object
        return False


def config_object(file: Path, what: str) -> dict:
    """A config.json's object, or ModelLoadError in one line: not readable, not JSON, or not
    an object."""
    try:
        raw = json.loads(file.read_text())
    except (ValueError, OSError) as e:
        raise ModelLoadError(f"{file}: not a readable {what} ({e})") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{file}: not {what} (a JSON object of settings)")
    return raw


# Bounds past every published model's, so that a config's numbers cannot ask for more than a
# machine holds (a head's widths are its target's: 16384 is Llama 3.1 405B's)
MAX_WIDTH = 1 << 16
MAX_VOCAB = 1 << 22
MAX_HEADS = 1024
MAX_POSITIONS = 1 << 24


def read_config(path: Path) -> HeadConfig:
    """A head's config.json, every field checked before a module is built from it: one line
    naming the field that is missing or out of range (a config asking to run code of its own
    is refused too: mlxspec never runs it)."""
    from ..folder_code import refuse_custom_code

    file = Path(path) / "config.json"
    raw = config_object(file, "an EAGLE-3 config")
    refuse_custom_code(Path(path))
    layer = raw.get("transformer_layer_config") or raw  # speculators nests the layer's config
    eagle = raw.get("eagle_config") or {}
    if not isinstance(layer, dict) or not isinstance(eagle, dict):
        raise ModelLoadError(f"{file}: transformer_layer_config and eagle_config must be objects")
    field = _Fields(file, raw, layer)
    layers = layer.get("num_hidden_layers", raw.get("num_hidden_layers", 1))
    if layers != 1:
        raise ModelLoadError(f"{file}: num_hidden_layers is {layers!r}: an EAGLE-3 head is one decoder layer")
    hidden, heads, kv_heads, vocab = field.attention()
    config = HeadConfig(
        hidden_size=hidden,
        intermediate_size=field.size("intermediate_size", most=8 * MAX_WIDTH),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=field.size("head_dim", most=MAX_WIDTH, default=hidden // heads),
        vocab_size=vocab,
        draft_vocab_size=field.size("draft_vocab_size", most=vocab, default=vocab),
        aux_layer_ids=_aux_layer_ids(file, eagle, raw),
        target_hidden_size=field.size("target_hidden_size", most=MAX_WIDTH, default=hidden),
        rms_norm_eps=field.positive("rms_norm_eps", 1e-5),
        rope_theta=field.positive("rope_theta", 10000.0),
        rope_scaling=layer.get("rope_scaling"),
        max_position_embeddings=field.size("max_position_embeddings", most=MAX_POSITIONS, default=8192),
        attention_bias=field.switch("attention_bias"),
        norm_before_residual=field.switch("norm_before_residual", top=True),
        extra={k: v for k, v in raw.items() if k in ("mlxspec", "torch_dtype")},
    )
    _check_rope(file, config)
    return config


class _Fields:
    """A config's fields read as the head needs them: the layer's own first, then the top
    level's (speculators keeps the vocabularies there), one line for a wrong one."""

    def __init__(self, file: Path, raw: dict, layer: dict, *, what: str = "an EAGLE-3 config"):
        self.file, self.raw, self.layer, self.what = file, raw, layer, what

    def _get(self, key: str, *, top: bool = False):
        scopes = (self.raw,) if top else (self.layer, self.raw)
        return next((scope[key] for scope in scopes if scope.get(key) is not None), None)

    def given(self, key: str) -> bool:
        return self._get(key) is not None

    def size(self, key: str, *, most: int, default: int | None = None) -> int:
        value = self._get(key)
        value = default if value is None else value
        if value is None:
            raise ModelLoadError(f"{self.file}: {self.what} needs {key}")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ModelLoadError(f"{self.file}: {key} is {value!r}, not a whole number from 1 to {most}")
        return value

    def positive(self, key: str, default: float) -> float:
        value = self._get(key)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ModelLoadError(f"{self.file}: {key} is {value!r}, not a positive number")
        return float(value)

    def attention(self) -> tuple[int, int, int, int]:
        """(hidden_size, num_attention_heads, num_key_value_heads, vocab_size), each in range,
        the key-value heads dividing the heads."""
        hidden = self.size("hidden_size", most=MAX_WIDTH)
        heads = self.size("num_attention_heads", most=min(MAX_HEADS, hidden))
        kv_heads = self.size("num_key_value_heads", most=heads, default=heads)
        if heads % kv_heads:
            raise ModelLoadError(
                f"{self.file}: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}"
            )
        return hidden, heads, kv_heads, self.size("vocab_size", most=MAX_VOCAB)

    def switch(self, key: str, *, top: bool = False) -> bool:
        value = self._get(key, top=top)
        if value is not None and not isinstance(value, bool):
            raise ModelLoadError(f"{self.file}: {key} is {value!r}, not true or false")
        return bool(value)


def _aux_layer_ids(file: Path, eagle: dict, raw: dict) -> tuple[int, ...] | None:
    """The target layers the head reads (None: EAGLE-3's default for the target's depth)."""
    key = "eagle_aux_hidden_state_layer_ids"
    ids = eagle.get(key, raw.get(key))
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelLoadError(f"{file}: {key} is {ids!r}, not a list of layer numbers")
    if any(i < 0 for i in ids):
        raise ModelLoadError(f"{file}: {key} {ids} holds a negative layer number")
    return tuple(ids)


def _check_rope(file: Path, config: HeadConfig) -> None:
    """The rope mlx-lm builds from the config, built and run once here: a rope_scaling it
    cannot read (a factor that is no number) is one line naming it, not a failure mid-draft."""
    from mlx_lm.models.rope_utils import initialize_rope

    scaling = config.rope_scaling
    if scaling is not None and not isinstance(scaling, dict):
        raise ModelLoadError(f"{file}: rope_scaling is {scaling!r}, not an object")
    try:
        rope = initialize_rope(config.head_dim, config.rope_theta, False, scaling, config.max_position_embeddings)
        mx.eval(rope(mx.zeros((1, 1, 2, config.head_dim))))
    except Exception as e:  # mlx-lm raises ValueError, KeyError, TypeError... for what it cannot read
        raise ModelLoadError(
            f"{file}: rope_scaling {scaling} is not one mlx-lm can build ({type(e).__name__}: {_first_line(e)})"
        ) from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def layer_fields(config) -> dict:
    """The decoder layers' fields of a draft config (an EAGLE-3 head's, a DFlash drafter's),
    as transformers' Llama and Qwen3 configs name them."""
    return {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "attention_bias": config.attention_bias,
        "vocab_size": config.vocab_size,
    }


def config_dict(config: HeadConfig) -> dict:
    """The published layout (EAGLE / SpecForge), as vLLM and SGLang read it."""
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **layer_fields(config),
        "num_hidden_layers": 1,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "tie_word_embeddings": False,
    }
    if config.aux_layer_ids is not None:
        out["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
            "use_aux_hidden_state": True,
        }
    if config.norm_before_residual:
        out["norm_before_residual"] = True
    return out | config.extra


class Attention(nn.Module):
    def __init__(self, config: HeadConfig, *, width: int | None = None):
        """`width`: what q, k and v read (a head's: 2·hidden, its embedding beside its features)."""
        super().__init__()
        from mlx_lm.models.rope_utils import initialize_rope

        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        wide, bias = width or 2 * config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(wide, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(wide, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(wide, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)
        self.rope = initialize_rope(
            self.head_dim, config.rope_theta, False, config.rope_scaling, config.max_position_embeddings
        )
        self.scale = self.head_dim**-0.5

    def project(self, x: mx.array, offset: int, *, rope=None) -> tuple[mx.array, mx.array, mx.array]:
        """q (B, heads, L, d), k and v (B, kv_heads, L, d), rotated for positions offset..
        (or as `rope(t, offset)` places them)."""
        b, length, _ = x.shape
        rope = rope or self.rope

        def split(t, n):
            return t.reshape(b, length, n, self.head_dim).transpose(0, 2, 1, 3)

        q = rope(split(self.q_proj(x), self.heads), offset=offset)
        k = rope(split(self.k_proj(x), self.kv_heads), offset=offset)
        return q, k, split(self.v_proj(x), self.kv_heads)

    def __call__(self, x: mx.array, cache, layout=None) -> mx.array:
        """`layout` (tree_attention.TreeLayout): the rows are tree nodes, each at its depth's
        position, attending to the context and its ancestors only."""
        b, length, _ = x.shape
        if layout is None:
            q, k, v = self.project(x, cache.offset)
            mask = "causal" if length > 1 else None
        else:
            from ..decoding.tree_attention import rotate_at

            q, k, v = self.project(x, cache.offset, rope=lambda t, offset: rotate_at(self.rope, t, layout))
            mask = layout.mask_for(cache)
        k, v = cache.update_and_fetch(k, v)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


class MLP(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=eps)
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=eps)
        self.mlp = MLP(config)


class Eagle3Head(nn.Module):
    """The head. `embed` is the target's embedding module when the head has none of its own."""

    def __init__(self, config: HeadConfig, *, own_embedding: bool = False):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.feature_width, config.hidden_size, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        if own_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # draft id -> target id (the published d2t holds target - draft)
        object.__setattr__(self, "draft_to_target", mx.arange(config.draft_vocab_size, dtype=mx.uint32))
        object.__setattr__(self, "_shared_embedding", None)

    def share_embedding(self, embedding) -> None:
        object.__setattr__(self, "_shared_embedding", embedding)

    def why_no_trees(self) -> str | None:
        """None where its own attention (Attention above) reads a tree's layout: a rotary
        embedding that places each row at its own position (not "dynamic" NTK scaling)."""
        from ..decoding.tree_attention import why_not_rope

        return why_not_rope(self.midlayer.self_attn.rope)

    def embed(self, ids: mx.array) -> mx.array:
        table = self.embed_tokens if "embed_tokens" in self else self._shared_embedding
        return table(ids)

    def fuse(self, features: mx.array) -> mx.array:
        """The target's features (…, 3·hidden) to the layer's width."""
        return self.fc(features)

    def layer_input(self, ids: mx.array, hidden: mx.array) -> tuple[mx.array, mx.array]:
        """(attention input (…, 2·hidden), residual (…, hidden)) for tokens and fused hidden states."""
        layer = self.midlayer
        embedded = layer.input_layernorm(self.embed(ids).astype(hidden.dtype))
        if self.config.norm_before_residual:
            hidden = layer.hidden_norm(hidden)
            return mx.concatenate([embedded, hidden], axis=-1), hidden
        return mx.concatenate([embedded, layer.hidden_norm(hidden)], axis=-1), hidden

    def layer_output(self, residual: mx.array, attended: mx.array) -> mx.array:
        residual = residual + attended
        return residual + self.midlayer.mlp(self.midlayer.post_attention_layernorm(residual))

    def __call__(
        self, ids: mx.array, hidden: mx.array, cache, *, chained: bool = False, layout=None
    ) -> tuple[mx.array, mx.array]:
        """ids (B, L), hidden (B, L, 3·hidden): the target's features, or (B, L, hidden) the
        head's own last output when `chained` -> (logits (B, L, draft vocab), pre-norm
        output (B, L, hidden), what the next chained step reads). Told, not guessed from
        the width: a head three times its target's width would look the same. `layout`:
        the rows are nodes of a tree (tree_attention.TreeLayout)."""
        x, residual = self.layer_input(ids, hidden if chained else self.fuse(hidden))
        out = self.layer_output(residual, self.midlayer.self_attn(x, cache, layout))
        return self.lm_head(self.norm(out)), out


def load_head(path: Path, *, dtype=None) -> Eagle3Head:
    """A head from a folder in the published layout. Raises ModelLoadError in one line."""
    path = Path(path)
    config = read_config(path)
    weights = _published_to_module(read_weights(path, what="an EAGLE-3 head"), path=path)
    head = Eagle3Head(config, own_embedding="embed_tokens.weight" in weights)
    targets = read_draft_ids(weights, draft_vocab_size=config.draft_vocab_size, vocab_size=config.vocab_size, path=path)
    if targets is not None:
        object.__setattr__(head, "draft_to_target", targets)
    load_checked(head, weights, path=path, what="an EAGLE-3 head", dtype=dtype)
    return head


def read_draft_ids(weights: dict, *, draft_vocab_size: int, vocab_size: int, path: Path) -> mx.array | None:
    """The target id of each of a drafter's ids, from the published `d2t` (target id minus
    draft id; `t2d`, the same as a mask over the target's ids, is dropped): both taken out of
    `weights`. None where the file has no d2t. ModelLoadError in one line for a d2t of the
    wrong length or one that points past the target's vocabulary."""
    d2t = weights.pop("d2t", None)
    t2d = weights.pop("t2d", None)
    if d2t is None:
        return None
    if d2t.ndim != 1 or d2t.shape[0] != draft_vocab_size:
        raise ModelLoadError(f"{path}: d2t has shape {tuple(d2t.shape)}, draft_vocab_size is {draft_vocab_size}")
    if not mx.issubdtype(d2t.dtype, mx.integer):
        raise ModelLoadError(f"{path}: d2t is {d2t.dtype}, not whole numbers (offsets from draft to target ids)")
    targets = np.arange(draft_vocab_size, dtype=np.int64) + np.array(d2t.astype(mx.int64))
    if targets.min() < 0 or targets.max() >= vocab_size:
        raise ModelLoadError(f"{path}: d2t points past the target's {vocab_size} ids")
    if len(np.unique(targets)) != len(targets):
        raise ModelLoadError(f"{path}: d2t maps two draft ids to one target id")
    if t2d is not None:  # the same map as a mask over the target's ids: it must say the same
        present = np.zeros(vocab_size, dtype=np.bool_)
        present[targets] = True
        if t2d.shape != (vocab_size,) or not np.array_equal(np.array(t2d).astype(np.bool_), present):
            raise ModelLoadError(f"{path}: t2d does not mark the target ids d2t maps to")
    return mx.array(targets.astype(np.uint32))


def draft_id_weights(draft_to_target: mx.array, *, vocab_size: int) -> dict:
    """`d2t` and `t2d` as the published layout writes them, for a drafter over part of the
    target's ids."""
    targets = np.array(draft_to_target, dtype=np.int64)
    present = np.zeros(vocab_size, dtype=np.bool_)
    present[targets] = True
    return {"d2t": mx.array(targets - np.arange(len(targets), dtype=np.int64)), "t2d": mx.array(present)}


def read_weights(path: Path, *, what: str) -> dict:
    """Every tensor of the folder's *.safetensors files; ModelLoadError in one line for none,
    for a file that is not one, or for a tensor that two files hold (which one is meant?)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: {what} needs its weights (*.safetensors)")
    weights, source = {}, {}
    for file in files:
        try:
            tensors = mx.load(str(file))
        except Exception as e:  # a truncated or foreign file: one line, naming it
            raise ModelLoadError(f"{file}: not a readable safetensors file ({e})") from None
        for name in tensors:
            if name in source:
                raise ModelLoadError(f"{file}: {name} is in {source[name].name} too: one of the two is stale")
            source[name] = file
        weights.update(tensors)
    return weights


def renamed(weights: dict, rename, *, path: Path) -> dict:
    """`weights` under `rename(name)`; ModelLoadError in one line where two names become one
    (a file holding a tensor both with and without a prefix)."""
    out, was = {}, {}
    for name, value in weights.items():
        new = rename(name)
        if new in out:
            raise ModelLoadError(f"{path}: {was[new]} and {name} are both {new}: which one is meant?")
        out[new], was[new] = value, name
    return out


def load_checked(module: nn.Module, weights: dict, *, path: Path, what: str, dtype=None) -> None:
    """`weights` into `module`, each name and shape checked against what its config built
    first: one line naming a missing, unexpected or misshapen tensor."""
    expected = dict(_flat(module.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ModelLoadError(f"{path}: the weights of {what} lack {', '.join(missing[:4])}")
    for name, value in weights.items():
        want = expected.get(name)
        if want is None:
            raise ModelLoadError(f"{path}: unexpected tensor {name} in {what}")
        if tuple(value.shape) != tuple(want.shape):
            raise ModelLoadError(f"{path}: {name} has shape {tuple(value.shape)}, the config says {tuple(want.shape)}")
        # damage that shapes do not show: weights stored as whole numbers, or not finite
        if mx.issubdtype(want.dtype, mx.floating) and not mx.issubdtype(value.dtype, mx.floating):
            raise ModelLoadError(f"{path}: {name} holds {value.dtype} values, not floating-point weights")
        if mx.issubdtype(value.dtype, mx.floating) and not mx.all(mx.isfinite(value)).item():
            raise ModelLoadError(f"{path}: {name} holds values that are not finite (NaN or infinity): damaged")
    if dtype is not None:
        weights = {k: v.astype(dtype) for k, v in weights.items()}
    module.load_weights(list(weights.items()))
    mx.eval(module.parameters())


def save_head(head: Eagle3Head, path: Path, *, dtype=mx.bfloat16) -> None:
    """Write the published layout: config.json and model.safetensors with d2t and t2d."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = head.config
    weights = {name: value.astype(dtype) for name, value in _flat(head.parameters())}
    weights |= draft_id_weights(head.draft_to_target, vocab_size=config.vocab_size)
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config_dict(config), indent=2) + "\n")


def _published_to_module(weights: dict, *, path: Path) -> dict:
    """Published names to this module's: no `model.` prefix, `layers.0.` read as `midlayer.`."""

    def rename(name: str) -> str:
        name = name.removeprefix("model.")
        return "midlayer." + name[len("layers.0.") :] if name.startswith("layers.0.") else name

    return renamed(weights, rename, path=path)


def _flat(tree, prefix: str = ""):
    from mlx.utils import tree_flatten

    return tree_flatten(tree, prefix=prefix)


def config_from_target(
    target_config: dict,
    *,
    draft_vocab_size: int,
    aux_layer_ids: tuple[int, ...],
    intermediate_size: int | None = None,
    norm_before_residual: bool = False,
) -> HeadConfig:
    """A head shaped for a target (mlx-lm config dict): its width, heads and rope."""
    text = target_config.get("text_config") or target_config
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    return HeadConfig(
        hidden_size=hidden,
        intermediate_size=int(intermediate_size or text.get("intermediate_size") or 4 * hidden),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        vocab_size=int(text["vocab_size"]),
        draft_vocab_size=draft_vocab_size,
        aux_layer_ids=tuple(aux_layer_ids),
        target_hidden_size=hidden,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        rope_theta=float(text.get("rope_theta", 10000.0)),
        rope_scaling=text.get("rope_scaling"),
        max_position_embeddings=int(text.get("max_position_embeddings") or 8192),
        norm_before_residual=norm_before_residual,
    )


__all__ = ["ARCHITECTURES", "Eagle3Head", "HeadConfig", "config_from_target", "load_head", "save_head"]


def target_embedding(model):
    """The target's token embedding module (what a head without its own shares)."""
    inner = getattr(model, "language_model", model)
    return inner.model.embed_tokens


def check_fits(config: HeadConfig, *, target_config: dict, target_layers: int, name: str) -> tuple[int, ...]:
    """The aux layer ids the head reads from this target; IncompatibleHead naming the field
    that does not fit."""
    from ..errors import IncompatibleHead

    text = target_config.get("text_config") or target_config
    hidden = int(text["hidden_size"])
    vocab = int(text["vocab_size"])
    if config.target_hidden_size != hidden:
        raise IncompatibleHead(f"{name}: target_hidden_size is {config.target_hidden_size}, the target's is {hidden}")
    if config.vocab_size != vocab:
        raise IncompatibleHead(f"{name}: vocab_size is {config.vocab_size}, the target's is {vocab}")
    ids = config.aux_layer_ids or _default_ids(target_layers)
    if any(not 0 <= i < target_layers for i in ids):
        raise IncompatibleHead(
            f"{name}: eagle_aux_hidden_state_layer_ids {list(ids)} do not fit a target of {target_layers} layers"
        )
    if hidden * len(ids) != config.feature_width:
        raise IncompatibleHead(
            f"{name}: fc reads {config.feature_width} features, the target gives {hidden * len(ids)}"
        )
    return tuple(ids)


def _default_ids(layers: int) -> tuple[int, ...]:
    from ..decoding.capture import default_aux_layers

    return default_aux_layers(layers)
