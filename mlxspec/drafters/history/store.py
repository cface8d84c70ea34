"""One history index per namespace (the server: one per API key), optionally kept on disk.

Threads: the worker drafts and adds under the store's lock; /health reads `describe` from
the event loop, which takes no lock at all (it reads a few ints, one update stale at worst),
and no file is read or written while the lock is held. A file's read or write is bounded in
time (files.within), so neither a FIFO nor a hung mount at a namespace's path can hold the
worker, the lock, or /health."""

from __future__ import annotations

import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ...errors import DamagedHistory
from .drafter import HistoryDrafter
from .files import (
    LOAD_SECONDS,
    SAVE_SECONDS,
    folder_secret,
    key_digest,
    read_documents,
    unkeyed_digest,
    within,
    write_documents,
)
from .index import DEFAULT_LIMIT_TOKENS, MAX_MATCH, MIN_MATCH, HistoryIndex
from .proposals import Speculation

DEFAULT_NAMESPACE = "default"  # a session's own, or a server's without API keys
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def namespace_of(api_key: str | None, *, secret: bytes) -> str:
    """A namespace for an API key that names nothing of the key: its keyed digest."""
    return DEFAULT_NAMESPACE if api_key is None else "key-" + key_digest(api_key, secret)


class HistoryStore:
    """One HistoryIndex per namespace (the server: a keyed digest of the API key; a session:
    one), so one namespace's history never drafts for another's. At most `max_namespaces`
    held, the least recently used dropped first (saved first when `folder` is set): memory
    is at most max_namespaces x limit_tokens x bytes_per_token().

    With `folder`, a namespace's index is read from `<folder>/<namespace>.npz` when first
    used (or by `preload`) and written by `save`; a damaged, foreign or unreadable file (not
    a regular file, not read within files.LOAD_SECONDS) is refused in one line (passed to
    `warn`), and that namespace starts empty (the next save replaces the file). A namespace
    that cannot be saved is said so in one line, and the others are saved all the same."""

    def __init__(
        self,
        *,
        limit_tokens: int = DEFAULT_LIMIT_TOKENS,
        max_namespaces: int = 16,
        folder: Path | None = None,
        speculation: Speculation = Speculation(),
        keep_prompts: bool = True,
        max_match: int = MAX_MATCH,
        min_match: int = MIN_MATCH,
        warn: Callable[[str], None] = print,
        vocab_size: int | None = None,
    ):
        if max_namespaces < 1:
            raise ValueError("max_namespaces must be >= 1")
        self.limit_tokens, self.max_namespaces, self.folder = limit_tokens, max_namespaces, folder
        self.speculation, self.keep_prompts, self.warn = speculation, keep_prompts, warn
        self.vocab_size = vocab_size  # ids a file may hold (the target's width)
        self._shape = {"limit_tokens": limit_tokens, "max_match": max_match, "min_match": min_match}
        self._indexes: OrderedDict[str, HistoryIndex] = OrderedDict()
        self._lock = threading.Lock()
        self._secret: bytes | None = None

    def path(self, namespace: str) -> Path | None:
        return self.folder / f"{namespace}.npz" if self.folder is not None else None

    def namespace_of(self, api_key: str) -> str:
        """An API key's namespace: its digest keyed by the folder's secret (files.folder_secret;
        without a folder, one made for this store alone). A file named by the old unkeyed
        digest of this key is renamed to the new name (the key is needed to know it)."""
        namespace = namespace_of(api_key, secret=self._key_secret())
        if self.folder is not None:
            old, new = self.path("key-" + unkeyed_digest(api_key)), self.path(namespace)
            try:
                within(LOAD_SECONDS, lambda: _rename_once(old, new), what=str(old))
            except OSError as e:
                self.warn(f"warning: {old}: not renamed to {new.name} ({e.strerror or e}); that key starts empty")
        return namespace

    def _key_secret(self) -> bytes:
        folder = self.folder
        if self._secret is None and folder is None:
            self._secret = secrets.token_bytes(32)  # nothing on disk: names for this process alone
        elif self._secret is None:
            self._secret = within(LOAD_SECONDS, lambda: folder_secret(folder), what=str(folder))
        return self._secret

    def preload(self, namespaces: Iterable[str]) -> None:
        """Read these namespaces' files now (at most max_namespaces), so that /health counts
        what a restarted server holds before its first request."""
        for namespace in list(namespaces)[: self.max_namespaces]:
            self.index(namespace)

    def index(self, namespace: str) -> HistoryIndex:
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"a namespace is 1-64 letters, digits, - or _, got {namespace!r}")
        with self._lock:
            if namespace in self._indexes:
                self._indexes.move_to_end(namespace)
                return self._indexes[namespace]
        read = self._read(namespace)  # outside the lock: a slow file holds no one else
        dropped = []
        with self._lock:
            if namespace in self._indexes:  # read meanwhile by another thread
                return self._indexes[namespace]
            self._indexes[namespace] = read
            while len(self._indexes) > self.max_namespaces:
                name, old = self._indexes.popitem(last=False)
                dropped.append((name, old.arrays()))
        for name, arrays in dropped:
            self._write(name, arrays)
        return read

    def drafter(self, namespace: str = DEFAULT_NAMESPACE, *, min_match: int | None = None) -> HistoryDrafter:
        return HistoryDrafter(
            self.index(namespace),
            speculation=self.speculation,
            min_match=min_match,
            keep_prompts=self.keep_prompts,
            lock=self._lock,
        )

    def describe(self, namespace: str) -> dict:
        """What one namespace's index holds (nothing is made or read for it here). Takes no
        lock: the event loop calls it, and must never wait on the worker."""
        index = self._indexes.get(namespace)
        return {  # plain ints: numpy's do not go into JSON
            "documents": int(index.documents) if index is not None else 0,
            "slots": int(index.size) if index is not None else 0,
            "bytes": int(index.nbytes) if index is not None else 0,
            "limit_tokens": int(self.limit_tokens),
        }

    def save(self) -> None:
        """Every namespace held, to `folder` (nothing without one): each on its own, so one
        that fails (a folder at its path, a full disk) leaves the others' saved."""
        if self.folder is None:
            return
        with self._lock:  # copies under the lock, written after it
            held = [(namespace, index.arrays()) for namespace, index in self._indexes.items()]
        for namespace, arrays in held:
            self._write(namespace, arrays)

    def _read(self, namespace: str) -> HistoryIndex:
        index = HistoryIndex(**self._shape)
        path = self.path(namespace)
        if path is None:
            return index
        try:
            documents = within(LOAD_SECONDS, lambda: read_documents(path, vocab_size=self.vocab_size), what=str(path))
        except FileNotFoundError:
            return index
        except (DamagedHistory, TimeoutError) as e:
            self.warn(f"{e}; starting an empty history")
            return index
        index.add_documents(documents)
        return index

    def _write(self, namespace: str, arrays: tuple[np.ndarray, np.ndarray]) -> None:
        path = self.path(namespace)
        if path is None:
            return
        try:
            within(SAVE_SECONDS, lambda: write_documents(path, *arrays), what=str(path))
        except (OSError, TimeoutError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.warn(f"warning: {path}: the history could not be saved ({reason}); it is kept in memory")


def _rename_once(old: Path, new: Path) -> None:
    """A file under its old name moved to its new one, unless the new one exists already."""
    if old.is_file() and not new.exists():
        old.replace(new)
        new.chmod(0o600)
