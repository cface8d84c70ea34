"""What an import checks before it writes a tensor, so that a damaged GGUF is refused
rather than imported as NaN or garbage weights.

- Layout: each tensor's type and shape give its byte size (GGML's block sizes); the file
  must hold exactly that many bytes for it, up to the next tensor's data (or the end of
  the file), less than one alignment of padding after. A type id changed to another valid
  type changes that size, so it shows here. The type must also belong to the file's
  declared quantization (`general.file_type`): floats and llama.cpp's legacy and K blocks
  in a legacy or K-quant file, floats only in a float file.
- Values: every converted weight finite, and no group of 32 far larger than the tensor's
  typical group. Random bytes over a block's float16 scale give scales anywhere between
  2**-14 and 2**15; trained weights keep their largest group within ~30x the median one
  (SmolLM2, Gemma 3 270M: 26 at most), so a 4096x group is damage, not an outlier.
"""

from __future__ import annotations

import numpy as np

from ...errors import ModelLoadError

FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
BLOCK_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
GROUP = 32  # elements a magnitude is taken over: GGML's smallest block
MIN_GROUPS = 8  # fewer groups than this: only finiteness is checked (no typical group to compare with)
RATIO_LIMIT = 2.0**12  # a group this many times the tensor's median group is damage
VALUE_LIMIT = 65504.0  # float16's largest: no trained weight is larger


class DamagedGGUF(ModelLoadError):
    """A GGUF whose tensor data does not hold what its header says."""


def check_layout(path, reader, size: int) -> None:
    """Refuse a tensor whose type and shape disagree with the bytes the file holds for it,
    or whose type is foreign to the file's declared quantization."""
    from gguf import GGML_QUANT_SIZES

    declared, allowed = _declared_family(reader) or (None, None)
    tensors = sorted(reader.tensors, key=lambda t: int(t.data_offset))
    ends = [int(t.data_offset) for t in tensors[1:]] + [size]
    for tensor, end in zip(tensors, ends):
        type_name = tensor.tensor_type.name
        label = f"{path}: tensor {tensor.name} ({type_name}, {_shape(tensor)})"
        block, _ = GGML_QUANT_SIZES[tensor.tensor_type]
        if int(tensor.n_elements) % block:
            raise DamagedGGUF(f"{label} does not split into {type_name}'s blocks of {block}: its shape is damaged")
        room = end - int(tensor.data_offset)
        if not int(tensor.n_bytes) <= room < int(tensor.n_bytes) + reader.alignment:
            raise DamagedGGUF(
                f"{label} takes {int(tensor.n_bytes)} bytes but the file holds {room} for it: "
                "its type or shape is damaged"
            )
        if allowed is not None and type_name not in allowed:
            raise DamagedGGUF(f"{label} is not a type a {declared} file holds: its type is damaged")


def _declared_family(reader) -> tuple[str, frozenset] | None:
    """The tensor types a file of its declared `general.file_type` may hold (None: not
    declared, or a kind, like the IQ types, whose mixes are not listed here)."""
    from gguf import LlamaFileType

    field = reader.fields.get("general.file_type")
    try:
        name = LlamaFileType(int(field.contents())).name
    except (AttributeError, TypeError, ValueError):
        return None
    declared = name.removeprefix("MOSTLY_").removeprefix("ALL_")
    if declared in FLOAT_TYPES:
        return declared, FLOAT_TYPES
    if any(declared == t or declared.startswith(f"{t}_") for t in BLOCK_TYPES):  # Q4_K_M: Q4_K's mix
        return declared, FLOAT_TYPES | BLOCK_TYPES
    return None


def check_values(name: str, type_name: str, values: np.ndarray) -> None:
    """Refuse converted weights that are not finite or far out of the tensor's range."""
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    if not np.isfinite(flat).all():
        raise DamagedGGUF(f"tensor {name} ({type_name}) holds NaN or infinite values: its data is damaged")
    whole = flat.size // GROUP * GROUP
    groups = np.abs(flat[:whole]).reshape(-1, GROUP).max(axis=1) if whole else np.abs(flat)
    _check_magnitudes(name, type_name, groups, largest=float(np.abs(flat).max(initial=0.0)))


def check_blocks(name: str, type_name: str, scales: np.ndarray, biases: np.ndarray, levels: int) -> None:
    """The same for blocks kept as they are (scale, bias, `levels` quantization steps): a
    block's largest weight is at most |scale| * levels + |bias|."""
    scales, biases = np.asarray(scales, np.float32), np.asarray(biases, np.float32)
    if not (np.isfinite(scales).all() and np.isfinite(biases).all()):
        raise DamagedGGUF(f"tensor {name} ({type_name}) holds NaN or infinite scales: its data is damaged")
    bounds = (np.abs(scales) * levels + np.abs(biases)).reshape(-1)
    _check_magnitudes(name, type_name, bounds, largest=float(bounds.max(initial=0.0)))


def _check_magnitudes(name: str, type_name: str, groups: np.ndarray, *, largest: float) -> None:
    if largest > VALUE_LIMIT:
        raise DamagedGGUF(f"tensor {name} ({type_name}) holds a weight of {largest:.3g}: its data is damaged")
    nonzero = groups[groups > 0]
    if nonzero.size < MIN_GROUPS:
        return
    ratio = float(nonzero.max() / np.median(nonzero))
    if ratio > RATIO_LIMIT:
        raise DamagedGGUF(
            f"tensor {name} ({type_name}) holds a block {ratio:.3g} times larger than its typical one: "
            "its data is damaged"
        )


def _shape(tensor) -> str:
    return "x".join(str(int(d)) for d in reversed(tensor.shape.tolist()))
