"""`mlxspec train-draft --data-from RUN` (issues 41 and 42): the target's data is the costly
part of a run, so a head may begin from the data a DFlash drafter's run made for the same
target, and the other way round. Through the real command on the tiny random llama: the
source's shards are linked, never written; the drafter reads the taps nearest its own; a
run begun from a stopped run's data goes on making it, tapped as it was, to the data of the
source never stopped; and the head it writes drafts exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.models.test_train_draft import _train
from tests.models.test_train_draft_dflash import TEXT, drafts_exactly
from tests.models.test_train_draft_resume import _shards, _stop

# text read teacher-forced only (the data is the same at every run): some 200 chunks, seven
# shards, so that a run stopped after its first shard has more to read
DFLASH = ["--kind", "dflash", "--mask-id", 3, "--block-size", 4, "--batch-rows", 128, "--warmup", 5]
DFLASH += ["--answer-minutes", 0, "--text-minutes", 5, "--tokens", 4000]
HEAD = ["--draft-vocab", 128, "--batch-rows", 256, "--warmup", 5, "--tokens", 30000]
HEAD += ["--answer-minutes", 0, "--text-minutes", 5]


@pytest.fixture(scope="module")
def target(factory) -> Path:
    return factory.pair("llama")[0]


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("shared-text") / "text.txt"
    path.write_text(TEXT * 800)
    return path


@pytest.fixture(scope="module")
def source(target, text, tmp_path_factory) -> Path:
    """A DFlash drafter's finished run: its data tapped at the outputs of both layers."""
    out = tmp_path_factory.mktemp("shared-source") / "dflash"
    done = _train("--target", target, "--out", out, "--text", text, *DFLASH)
    assert done.returncode == 0, done.stderr
    return out


def test_a_head_learns_from_a_dflash_runs_data_and_drafts_exactly(source, target, tmp_path):
    progress = (source / "data" / "progress.json").read_bytes()
    out = tmp_path / "head"
    # --corpus-tokens may read on into the source's corpus (here it has none)
    done = _train("--target", target, "--out", out, "--data-from", source, *HEAD, "--corpus-tokens", 5000)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"head written to {out}"), done.stdout
    assert "text:" not in done.stderr  # the source read all the text: nothing is read again

    theirs = sorted((source / "data").glob("shard-*.npz"))
    assert len(theirs) > 1 and [p.name for p in sorted((out / "data").glob("shard-*.npz"))] == [p.name for p in theirs]
    assert all(os.path.samefile(p, out / "data" / p.name) for p in theirs)  # linked, not copied
    assert (source / "data" / "progress.json").read_bytes() == progress  # the source's files unwritten
    # DFlash taps the outputs of layers 0 and 1, the stream entering layer 1 and after layer 1
    # (its last): EAGLE-3's three states entering layers (1, 1, 0) read the nearest a head can name
    for run in (source, out):
        assert json.loads((run / "data" / "taps.json").read_text()) == {"stream": [1, 2]}
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 1, 1]
    settings = json.loads((out / "run.json").read_text())
    begun_from = json.loads((source / "run.json").read_text())
    assert settings["data_from"] == str(source.resolve()) and settings["text_files"] == begun_from["text_files"]
    assert settings["corpus_tokens"] == 5000 and begun_from["corpus_tokens"] == 2_000_000
    assert f"Begun from the data of {source.resolve()}" in (out / "README.md").read_text()
    alpha = float(done.stdout.split("held-out α per position ")[1].split()[0])
    assert alpha > 0.2, done.stdout  # it learnt from the features it read

    drafts_exactly(target, out, kind="eagle3", settings=((3, 0), (3, 6), ("auto", "auto")))


