"""OpenBLAS by default on Linux: the decision (blas.plan), and the real command re-executing
itself with the library preloaded, or not, as the environment asks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxspec.cli import blas

LIBRARY = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")


def no_blas_env(**extra) -> dict:
    """This environment without any preload (CI exports one itself) or mlxspec's marker."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "OPENBLAS_NUM_THREADS", blas.MARKER)}
    env.pop(blas.OPT_OUT, None)
    return {**env, **extra}


def plan(env: dict, **kw) -> blas.Plan:
    kw.setdefault("system", "Linux")
    kw.setdefault("mlx_blas", lambda: Path("libblas-x.so.3"))
    kw.setdefault("find", lambda: LIBRARY)
    return blas.plan(env, **kw)


def test_plan_preloads_a_found_openblas():
    assert plan({}).preload == LIBRARY
    assert plan({"LD_PRELOAD": ""}).preload == LIBRARY  # empty is unset


@pytest.mark.parametrize(
    "env, why",
    [
        ({"LD_PRELOAD": "/lib/libjemalloc.so"}, "kept as it is"),
        ({blas.OPT_OUT: "1"}, blas.OPT_OUT),
        ({blas.MARKER: str(LIBRARY), "LD_PRELOAD": str(LIBRARY)}, "preloaded by mlxspec"),  # no second re-exec
    ],
)
def test_plan_leaves_the_environment_alone(env, why):
    decided = plan(env)
    assert decided.preload is None and decided.hint is None and why in decided.reason


def test_plan_only_for_the_linux_cpu_wheel():
    assert plan({}, system="Darwin").preload is None
    assert plan({}, mlx_blas=lambda: None).preload is None  # a CUDA build, or an MLX linked otherwise


def test_no_openblas_says_what_to_install():
    decided = plan({}, find=lambda: None)
    assert decided.preload is None
    assert "apt-get install libopenblas0-pthread" in decided.hint and "slow" in decided.hint
    assert plan({blas.OPT_OUT: "1"}, find=lambda: None).hint is None  # the opt-out silences it


def test_the_user_thread_count_is_kept():
    assert blas.preloaded_env(LIBRARY, {})["OPENBLAS_NUM_THREADS"] == str(blas.THREADS)
    env = blas.preloaded_env(LIBRARY, {"OPENBLAS_NUM_THREADS": "3"})
    assert env["OPENBLAS_NUM_THREADS"] == "3" and env["LD_PRELOAD"] == str(LIBRARY) and env[blas.MARKER]


def test_candidates_look_where_distributions_install_it():
    paths = [str(p) for p in blas.candidates("aarch64")]
    assert "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3" in paths
    assert "/usr/lib64/libopenblas.so.0" in paths


# --- the real command ------------------------------------------------------------------

needs_openblas = pytest.mark.skipif(
    sys.platform != "linux" or blas.find_openblas() is None or blas.reference_blas() is None,
    reason="Linux, MLX's CPU wheel and a system OpenBLAS only",
)
MLXSPEC = str(Path(sys.executable).with_name("mlxspec"))


def run(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


@needs_openblas
@pytest.mark.parametrize("command", [[MLXSPEC], [sys.executable, "-m", "mlxspec"]])
def test_the_command_loads_openblas_by_itself(command):
    done = run(*command, "--verbose", "--version", env=no_blas_env())
    assert done.returncode == 0, done.stderr
    assert "preloaded by mlxspec; OpenBLAS loaded" in done.stderr
    assert f"{blas.THREADS} thread" in done.stderr


@needs_openblas
def test_generate_runs_with_openblas_by_itself():
    done = run(MLXSPEC, "--verbose", "generate", "def add(a, b):", "-m", "4", "--temp", "0", env=no_blas_env())
    assert done.returncode == 0, done.stderr
    assert "OpenBLAS loaded" in done.stderr and done.stdout.strip()


@needs_openblas
def test_the_opt_out_keeps_mlx_own_blas():
    done = run(MLXSPEC, "--verbose", "--version", env=no_blas_env(**{blas.OPT_OUT: "1"}))
    assert done.returncode == 0, done.stderr
    assert "no OpenBLAS loaded" in done.stderr and "apt-get" not in done.stderr


@needs_openblas
def test_the_users_own_preload_is_kept():
    libc = next(p for p in Path("/proc/self/maps").read_text().split() if "/libc.so" in p or "/libc-" in p)
    done = run(MLXSPEC, "--verbose", "--version", env=no_blas_env(LD_PRELOAD=libc))
    assert done.returncode == 0, done.stderr
    assert "kept as it is; no OpenBLAS loaded" in done.stderr


def test_no_reexec_when_main_is_called_in_process(monkeypatch):
    """Tests and programs call main(argv): they are never replaced by another process."""
    from mlxspec.cli import main

    monkeypatch.setattr(blas, "reexec_with_openblas", lambda: pytest.fail("re-executed"))
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0


def test_without_openblas_one_line_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(blas, "find_openblas", lambda paths=None: None)
    monkeypatch.setattr(blas, "reference_blas", lambda: Path("libblas-x.so.3"))
    monkeypatch.setattr(blas.platform, "system", lambda: "Linux")
    for name in ("LD_PRELOAD", blas.MARKER, blas.OPT_OUT):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(blas.os, "execve", lambda *a: pytest.fail("re-executed"))
    blas.reexec_with_openblas()
    out, err = capsys.readouterr()
    assert not out and len(err.splitlines()) == 1 and "apt-get install libopenblas0-pthread" in err


@pytest.mark.parametrize(
    "args",
    [
        ["--verbose", "models", "list"],
        ["models", "list", "--verbose"],
        ["models", "--verbose", "list", "--verbose"],
        ["--verbose", "generate", "def add(a, b):", "-m", "2", "--verbose"],
        ["generate", "def add(a, b):", "-m", "2", "--verbose"],
    ],
)
def test_verbose_before_or_after_the_command_says_the_blas_once(args, capsys, monkeypatch):
    from tests.cli.test_cli import run as run_in_process

    monkeypatch.delenv("MLXSPEC_VERBOSE", raising=False)
    code, _, err = run_in_process(capsys, *args)
    assert code == 0, err
    assert err.count("BLAS: ") == 1, err


def test_without_verbose_the_blas_is_not_said(capsys, monkeypatch):
    from tests.cli.test_cli import run as run_in_process

    monkeypatch.delenv("MLXSPEC_VERBOSE", raising=False)
    code, _, err = run_in_process(capsys, "models", "list")
    assert code == 0 and "BLAS: " not in err
