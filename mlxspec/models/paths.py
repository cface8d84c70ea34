"""Where mlxspec keeps its own files: one cache root, and the folders under it (imported
models, registry wheels, the history index kept by `serve --history-keep`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_root() -> Path:
    """mlxspec's own cache: $MLXSPEC_CACHE, else $XDG_CACHE_HOME/mlxspec, else ~/.cache/mlxspec."""
    if os.environ.get("MLXSPEC_CACHE"):
        return Path(os.environ["MLXSPEC_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "mlxspec"


def history_folder(tokenizer=None) -> Path:
    """The history index's files (drafters/history/), one per namespace; with `tokenizer`,
    under a folder of its own (a digest of its vocabulary), so that a server restarted on
    another model never reads ids it does not share."""
    folder = cache_root() / "history"
    return folder / tokenizer_digest(tokenizer) if tokenizer is not None else folder


def tokenizer_digest(tokenizer) -> str:
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()[:16]
