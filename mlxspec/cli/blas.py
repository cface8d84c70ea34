"""OpenBLAS under MLX's Linux CPU backend, without the user exporting anything.

The Linux `mlx[cpu]` wheel links a reference BLAS of its own (mlx_cpu.libs/libblas-*.so.3):
its matrix products are 4-15x slower than OpenBLAS's, and a multi-token verify costs several
single-token steps, so speculation cannot pay. A library that is already loaded when the
process starts overrides those symbols, and only the dynamic loader can do that: the
`mlxspec` command re-executes itself once with LD_PRELOAD naming a system OpenBLAS.

Standard library only: the decision is made before typer, rich or MLX are imported.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

OPT_OUT = "MLXSPEC_NO_OPENBLAS"  # set (to anything but 0/empty): MLX's own BLAS, and no hint
MARKER = "MLXSPEC_OPENBLAS"  # set in the re-executed process: the library mlxspec preloaded
# Measured on this 2-core machine while it was shared (load 3.8-4.6), 1 thread against 2:
# `generate --pair smollm2 -m 32`: 5.7-13.7 against 7.2-14.7 tok/s, prefill of 36 tokens 0.21-0.41
# against 0.22-0.49 s (noise larger than any difference); a 407-token prompt read in 3.3-3.7 s
# against 4.7-5.4 s. One thread: faster to read a long prompt here, and no threads spinning beside
# other busy processes.
THREADS = 1
INSTALL_HINT = (
    "MLX is using its slow reference BLAS (4-15x slower on a CPU; speculation rarely pays): install OpenBLAS "
    f"(`sudo apt-get install libopenblas0-pthread`) and mlxspec uses it by itself ({OPT_OUT}=1 hides this line)"
)


def candidates(machine: str | None = None) -> list[Path]:
    """Where distributions put an OpenBLAS that exports the standard BLAS symbols."""
    arch = machine or platform.machine()
    debian = Path(f"/usr/lib/{arch}-linux-gnu")
    return [
        debian / "openblas-pthread" / "libblas.so.3",  # Debian, Ubuntu: libopenblas0-pthread
        debian / "openblas-openmp" / "libblas.so.3",
        debian / "libopenblas.so.0",
        Path("/usr/lib64/libopenblasp.so.0"),  # Fedora, RHEL: openblas-threads
        Path("/usr/lib64/libopenblas.so.0"),  # Fedora, RHEL, openSUSE: openblas
        Path("/usr/lib/libopenblas.so.0"),  # Arch, Alpine
    ]


def find_openblas(paths: list[Path] | None = None) -> Path | None:
    return next((path for path in (paths or candidates()) if path.exists()), None)


def reference_blas() -> Path | None:
    """The reference BLAS bundled with MLX's Linux CPU wheel, if that is the MLX installed
    (found without importing it); None for a CUDA build or an MLX linked otherwise."""
    try:
        spec = find_spec("mlx")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(next(iter(spec.submodule_search_locations))).parent
    if any(site.glob("mlx_cuda*")):  # MLX's CUDA backend: the GPU does the products
        return None
    return next(iter(sorted(site.glob("mlx_cpu.libs/libblas*"))), None)


def _set(env: dict, name: str) -> bool:
    return env.get(name, "").strip() not in ("", "0")


@dataclass(frozen=True)
class Plan:
    """What to do about BLAS in this process: `preload` names a library to re-execute with;
    `hint` is a line for stderr; `reason` says why, for --verbose."""

    reason: str
    preload: Path | None = None
    hint: str | None = None


def plan(env: dict | None = None, *, system: str | None = None, mlx_blas=None, find=None) -> Plan:
    """Decide, from the environment alone, whether to re-execute with OpenBLAS preloaded
    (`mlx_blas` and `find` stand in for reference_blas and find_openblas in tests)."""
    env = os.environ if env is None else env
    mlx_blas, find = mlx_blas or reference_blas, find or find_openblas
    if (system or platform.system()) != "Linux":
        return Plan("not Linux: MLX uses the platform's own BLAS")
    if env.get(MARKER):
        return Plan(f"OpenBLAS {env[MARKER]} preloaded by mlxspec")
    if _set(env, OPT_OUT):
        return Plan(f"{OPT_OUT} is set: MLX's bundled reference BLAS")
    if env.get("LD_PRELOAD"):
        return Plan(f"LD_PRELOAD is set ({env['LD_PRELOAD']}): kept as it is")
    if mlx_blas() is None:
        return Plan("MLX here does not use the CPU wheel's reference BLAS: nothing to replace")
    library = find()
    if library is None:
        return Plan("no OpenBLAS found: MLX's bundled reference BLAS", hint=INSTALL_HINT)
    return Plan(f"OpenBLAS {library} preloaded by mlxspec", preload=library)


def preloaded_env(library: Path, env: dict | None = None) -> dict:
    """The environment to re-execute with; a thread count the user set is kept."""
    env = dict(os.environ if env is None else env)
    env["LD_PRELOAD"] = str(library)
    env.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))
    env[MARKER] = str(library)  # the re-executed process never re-executes again
    return env


def reexec_with_openblas() -> None:
    """Re-execute this process once with OpenBLAS preloaded, when `plan` says so; otherwise
    say what to install (a line on stderr) or do nothing. Returns only when not re-executing."""
    decided = plan()
    if decided.hint:
        print(f"mlxspec: {decided.hint}", file=sys.stderr)
    if decided.preload is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # orig_argv keeps the interpreter's own options and how it was started (script, -m, -c)
        os.execve(sys.executable, sys.orig_argv, preloaded_env(decided.preload))
    except OSError:
        return  # run on as we are: slower, still correct


def mapped_openblas() -> str | None:
    """The OpenBLAS library this process has mapped for MLX, read from /proc/self/maps.
    NumPy's own copy (numpy.libs/libscipy_openblas64_*.so, mapped once anything imports
    NumPy) does not count: its symbols carry a suffix, so MLX never calls it."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
        if Path(path).name.startswith("libscipy_openblas"):
            continue
        if "openblas" in path.lower() or (os.environ.get(MARKER) and path == os.environ[MARKER]):
            return path
    return None


def describe() -> str:
    """One line for --verbose: which BLAS MLX's CPU backend gets here, and why."""
    decided = plan()
    if platform.system() != "Linux":
        return f"BLAS: {decided.reason}"
    mapped = mapped_openblas()
    threads = os.environ.get("OPENBLAS_NUM_THREADS")
    loaded = f"OpenBLAS loaded ({mapped}, {threads or 'its default'} thread{'' if threads == '1' else 's'})"
    return f"BLAS: {decided.reason}; " + (loaded if mapped else "no OpenBLAS loaded")
