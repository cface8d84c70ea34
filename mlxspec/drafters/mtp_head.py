"""A model's own multi-token-prediction (MTP) head, read from its checkpoint.

Qwen3.5 (dense and MoE) and Qwen3-Next checkpoints carry `mtp.*`: one full-attention decoder
layer of the body's own kind after a projection of the normed token embedding beside the
normed hidden state, then a norm; the body's embedding and output layer are shared. The
forward, as vLLM's `qwen3_next_mtp.py` / `qwen3_5_mtp.py` run it (Qwen's reference):

    e = pre_fc_norm_embedding(embed(token_{j+1}))
    h = pre_fc_norm_hidden(hidden_j)              the target's last hidden state at j, AFTER
                                                  its final norm (vLLM's and SGLang's target
                                                  model returns it normed: HIDDEN_AFTER_NORM)
    x = fc(concat(e, h))                          embedding first, 2·hidden -> hidden
    x = layers[0](x)                              full attention at position j (its own KV cache)
    out = norm(x);  logits = lm_head(out)         predicts token j+2; chained, `out` is the
                                                  next step's hidden (vLLM's proposer does so)

mlx-lm 0.32 drops `mtp.*` in `sanitize`, so the head is read here, from the shard(s) the
safetensors index names for it (nothing else is read), with the body's transforms: the hub
stores Qwen3.5/Next norms zero-centred, and mlx-lm adds 1 to the body's norms exactly when it
finds the body in the hub's layout (Qwen3.5: conv1d weights in the hub's shape; Qwen3-Next:
experts unstacked); MoE experts are stacked as mlx-lm stacks them (`switch_mlp`). A folder
`mlxspec models add-mtp` wrote keeps the head converted already, in `mtp.safetensors`.

DeepSeek-style nextn layers (`enorm`, `hnorm`, `eh_proj`, a decoder layer, `shared_head`, at
index num_hidden_layers: NextnHead) are served for glm4_moe_lite (GLM-4.7-Flash), the layer's
tensors put through the body's own `sanitize` (MLA's kv_b_proj split, experts stacked). The
other nextn families (DeepSeek-V3, GLM-4.5, MiMo) are refused naming the family.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import IncompatibleHead, UnsupportedModel

PREFIX = "mtp."
CONVERTED_FILE = "mtp.safetensors"  # a head stored beside a model, already converted
QUANTIZED_KEY = "mlxspec.quantized"  # its metadata: the quantization of each quantized module
# the head reads the target's last hidden state after its final norm, as vLLM's and SGLang's
# MTP drafters are given it (their target models return it normed); some MLX ports feed it
# before the norm. A real checkpoint's acceptance (on a Mac) is what would settle it.
HIDDEN_AFTER_NORM = True
# families whose checkpoints carry `mtp.*` (a full-attention layer of the body's own kind)
MTP_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
# families whose checkpoints carry a nextn layer at index num_hidden_layers (served)
NEXTN_FAMILIES = ("glm4_moe_lite",)
# nextn families not served yet: mlx-lm 0.32's deepseek_v3 drops only layer 61 (a smaller
# checkpoint with its nextn layer does not load), the others are untested here
NEXTN_REFUSED = ("deepseek_v3", "deepseek_v32", "glm4_moe", "mimo", "mimo_v2_flash")
# norms the hub stores zero-centred (mlx-lm's sanitize adds 1 to the body's)
_ZERO_CENTRED = (
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)
_EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_PER_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.")  # Qwen3-Next's layout: one tensor per expert


def family_of(config: dict) -> str:
    return str(config.get("model_type", ""))


def text_config(config: dict) -> dict:
    return config.get("text_config") or config


def check_family(config: dict, name: str) -> None:
    family = family_of(config)
    if family in MTP_FAMILIES + NEXTN_FAMILIES:
        return
    serves = ", ".join(MTP_FAMILIES + NEXTN_FAMILIES)
    if family in NEXTN_REFUSED:
        raise UnsupportedModel(
            f"{name} is {family}: its nextn MTP layers are not supported yet (--draft mtp serves {serves})"
        )
    what = family or "of no known family"
    raise UnsupportedModel(f"{name} is {what}: no MTP head to draft with (--draft mtp serves {serves})")


# -- the head
class MtpHead(nn.Module):
    """The head's own parameters; the target's embedding and output layer are shared, not
    owned (they are not in this module's parameters)."""

    def __init__(self, *, layer: nn.Module, hidden_size: int, eps: float):
        super().__init__()
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden_size, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden_size, eps=eps)
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.layers = [layer]
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        object.__setattr__(self, "_embed", None)
        object.__setattr__(self, "_output", None)
        object.__setattr__(self, "draft_to_target", None)  # the target's whole vocabulary

    def share(self, *, embed, output) -> None:
        """The target's embedding module and its logits function (hidden -> logits)."""
        object.__setattr__(self, "_embed", embed)
        object.__setattr__(self, "_output", output)

    def hidden(self, ids: mx.array, hidden: mx.array, cache, layout=None) -> mx.array:
        """ids (B, L) tokens j+1, hidden (B, L, H) states at j -> the head's normed output (B, L, H)."""
        from mlx_lm.models.base import create_attention_mask

        embedded = self.pre_fc_norm_embedding(self._embed(ids).astype(hidden.dtype))
        x = self.fc(mx.concatenate([embedded, self.pre_fc_norm_hidden(hidden)], axis=-1))
        mask = create_attention_mask(x, cache)
        with _reading_tree(self, layout):
            x = self.layers[0](x, mask=mask, cache=cache)
        return self.norm(x)

    def __call__(
        self, ids: mx.array, hidden: mx.array, cache, *, chained: bool = False, layout=None
    ) -> tuple[mx.array, mx.array]:
        """-> (logits (B, L, target vocab), output (B, L, H): what a chained step reads as its
        hidden state). `chained` changes nothing: the head reads its own output as it reads
        the target's (both normed). `layout`: the rows are nodes of a tree."""
        out = self.hidden(ids, hidden, cache, layout)
        return self._output(out), out

    def why_no_trees(self) -> str | None:
        return _why_no_trees(self)


