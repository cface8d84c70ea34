"""An imported folder's record of what it was made from and what was written: the source's
sha256 and, per weight file, its sha256, size and modification time (in the import's
manifest). A load compares sizes and times only, so it stays fast; a file whose size or
time changed is hashed again, and a digest that differs is refused. `verify` hashes all.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from ...errors import ModelLoadError

MANIFEST = "mlxspec-import.json"
CHUNK = 1 << 22


class DamagedWeights(ModelLoadError):
    """An imported folder whose weights are not the ones its import wrote."""


def sha256(path: Path, on_progress: Callable[[int, int], None] | None = None) -> str:
    """The file's sha256, read in chunks; `on_progress(done, total)` in bytes after each."""
    digest, done, total = hashlib.sha256(), 0, Path(path).stat().st_size if on_progress else 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            if on_progress:
                done += len(block)
                on_progress(done, total)
    return digest.hexdigest()


def _stat(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def weight_record(folder: Path) -> dict:
    """{file name: sha256, size, mtime_ns} for the folder's safetensors files."""
    return {f.name: {"sha256": sha256(f), **_stat(f)} for f in sorted(Path(folder).glob("*.safetensors"))}


def read_manifest(folder: Path) -> dict | None:
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def check_weights(folder: Path, *, full: bool = False) -> int | None:
    """Refuse an imported folder whose weight files differ from its record (hashing only
    those whose size or time changed, or all with `full`). Returns the files checked, None
    for a folder with no record (not an import, or one made before records were kept)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    record = manifest.get("weights") if manifest else None
    if not isinstance(record, dict):
        return None
    present = {f.name for f in folder.glob("*.safetensors")}
    if missing := sorted(set(record) - present):
        raise DamagedWeights(f"{folder} lacks {missing[0]}, which its import wrote: {_again(manifest)}")
    if extra := sorted(present - set(record)):
        raise DamagedWeights(f"{folder} holds {extra[0]}, which its import did not write: {_again(manifest)}")
    restamped = False
    for name, made in sorted(record.items()):
        path = folder / name
        now = _stat(path)
        if not full and now == {"size": made.get("size"), "mtime_ns": made.get("mtime_ns")}:
            continue
        if now["size"] != made.get("size") or sha256(path) != made.get("sha256"):
            raise DamagedWeights(f"{path} is not the file its import wrote (its sha256 differs): {_again(manifest)}")
        if now["mtime_ns"] != made.get("mtime_ns"):  # touched, not changed: the next load skips it again
            made["mtime_ns"], restamped = now["mtime_ns"], True
    if restamped:
        _rewrite(folder, manifest)
    return len(record)


def source_changed(folder: Path) -> str | None:
    """What differs between an import's source file and the one it was made from (None:
    the same, or the source is not on this machine to compare)."""
    manifest = read_manifest(folder) or {}
    source, digest = manifest.get("source"), manifest.get("source_sha256")
    if not source or not digest or not Path(source).is_file():
        return None
    return None if sha256(Path(source)) == digest else f"{source} changed since {folder} was imported from it"


def _again(manifest: dict) -> str:
    source = manifest.get("source", "the GGUF file")
    return f"import it again (`mlxspec models import {source} --force`)"


def write_manifest(folder: Path, manifest: dict) -> bool:
    """Replace the record whole (never half written); False when the folder cannot be written."""
    partial = Path(folder) / (MANIFEST + ".partial")
    try:
        partial.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(partial, Path(folder) / MANIFEST)
    except OSError:
        return False
    return True


def _rewrite(folder: Path, manifest: dict) -> None:
    write_manifest(folder, manifest)  # a read-only folder: the next load hashes again, nothing worse
