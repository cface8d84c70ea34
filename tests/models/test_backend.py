"""MLX's backend: the extras that install one (never two), and cuDNN attention turned off
before the first forward where speculative decoding runs on the CUDA backend. No GPU here:
the decision is tested, its wiring into load_pair on the CPU with the backend check forced."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import mlxspec
from mlxspec.models import backend
from mlxspec.models.backend import CUDNN_ATTENTION

BACKEND_EXTRAS = {"cpu", "cuda", "cuda12", "cuda13"}


def test_cudnn_attention_is_switched_off_for_speculation_on_cuda_only():
    env = {}
    decided = backend.keep_attention_plans(drafting=True, env=env, cuda=True)
    assert decided.switch_off and env == dict.fromkeys(CUDNN_ATTENTION, "0")
    for cuda, drafting in ((False, True), (True, False), (False, False)):
        untouched = {}
        assert not backend.keep_attention_plans(drafting=drafting, env=untouched, cuda=cuda).switch_off
        assert untouched == {}


@pytest.mark.parametrize("name", CUDNN_ATTENTION)
def test_a_switch_the_user_set_is_kept(name):
    env = {name: "1"}
    decided = backend.keep_attention_plans(drafting=True, env=env, cuda=True)
    assert not decided.switch_off and env == {name: "1"} and "set by the user" in decided.reason


def test_load_pair_decides_before_the_first_forward(monkeypatch):
    """MLX reads the switch at its first attention call, and loading a model runs one (a
    one-id forward to learn its width): load_pair decides first. The CUDA check is forced
    here (no GPU on this machine); MLX itself runs as it is."""
    for name in CUDNN_ATTENTION:
        monkeypatch.setenv(name, "")  # recorded, so that what load_pair sets is undone afterwards
        monkeypatch.delenv(name)
    monkeypatch.setattr(backend, "on_cuda", lambda: True)
    mlxspec.load_pair(no_draft=True)
    assert not any(name in os.environ for name in CUDNN_ATTENTION)  # standard decoding only
    mlxspec.load_pair()
    assert all(os.environ.get(name) == "0" for name in CUDNN_ATTENTION)


def test_on_this_machine_mlx_is_not_on_cuda():
    assert backend.on_cuda() is False


def test_a_missing_backend_is_named():
    """What `import mlx.core` raises with MLX's Linux frontend wheel alone (no mlx-cpu, no
    mlx-cuda: checked with `pip install --no-deps --target DIR mlx==0.32.4`)."""
    assert backend.missing_backend(ImportError("libmlx.so: cannot open shared object file: No such file or directory"))
    assert not backend.missing_backend(ImportError("No module named 'mlx_lm'"))
    assert "mlxspec[cpu]" in backend.NO_BACKEND and "mlxspec[cuda]" in backend.NO_BACKEND


def _requirements() -> tuple[list[str], dict[str, list[str]]]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _mlx_extras(requirement: str) -> set[str]:
    found = re.match(r"mlx\[([^\]]*)\]", requirement.replace(" ", ""))
    return set(found.group(1).split(",")) if found else set()


def test_one_backend_per_extra_and_none_forced():
    """Each MLX backend package writes the same mlx/lib/libmlx.so: the base dependencies name
    none (`pip install 'mlxspec[cuda]'` would otherwise bring mlx-cpu along), each backend
    extra exactly one, on Linux only (a Mac's Metal comes with mlx), and no other extra any."""
    base, extras = _requirements()
    assert all(not _mlx_extras(r) for r in base) and any(r.startswith("mlx>=") for r in base)
    for name, requirements in extras.items():
        named = [_mlx_extras(r) for r in requirements if _mlx_extras(r)]
        if name in BACKEND_EXTRAS:
            assert len(named) == 1 and len(named[0]) == 1, name
            assert all("sys_platform == 'linux'" in r for r in requirements if _mlx_extras(r)), name
        else:
            assert named == [], name
    assert BACKEND_EXTRAS <= set(extras)