def _why_no_trees(head) -> str | None:
    """None when the head's one layer's attention has the shape trees are read through."""
    from ..decoding.tree_attention import why_not_rope

    attention = getattr(head.layers[0], "self_attn", None)
    if attention is None or not hasattr(attention, "rope"):
        return f"this {type(head).__name__}'s layer has no attention of the shape trees are read through"
    return why_not_rope(attention.rope)


def _reading_tree(head, layout):
    """The head's one layer reads its rows as `layout` says (no layout: as a chain)."""
    from contextlib import nullcontext

    from ..decoding.tree_attention import install, reading

    if layout is None:
        return nullcontext()
    install(head, [head.layers[0].self_attn])
    return reading(head, layout)


class SharedHead(nn.Module):
    def __init__(self, hidden_size: int, eps: float, vocab_size: int | None):
        super().__init__()
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        if vocab_size:  # the checkpoint's own copy of the output layer
            self.head = nn.Linear(hidden_size, vocab_size, bias=False)


class NextnHead(nn.Module):
    """DeepSeek-V3-style nextn layer (GLM-4.5+, DeepSeek-V3, MiMo), as vLLM's
    `deepseek_mtp.py` runs it:

        e = enorm(embed(token_{j+1}))  (zero at position 0: "not needed by MTP")
        x = eh_proj(concat(e, hnorm(hidden_j)))     embedding first
        out = layer(x)                              pre-norm: what a chained step reads
        logits = shared_head.head(shared_head.norm(out))   (the target's lm_head without one)
    """

    def __init__(self, *, layer: nn.Module, hidden_size: int, eps: float, vocab_size: int | None):
        super().__init__()
        self.enorm = nn.RMSNorm(hidden_size, eps=eps)
        self.hnorm = nn.RMSNorm(hidden_size, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.layers = [layer]
        self.shared_head = SharedHead(hidden_size, eps, vocab_size)
        object.__setattr__(self, "_embed", None)
        object.__setattr__(self, "_output", None)
        object.__setattr__(self, "draft_to_target", None)

    def share(self, *, embed, output) -> None:
        object.__setattr__(self, "_embed", embed)
        object.__setattr__(self, "_output", self.shared_head.head if "head" in self.shared_head else output)

    def hidden(self, ids: mx.array, hidden: mx.array, cache, layout=None) -> mx.array:
        from mlx_lm.models.base import create_attention_mask

        embedded = self._embed(ids).astype(hidden.dtype)
        first = _at_position_zero(ids, cache, layout)
        if first is not None:
            embedded = mx.where(first[..., None], 0, embedded)
        x = self.eh_proj(mx.concatenate([self.enorm(embedded), self.hnorm(hidden)], axis=-1))
        mask = create_attention_mask(x, cache, return_array=True)  # MLA takes an array mask
        with _reading_tree(self, layout):
            return self.layers[0](x, mask=mask, cache=cache)

    def __call__(
        self, ids: mx.array, hidden: mx.array, cache, *, chained: bool = False, layout=None
    ) -> tuple[mx.array, mx.array]:
        """`layout`: the rows are nodes of a tree."""
        out = self.hidden(ids, hidden, cache, layout)
        return self._output(self.shared_head.norm(out)), out

    def why_no_trees(self) -> str | None:
        return _why_no_trees(self)


def _at_position_zero(ids: mx.array, cache, layout) -> mx.array | None:
    """Which rows of `ids` (B, L) sit at position 0 (None: none do). In a packed batch the
    cache's offset counts every lane's columns, so each row's position is the layout's."""
    positions = getattr(layout, "fresh_positions", None)  # a packed batch's (decoding/packed.py)
    if positions is not None:
        return positions().reshape(ids.shape) == 0
    if cache is None or cache.offset == 0:  # alone: the cache's first row sits at position 0
        return (mx.arange(ids.shape[1]) == 0)[None, :]
    return None


@dataclass(frozen=True)
class Body:
    """What the head shares with and takes from the target's mlx-lm model."""

    text_model: nn.Module  # the inner model: embed_tokens, layers, norm
    args: object  # its ModelArgs / TextModelArgs
    logits: object  # hidden (normed) -> logits, as the target computes them


def body_of(model) -> Body:
    outer = getattr(model, "language_model", model)  # Qwen3.5: a multimodal wrapper
    inner = outer.model
    if outer.args.tie_word_embeddings:
        logits = inner.embed_tokens.as_linear
    else:
        logits = outer.lm_head
    return Body(text_model=inner, args=outer.args, logits=logits)


def build_head(body: Body, *, nextn_vocab: int | None = None) -> MtpHead | NextnHead:
    """An MTP head of the body's own kind: its decoder-layer class at a full-attention index
    (`mtp.*`), or at index num_hidden_layers (nextn: MoE there as the body's later layers)."""
    args = body.args
    # the body's own class (a tapped layer's class is a subclass of it: capture.py)
    layer_class = next(c for c in type(body.text_model.layers[0]).__mro__ if not c.__name__.startswith("Tapped"))
    if args.model_type in NEXTN_FAMILIES:
        layer = layer_class(args, layer_idx=args.num_hidden_layers)
        return NextnHead(layer=layer, hidden_size=args.hidden_size, eps=args.rms_norm_eps, vocab_size=nextn_vocab)
    full_attention = int(getattr(args, "full_attention_interval", 1)) - 1
    layer = layer_class(args, layer_idx=full_attention)
    return MtpHead(layer=layer, hidden_size=args.hidden_size, eps=args.rms_norm_eps)


# -- reading the checkpoint
def safetensors_header(path: Path) -> dict:
    """name -> {"dtype", "shape", ...} from a safetensors file's header, without its data;
    one line when the file has no such header (cut short, not safetensors)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > Path(path).stat().st_size - 8:
                raise ValueError("a header longer than the file")
            header = json.loads(f.read(size))
        if not isinstance(header, dict) or not all(isinstance(v, dict) for k, v in header.items() if k[:2] != "__"):
            raise ValueError("a header that is not an object of tensors")
    except (OSError, ValueError, struct.error) as e:
        raise IncompatibleHead(f"{path}: not a readable safetensors file ({e})") from None
    header.pop("__metadata__", None)
    return header


def written_by_mlxspec(path: Path) -> bool:
    """Whether a CONVERTED_FILE is add-mtp's (its header's metadata says so), read without its
    data; a damaged header is no one's."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            metadata = json.loads(f.read(size)).get("__metadata__") or {}
    except (OSError, ValueError, struct.error, AttributeError):
        return False
    return QUANTIZED_KEY in metadata


