"""The caches' options as a person gives them (`--max-kv-size`, `--kv-bits`), checked without
MLX: the command line refuses a bad value before any model loads, and caches.py checks them
again as it builds a cache."""

from __future__ import annotations

from ..errors import InvalidOption

KV_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize accepts
KV_GROUP_SIZES = (32, 64, 128)
KEPT_TOKENS = 4  # mlx-lm's make_prompt_cache keeps the first 4 tokens past max_kv_size


def check_cache_options(max_kv_size, kv_bits, kv_group_size: int = 64) -> None:
    """The caches' options (caches.CacheOptions), checked as the caches will use them."""
    whole = isinstance(max_kv_size, int) and not isinstance(max_kv_size, bool)
    if max_kv_size is not None and not (whole and max_kv_size > KEPT_TOKENS):
        raise InvalidOption(
            f"max KV size must be a whole number above {KEPT_TOKENS} (the first {KEPT_TOKENS} tokens are always "
            f"kept), got {max_kv_size!r}"
        )
    if kv_bits is not None and kv_bits not in KV_BITS:
        raise InvalidOption(f"KV bits must be one of {', '.join(map(str, KV_BITS))}, got {kv_bits!r}")
    if kv_group_size not in KV_GROUP_SIZES:
        raise InvalidOption(
            f"KV group size must be one of {', '.join(map(str, KV_GROUP_SIZES))}, got {kv_group_size!r}"
        )
