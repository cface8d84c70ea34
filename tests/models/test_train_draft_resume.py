"""`mlxspec train-draft` stopped and continued (issue 41, item 2), through the real command
in subprocesses on a tiny random target: a run killed (SIGKILL) while it answers the
corpus's prompts and again while it reads its conversations, then interrupted (Ctrl-C) and
killed while it trains, each time continued with --resume, ends with the data and the head
of a run never stopped."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.models.test_train_draft import ROOT, _train
from tests.models.test_train_draft_corpus import _corpus
from tests.models.test_train_draft_inputs import ENV


@pytest.fixture(scope="module")
def target(factory) -> Path:
    return factory.pair("llama")[0]


# no --minutes: the budget is trained positions, so the schedule (learning rate, the first
# draft step alone) is the same whenever the run is stopped; the phases' time is ample, and
# training takes some 6 s here (350 steps), time for two stops a second after it starts
OPTIONS = ["--tokens", 90000, "--answer-minutes", 5, "--text-minutes", 5, "--corpus-tokens", 16000]
OPTIONS += ["--max-tokens", 16, "--batch", 4, "--draft-vocab", 128, "--batch-rows", 256, "--warmup", 5]


def _stop(args: list, *, after: str, how: signal.Signals, seconds: float = 0.0) -> str:
    """Start train-draft, send `how` once a line starting with `after` is printed (and
    `seconds` more have passed); what it printed."""
    command = [sys.executable, "-m", "mlxspec", "train-draft", *map(str, args)]
    running = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    said = []
    try:
        for line in running.stderr:
            said.append(line)
            if line.startswith(after):
                break
        else:
            pytest.fail(f"it ended before {after!r}: {''.join(said)}")
        if seconds:
            try:
                running.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                pass
        assert running.poll() is None, "".join(said)  # still running: stopped mid-work
        running.send_signal(how)
        said.append(running.communicate(timeout=60)[1])
    finally:
        running.kill()
    expected = -signal.SIGKILL if how == signal.SIGKILL else 130  # SIGTERM stops as Ctrl-C does
    assert running.returncode == expected, "".join(said)
    return "".join(said)


def _shards(out: Path) -> list[dict]:
    from mlxspec.training.store import load_shards

    return [
        {"ids": e.ids.tolist(), "train_from": e.train_from, "held_out": e.held_out, "greedy": e.greedy, "e": e}
        for e in load_shards(out / "data")
    ]


def test_a_run_killed_and_interrupted_resumes_to_the_head_of_one_never_stopped(target, tmp_path):
    import mlx.core as mx

    corpus = _corpus(tmp_path / "corpus.json", 60)
    whole = _train("--target", target, "--out", tmp_path / "whole", "--corpus", corpus, *OPTIONS)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "stopped"
    resume = ["--target", target, "--out", out, "--resume"]
    # killed while the second shard of answers is made, then while the conversations are read
    _stop(["--target", target, "--out", out, "--corpus", corpus, *OPTIONS], after="answers:", how=signal.SIGKILL)
    record = json.loads((out / "data" / "progress.json").read_text())
    assert record["text_done"] == 0 and record["shards"] > 0
    # what a kill between a shard's rename and its record's leaves (the shard is the one this
    # run would have written: the whole run's), and one cut short in writing
    first = f"shard-{record['shards']:04d}"
    shutil.copy(tmp_path / "whole" / "data" / f"{first}.npz", out / "data")
    (out / "data" / f"{first}.partial.npz").write_bytes(b"PK\x03\x04 cut short")
    said = _stop(resume, after="text:", how=signal.SIGKILL)
    assert f"{first}.npz was written but not recorded" in said, said
    assert not (out / "data" / f"{first}.partial.npz").exists()
    assert "answers:" in said  # the answers went on from the shards kept
    # a log (not a terminal) gets a line a shard with the phase's share done and, from the
    # second shard of a session on, its ETA
    lines = [line for line in said.splitlines() if line.startswith("answers:")]
    assert len(lines) > 2 and all(re.search(r"\), \d+% of the phase", line) for line in lines), lines
    assert all(re.search(r"of the phase, (about \d+ min|\d+ s) left$", line) for line in lines[1:]), lines
    record = json.loads((out / "data" / "progress.json").read_text())
    assert 0 < record["text_done"] and not (out / "checkpoint").exists()
    # Ctrl-C some steps into training (a checkpoint of the last whole step), SIGTERM some
    # steps later (the same), then killed after it resumed (the work since that checkpoint
    # is lost, not the checkpoint)
    said = _stop(resume, after="held-out α", how=signal.SIGINT, seconds=1)
    assert "text:" in said
    first_step = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    said = _stop(resume, after="held-out α", how=signal.SIGTERM, seconds=1)  # evaluated: training again
    step = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert 0 < first_step < step and f"interrupted at step {step}: checkpoint saved" in said, said
    _stop(resume, after="resuming training at step", how=signal.SIGKILL, seconds=0.5)
    finished = _train(*resume)
    assert finished.returncode == 0, finished.stderr
    assert f"resuming training at step {step}" in finished.stderr
    assert "answers:" not in finished.stderr and "text:" not in finished.stderr

    # the same data: every shard reads whole, the same examples in the same shards
    made, kept = _shards(tmp_path / "whole"), _shards(out)
    assert [{k: v for k, v in m.items() if k != "e"} for m in made] == [
        {k: v for k, v in m.items() if k != "e"} for m in kept
    ]
    for m, k in zip(made, kept):
        assert np.array_equal(m["e"].features, k["e"].features)
        assert np.array_equal(m["e"].top_ids, k["e"].top_ids)
        assert np.array_equal(m["e"].top_probs, k["e"].top_probs)
    assert len({tuple(m["ids"]) for m in made if m["held_out"]}) > 0
    records = [json.loads((d / "data" / "progress.json").read_text()) for d in (tmp_path / "whole", out)]
    assert [{k: r[k] for k in ("prompts_done", "text_done", "shards")} for r in records] == [
        {k: records[0][k] for k in ("prompts_done", "text_done", "shards")}
    ] * 2
    # the same training: steps, positions and the head's weights
    states = [json.loads((d / "checkpoint" / "state.json").read_text()) for d in (tmp_path / "whole", out)]
    assert (states[1]["step"], states[1]["tokens"]) == (states[0]["step"], states[0]["tokens"])
    heads = [mx.load(str(d / "model.safetensors")) for d in (tmp_path / "whole", out)]
    assert heads[0].keys() == heads[1].keys()
    for name in heads[0]:
        assert mx.array_equal(heads[0][name], heads[1][name]).item(), name

    # what a later session measures a head with: its coverage on the corpus's held-out
    # prompts (demos/eagle3/coverage.py), the two held-out conversations' four user turns
    shown = subprocess.run(
        [sys.executable, "demos/eagle3/coverage.py", "--target", str(target), "--draft", str(out)]
        + ["--corpus", str(corpus), "--prompts", "8", "--max-tokens", "8", "--depth", "2", "--temp", "0"],
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("4 prompts: held out of --corpus"), shown.stdout
    rows = [line.split() for line in shown.stdout.splitlines() if line.strip()[:1] in ("1", "2")]
    assert [r[0] for r in rows] == ["1", "2"] and all(int(r[-1]) > 0 for r in rows), shown.stdout


def test_a_resumed_run_takes_a_new_time_plan_and_keeps_it(target, tmp_path):
    """A run whose answers take longer than its owner has is cut short on --resume: the
    phase it is in ends, the data made is kept, and the plan is saved for later sessions."""
    corpus = _corpus(tmp_path / "corpus.json", 60)
    out = tmp_path / "run"
    _stop(["--target", target, "--out", out, "--corpus", corpus, *OPTIONS], after="answers:", how=signal.SIGKILL)
    answered = json.loads((out / "data" / "progress.json").read_text())["prompts_done"]
    assert answered > 0

    refused = _train("--target", target, "--out", out, "--resume", "--text-minutes", "-1")
    assert refused.returncode == 2 and "--text-minutes must be a number of minutes >= 0" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert json.loads((out / "run.json").read_text())["text_minutes"] == 5  # a refused plan is not saved
    for other in (["--kind", "dflash"], ["--lr", "0.1"], ["--max-tokens", "5"]):  # the run's own, not a plan
        refused = _train("--target", target, "--out", out, "--resume", *other)
        assert (
            refused.returncode == 2 and f"{other[0]}: a resumed run keeps the settings it began with" in refused.stderr
        )
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    # more of the corpus is part of a plan: its conversations come in the same order
    plan = ["--answer-minutes", 0, "--corpus-tokens", 20000]
    said = _stop(["--target", target, "--out", out, "--resume", *plan], after="text:", how=signal.SIGKILL)
    assert "the run's plan changed: --answer-minutes 5.0 → 0.0, --corpus-tokens 16000 → 20000" in said, said
    assert json.loads((out / "run.json").read_text())["corpus_tokens"] == 20000
    assert "answers:" not in said  # straight to reading the conversations
    record = json.loads((out / "data" / "progress.json").read_text())
    assert record["prompts_done"] == answered and record["text_done"] > 0
    assert json.loads((out / "run.json").read_text())["answer_minutes"] == 0
    # the next session keeps the new plan without being told again
    said = _stop(["--target", target, "--out", out, "--resume"], after="held-out α", how=signal.SIGINT)
    assert "answers:" not in said and "plan changed" not in said
