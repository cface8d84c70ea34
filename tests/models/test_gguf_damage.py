"""Damaged GGUF files are refused in one line naming the tensor (issue 19, items 3 and 6):
random bytes over tensor data, a tensor's type id changed to another valid type, a version
gguf-py cannot read; and an imported folder's weights are checked against the record its
import wrote, on load (when a file's size or time changed) and by `mlxspec models verify`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mlxspec
from mlxspec.errors import ModelLoadError
from mlxspec.models.gguf import UnsupportedGGUF, import_gguf
from tests.support.gguf_damage import with_random_bytes, with_type
from tests.support.gguf_files import write_gguf

ROOT = Path(__file__).resolve().parents[2]
DAMAGE = r"tensor \S+ \(\w+(, [\dx]+)?\) .*damaged"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def ggufs(factory, tmp_path_factory):
    """A tiny llama as float32 and with Q4_1 matrices (blocks with scales)."""
    folder = tmp_path_factory.mktemp("ggufs")
    source = factory.pair("llama")[0]
    return {
        "F32": write_gguf(source, folder / "f32.gguf"),
        "Q4_1": write_gguf(source, folder / "q41.gguf", types={"matrix": "Q4_1"}),
    }


def cli(*args, env_cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", MLXSPEC_CACHE=str(env_cache))
    return subprocess.run([sys.executable, "-m", "mlxspec", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("kind, dtype", [("F32", "float32"), ("Q4_1", "float32"), ("Q4_1", "q4")])
@pytest.mark.parametrize("seed", range(4))
def test_random_bytes_over_tensor_data_are_refused_naming_the_tensor(ggufs, tmp_path, cache, kind, dtype, seed):
    damaged = with_random_bytes(ggufs[kind], tmp_path / "damaged.gguf", seed=seed)
    with pytest.raises(ModelLoadError, match=DAMAGE):
        import_gguf(damaged, dtype=dtype, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kind, tensor, type_name",
    [
        ("F32", "blk.0.ffn_down.weight", "F16"),
        ("Q4_1", "blk.0.ffn_down.weight", "Q4_0"),
        ("Q4_1", "blk.1.attn_q.weight", "Q5_0"),
    ],
)
def test_a_tensor_claiming_another_valid_type_is_refused(ggufs, tmp_path, cache, kind, tensor, type_name):
    retyped = with_type(ggufs[kind], tmp_path / "retyped.gguf", tensor=tensor, type_name=type_name)
    with pytest.raises(ModelLoadError, match=rf"tensor {tensor} \({type_name}, .*its type or shape is damaged"):
        import_gguf(retyped, dtype="float32", out=tmp_path / "out")


def test_a_tensor_foreign_to_the_declared_quantization_is_refused(factory, tmp_path, cache):
    """IQ4_NL blocks are as long as Q4_0's: only the file's declared type tells them apart."""
    source = factory.pair("llama")[0]
    path = write_gguf(source, tmp_path / "q40.gguf", types={"matrix": "Q4_0"}, file_type="MOSTLY_Q4_0")
    import_gguf(path, dtype="float32", out=tmp_path / "sound")  # as written: imports
    retyped = with_type(path, tmp_path / "iq4.gguf", tensor="blk.0.ffn_down.weight", type_name="IQ4_NL")
    with pytest.raises(ModelLoadError, match=r"blk.0.ffn_down.weight \(IQ4_NL, .*is not a type a Q4_0 file holds"):
        import_gguf(retyped, dtype="float32", out=tmp_path / "out")


def test_damage_through_the_cli_is_one_line_and_exit_1(ggufs, tmp_path):
    damaged = with_random_bytes(ggufs["Q4_1"], tmp_path / "damaged.gguf", seed=7)
    run = cli("generate", "hello", "--target", str(damaged), "--no-draft", "--json", env_cache=tmp_path / "c")
    assert run.returncode == 1 and run.stdout == "", run.stdout
    assert run.stderr.count("\n") <= 2 and "damaged" in run.stderr and "Warning" not in run.stderr, run.stderr
    assert not list((tmp_path / "c" / "models").glob("*")) if (tmp_path / "c" / "models").exists() else True


def test_an_unsupported_version_is_named(ggufs, tmp_path, cache):
    raw = bytearray(ggufs["F32"].read_bytes())
    raw[4:8] = (99).to_bytes(4, "little")
    (tmp_path / "v99.gguf").write_bytes(raw)
    with pytest.raises(UnsupportedGGUF, match="GGUF version 99, which mlxspec cannot read"):
        import_gguf(tmp_path / "v99.gguf")


def test_an_import_records_digests_and_damaged_weights_are_refused_on_load_and_by_verify(ggufs, tmp_path, cache):
    folder = import_gguf(ggufs["F32"], dtype="float32", out=tmp_path / "imported")
    manifest = json.loads((folder / "mlxspec-import.json").read_text())
    assert len(manifest["source_sha256"]) == 64 and set(manifest["weights"]) == {"model.safetensors"}
    run = cli("models", "verify", str(folder), env_cache=cache)
    assert run.returncode == 0 and "1 weight file as imported" in run.stdout, run.stderr
    weights = folder / "model.safetensors"
    os.utime(weights)  # touched, unchanged: loads (and the record takes the new time)
    mlxspec.load_pair(str(folder), no_draft=True)
    assert json.loads((folder / "mlxspec-import.json").read_text())["weights"]["model.safetensors"]["mtime_ns"] == (
        weights.stat().st_mtime_ns
    )
    raw = bytearray(weights.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 4] = b"\xff\xff\xff\x7f"  # a NaN, same size
    weights.write_bytes(raw)
    with pytest.raises(ModelLoadError, match="model.safetensors is not the file its import wrote"):
        mlxspec.load_pair(str(folder), no_draft=True)
    run = cli("models", "verify", str(folder), env_cache=cache)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "sha256 differs" in run.stderr, run.stderr


def test_verify_says_when_there_is_no_record(factory, tmp_path, cache):
    run = cli("models", "verify", str(factory.pair("llama")[0]), env_cache=cache)
    assert run.returncode == 1 and "no record of the weights" in run.stderr, run.stderr


@pytest.mark.slow
def test_random_bytes_in_the_real_smollm2_gguf_are_refused(tmp_path):
    from tests.support import real_models

    damaged = with_random_bytes(real_models.gguf_file(real_models.SMOLLM2), tmp_path / "smollm2.gguf", seed=0)
    with pytest.raises(ModelLoadError, match=DAMAGE):
        import_gguf(damaged, dtype="float32", out=tmp_path / "out")


def test_the_same_file_fetched_again_is_not_imported_again(ggufs, tmp_path, cache):
    """A GGUF of the same size and sha256 as an import's source (a registry wheel fetched again
    after its files were deleted) finds that import: no second conversion."""
    import shutil

    from mlxspec.models.gguf import imported_folder
    from mlxspec.models.loading import import_gguf_once

    first = tmp_path / "a" / "tiny.gguf"
    first.parent.mkdir()
    shutil.copy(ggufs["F32"], first)
    folder = import_gguf_once(first, dtype="float32")
    written = (folder / "model.safetensors").stat().st_mtime_ns
    again = tmp_path / "b" / "tiny.gguf"
    again.parent.mkdir()
    shutil.copy(ggufs["F32"], again)
    assert imported_folder(again, "float32") == folder
    assert import_gguf_once(again, dtype="float32") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == written
    assert json.loads((folder / "mlxspec-import.json").read_text())["source"] == str(again.resolve())
