"""Messages that say what failed, in one line, naming the file (issue 19, item 6): a chat
template's sandbox violation or empty rendering, and the "internal error" paths an audit of
bad inputs found (each now a line of its own)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.cli.test_cli import run


def with_template(source, out, template: str):
    shutil.copytree(source, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


TEMPLATES = {
    "sandbox violation": ("{{ ''.__class__.__mro__ }}", "failed: access to attribute '__class__'"),
    "renders nothing": ("{% if false %}x{% endif %}", "rendered the prompt as nothing"),
    "raises itself": ("{{ raise_exception('roles must alternate') }}", "failed: roles must alternate"),
}


@pytest.mark.parametrize("case", list(TEMPLATES))
@pytest.mark.parametrize("command", ["generate", "cache-prompt"])
def test_a_failing_chat_template_is_named(capsys, factory, tmp_path, case, command):
    template, message = TEMPLATES[case]
    folder = with_template(factory.pair("llama")[0], tmp_path / "model", template)
    extra = ["-o", str(tmp_path / "c.safetensors")] if command == "cache-prompt" else []
    code, out, err = run(capsys, command, "hello", "-t", str(folder), "--no-draft", *extra)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"the model's chat template ({folder / 'tokenizer_config.json'})" in err and message in err, err
    assert "internal error" not in err


# --- the audit: bad inputs that ended as "internal error" -----------------------------------
def test_a_chat_template_that_is_not_text_is_named(capsys, factory, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(factory.pair("llama")[0], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": 5}))
    code, out, err = run(capsys, "generate", "hello", "-t", str(folder), "--no-draft")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "internal error" not in err, err
    assert "the model's chat template" in err and "failed" in err


@pytest.mark.parametrize("option", [[], ["--system", "\udcff"]])
def test_text_that_is_not_utf8_is_refused(capsys, factory, option):
    """Bytes that are not UTF-8 on a command line arrive as lone surrogates."""
    prompt = "hello" if option else "caf\udce9"
    code, out, err = run(capsys, "generate", prompt, "-t", str(factory.pair("llama")[0]), "--no-draft", *option)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not valid UTF-8 text" in err, err


@pytest.mark.parametrize("columns", ["²", "١٢", "wide"])
def test_a_terminal_size_that_is_not_ascii_digits_is_ignored(columns):
    """rich took `COLUMNS=²` for a number (isdigit) and failed on int(): every command died
    with a traceback. The size is dropped; the command runs."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": columns, "LINES": columns}
    done = subprocess.run(
        [sys.executable, "-m", "mlxspec", "models", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)
