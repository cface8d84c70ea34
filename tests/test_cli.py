"""The command line, run in-process through its real entry point (and once as a process):
exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from mlxspec import synthetic
from mlxspec.cli import main
from tests.conftest import stdlib_texts


def run(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.fixture(scope="module")
def folders(factory):
    return [str(p) for p in factory.pair("llama")]


def test_generate_streams_text_and_prints_stats(capsys, folders):
    target, draft = folders
    code, out, err = run(capsys, "generate", "def main(", "-t", target, "-d", draft, "-m", "24")
    assert code == 0
    _, as_json, _ = run(capsys, "generate", "def main(", "-t", target, "-d", draft, "-m", "24", "--json")
    assert out == json.loads(as_json)["text"] + "\n"  # what streamed is the whole completion
    assert "24 tokens" in err and "tok/s" in err and "γ auto" in err


def test_generate_json(capsys, folders):
    target, draft = folders
    code, out, err = run(capsys, "generate", "def main(", "-t", target, "-d", draft, "-m", "16", "--json")
    assert code == 0
    data = json.loads(out)
    assert {"text", "tokens", "prompt_tokens", "stats", "finish_reason", "target", "draft"} <= set(data)
    stats = data["stats"]
    for field in (
        "tokens",
        "rounds",
        "drafted",
        "accepted",
        "tested",
        "acceptance_rate",
        "tokens_per_round",
        "per_position_acceptance",
        "prefill_seconds",
        "decode_seconds",
        "tokens_per_second",
    ):
        assert field in stats, field
    assert stats["tokens"] == len(data["tokens"]) == 16
    assert stats["accepted"] <= stats["tested"] <= stats["drafted"]
    assert 0 <= stats["acceptance_rate"] <= 1


def test_no_draft_gives_the_same_tokens_at_temperature_zero(capsys, folders):
    target, draft = folders
    runs = []
    for extra in (["--no-draft"], ["-g", "3"], ["-g", "6"]):
        code, out, _ = run(capsys, "generate", "class Point:", "-t", target, "-d", draft, "-m", "30", "--json", *extra)
        assert code == 0
        runs.append(json.loads(out)["tokens"])
    assert runs[0] == runs[1] == runs[2]


def test_seeded_sampling_is_reproducible(capsys, folders):
    """With a fixed gamma a seed fixes the sample. (With auto, each round's draft length
    follows measured timings, so a seed fixes the distribution, not the exact sample.)"""
    target, draft = folders
    for gamma in ("0", "3"):
        outs = [
            run(
                capsys,
                "generate",
                "import os",
                "-t",
                target,
                "-d",
                draft,
                "-g",
                gamma,
                "-m",
                "20",
                "--json",
                "--temp",
                "0.9",
                "--top-p",
                "0.95",
                "--seed",
                "4",
            )[1]
            for _ in range(2)
        ]
        assert json.loads(outs[0])["tokens"] == json.loads(outs[1])["tokens"]


@pytest.fixture(scope="module")
def bad_folders(factory, folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    corrupt = root / "corrupt"
    shutil.copytree(folders[0], corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    no_weights = root / "no-weights"
    shutil.copytree(folders[0], no_weights)
    (no_weights / "model.safetensors").unlink()
    other_tok = root / "other-tok"
    synthetic.train_tokenizer(stdlib_texts(60)[30:], 512, other_tok)
    foreign = root / "foreign-draft"
    synthetic.build_model("llama", foreign, tokenizer_dir=other_tok, seed=3, eos_token_ids=factory.eos)
    chunked = factory.model("llama4-chunked", arch="llama4", seed=1)
    short = factory.model("short-context", arch="llama", seed=1, overrides={"max_position_embeddings": 32})
    configs = {}
    for name, edit in (
        ("config-list", lambda config: [config]),
        ("no-heads", lambda config: {k: v for k, v in config.items() if k != "num_attention_heads"}),
        ("heads-text", lambda config: {**config, "num_attention_heads": "four"}),
    ):
        folder = root / name
        shutil.copytree(folders[0], folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(edit(config)))
        configs[name.replace("-", "_")] = str(folder)
    return {
        "corrupt": str(corrupt),
        "no_weights": str(no_weights),
        "foreign": str(foreign),
        "chunked": str(chunked),
        "short": str(short),
        **configs,
    }


BAD_INPUTS = {
    "missing folder": (["-t", "./no/such/model"], "no model folder"),
    "unknown repo offline": (["-t", "mlx-community/No-Such-Model-4bit"], "not in the local Hugging Face cache"),
    "corrupt weights": (["-t", "{corrupt}", "--no-draft"], "cannot load"),
    "missing weights": (["-t", "{no_weights}", "--no-draft"], "no *.safetensors"),
    "tokenizers differ": (["-t", "{target}", "-d", "{foreign}"], "tokenizers differ: id"),
    "unknown cache type": (["-t", "{chunked}", "--no-draft"], "ChunkedKVCache is not supported"),
    "xtc": (["-t", "{target}", "-d", "{draft}", "--xtc-probability", "0.5"], "XTC sampling cannot be kept exact"),
    "negative gamma": (["-t", "{target}", "-d", "{draft}", "-g", "-1"], "must be a whole number >= 0"),
    "negative temperature": (["-t", "{target}", "-d", "{draft}", "--temp", "-0.5"], "temperature must be >= 0"),
    "top-p zero": (["-t", "{target}", "-d", "{draft}", "--top-p", "0"], "top-p must be in (0, 1]"),
    "top-p above one": (["-t", "{target}", "-d", "{draft}", "--top-p", "1.2"], "top-p must be in (0, 1]"),
    "gamma not a number": (["-t", "{target}", "-g", "lots"], "must be a whole number >= 0 or 'auto', got 'lots'"),
    "draft without target": (["-d", "{draft}"], "--draft needs a --target"),
    "not enough memory": (["-t", "{target}", "-d", "{draft}", "ENV:MLXSPEC_MEMORY_LIMIT=10MB"], "needs about"),
    "config.json a list": (["-t", "{config_list}", "--no-draft"], "config.json holds a JSON list, not an object"),
    "config.json lacks a field": (["-t", "{no_heads}", "--no-draft"], "config.json lacks num_attention_heads"),
    "config.json field not a number": (
        ["-t", "{heads_text}", "--no-draft"],
        "config.json: num_attention_heads is 'four', not a whole number",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_a_nonzero_exit(capsys, monkeypatch, folders, bad_folders, case):
    args, message = BAD_INPUTS[case]
    names = {"target": folders[0], "draft": folders[1], **bad_folders}
    argv = []
    for a in args:
        if a.startswith("ENV:"):
            key, value = a[4:].split("=")
            monkeypatch.setenv(key, value)
        else:
            argv.append(a.format(**names))
    code, out, err = run(capsys, "generate", "hello", *argv)
    assert code != 0
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and out == ""


def test_empty_prompt(capsys, folders):
    code, _, err = run(capsys, "generate", "  ", "-t", folders[0], "-d", folders[1])
    assert code == 2 and err.strip() == "error: the prompt is empty"


def test_prompt_longer_than_the_context(capsys, bad_folders):
    code, _, err = run(capsys, "generate", "word " * 60, "-t", bad_folders["short"], "--raw", "--no-draft")
    assert code == 1 and "reads at most 32" in err and len(err.strip().splitlines()) == 1


def test_the_installed_command_runs_as_a_process(folders):
    """Once through a real process: the console entry point, stdout/stderr and exit code."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxspec",
            "generate",
            "def f(",
            "-t",
            folders[0],
            "-d",
            folders[1],
            "-m",
            "8",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"]["tokens"] == 8
    bad = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "x", "-t", "/no/such"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 1 and bad.stderr.strip() == "error: no model folder or .gguf file at /no/such"
