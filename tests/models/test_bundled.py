"""The bundled tiny pair: shipped, offline, loadable like any folder, and the default."""

from __future__ import annotations

import json
import subprocess
import sys

import mlxspec
from mlxspec.models.pairs import BUNDLED_DRAFT, BUNDLED_TARGET
from tests.cli.test_cli import run


def test_bundled_files_and_size():
    total = 0
    for folder in (BUNDLED_TARGET, BUNDLED_DRAFT):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (folder / name).exists(), folder / name
        total += sum(f.stat().st_size for f in folder.iterdir())
    assert total <= 20 * 2**20, f"{total / 2**20:.1f} MiB"
    assert (BUNDLED_TARGET.parent / "README.md").exists()  # the model card


def test_loads_with_mlx_lm_and_is_the_default(monkeypatch):
    import mlx_lm

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = mlx_lm.load(str(BUNDLED_TARGET))
    pair = mlxspec.load_pair()
    assert pair.target.path == BUNDLED_TARGET and pair.draft.path == BUNDLED_DRAFT
    assert pair.target.width == pair.draft.width == len(tokenizer.get_vocab())
    result = mlxspec.generate(pair, "def fibonacci(n):", max_tokens=24, gamma=4)
    assert result.stats.tokens > 0 and result.stats.acceptance_rate is not None


def test_bundled_greedy_speculation_is_exact():
    pair = mlxspec.load_pair()
    prompt = "import os\n\n\ndef list_files(root):\n"
    standard = mlxspec.generate(pair, prompt, max_tokens=64, gamma=0)
    for gamma in (2, 5, "auto"):
        assert mlxspec.generate(pair, prompt, max_tokens=64, gamma=gamma).tokens == standard.tokens


def test_preset_tiny_is_the_bundled_pair(capsys):
    code, out, _ = run(capsys, "generate", "class Point:", "--pair", "tiny", "-m", "8", "--json")
    assert code == 0 and json.loads(out)["target"].endswith("tiny-target")


def test_generate_with_no_model_arguments_offline():
    """The issue's 'done when': on a fresh install, offline, no model named."""
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "def main(", "--json", "-m", "32"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["stats"]["acceptance_rate"] is not None and data["stats"]["tokens"] > 0


def test_race_on_the_bundled_pair(capsys):
    """The README's first command (shorter): both texts, identical, and a note on stderr that
    says what the bundled pair is and how to get a real one."""
    code, out, err = run(capsys, "race", "-m", "32")
    assert code == 0 and "speculative (" in out and "Outputs identical." in out
    assert err.count("The bundled pair is a 4M-parameter toy") == 1 and "--pair smollm2" in err


def test_cache_options_on_the_command_line_stay_exact(capsys):
    """--max-kv-size (a window with kept tokens, wrapping here) and --kv-bits (quantized KV;
    the bundled pair's 64-wide heads take the default group of 64): every draft length gives
    standard decoding's ids."""
    for extra in (["--max-kv-size", "12"], ["--kv-bits", "4"]):
        runs = [
            json.loads(run(capsys, "generate", "import os\n\ndef main(", "-m", "32", "--json", "-g", g, *extra)[1])
            for g in ("0", "3", "auto")
        ]
        assert runs[0]["tokens"] == runs[1]["tokens"] == runs[2]["tokens"] and len(runs[0]["tokens"]) == 32, extra


def test_auto_decodes_plainly_when_the_draft_costs_more_than_its_target():
    """The bundled pair used the other way round: the 5-layer model drafts for the 2-layer
    one, and a round of 2 drafts costs ~6 plain steps here. `--gamma auto` kept probing
    (0.59x of standard decoding); now its opening round shows what a round costs, later
    probes are held to the budget (the draft's catching up on a plain stretch alone costs
    more per id than the budget earns), and nearly every id comes from plain steps. What the
    controller chose is asserted, not the wall clock; the speed is in demos/never_slower.py."""
    pair = mlxspec.load_pair(str(BUNDLED_DRAFT), str(BUNDLED_TARGET))
    prompt = "import os\n\n\ndef list_files(root):\n"
    rounds = [e for e in mlxspec.stream(pair, prompt, max_tokens=384, raw=True) if isinstance(e, mlxspec.Round)]
    emitted = [t for r in rounds for t in r.emitted]
    drafting = [r for r in rounds if r.gamma]
    plain_ids = sum(len(r.emitted) for r in rounds if not r.gamma)
    assert len(emitted) >= 256
    assert len(drafting) <= 3 and plain_ids >= 0.95 * len(emitted)
    assert emitted == mlxspec.generate(pair, prompt, max_tokens=384, raw=True, gamma=0).tokens[: len(emitted)]