INDEX = "model.safetensors.index.json"


def weight_map(index: Path) -> dict[str, str]:
    """A safetensors index's tensor -> file map, checked: an object of names, each file a
    plain name inside the index's folder (a path that climbs out of it, or starts from the
    root, is refused: a model's metadata never opens a file elsewhere)."""
    try:
        raw = json.loads(index.read_text())
    except (OSError, ValueError) as e:
        raise IncompatibleHead(f"{index}: not a readable safetensors index ({type(e).__name__})") from None
    mapping = raw.get("weight_map", {}) if isinstance(raw, dict) else None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise IncompatibleHead(f"{index}: its weight_map is not an object of tensor names and file names")
    for name, file in mapping.items():
        if not inside_folder(file):
            raise IncompatibleHead(f"{index} names {file!r} for {name!r}: a weight file must lie in the model's folder")
    return mapping


def inside_folder(name: str) -> bool:
    """A file name from a model's metadata that stays in its folder: relative, no `..`, no
    drive or backslash tricks, not empty."""
    path = Path(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name and "\0" not in name


def tensor_files(folder: Path) -> dict[str, Path]:
    """Every tensor name in a model folder -> the file holding it (the index when there is
    one, else the headers of its safetensors files)."""
    index = folder / INDEX
    if index.exists():
        return {name: folder / file for name, file in weight_map(index).items()}
    names = {}
    for file in sorted(folder.glob("model*.safetensors")):
        names.update({name: file for name in safetensors_header(file)})
    return names


def head_tensor_name(name: str, nextn: int | None = None) -> str | None:
    """`mtp.x` (or `model.mtp.x`, `language_model.mtp.x`), or with `nextn` the layer's
    `model.layers.{nextn}.x` -> `x`; None for the body's tensors."""
    if nextn is not None:
        prefix = f"model.layers.{nextn}."
        return name[len(prefix) :] if name.startswith(prefix) else None
    at = name.find(PREFIX)
    if at < 0 or (at and not name[:at].endswith(".")):
        return None
    return name[at + len(PREFIX) :]


def read_head_tensors(folder: Path, *, nextn: int | None = None) -> tuple[dict[str, mx.array], dict | None]:
    """(the head's tensors by their name inside the head, the quantization of a head stored
    converted already, by module path, or None for the hub's layout), reading only the
    file(s) that hold them. Empty when the folder has none. `nextn`: the index of the nextn
    layer (num_hidden_layers), for those families."""
    converted = folder / CONVERTED_FILE
    if converted.exists():
        tensors, metadata = _load(converted, return_metadata=True)
        if QUANTIZED_KEY not in metadata:  # another tool's sidecar (MTPLX writes one of this name)
            raise IncompatibleHead(
                f"{converted} was not written by `mlxspec models add-mtp` (its layout is unknown): move it "
                "away and run add-mtp"
            )
        return dict(tensors), quantized_record(metadata[QUANTIZED_KEY], converted)
    files = tensor_files(folder)
    wanted = {name: head_tensor_name(name, nextn) for name in files}
    wanted = {name: short for name, short in wanted.items() if short is not None}
    tensors = {}
    for file in sorted({files[name] for name in wanted}):
        if not file.exists():  # mlx-lm globs the files it finds: only the index remembers this one
            raise IncompatibleHead(
                f"{folder}'s index names {file.name} for the MTP head, and there is no such file "
                "(an interrupted download? fetch the model again)"
            )
        loaded = _load(file)
        tensors.update({wanted[name]: loaded[name] for name in loaded if name in wanted})
    return tensors, None


def quantized_record(text: str, path: Path) -> dict:
    """add-mtp's record of the head's quantization (module path -> false, or its
    group_size, bits and mode), checked before nn.quantize reads it."""
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not all(_quantization(v) for v in record.values()):
        raise IncompatibleHead(
            f"{path}: its {QUANTIZED_KEY} metadata is not add-mtp's record of the head's quantization: "
            "run `mlxspec models add-mtp` again"
        )
    return record


def _quantization(value) -> bool:
    if isinstance(value, bool):
        return True
    whole = [value.get(k) for k in ("group_size", "bits")] if isinstance(value, dict) else [None]
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in whole) and isinstance(
        value.get("mode", "affine"), str
    )


