"""GGUF import on files written here the way llama.cpp writes them (tests/support/gguf_files.py),
from tiny models whose every weight is known: the imported model must compute what the
original does, its tokenizer must give the same ids, and bad files get one clear line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxspec
from mlxspec.errors import IncompatiblePair, InsufficientMemory, ModelLoadError
from mlxspec.models.gguf import GGUFError, UnsupportedGGUF, import_gguf, imported_folder
from tests.support.gguf_files import write_gguf

ARCHS = ["llama", "qwen2", "qwen3", "gemma3_text"]
IDS = list(range(20, 52))
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "Hello, world!  Two  spaces.",
    "naïve café 日本 🙂",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory, monkeypatch_module):
    folder = tmp_path_factory.mktemp("mlxspec-cache")
    monkeypatch_module.setenv("MLXSPEC_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def logits_of(model, ids):
    return model(mx.array([ids]))[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_float_import_computes_what_the_original_does(factory, tmp_path, cache_dir, arch):
    import mlx_lm

    source = factory.pair(arch)[0]
    gguf = write_gguf(source, tmp_path / f"{arch}.gguf")
    folder = import_gguf(gguf, dtype="float32")
    original, original_tokenizer = mlx_lm.load(str(source))
    imported, tokenizer = mlx_lm.load(str(folder))
    assert mx.allclose(logits_of(original, IDS), logits_of(imported, IDS), atol=1e-4).item()
    for text in TEXTS:
        assert tokenizer.encode(text) == original_tokenizer.encode(text), text
    assert set(tokenizer.eos_token_ids) == set(original_tokenizer.eos_token_ids)
    assert tokenizer.chat_template == original_tokenizer.chat_template


def test_native_blocks_are_kept_bit_for_bit(factory, tmp_path, cache_dir):
    """Q4_0 / Q4_1 / Q8_0 become MLX's (weight, scales, biases) exactly as MLX's own GGUF
    reader gives them, with nothing rounded again."""
    source = factory.pair("llama")[0]
    for qtype, dtype in (("Q4_0", "q4"), ("Q4_1", "q4"), ("Q8_0", "q8")):
        gguf = write_gguf(source, tmp_path / f"{qtype}.gguf", types={"matrix": qtype})
        reference = mx.load(str(gguf))  # MLX's own reader: these types only
        folder = import_gguf(gguf, dtype=dtype)
        imported = mx.load(str(folder / "model.safetensors"))
        name = "model.layers.0.mlp.down_proj"  # not permuted: the raw blocks
        for part in ("weight", "scales", "biases"):
            assert mx.array_equal(imported[f"{name}.{part}"], reference[f"blk.0.ffn_down.{part}"]).item(), (qtype, part)
        pair = mlxspec.load_pair(str(folder), no_draft=True)
        assert len(mlxspec.generate(pair, IDS[:8], max_tokens=4, gamma=0).tokens) == 4


def test_quantized_types_are_dequantized_to_float(factory, tmp_path, cache_dir):
    """A Q8_0 file imported as float32 holds gguf-py's dequantized values."""
    source = factory.pair("qwen3")[0]
    gguf = write_gguf(source, tmp_path / "q8.gguf", types={"matrix": "Q8_0", "embedding": "Q8_0"})
    folder = import_gguf(gguf, dtype="float32")
    config = json.loads((folder / "config.json").read_text())
    assert "quantization" not in config
    weights = mx.load(str(folder / "model.safetensors"))
    assert all(w.dtype == mx.float32 for w in weights.values())
    original = mx.load(str(source / "model.safetensors"))["model.layers.1.mlp.up_proj.weight"]
    got = weights["model.layers.1.mlp.up_proj.weight"]
    assert 0 < mx.abs(got - original).max().item() < 0.05 * mx.abs(original).max().item()  # Q8_0's rounding, no more


def test_an_import_is_reused_while_the_file_is_unchanged(factory, tmp_path, cache_dir):
    gguf = write_gguf(factory.pair("llama")[0], tmp_path / "reuse.gguf")
    folder = import_gguf(gguf, dtype="float32")
    assert folder == imported_folder(gguf, "float32") and folder.is_relative_to(cache_dir)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(gguf, dtype="float32") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    write_gguf(factory.pair("qwen2")[0], gguf)  # the file changed: its new content's import
    changed = import_gguf(gguf, dtype="float32")
    assert json.loads((changed / "config.json").read_text())["model_type"] == "qwen2"


