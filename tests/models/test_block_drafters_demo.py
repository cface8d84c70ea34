"""demos/block_drafters.py (issue 42, item 4; issue 41's before and after): a preset's EAGLE-3
head beside a DFlash drafter and another head on one target, each as a chain and as a tree,
alone and beside prompt lookup, run through the real script on a tiny preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.dflash import make_dflash
from tests.support.heads import make_head

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_side_by_side_measures_every_method_on_the_same_greedy_text(factory, tmp_path):
    target, draft = factory.pair("llama")
    head = make_head(target, tmp_path / "head")
    dflash = make_dflash(target, tmp_path / "dflash")
    presets = tmp_path / "models.toml"
    presets.write_text(f'[tinyblocks]\ntarget = "{target}"\ndraft = "{head}"\ndflash = "{dflash}"\n')
    env = os.environ | {"MLXSPEC_MODELS": str(presets), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "demos/block_drafters.py", "--pair", "tinyblocks", "--dflash", str(dflash)]
    command += ["--quick", "--max-tokens", "12", "--temp", "0,0.7", "--json"]
    shown = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    methods = ["standard"] + [
        f"{drafter} {shape}{beside}"
        for beside in ("", " + lookup")
        for drafter, shape in (("head", "chain"), ("head", "tree"), ("DFlash", "chain"), ("DFlash", "DDTree"))
    ]
    for temp in ("0.0", "0.7"):
        rows = report["temps"][temp]
        assert list(rows) == methods
        assert rows["standard"]["speedup"] == 1.0 and rows["standard"]["nodes_per_round"] is None
        # every method writes every prompt's 12 tokens (the tiny target ends none early)
        assert {row["tokens"] for row in rows.values()} == {rows["standard"]["tokens"]}
        for name in methods[1:]:
            row = rows[name]
            assert row["rounds"] <= rows["standard"]["rounds"] and 0 < row["speedup"]
            assert row["alpha_per_depth"] and 0 <= row["alpha_per_depth"][0] <= 1
        # the drafters drafted, and their drafting was timed: a cost a round over a standard step
        for name in ("head chain", "DFlash chain", "DFlash DDTree"):
            assert rows[name]["nodes_per_round"] > 0 and rows[name]["drafter_cost"] > 0, (temp, name, rows[name])


def test_another_head_runs_beside_the_presets_own_and_lookup_can_be_left_out(factory, tmp_path):
    """--head adds a retrained head beside the shipped one (issue 41's before and after in one
    run), --dflash may be left out, --no-lookup leaves out the rows beside lookup, and
    --repeats runs every prompt again, its speedups' median reported."""
    target, _ = factory.pair("llama")
    shipped, retrained = make_head(target, tmp_path / "shipped"), make_head(target, tmp_path / "new", seed=1)
    presets = tmp_path / "models.toml"
    presets.write_text(f'[tinyheads]\ntarget = "{target}"\ndraft = "{shipped}"\n')
    env = os.environ | {"MLXSPEC_MODELS": str(presets), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "demos/block_drafters.py", "--pair", "tinyheads", "--head", str(retrained)]
    command += ["--quick", "--max-tokens", "8", "--temp", "0", "--no-lookup", "--repeats", "2", "--json"]
    shown = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)["temps"]["0.0"]
    assert list(rows) == ["standard", "head chain", "head tree", "new head chain", "new head tree"]
    assert {row["tokens"] for row in rows.values()} == {rows["standard"]["tokens"]}
    assert rows["new head chain"]["nodes_per_round"] > 0
    # two repeats: each one's speedup over its own standard decoding, the median reported
    assert rows["standard"]["speedups"] == [1.0, 1.0] and len(rows["new head tree"]["speedups"]) == 2