def _load(file: Path, **kwargs):
    """mx.load, with a damaged file said in one line."""
    try:
        return mx.load(str(file), **kwargs)
    except (RuntimeError, ValueError) as e:
        raise IncompatibleHead(f"cannot read the MTP head from {file}: {str(e).splitlines()[0]}") from None


def body_in_hub_layout(folder: Path, family: str) -> bool:
    """Whether mlx-lm found the body in the hub's layout (and so added 1 to its norms):
    read from tensor names and shapes in the headers, as its `sanitize` reads them."""
    files = tensor_files(folder)
    if family in NEXTN_FAMILIES:
        return False
    if family == "qwen3_next":
        return any(name.endswith(".mlp.experts.0.up_proj.weight") and head_tensor_name(name) is None for name in files)
    conv = [name for name in files if name.endswith("conv1d.weight") and head_tensor_name(name) is None]
    if not conv:
        return False
    if not files[conv[0]].exists():  # an original fetched for its head alone: the hub's layout
        return True
    shape = safetensors_header(files[conv[0]]).get(conv[0], {}).get("shape")
    if not isinstance(shape, list) or not shape:
        raise IncompatibleHead(f"{files[conv[0]]}: its header gives {conv[0]} no shape")
    return shape[-1] != 1


def convert(tensors: dict[str, mx.array], *, zero_centred: bool, num_experts: int) -> dict[str, mx.array]:
    """The hub's head tensors as the body's transforms leave the body's: norms +1 when the
    body's were, experts stacked into `switch_mlp` (mlx-lm's qwen3_next/qwen3_5_moe sanitize)."""
    out = dict(tensors)
    for name in list(out):
        if zero_centred and out[name].ndim == 1 and (name in _ZERO_CENTRED[:3] or name.endswith(_ZERO_CENTRED[3:])):
            out[name] = out[name] + 1.0
    for prefix in sorted({n.split(".experts.")[0] for n in out if _PER_EXPERT.search(n)}):
        for projection in _EXPERT_PROJECTIONS:
            parts = [out.pop(f"{prefix}.experts.{e}.{projection}.weight", None) for e in range(num_experts)]
            if any(p is None for p in parts):
                raise IncompatibleHead(f"the MTP head's experts are incomplete ({prefix}.experts.*.{projection})")
            out[f"{prefix}.switch_mlp.{projection}.weight"] = mx.stack(parts)
        # Qwen3.5-MoE's fused layout: experts.gate_up_proj (E, 2I, H), experts.down_proj
    for prefix in sorted({n[: -len(".experts.gate_up_proj")] for n in out if n.endswith(".experts.gate_up_proj")}):
        gate_up = out.pop(f"{prefix}.experts.gate_up_proj")
        middle = gate_up.shape[-2] // 2
        out[f"{prefix}.switch_mlp.gate_proj.weight"] = gate_up[..., :middle, :]
        out[f"{prefix}.switch_mlp.up_proj.weight"] = gate_up[..., middle:, :]
        out[f"{prefix}.switch_mlp.down_proj.weight"] = out.pop(f"{prefix}.experts.down_proj")
    return out


