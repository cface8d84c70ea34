"""GGUF tensors to MLX arrays: quantized blocks MLX can hold exactly are repacked, every
other type is dequantized with gguf-py (llama.cpp's own reader) and stored as asked.

GGML's Q4_0, Q4_1 and Q8_0 are affine quantizations over groups of 32 along a row, the
same scheme as MLX's `mx.quantize(..., group_size=32)`:

    Q4_0: w = d * (q - 8)    -> scale d, bias -8 d,   4 bits
    Q4_1: w = d * q + m      -> scale d, bias m,      4 bits
    Q8_0: w = d * q (signed) -> scale d, bias -128 d, 8 bits (q + 128 unsigned)

so their blocks become MLX's (weight, scales, biases) triple without rounding anything
again. GGML packs a 4-bit block as 16 bytes whose low nibbles are elements 0..15 and high
nibbles 16..31; MLX packs consecutive elements into uint32 words, lowest bits first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The types kept quantized as they are, and their bits.
NATIVE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
GROUP_SIZE = 32
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
QUANTIZED_DTYPES = {"q4": 4, "q8": 8}
DTYPES = FLOAT_DTYPES + tuple(QUANTIZED_DTYPES)


@dataclass(frozen=True)
class Plan:
    """How one tensor is stored: as a float of `dtype`, or quantized with `bits`."""

    dtype: str  # float32 | bfloat16 | float16: the float type (also of scales and biases)
    bits: int | None = None  # None: a float tensor

    def output_bytes(self, elements: int) -> int:
        float_bytes = 4 if self.dtype == "float32" else 2
        if self.bits is None:
            return elements * float_bytes
        groups = elements // GROUP_SIZE
        return elements * self.bits // 8 + 2 * groups * float_bytes


def plan(type_name: str, shape: tuple[int, ...], *, dtype: str, float_dtype: str, quantizable: bool) -> Plan:
    """`dtype`: what the user asked (a float type, q4 or q8). Matrices whose rows split
    into groups of 32 are quantized for q4/q8 (their native blocks kept when the bits
    agree); norms, biases and odd shapes stay float."""
    bits = QUANTIZED_DTYPES.get(dtype)
    groups_fit = len(shape) == 2 and shape[-1] % GROUP_SIZE == 0
    if bits is None or not quantizable or not groups_fit:
        return Plan(dtype if dtype in FLOAT_DTYPES else float_dtype)
    return Plan(float_dtype, bits)


def _block_fields(raw: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    """Raw bytes (any shape) -> (rows, blocks per row, block bytes)."""
    flat = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    return flat.reshape(rows, flat.shape[1] // block_bytes, block_bytes)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """(rows, columns) values < 2**bits -> (rows, columns * bits / 32) uint32, MLX's order."""
    per_word = 32 // bits
    q = q.astype(np.uint32).reshape(q.shape[0], -1, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    return np.bitwise_or.reduce(q << shifts, axis=-1)


def native_triple(type_name: str, raw: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0 / Q4_1 / Q8_0 blocks -> (weight uint32, scales float16, biases float16), exactly."""
    if type_name == "Q8_0":
        blocks = _block_fields(raw, rows, 34)
        d = blocks[..., :2].copy().view(np.float16)[..., 0]
        q = blocks[..., 2:].copy().view(np.int8).astype(np.int16) + 128
        return _pack(q.reshape(rows, -1), 8), d, (-128 * d.astype(np.float32)).astype(np.float16)
    offset = 2 if type_name == "Q4_0" else 4
    blocks = _block_fields(raw, rows, offset + 16)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., offset:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)  # elements 0..15, then 16..31
    if type_name == "Q4_0":
        bias = (-8 * d.astype(np.float32)).astype(np.float16)
    else:
        bias = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    return _pack(q.reshape(rows, -1), 4), d, bias


def dequantize(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Any GGML type -> float32 array of `shape` (numpy, via gguf-py)."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[type_name]
    if qtype == GGMLQuantizationType.F32:
        values = np.asarray(raw, dtype=np.float32)
    elif qtype == GGMLQuantizationType.F16:
        values = np.asarray(raw).view(np.float16).astype(np.float32)
    else:
        values = quants.dequantize(np.asarray(raw), qtype).astype(np.float32, copy=False)
    return values.reshape(shape)


def supported(type_name: str) -> bool:
    """Whether gguf-py can dequantize this type."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType.__members__.get(type_name)
    return qtype is not None and (type_name in ("F32", "F16") or qtype in quants._type_traits)
