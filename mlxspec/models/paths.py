"""Where mlxspec keeps its own files: one cache root, and the folders under it (imported
models, registry wheels, the history index kept by `serve --history-keep`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """mlxspec's own cache: $MLXSPEC_CACHE, else $XDG_CACHE_HOME/mlxspec, else ~/.cache/mlxspec."""
    if os.environ.get("MLXSPEC_CACHE"):
        return Path(os.environ["MLXSPEC_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "mlxspec"


def history_folder() -> Path:
    """The history index's files (drafters/history.py), one per namespace."""
    return cache_root() / "history"
