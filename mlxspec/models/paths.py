"""Where mlxspec keeps its own files: one cache root, and the folders under it (imported
models, registry wheels, the history index kept by `serve --history-keep`, the loading steps
the CLI has shown in full)."""

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


SHOWN = "shown.json"  # the loading steps the CLI has shown in full, by digest


def _shown() -> list:
    try:
        shown = json.loads((cache_root() / SHOWN).read_text())
    except (OSError, ValueError):
        return []
    return shown if isinstance(shown, list) else []


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def shown_before(key: str) -> bool:
    """Whether `mark_shown(key)` was called with this cache."""
    return _digest(key) in _shown()


def mark_shown(key: str) -> None:
    """Remember `key` in this cache (a cache that cannot be written forgets: shown again)."""
    shown = _shown()
    if _digest(key) in shown:
        return
    record = cache_root() / SHOWN
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = record.with_name(f"{SHOWN}.{os.getpid()}.partial")
        partial.write_text(json.dumps([*shown, _digest(key)][-200:]))
        os.replace(partial, record)  # whole or not at all: another process may write it too
    except OSError:
        pass