def test_data_begun_from_a_stopped_run_goes_on_to_the_data_of_one_never_stopped(source, target, text, tmp_path):
    stopped = tmp_path / "stopped"
    _stop(["--target", target, "--out", stopped, "--text", text, *DFLASH], after="text:", how=signal.SIGINT)
    record = json.loads((stopped / "data" / "progress.json").read_text())
    whole = json.loads((source / "data" / "progress.json").read_text())
    assert 0 < record["text_done"] < whole["text_done"], (record, whole)

    out = tmp_path / "head"
    done = _train("--target", target, "--out", out, "--data-from", stopped, *HEAD)
    assert done.returncode == 0, done.stderr
    assert "text:" in done.stderr  # it read the rest of the text, tapped as the source tapped
    made = sorted(p.name for p in (out / "data").glob("shard-*.npz"))
    assert made == sorted(p.name for p in (source / "data").glob("shard-*.npz"))
    assert not any(os.path.exists(stopped / "data" / name) for name in made[record["shards"] :])
    for theirs, ours in zip(_shards(source), _shards(out)):
        assert theirs["ids"] == ours["ids"] and theirs["held_out"] == ours["held_out"]
        assert np.array_equal(theirs["e"].features, ours["e"].features)
        assert np.array_equal(theirs["e"].top_probs, ours["e"].top_probs)


