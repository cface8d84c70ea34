"""Finding an imported model folder by what a user calls it."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelNotFound


def find_import(name: str) -> Path:
    """The folder for `name`: a folder, a folder's name in mlxspec's cache, or the import of a
    GGUF file or registry package (as `auto` imports it)."""
    from .loading import local_copy
    from .paths import cache_root

    path = Path(name).expanduser()
    if path.is_dir():
        return path
    cached = cache_root() / "models" / name
    if "/" not in name and cached.is_dir():
        return cached
    found = local_copy(name)
    if found is None or not found.is_dir():
        raise ModelNotFound(f"no imported model {name} on this machine (`mlxspec models import FILE` makes one)")
    return found