def test_bad_files_get_one_clear_line(factory, tmp_path, cache_dir):
    good = write_gguf(factory.pair("llama")[0], tmp_path / "good.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(GGUFError, match="not a complete GGUF file"):
        import_gguf(truncated)
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        import_gguf(text)
    other = write_gguf(factory.pair("llama")[0], tmp_path / "phi.gguf", architecture="phi3")
    with pytest.raises(UnsupportedGGUF, match="architecture 'phi3' is not supported"):
        import_gguf(other)


def test_an_unreadable_quantization_type_is_named(factory, tmp_path, cache_dir):
    import gguf

    path = tmp_path / "q81.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 40), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedGGUF, match="Q8_1"):
        import_gguf(path)


def test_a_conversion_that_does_not_fit_is_refused(factory, tmp_path, cache_dir, monkeypatch):
    gguf = write_gguf(factory.pair("llama")[0], tmp_path / "big.gguf")
    monkeypatch.setenv("MLXSPEC_MEMORY_LIMIT", "1KB")
    with pytest.raises(InsufficientMemory, match="memory"):
        import_gguf(gguf, dtype="float32", force=True)
    monkeypatch.delenv("MLXSPEC_MEMORY_LIMIT")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**6, 10**6 - 10, 10))
    with pytest.raises(InsufficientMemory, match="of disk"):
        import_gguf(gguf, dtype="float32", force=True)


def test_a_gguf_draft_with_another_vocabulary_is_refused(factory, tmp_path, cache_dir):
    target = write_gguf(factory.pair("llama")[0], tmp_path / "target.gguf")
    from mlxspec.models import synthetic
    from tests.conftest import stdlib_texts

    other_tokenizer = tmp_path / "other-tokenizer"
    synthetic.train_tokenizer(stdlib_texts(12)[6:], 480, other_tokenizer)
    stranger = tmp_path / "stranger"
    synthetic.build_model("llama", stranger, tokenizer_dir=other_tokenizer, seed=5, eos_token_ids=factory.eos)
    draft = write_gguf(stranger, tmp_path / "draft.gguf")
    with pytest.raises(IncompatiblePair, match="id \\d+ is"):
        mlxspec.load_pair(str(target), str(draft))


def test_cli_imports_a_gguf_given_as_target(factory, tmp_path, cache_dir):
    gguf = write_gguf(factory.pair("qwen3")[0], tmp_path / "cli.gguf")
    env = {**__import__("os").environ, "MLXSPEC_CACHE": str(tmp_path / "cli-cache")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxspec",
            "generate",
            "--target",
            str(gguf),
            "--no-draft",
            "--raw",
            "-m",
            "4",
            "--json",
            "hello",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert "importing cli.gguf as float32" in run.stderr
    assert json.loads(run.stdout)["stats"]["tokens"] == 4
    out = tmp_path / "imported"
    run = subprocess.run(
        [sys.executable, "-m", "mlxspec", "models", "import", str(gguf), "--dtype", "q8", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0 and run.stdout.strip() == str(out), run.stderr
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    run = subprocess.run(
        [sys.executable, "-m", "mlxspec", "models", "import", str(tmp_path / "missing.gguf")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "no GGUF file" in run.stderr


def test_the_same_file_under_another_name_finds_its_import(factory, tmp_path):
    """An import is keyed by its source's content: `models import` of a copy under another
    name prints the folder already made, converts nothing and keeps one folder; a file of
    other content under the copy's name gets its own import."""
    first = write_gguf(factory.pair("llama")[0], tmp_path / "SmolThing.Q8.gguf")
    env = {**__import__("os").environ, "MLXSPEC_CACHE": str(tmp_path / "cache")}

    def imported(path: Path) -> Path:
        done = subprocess.run(
            [sys.executable, "-m", "mlxspec", "models", "import", str(path), "--dtype", "float32"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return Path(done.stdout.strip())

    folder = imported(first)
    written = (folder / "model.safetensors").stat().st_mtime_ns
    copy = shutil.copy(first, tmp_path / "smol-thing-q8-downloaded-again.gguf")
    assert imported(copy) == folder and (folder / "model.safetensors").stat().st_mtime_ns == written
    assert imported(first) == folder  # the first name is still known, unhashed
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == [folder.name]
    (tmp_path / "other").mkdir()
    other = write_gguf(factory.pair("qwen3")[0], tmp_path / "other" / "smol-thing-q8-downloaded-again.gguf")
    assert imported(other) != folder


def test_a_truncated_file_through_the_cli_is_one_line(factory, tmp_path):
    good = write_gguf(factory.pair("llama")[0], tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:4096])
    env = {**__import__("os").environ, "MLXSPEC_CACHE": str(tmp_path / "c")}
    run = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "--target", str(cut), "--no-draft", "hi"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 1 and run.stderr.count("\n") <= 2 and "not a complete GGUF file" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert issubclass(GGUFError, ModelLoadError)


def test_a_gguf_named_file_that_is_not_one_is_refused_before_any_importing_line(capsys, tmp_path, cache_dir):
    from tests.cli.test_cli import run

    text = tmp_path / "notes.gguf"
    text.write_text("not a model at all")
    code, _, err = run(capsys, "generate", "hi", "-t", str(text), "--no-draft", "-m", "2")
    assert code != 0 and "not a GGUF file" in err and "importing" not in err
    assert len(err.strip().splitlines()) == 1
