"""How much memory this machine lets a pair use, and whether a model fits: the one check
that loading a pair, fetching a preset and importing a GGUF file make before they read
weights."""

from __future__ import annotations

import os
import re

from ..errors import InsufficientMemory, InvalidOption

# Beyond the weights: activations, KV caches of a few thousand tokens, MLX's buffers.
_OVERHEAD_FRACTION = 0.10
_OVERHEAD_BYTES = 512 * 2**20


def machine_memory() -> int:
    """Bytes the pair may use: MLXSPEC_MEMORY_LIMIT if set, else the GPU's recommended
    working set on Apple silicon, else physical memory."""
    override = os.environ.get("MLXSPEC_MEMORY_LIMIT")
    if override:
        return parse_size(override)
    try:
        import mlx.core as mx

        info = mx.device_info()
        for key in ("max_recommended_working_set_size", "memory_size"):
            if info.get(key):
                return int(info[key])
    except Exception:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise InvalidOption(f"cannot read memory size {text!r} (e.g. 16GB, 512MB)")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def estimate_memory(weight_bytes: int) -> int:
    return int(weight_bytes * (1 + _OVERHEAD_FRACTION)) + _OVERHEAD_BYTES


def check_memory(weight_bytes: int, what: str) -> None:
    need, have = estimate_memory(weight_bytes), machine_memory()
    if need > have:
        raise InsufficientMemory(
            f"{what} needs about {gib(need)} of memory and this machine allows {gib(have)}: "
            "choose smaller (e.g. 4-bit) models"
        )


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"
