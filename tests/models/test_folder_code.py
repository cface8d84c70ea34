"""A model folder never runs its own code (issue 19, item 1): one that asks for it is
refused in one line, with "y" on stdin, and nothing reaches stdout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE = """
from pathlib import Path
Path(MARKER).write_text("the folder's code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def folder_asking_for_code(source: Path, out: Path, file: str) -> Path:
    shutil.copytree(source, out)
    # an absolute marker: transformers runs a copy of the file from its modules cache
    (out / "evil.py").write_text(CODE.replace("MARKER", repr(str(out / "ran.txt"))))
    data = json.loads((out / file).read_text())
    data["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    if file == "tokenizer_config.json":
        data["tokenizer_class"] = "EvilTokenizer"
    (out / file).write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("file", ["tokenizer_config.json", "config.json"])
def test_a_folder_asking_for_its_own_code_is_refused_and_its_code_never_runs(factory, tmp_path, file):
    folder = folder_asking_for_code(factory.pair("llama")[0], tmp_path / "evil", file)
    run = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "hello", "--target", str(folder), "--no-draft", "--json"],
        input="y\n",
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"),
        timeout=120,
    )
    assert not (folder / "ran.txt").exists()
    assert run.returncode == 1 and run.stdout == "", (run.stdout, run.stderr)
    assert run.stderr.count("\n") == 1 and "own Python code (auto_map)" in run.stderr and file in run.stderr


def test_the_tokenizer_is_loaded_with_remote_code_off(factory, tmp_path, monkeypatch):
    """Below the folder check, the tokenizer is still asked for without remote code: with
    the check out of the way the load fails and the code does not run."""
    import mlxspec
    from mlxspec.errors import ModelLoadError
    from mlxspec.models import loading

    folder = folder_asking_for_code(factory.pair("llama")[0], tmp_path / "evil", "tokenizer_config.json")
    monkeypatch.setattr(loading, "refuse_custom_code", lambda path: None)
    monkeypatch.setattr("builtins.input", lambda *a: "y")
    with pytest.raises(ModelLoadError):
        mlxspec.load_pair(str(folder), no_draft=True)
    assert not (folder / "ran.txt").exists()
