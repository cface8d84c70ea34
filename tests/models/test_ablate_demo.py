"""demos/eagle3/ablate.py (issue 41, item 3): EAGLE-3 heads trained from one run's data with
one thing changed each, read on the same held-out examples, through the real script on a
tiny target's run over a small corpus (answers and text both)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.models.test_train_draft import ROOT
from tests.models.test_train_draft_corpus import _corpus_run
from tests.models.test_train_draft_inputs import ENV


def test_each_variant_trains_on_what_it_says_and_is_read_on_the_same_held_out_examples(factory, tmp_path):
    target = factory.pair("llama")[0]
    # every conversation read and answered: two of the 49 are held out, answers and text both
    _, run, _ = _corpus_run(
        target, tmp_path, 50, "--tokens", 500, "--answer-minutes", 2, "--text-minutes", 2,
        "--corpus-tokens", 100000, "--max-tokens", 8, "--batch", 16,
    )  # fmt: skip
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (run / "data").iterdir())
    variants = "baseline,answers-only,text-only,vocab-32,steps-1"
    shown = subprocess.run(
        [sys.executable, "demos/eagle3/ablate.py", "--run", str(run), "--variants", variants, "--minutes", "0.05"]
        + ["--json"],
        capture_output=True, text=True, cwd=ROOT, env=ENV | {"HF_HUB_OFFLINE": "1"}, timeout=300,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    rows = {r["variant"]: r for r in json.loads(shown.stdout)["variants"]}
    assert list(rows) == variants.split(",")
    base = rows["baseline"]
    # the data it trains on: answers and text split the baseline's positions between them
    assert 0 < rows["answers-only"]["train_positions"] < base["train_positions"]
    assert rows["answers-only"]["train_positions"] + rows["text-only"]["train_positions"] == base["train_positions"]
    assert (rows["vocab-32"]["draft_vocab"], base["draft_vocab"]) == (32, 64)
    assert (rows["steps-1"]["steps"], base["steps"]) == (1, 3)
    for row in rows.values():
        assert row["training_steps"] > 0 and row["trained_positions"] > 0, row
        for part in ("answers", "text"):  # both kinds held out, read alike for every variant
            figures = row["held_out"][part]
            assert len(figures["alpha"]) == 3 and all(0 <= a <= 1 for a in figures["alpha"])
            assert 0 < figures["expected_acceptance"] <= 1
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (run / "data").iterdir()) == before  # read only
    # a table for people, and a variant it does not know is one line
    table = subprocess.run(
        [sys.executable, "demos/eagle3/ablate.py", "--run", str(run), "--variants", "baseline", "--minutes", "0.02"],
        capture_output=True, text=True, cwd=ROOT, env=ENV | {"HF_HUB_OFFLINE": "1"}, timeout=300,
    )  # fmt: skip
    assert table.returncode == 0 and "baseline" in table.stdout and "α per draft step" in table.stdout
    bad = subprocess.run(
        [sys.executable, "demos/eagle3/ablate.py", "--run", str(run), "--variants", "layers-2"],
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.strip().startswith("error: unknown variant 'layers-2'")
    assert os.path.isdir(run / "data")