_NEXTN_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")


def convert_nextn(tensors: dict[str, mx.array], model) -> dict[str, mx.array]:
    """A nextn layer's hub tensors through the body's own `sanitize` (experts stacked, MLA's
    kv_b_proj split as mlx-lm splits it): the layer's tensors are shown to it under the
    index of the body's last layer, which it transforms as it would that layer's. Its own
    copy of the embedding is left out: the body's is shared (as vLLM loads it)."""
    last = model.args.num_hidden_layers - 1
    own = {k: v for k, v in tensors.items() if k.startswith(_NEXTN_OWN)}
    layer = {
        f"model.layers.{last}.{k}": v for k, v in tensors.items() if not k.startswith(_NEXTN_OWN + ("embed_tokens.",))
    }
    prefix = f"model.layers.{last}."
    sanitized = {"layers.0." + k[len(prefix) :]: v for k, v in model.sanitize(layer).items()}
    return own | sanitized


def nextn_index(config: dict) -> int | None:
    """Where a nextn family keeps its head: the layer index num_hidden_layers."""
    return int(text_config(config)["num_hidden_layers"]) if family_of(config) in NEXTN_FAMILIES else None


def load_head(folder: Path, model, config: dict, *, name: str, dtype=None) -> MtpHead | NextnHead:
    """The MTP head of the model at `folder` (its mlx-lm `model`, its `config`), sharing the
    body's embedding and output layer. Raises one line naming what is missing or wrong."""
    check_family(config, name)
    nextn = nextn_index(config)
    tensors, quantized = read_head_tensors(Path(folder), nextn=nextn)
    if not tensors:
        declared = int(text_config(config).get("mtp_num_hidden_layers", 0) or 0)
        declared = declared or int(text_config(config).get("num_nextn_predict_layers", 0) or 0)
        fix = (
            f"; the original checkpoint has it: mlxspec models add-mtp {name} --from ORIGINAL_REPO"
            if declared or "quantization" in config
            else ""
        )
        what = f"model.layers.{nextn}.*" if nextn is not None else "mtp.*"
        raise IncompatibleHead(f"{name} has no MTP head (no {what} tensors in its files){fix}")
    head = head_from(tensors, model=model, config=config, hub_folder=Path(folder), quantized=quantized, name=name)
    if dtype is not None:
        head.set_dtype(dtype)
    return head


