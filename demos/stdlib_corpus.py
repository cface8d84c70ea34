"""The Python standard library's own source as a corpus, split by a hash of each file's path
into training and held-out files (the same split on every machine with the same Python)."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

EXCLUDED = {"site-packages", "test", "tests", "idle_test"}


def split_files(held_out_percent: int = 5) -> tuple[list[Path], list[Path]]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in lib.rglob("*.py") if not EXCLUDED & set(f.relative_to(lib).parts))
    train, held = [], []
    for f in files:
        bucket = int(hashlib.sha256(str(f.relative_to(lib)).encode()).hexdigest(), 16) % 100
        (held if bucket < held_out_percent else train).append(f)
    return train, held


def read(files: list[Path]) -> list[str]:
    return [f.read_text(errors="ignore") for f in files]


def continuation_prompts(files: list[Path], count: int, seed_lines: int = 2) -> list[str]:
    """Code-continuation prompts from held-out files: the file's text up to a function
    definition and the first line of its body (at most 1,500 characters of context)."""
    prompts = []
    per_file = max(1, count // max(len(files), 1) + 1)
    for f in files:
        lines = f.read_text(errors="ignore").splitlines(keepends=True)
        taken = 0
        for i, line in enumerate(lines):
            if line.lstrip().startswith("def ") and line.rstrip().endswith(":") and i + seed_lines < len(lines):
                context = "".join(lines[: i + seed_lines])[-1500:]
                prompts.append(context)
                taken += 1
                if taken == per_file:
                    break
        if len(prompts) >= count:
            break
    return prompts[:count]
