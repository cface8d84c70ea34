"""The command line, run in-process through its real entry point (and once as a process):
exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from mlxspec.cli import main
from mlxspec.models import synthetic
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


def test_auto_never_drafts_blind_with_a_draft_that_outweighs_its_target(capsys):
    """The bundled pair the other way round: the 5-layer model drafts for the 2-layer one (six
    times its weights). `--gamma auto` used to draft its first round blind, a tenth of a short
    generation's time; priced from the weights, it decodes plainly from the start."""
    from mlxspec.models.pairs import BUNDLED_DRAFT, BUNDLED_TARGET

    swapped = ["-t", str(BUNDLED_DRAFT), "-d", str(BUNDLED_TARGET), "-m", "48", "--json"]
    code, out, _ = run(capsys, "generate", "def main(", *swapped)
    auto = json.loads(out)
    _, out, _ = run(capsys, "generate", "def main(", *swapped, "-g", "0")
    assert code == 0 and auto["tokens"] == json.loads(out)["tokens"]
    assert auto["stats"]["model_rounds"] == 0 and auto["stats"]["plain_rounds"] == auto["stats"]["rounds"] > 0


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
    "negative gamma": (["-t", "{target}", "-d", "{draft}", "-g", "-1"], "must be a whole number from 0 to 64"),
    "negative temperature": (["-t", "{target}", "-d", "{draft}", "--temp", "-0.5"], "temperature must be >= 0"),
    "top-p zero": (["-t", "{target}", "-d", "{draft}", "--top-p", "0"], "top-p must be in (0, 1]"),
    "top-p above one": (["-t", "{target}", "-d", "{draft}", "--top-p", "1.2"], "top-p must be in (0, 1]"),
    "gamma not a number": (
        ["-t", "{target}", "-g", "lots"],
        "must be a whole number from 0 to 64 or 'auto', got 'lots'",
    ),
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


@pytest.mark.slow
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