def head_from(
    tensors: dict[str, mx.array], *, model, config: dict, hub_folder: Path, quantized: dict | None, name: str
) -> MtpHead | NextnHead:
    """The head from its tensors: in the hub's layout (`quantized` None: the body's transforms
    applied, `hub_folder` says whether the body's norms were zero-centred) or converted
    already (`quantized`: the quantization of each quantized module, by path)."""
    family = family_of(config)
    body = body_of(model)
    own_output = tensors.get("shared_head.head.weight")
    head = build_head(body, nextn_vocab=None if own_output is None else own_output.shape[0])
    if quantized is None and nextn_index(config) is not None:
        tensors = convert_nextn(tensors, model)
    elif quantized is None:
        zero_centred = body_in_hub_layout(hub_folder, family)
        tensors = convert(tensors, zero_centred=zero_centred, num_experts=int(getattr(body.args, "num_experts", 0)))
    if quantized:
        nn.quantize(head, class_predicate=lambda path, module: quantized.get(path, False))
    _check_kinds(head, tensors, name)
    try:
        head.load_weights(list(tensors.items()), strict=True)
    except ValueError as e:  # its message names the parameters on a second line
        raise IncompatibleHead(f"{name}'s MTP head does not fit its body: {' '.join(str(e).split())}") from None
    head.share(embed=body.text_model.embed_tokens, output=body.logits)
    mx.eval(head.parameters())
    return head


def _check_kinds(head: nn.Module, tensors: dict[str, mx.array], name: str) -> None:
    """load_weights checks names and shapes, not dtypes: integers where the head holds floats
    (or floats where it holds packed quantized weights) would load and draft nonsense."""
    from mlx.utils import tree_flatten

    expected = dict(tree_flatten(head.parameters()))
    for key, value in tensors.items():
        want = expected.get(key)
        if want is not None and mx.issubdtype(value.dtype, mx.floating) != mx.issubdtype(want.dtype, mx.floating):
            raise IncompatibleHead(
                f"{name}'s MTP head does not fit its body: {key} is {value.dtype} where {want.dtype} belongs"
            )


def quantize_head(head: nn.Module, *, model, group_size: int, bits: int, mode: str = "affine") -> dict:
    """Quantize the head as mlx-lm quantizes a body (its family's predicate: MoE gates at 8
    bits; layers whose input does not split into groups stay as they are). Returns what
    was quantized, by module path, as `save_converted` records it."""
    predicate = getattr(model, "quant_predicate", None)
    if predicate is None and hasattr(model, "language_model"):
        predicate = getattr(model.language_model, "quant_predicate", None)
    chosen = {}

    def choose(path, module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        params = predicate(path, module) if predicate is not None else True
        if params is False:
            return False
        params = {"group_size": group_size, "bits": bits, "mode": mode} | (params if isinstance(params, dict) else {})
        chosen[path] = params
        return params

    nn.quantize(head, class_predicate=choose)
    return chosen


def save_converted(head: nn.Module, folder: Path, *, quantized: dict, source: str) -> Path:
    """The head, converted, beside a model (CONVERTED_FILE): `--draft mtp` reads it there."""
    from mlx.utils import tree_flatten

    path = Path(folder) / CONVERTED_FILE
    metadata = {QUANTIZED_KEY: json.dumps(quantized), "source": source, "format": "mlx"}
    mx.save_safetensors(str(path), dict(tree_flatten(head.parameters())), metadata=metadata)
    return path
