"""A history index on disk: one .npz per namespace (no pickles) with a header that names the
format and a sha256 of the content, refused in one line when it does not read back whole.

Hostile or unlucky paths: a file is opened only if it is a regular file (opened without
blocking, then checked with fstat: a FIFO or a device at the path never blocks the open), and
every read or write runs on a thread of its own, waited for at most a bound, so that a hung
filesystem (a network mount that stopped answering) costs that namespace its file, not the
server its worker. Files are written 0600 in a folder made 0700: they hold what a key's
clients sent. A key's file is named by a keyed digest (HMAC-SHA256) with a secret kept
beside the files, so the name tells nothing of the key without that secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...errors import DamagedHistory

FORMAT = "mlxspec-history/1"
LOAD_SECONDS = 20.0  # a namespace's file read whole (1M tokens: 0.7 s here); past it, abandoned
SAVE_SECONDS = 20.0
SECRET_NAME = "key-secret"  # beside the files: names them by API key
_SECRET_BYTES = 32
_PRIVATE_FILE = 0o600
_PRIVATE_FOLDER = 0o700


def digest(lengths: np.ndarray, tokens: np.ndarray) -> str:
    return hashlib.sha256(lengths.astype("<i8").tobytes() + tokens.astype("<i4").tobytes()).hexdigest()


def key_digest(api_key: str, secret: bytes) -> str:
    """An API key's name on disk: HMAC-SHA256 under the folder's secret (a plain hash of a
    weak key would let its file's name be checked against guesses offline)."""
    return hmac.new(secret, api_key.encode(), hashlib.sha256).hexdigest()[:32]


def unkeyed_digest(api_key: str) -> str:
    """How a key's file was named before the secret (kept only to rename such files)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


# opened as written, never through a link planted at a history path, and closed on exec
_NO_LINKS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _new_private_file(path: Path):
    """A file made at `path` (0600), never one that is there already nor a link's target."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINKS, _PRIVATE_FILE), "wb")


def _partial_of(path: Path) -> Path:
    """A name of its own for one write of `path`: a write left behind on a hung filesystem
    (`within`) never shares it with the next."""
    return path.with_name(f"{path.name}.{secrets.token_hex(6)}.partial")


def open_regular(path: Path):
    """`path` opened for reading if it is a regular file: opened without blocking (a FIFO's
    open would wait for a writer), then checked; DamagedHistory otherwise. FileNotFoundError
    when there is nothing there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NO_LINKS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DamagedHistory(f"{path}: not a regular file, not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_documents(path: Path, *, vocab_size: int | None = None) -> list[np.ndarray]:
    """The documents of a history file, checked whole; DamagedHistory naming what is wrong.
    With `vocab_size`, an id the model cannot read is damage too (a file from a model with a
    larger vocabulary would send it into the target's forward). FileNotFoundError when there
    is no file."""
    refuse = f"{path}: not a sound history file"
    try:
        with open_regular(path) as f, np.load(f, allow_pickle=False) as archive:
            if sorted(archive.files) != ["header", "lengths", "tokens"]:
                raise DamagedHistory(f"{refuse} (holds {sorted(archive.files)}, not header, lengths, tokens)")
            header = json.loads(archive["header"].tobytes().decode())
            lengths, tokens = archive["lengths"], archive["tokens"]
    except (DamagedHistory, FileNotFoundError):
        raise
    except Exception as e:  # a damaged file fails in many ways (zip, npy header, JSON, CRC): each is one line
        raise DamagedHistory(f"{refuse} ({type(e).__name__}: {_one_line(e)})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else None
        raise DamagedHistory(f"{refuse} (format {found!r}, expected {FORMAT!r})")
    if lengths.dtype != np.dtype("<i8") or tokens.dtype != np.dtype("<i4") or lengths.ndim != 1 or tokens.ndim != 1:
        raise DamagedHistory(f"{refuse} (arrays of the wrong type or shape)")
    if header.get("sha256") != digest(lengths, tokens):
        raise DamagedHistory(f"{refuse} (its content does not match its sha256)")
    if (lengths < 0).any() or int(lengths.sum()) != tokens.size or (tokens < 0).any():
        raise DamagedHistory(f"{refuse} (document lengths or token ids out of range)")
    if vocab_size is not None and tokens.size and int(tokens.max()) >= vocab_size:
        raise DamagedHistory(f"{refuse} (id {int(tokens.max())} is past this model's {vocab_size} ids)")
    return np.split(tokens.astype(np.int32), np.cumsum(lengths)[:-1]) if len(lengths) else []


def write_documents(path: Path, lengths: np.ndarray, tokens: np.ndarray) -> None:
    """Documents as one file, 0600 in a 0700 folder: written whole beside it, then put in
    place (a crash leaves the old file); on failure nothing of the attempt is left."""
    header = {
        "format": FORMAT,
        "documents": len(lengths),
        "tokens": int(tokens.size),
        "sha256": digest(lengths, tokens),
    }
    private_folder(path.parent)
    partial = _partial_of(path)
    try:
        with _new_private_file(partial) as f:
            np.savez(f, header=np.frombuffer(json.dumps(header).encode(), np.uint8), lengths=lengths, tokens=tokens)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def private_folder(folder: Path) -> None:
    """`folder` set 0700, made (with any parents missing, each 0700) if it is not there; a
    parent that exists is left as it is."""
    missing, above = [], folder
    while not above.is_dir() and above != above.parent:
        missing.append(above)
        above = above.parent
    for made in reversed(missing):
        made.mkdir(mode=_PRIVATE_FOLDER, exist_ok=True)
        os.chmod(made, _PRIVATE_FOLDER)  # mkdir's mode passes through the umask
    os.chmod(folder, _PRIVATE_FOLDER)


def folder_secret(folder: Path) -> bytes:
    """The secret that names a folder's files by API key: read from `<folder>/key-secret`,
    made (0600, at random) when there is none. A secret that is not a regular file of the
    right size is refused (DamagedHistory) rather than replaced: replacing it would orphan
    every file it named."""
    path = folder / SECRET_NAME
    private_folder(folder)
    # written whole under a name of its own, then linked in place: a second server starting
    # at the same moment, or a crash mid-write, never sees a part of it (link is atomic, and
    # fails where one is there already: that one is read)
    partial = _partial_of(path)
    try:
        with _new_private_file(partial) as f:
            f.write(secrets.token_bytes(_SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(partial, path)
        except FileExistsError:
            pass
    finally:
        partial.unlink(missing_ok=True)
    with open_regular(path) as f:
        secret = f.read(_SECRET_BYTES + 1)
    if len(secret) != _SECRET_BYTES:
        raise DamagedHistory(f"{path}: not a history secret ({len(secret)} bytes, not {_SECRET_BYTES})")
    return secret


def within(seconds: float, work: Callable[[], object], *, what: str):
    """`work()` on a daemon thread of its own, waited for at most `seconds`: its result, what
    it raised, or TimeoutError. A call stuck in the kernel cannot be interrupted from Python:
    it is left behind on its thread (a daemon, so it does not hold the process at exit)."""
    outcome: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # handed to the caller's thread
            outcome["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="mlxspec-history-file", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError(f"{what}: no answer within {seconds:g} s (a hung or slow filesystem?)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:200] or "unreadable"
