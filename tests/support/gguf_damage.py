"""Ways to damage a GGUF file the way a bad download or a bad disk does, shared by the
import tests and the fuzz demo."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np


def data_start(path: Path) -> int:
    from gguf import GGUFReader

    return int(GGUFReader(path).data_offset)


def with_random_bytes(source: Path, out: Path, *, seed: int, count: int = 1000) -> Path:
    """A copy with `count` random bytes written over the middle of its tensor data."""
    shutil.copyfile(source, out)
    start, size = data_start(source), source.stat().st_size
    at = start + (size - start) // 2 - count // 2
    with open(out, "r+b") as f:
        f.seek(at)
        f.write(np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes())
    return out


def type_id_at(path: Path, tensor: str) -> int:
    """Where the type id of `tensor`'s info lies (after its name, dimension count and dims)."""
    raw = path.read_bytes()
    name = tensor.encode()
    at = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    dims = struct.unpack_from("<I", raw, at)[0]
    return at + 4 + 8 * dims


def with_type(source: Path, out: Path, *, tensor: str, type_name: str) -> Path:
    """A copy whose `tensor` claims another (valid) GGML type."""
    from gguf import GGMLQuantizationType

    shutil.copyfile(source, out)
    with open(out, "r+b") as f:
        f.seek(type_id_at(source, tensor))
        f.write(struct.pack("<I", int(GGMLQuantizationType[type_name])))
    return out