def test_a_drafter_learns_from_a_heads_data(target, text, tmp_path):
    """The other way: a head's run taps the states entering layers 1, 1 and 0 (EAGLE-3's three
    on a target of two layers); a DFlash drafter begun from its data reads the output of layer
    0 (the state entering layer 1), once, and drafts exactly."""
    head = tmp_path / "head"
    done = _train("--target", target, "--out", head, "--text", text, *HEAD)
    assert done.returncode == 0, done.stderr
    assert json.loads((head / "data" / "taps.json").read_text()) == {"stream": [1, 1, 0]}
    drafter = tmp_path / "drafter"
    done = _train("--target", target, "--out", drafter, "--data-from", head, *DFLASH)
    assert done.returncode == 0, done.stderr
    assert json.loads((drafter / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [0]
    drafts_exactly(target, drafter, kind="dflash")


@pytest.mark.parametrize(
    "flags, complaint",
    [
        (["--text", "README.md"], "--text: with --data-from the data's settings are that run's"),
        (["--raw"], "--raw: with --data-from"),
        (["--max-tokens", 8], "--max-tokens: with --data-from"),
        (["--seed", 1], "--seed: with --data-from"),  # it orders the prompts
    ],
)
def test_an_option_that_would_make_other_data_is_one_line(flags, complaint, source, target, tmp_path):
    done = _train("--target", target, "--out", tmp_path / "run", "--data-from", source, *flags)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and complaint in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_a_source_that_is_not_a_run_of_this_target_is_one_line(source, target, factory, tmp_path):
    other = factory.pair("llama")[1]  # the pair's draft: another model
    cases = [
        (tmp_path, "not a training run (it has no run.json)"),
        (source, "its data is"),
    ]
    for (run, complaint), model in zip(cases, (target, other)):
        done = _train("--target", model, "--out", tmp_path / "run", "--data-from", run, "--tokens", 100)
        assert done.returncode != 0 and done.stderr.strip().count("\n") == 0, done.stderr
        assert complaint in done.stderr, done.stderr
        assert not (tmp_path / "run").exists()
    resumed = _train("--target", target, "--out", source, "--resume", "--data-from", source)
    assert resumed.returncode == 2 and "a resumed run keeps the settings it began with" in resumed.stderr


def _copy(source: Path, to: Path, **record) -> Path:
    """A copy of the run `source` whose data's progress record says `record` instead."""
    shutil.copytree(source, to)
    file = to / "data" / "progress.json"
    file.write_text(json.dumps(json.loads(file.read_text()) | record))
    return to


def test_the_time_a_source_spent_is_not_this_runs(source, target, tmp_path):
    """A source that took an hour over its data: --minutes is this run's own time (it trains
    for it, as a run that made its data would not), and it says whose time was whose."""
    slow = _copy(source, tmp_path / "slow", text_seconds=3600.0)
    out = tmp_path / "head"
    done = _train("--target", target, "--out", out, "--data-from", slow, "--minutes", 0.4, "--draft-vocab", 128)
    assert done.returncode == 0, done.stderr
    minutes = float(done.stdout.split(" min, held-out")[0].rsplit(", ", 1)[1])
    assert 0 < minutes < 1, done.stdout
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] > 0
    assert "(60.0 min of the data's time is that run's;" in (out / "README.md").read_text()


def test_a_sources_shard_written_but_not_recorded_is_made_again(source, target, tmp_path):
    """A source stopped between a shard's rename and its record's (or still running): the
    shard is left out, and this run makes it again, as the source would have."""
    record = json.loads((source / "data" / "progress.json").read_text())
    last = source / "data" / f"shard-{record['shards'] - 1:04d}.npz"
    with np.load(last) as shard:
        chunks = len(shard["lengths"])  # text chunks it holds, an example each
    cut = _copy(source, tmp_path / "cut", shards=record["shards"] - 1, text_done=record["text_done"] - chunks)
    out = tmp_path / "head"
    done = _train("--target", target, "--out", out, "--data-from", cut, *HEAD)
    assert done.returncode == 0, done.stderr
    assert "text:" in done.stderr  # the unrecorded shard made again
    made = sorted(p.name for p in (out / "data").glob("shard-*.npz"))
    assert made == sorted(p.name for p in (source / "data").glob("shard-*.npz"))
    assert not os.path.samefile(cut / "data" / last.name, out / "data" / last.name)
    for theirs, ours in zip(_shards(source), _shards(out)):
        assert theirs["ids"] == ours["ids"] and np.array_equal(theirs["e"].features, ours["e"].features)


def test_adopted_data_that_lost_its_taps_record_is_refused(source, target, tmp_path):
    """Without data/taps.json a run's data would be read as its own kind's taps: data begun
    from another run's is refused instead, in one line, and the record is not rewritten."""
    out = tmp_path / "head"
    _stop(["--target", target, "--out", out, "--data-from", source, *HEAD], after="held-out α", how=signal.SIGINT)
    (out / "data" / "taps.json").unlink()
    resumed = _train("--target", target, "--out", out, "--resume")
    assert resumed.returncode == 1 and "taps.json is missing" in resumed.stderr, resumed.stderr
    assert "Traceback" not in resumed.stderr and not (out / "data" / "taps.json").exists()


def test_an_adoption_that_fails_leaves_no_run_folder(source, target, tmp_path):
    broken = _copy(source, tmp_path / "broken")
    shard = broken / "data" / "shard-0001.npz"
    shard.unlink()
    shard.mkdir()  # neither linked nor copied
    out = tmp_path / "head"
    done = _train("--target", target, "--out", out, "--data-from", broken, *HEAD)
    assert done.returncode == 1 and "cannot take" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "kind, stream, aux, columns",
    [
        # gemma3-270m (18 layers): a DFlash run taps the outputs of layers 1, 4, 8, 12 and 15, the
        # stream entering layers 2, 5, 9, 13 and 16; a head's own three enter 2, 9 and 15
        ("eagle3", (2, 5, 9, 13, 16), (2, 9, 16), [0, 2, 4]),
        # the other way: the outputs of layers 1, 8 and 14, each once, read as the data holds them
        ("dflash", (2, 9, 15), (1, 8, 14), None),
        ("dflash", (2, 5, 9, 13, 16), (1, 4, 8, 12, 15), None),  # its own
        # the embeddings (position 0) are no layer's output, the last layer's output enters none
        ("dflash", (0, 18), (17,), [1]),
        ("eagle3", (0, 18), (0, 0, 0), [0, 0, 0]),
    ],
)
def test_a_drafter_reads_the_taps_nearest_its_own(kind, stream, aux, columns):
    from mlxspec.training.shape import TargetShape

    shape = TargetShape.of({"vocab_size": 100, "hidden_size": 2}, 18, kind=kind, stream=stream)
    assert shape.aux == aux and shape.feature_width == 2 * len(aux) and shape.data_width == 2 * len(stream)
    expected = None if columns is None else [2 * t + k for t in columns for k in (0, 1)]
    assert (shape.columns if shape.columns is None else shape.columns.tolist()) == expected


@pytest.mark.parametrize(
    "written, complaint",
    [
        ("{", "not a readable record of the data's taps"),
        ('{"stream": []}', "stream must be a list of positions from 0 to the target's 18 layers"),
        ('{"stream": [2, 19]}', "stream must be a list of positions"),
        ('{"stream": [2, 9.0]}', "stream must be a list of positions"),
    ],
)
def test_a_damaged_taps_record_is_one_line(written, complaint, tmp_path):
    from mlxspec.errors import TrainingError
    from mlxspec.training.store import read_taps

    (tmp_path / "taps.json").write_text(written)
    with pytest.raises(TrainingError, match=complaint):
        read_taps(tmp_path, layers=18)
    assert read_taps(tmp_path / "none", layers=18) is None