def test_a_bare_command_prints_its_usage_and_commands_and_succeeds():
    """`mlxspec` alone, as a newcomer first types it: the usage and the commands on stdout,
    exit 0 (click 8.2 and later make it a usage error, exit 2, the help on stderr)."""
    done = subprocess.run([sys.executable, "-m", "mlxspec"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("Usage: mlxspec ")
    assert all(f"  {command} " in done.stdout for command in ("generate", "chat", "race", "serve", "models"))


def loading_steps(cache, *args) -> list[str]:
    """The loading steps (lines ending in "…") the real command shows on a terminal's stderr
    (rich takes TTY_COMPATIBLE=1 for one), with mlxspec's cache at `cache`."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLXSPEC_CACHE=str(cache), TTY_COMPATIBLE="1")
    done = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", *args, "-m", "2"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = re.sub(r"\x1b\[[0-9;]*m", "", done.stderr).splitlines()
    return [line for line in lines if line.endswith("…")]


@pytest.mark.parametrize("pair", ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_finding_a_pair_is_said_in_full_once_per_cache_then_in_one_line(tmp_path, pair):
    """The first command with a cache shows each step of finding the pair (smollm2's: its hub
    repo, then its registry fallback and why); the next ones only what loads."""
    if pair == "smollm2":  # the tests' import of it, in a cache of this test's own
        from tests.support import real_models

        real = real_models.folder(real_models.SMOLLM2).parent.parent
        for folder in ("models", "registry"):
            (tmp_path / folder).symlink_to(real / folder)
    first = loading_steps(tmp_path, "Hello", "--pair", pair)
    assert len(first) >= 3 and first[0].startswith("Finding ")
    again = loading_steps(tmp_path, "Hello", "--pair", pair)
    assert again == [first[-1]] and again[0].startswith("Loading target ")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seed", "-1"], "seed must be a whole number from 0 to 2^64 - 1, got -1"),
        (["--seed", str(2**64)], "seed must be a whole number from 0 to 2^64 - 1"),
        (["--stop", ""], "a stop text is empty"),
        (["--max-kv-size", "2"], "max KV size must be a whole number above 4"),
        (["--kv-bits", "7"], "KV bits must be one of"),
        # issue 39: a digit only to str.isdigit was an internal error, Arabic-Indic digits a number
        (["--tree", "²"], "tree (nodes per round) must be a whole number from 0 to 256 or 'auto', got '²'"),
        (["--gamma", "²"], "gamma (draft length) must be a whole number from 0 to 64 or 'auto', got '²'"),
        (["--gamma", "١٢"], "gamma (draft length) must be a whole number from 0 to 64 or 'auto', got '١٢'"),
        # issue 39: one request's round held the machine for minutes
        (["--gamma", "1500"], "gamma (draft length) must be at most 64, got 1500: longer chains only cost time"),
        (["--tree", "50000"], "tree (nodes per round) must be at most 256, got 50000: bigger trees cost more"),
        (["--tree", "9" * 5000], "tree (nodes per round) must be at most 256, got 99999999999999999999… (5000 digits)"),
    ],
)
def test_bad_options_are_refused_before_loading(capsys, args, message):
    """Exit 2 and one line before any model loads (the target named does not exist)."""
    code, out, err = run(capsys, "generate", "hello", "-t", "/no/such/model", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and out == ""


def test_a_target_alone_drafts_by_prompt_lookup_and_says_so(capsys, folders, tmp_path, monkeypatch):
    target, draft = folders
    code, out, err = run(capsys, "generate", "def main(", "-t", target, "-m", "16", "--json")
    assert code == 0 and json.loads(out)["prompt_lookup"] is True and json.loads(out)["draft"] is None
    assert "drafting by prompt lookup" in err and "--draft MODEL" in err and "--no-draft" in err
    code, _, err = run(capsys, "generate", "def main(", "-t", target, "-m", "16")
    assert code == 0 and "drafting by prompt lookup (" in err.strip().splitlines()[-1]  # the stats line
    # a preset's draft with the same tokenizer, already on this machine, is named
    presets = tmp_path / "models.toml"
    presets.write_text(f'[other]\ntarget = "/elsewhere/model"\ndraft = "{draft}"\n')
    monkeypatch.setenv("MLXSPEC_MODELS", str(presets))
    code, _, err = run(capsys, "generate", "def main(", "-t", target, "-m", "4")
    assert code == 0 and f"--draft {draft}" in err
    # and where a preset names this very target: its name, not the draft's long path
    presets.write_text(presets.read_text() + f'[mine]\ntarget = "{target}"\ndraft = "{draft}"\n')
    code, _, err = run(capsys, "generate", "def main(", "-t", target, "-m", "4")
    assert code == 0 and "on this machine: --pair mine;" in err and draft not in err


@pytest.mark.slow
def test_smollm2_under_another_name_is_its_import_and_the_tip_names_the_preset(tmp_path):
    """SmolLM2's GGUF copied under another name, as a newcomer downloads it: no second import,
    and the prompt-lookup tip names `--pair smollm2`, not a folder inside the package."""
    from tests.support import real_models

    cache = tmp_path / "cache"
    imported = real_models.folder(real_models.SMOLLM2)
    (cache / "models").mkdir(parents=True)
    shutil.copytree(imported, cache / "models" / imported.name, copy_function=os.link)  # the tests' own, linked
    (cache / "registry").symlink_to(imported.parent.parent / "registry")
    copy = shutil.copy(real_models.gguf_file(real_models.SMOLLM2), tmp_path / "smollm2-135m-instruct-q4_1.gguf")
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLXSPEC_CACHE=str(cache))
    done = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "Hi", "-t", str(copy), "-m", "2"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "importing" not in done.stderr and sorted(p.name for p in (cache / "models").iterdir()) == [imported.name]
    assert "same tokenizer is on this machine: --pair smollm2;" in done.stderr and "assets" not in done.stderr


def test_the_stats_line_is_one_line_under_a_pipe(capsys, folders):
    """stderr is not a terminal here: the stats line is never wrapped, however long."""
    target, draft = folders
    code, _, err = run(capsys, "generate", "def main(", "-t", target, "-d", draft, "--ngram", "-m", "24")
    line = err.strip().splitlines()[-1]
    assert code == 0 and line.startswith("24 tokens · ") and "γ auto" in line and "prefill" in line


def test_stats_line_wraps_only_between_parts():
    import io

    from rich.console import Console

    from mlxspec.drafting.verdict import Judged
    from mlxspec.stats import Stats
    from mlxspec.views.summary import stats_line

    stats = Stats(tokens=64, emitted=70, rounds=20, drafted=60, tested=40, accepted=30, decode_seconds=0.5)
    stats.gamma, stats.prompt_tokens, stats.prefill_seconds = "auto", 120, 0.04
    stats.plain_rounds, stats.ngram_rounds = 4, 3
    line = stats_line(stats, judged=Judged(1.2, False, "faster"), reused=100, lookup=True)
    parts = line.plain.split(" · ")
    for width in (40, 50, 80, 160):
        out = io.StringIO()
        Console(file=out, width=width).print(line)
        rows = out.getvalue().splitlines()
        assert all(len(row) <= width for row in rows) and len(rows) == len(line.lines(width))
        assert [p for row in rows for p in row.strip().split(" · ")] == parts  # no part cut
    out = io.StringIO()
    Console(file=out, width=30).print(line, soft_wrap=True)
    assert out.getvalue() == line.plain + "\n"
    assert stats.tokens_per_round == 70 / 20  # emitted ids over rounds: >= 1 always


def test_stats_line_counts_one_in_the_singular():
    from mlxspec.stats import Stats
    from mlxspec.views.summary import stats_line

    stats = Stats(tokens=1, emitted=2, rounds=2, drafted=2, tested=2, accepted=0, decode_seconds=0.5)
    stats.gamma, stats.prompt_tokens, stats.prefill_seconds = "auto", 1, 0.04
    stats.plain_rounds, stats.ngram_rounds, stats.early_stops = 1, 1, 1
    plain = stats_line(stats).plain
    for part in ("1 token ·", "1 plain step ·", "1 n-gram round ·", "1 early stop ·", "(1 token)"):
        assert part in plain, (part, plain)
    assert "(1 new of 1 token)" in stats_line(stats, reused=0).plain


def test_json_tokens_per_round_is_at_least_one(capsys, folders):
    target, draft = folders
    for extra in ([], ["--temp", "1", "--seed", "3"], ["--no-draft"]):
        code, out, _ = run(capsys, "generate", "x", "-t", target, "-d", draft, "-m", "12", "--json", *extra)
        stats = json.loads(out)["stats"]
        assert code == 0 and stats["tokens_per_round"] >= 1 and stats["rounds"] > 0


def test_system_prompt_reaches_the_template(capsys, folders):
    target, draft = folders
    plain = json.loads(run(capsys, "generate", "hi", "-t", target, "-d", draft, "-m", "2", "--json")[1])
    told = json.loads(
        run(capsys, "generate", "hi", "-t", target, "-d", draft, "-m", "2", "--json", "--system", "Be brief.")[1]
    )
    assert told["prompt_tokens"] > plain["prompt_tokens"]


@pytest.mark.parametrize(
    "command",
    ["", "generate", "chat", "race", "bench", "models", "models download", "models import", "cache-prompt"],
)
def test_help_at_80_columns_shows_metavars_not_types(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, *command.split(), "--help")
    assert code == 0 and out.startswith("Usage: mlxspec")
    for noise in ("<bool>", "<str>", "<int>", "<float>", "[default: ("):
        assert noise not in out, (command, noise)
    assert "{" not in out.splitlines()[0]
    assert all(len(line) <= 80 for line in out.splitlines())
    if command in ("generate", "race"):
        assert ("PROMPT" if command == "generate" else "[PROMPT]") in out.splitlines()[0]


def test_output_paths_are_checked_before_any_work(capsys):
    """A folder that does not exist: exit 2, one line, before the models load (the target
    named does not exist either, and is not what is reported)."""
    for args in (
        ["race", "--svg", "/nonexistent/dir/x.svg"],
        ["race", "--html", "/nonexistent/dir/x.html"],
        ["bench", "--csv", "/nonexistent/dir/x.csv"],
        ["bench", "--plot", "/nonexistent/dir/x.png"],
        ["cache-prompt", "text", "--out", "/nonexistent/dir/x.safetensors"],
    ):
        code, out, err = run(capsys, *args, "-t", "/no/such/model")
        assert code == 2 and "no folder /nonexistent/dir" in err and len(err.strip().splitlines()) == 1, args


def test_max_kv_size_on_a_model_with_its_own_caches_says_it_does_not_apply(capsys, factory):
    """mlx-lm hands max_kv_size only to models without a make_cache of their own (gemma3_text
    builds its sliding windows itself; this mlx-lm's llama builds its layers too, so SmolLM2
    is one): the run goes on, exact, and one line says the option did nothing. qwen3 takes it."""
    target, draft = (str(p) for p in factory.pair("gemma3_text"))
    code, out, err = run(capsys, "generate", "def f(", "-t", target, "-d", draft, "-m", "8", "--max-kv-size", "16")
    assert code == 0 and out.strip()
    assert "--max-kv-size does not apply to" in err and "own caches" in err
    code, out, err = run(
        capsys, "generate", "def f(", "-t", *(factory.pair("qwen3")[:1]), "--no-draft", "-m", "4", "--max-kv-size", "16"
    )
    assert code == 0 and "does not apply" not in err


def test_no_ngram_with_nothing_else_to_draft_with_is_refused(capsys, folders):
    target, _ = folders
    for args in (["-t", target, "--no-ngram"], ["-t", target, "-d", "ngram", "--no-ngram"]):
        code, _, err = run(capsys, "generate", "x", *args)
        assert code == 2 and "--no-ngram leaves nothing to draft with" in err and len(err.strip().splitlines()) == 1
    code, _, _ = run(capsys, "generate", "x", "-t", target, "--no-ngram", "--no-draft", "-m", "2")
    assert code == 0


def test_alpha_is_a_dash_until_a_handful_of_drafts_were_tested():
    """Two tested drafts say nothing of α: '–', not 0.00; eight or more give the rate. A
    standard run shows no α at all."""
    from mlxspec.stats import MIN_TESTED_FOR_ALPHA, Stats
    from mlxspec.views.summary import stats_line

    few = Stats(tokens=20, emitted=20, rounds=19, drafted=4, tested=2, accepted=0, decode_seconds=0.5, gamma="auto")
    assert "α –" in stats_line(few).plain and "α 0.00" not in stats_line(few).plain
    enough = Stats(tokens=20, emitted=20, rounds=8, drafted=16, tested=MIN_TESTED_FOR_ALPHA, accepted=4)
    enough.decode_seconds, enough.gamma = 0.5, 2
    assert "α 0.50" in stats_line(enough).plain
    standard = Stats(tokens=20, emitted=20, rounds=20, decode_seconds=0.5)
    assert "α" not in stats_line(standard).plain


def test_piped_tables_follow_columns_and_carry_no_trailing_spaces(capsys, monkeypatch):
    for columns, widest in (("70", 70), ("200", 200), (None, 160)):
        if columns is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", columns)
        code, out, _ = run(capsys, "models")
        lines = out.splitlines()
        assert code == 0 and lines and "tiny" in out
        assert all(len(line) <= widest for line in lines), (columns, max(map(len, lines)))
        assert all(line == line.rstrip() for line in lines)
    monkeypatch.setenv("COLUMNS", "70")
    code, out, _ = run(capsys, "models")
    assert max(map(len, out.splitlines())) > 40  # the narrow listing, not a table cut short


def test_piped_tables_without_columns_take_the_terminals_width(capsys, monkeypatch):
    """A shell does not export COLUMNS: `mlxspec models | less` at an 80-column terminal is
    80 wide, read from the terminal on stderr (here a real pseudo-terminal 72 columns wide)."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 72, 0, 0))
    monkeypatch.delenv("COLUMNS", raising=False)
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        from mlxspec.cli.common import terminal_columns, wide_console

        assert terminal_columns() == 72 and wide_console().width == 72
    os.close(leader)


def test_loading_steps_name_a_bundled_model_as_the_presets_do():
    from mlxspec.cli.common import bundled_by_name
    from mlxspec.models.presets import ASSETS

    assert bundled_by_name(f"Loading draft {ASSETS}/tiny-draft") == "Loading draft bundled:tiny-draft"
    assert (
        bundled_by_name("Finding HuggingFaceTB/SmolLM2-135M-Instruct") == "Finding HuggingFaceTB/SmolLM2-135M-Instruct"
    )


@pytest.mark.parametrize("gamma", ["0", "3", "auto"])
def test_a_tiny_temperature_or_top_p_decodes_greedily(capsys, folders, gamma):
    """A temperature below float32's normal range, or a top-p so small only the top id
    survives, is greedy decoding in the limit: the greedy reply, never an empty one."""
    target, draft = folders

    def tokens(*extra):
        code, out, err = run(
            capsys, "generate", "def main(", "-t", target, "-d", draft, "-m", "12", "-g", gamma, "--json", *extra
        )
        assert code == 0, err
        return json.loads(out)["tokens"]

    greedy = tokens("--temp", "0")
    assert greedy
    assert tokens("--temp", "1e-45") == greedy and tokens("--temp", "1e-39") == greedy
    assert tokens("--temp", "0.8", "--top-p", "1e-300", "--seed", "3") == greedy


def test_generate_says_in_plain_words_whether_speculation_helped(capsys, folders):
    """Before the figures (which stay the last line), one line without symbols: whether drafting
    paid on this run, as an estimate from its own acceptance and costs (chat's "≈1.06x est."),
    or why it cannot tell."""
    target, draft = folders
    code, _, err = run(capsys, "generate", "def main(", "-t", target, "-d", draft, "-g", "3", "-m", "48")
    lines = err.strip().splitlines()
    assert code == 0 and lines[-1].startswith("48 tokens · ") and "x est." in lines[-1]
    words = lines[-2]
    assert words.startswith("Speculative decoding ") and "α" not in words and "τ" not in words and "γ" not in words
    assert any(verdict in words for verdict in ("helped", "made little difference", "did not pay")), words
    assert "of the drafts" in words and "tokens per pass of the target" in words
    code, _, err = run(capsys, "generate", "def main(", "-t", target, "-d", draft, "-g", "3", "-m", "2")
    assert "too few drafts were tested to tell" in err.strip().splitlines()[-2]
    code, _, err = run(capsys, "generate", "def main(", "-t", target, "--no-draft", "-m", "4")
    assert "Speculative decoding" not in err  # no drafting, nothing to say of it


def test_plain_words_for_each_outcome():
    from mlxspec.drafting.verdict import Judged
    from mlxspec.stats import Stats
    from mlxspec.views.summary import plain_words

    def estimated(speedup, verdict):
        return Judged(speedup, False, verdict)

    def run_of(gamma=3, **counts):
        stats = Stats(tokens=60, emitted=60, decode_seconds=1.0, **counts)
        stats.gamma = gamma
        return stats

    helped = run_of(rounds=20, drafted=60, tested=50, accepted=40, model_rounds=20)
    said = plain_words(helped, estimated(1.8, "faster"))
    assert said.startswith("Speculative decoding helped: about 1.80x the speed of the target alone, estimated")
    assert plain_words(helped, estimated(1.0, "noise")).startswith("Speculative decoding made little difference here")
    slower = plain_words(helped, estimated(0.6, "slower"))
    assert slower.startswith("Speculative decoding did not pay here: about 0.60x") and "--no-draft" in slower
    plain = run_of("auto", rounds=60, plain_rounds=58, drafted=4, tested=3, accepted=1, model_rounds=2)
    assert "58 of 60 steps were the target's alone" in plain_words(plain, None)
    assert plain_words(Stats(tokens=4, rounds=4, plain_rounds=4), None) is None  # standard decoding


def test_json_names_a_bundled_model_as_the_presets_do(capsys):
    code, out, _ = run(capsys, "generate", "def f(", "-m", "2", "--json")
    data = json.loads(out)
    assert code == 0 and (data["target"], data["draft"]) == ("bundled:tiny-target", "bundled:tiny-draft")


# an answer the bundled target loops on at temperature 0 ("import sys" again and again)
REPEATING = "import os\nimport os\nimport os\nimport sys\nimport os\nimport sys\nimport os\n"


def test_a_speedup_on_a_repeating_answer_is_flagged(capsys):
    """Issue 39: generate headlined "helped: about 4.15x" over an answer stuck in a loop, which
    prompt lookup copies, where race flagged it. The words, the figures' line and --json carry
    the flag race gives (Stats.lookup_on_repetition); a draft model's drafts are not flagged."""
    args = ["generate", REPEATING, "-d", "ngram", "--raw", "-m", "48", "--temp", "0"]
    code, out, err = run(capsys, *args)
    words, line = err.strip().splitlines()[-2:]
    assert code == 0 and out.count("import sys") >= 8, out  # the loop
    assert "came from prompt lookup, copying an answer that repeats itself" in words and "expect less" in words
    assert "x est. on a repeating answer" in line or "x vs its plain steps on a repeating answer" in line, line
    code, out, _ = run(capsys, *args, "--json")
    stats = json.loads(out)["stats"]
    assert code == 0 and stats["lookup_on_repetition"] is True and stats["lookup_accepted"] == stats["accepted"] > 0
    assert stats["repeated"] > stats["emitted"] / 2
    code, out, _ = run(capsys, "generate", "def main(", "-m", "24", "--json")
    assert code == 0 and json.loads(out)["stats"]["lookup_on_repetition"] is False


def test_one_verdict_from_what_was_measured(capsys):
    """Issue 39: on one prompt --tree auto said "mostly stood aside (≈1.31x est.)" and --tree 0
    "helped: about 1.56x" at the same speed; "γ auto (mean 3.3, 62 plain steps)" read as if
    the plain steps were in the mean. One rule (drafting/verdict.py): a run's speedup is
    measured against its own plain steps (standard decoding inside the run) once it took 16,
    else estimated from τ and c and labelled "est."; the sentence, the figures' line and --json
    give the same figure and verdict."""
    import re

    words_of = {"faster": "helped", "noise": "made little difference", "slower": "did not pay", "plain": "stood aside"}
    for extra in ([], ["-g", "3", "--tree", "0"], ["--tree", "auto"]):
        code, _, err = run(capsys, "generate", "def main(", "-m", "64", *extra)
        words, line = err.strip().splitlines()[-2:]
        figure = re.search(r" · (≈?)(\d+\.\d\d)x (vs its plain steps|est\.)", line)
        plain = re.search(r" · (\d+) plain steps? · ", line)
        assert code == 0 and figure, line
        measured = plain is not None and int(plain[1]) >= 16 and "(mean " in line
        assert (figure[3] == "vs its plain steps") == measured and (figure[1] == "≈") == (not measured), line
        assert "mostly stood aside" not in words and "plain steps)" not in line  # the mean is the drafting rounds'
        speedup = float(figure[2])
        expected = (
            "plain"
            if "no draft was accepted" in words
            else "faster"
            if speedup >= 1.05
            else "slower"
            if speedup <= 0.95
            else "noise"
        )
        assert f"Speculative decoding {words_of[expected]}" in words and f"{speedup:.2f}x" in words, (words, line)
        assert ("measured against the" in words) == measured and ("estimated from" in words) == (not measured), words
        code, out, _ = run(capsys, "generate", "def main(", "-m", "64", "--json", *extra)
        data = json.loads(out)
        stats, judged = data["stats"], data["speedup"]
        assert judged["measured"] == (stats["plain_rounds"] >= 16 and stats["plain_rounds"] < stats["rounds"])
        assert judged["verdict"] in words_of and judged["speedup"] > 0


def test_the_tree_help_says_what_the_code_does(capsys):
    """Issue 39: --tree's help and docs/commands.md said auto trees run only at temperature 0,
    chains under sampling, while the code (README, docs/trees.md) grows them at every
    temperature: now all say so."""
    from pathlib import Path

    code, out, _ = run(capsys, "generate", "--help")
    help_text = " ".join(out.replace("│", " ").split())
    assert code == 0 and "from a head or prompt lookup at any temperature" in help_text, help_text
    assert "at temperature 0" not in help_text
    commands = " ".join((Path(__file__).parents[2] / "docs" / "commands.md").read_text().split())
    assert "for a head or prompt lookup at any temperature (chains beside a separate draft model)" in commands
    assert "draft model and under sampling" not in commands
