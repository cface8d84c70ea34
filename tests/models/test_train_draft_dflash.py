"""`mlxspec train-draft --kind dflash` (issue 42, item 3), through the real command on the tiny
random llama the EAGLE-3 training tests use, learning from a short text read over and over:
the drafter it writes is in the published layout, loads beside its target as kind `dflash`
and drafts exactly (greedy ids equal standard decoding's, chains and trees); its loss falls
well below the loss it started from; a run stopped mid-training and resumed writes the
drafter of one never stopped; options of the other kind, or out of range, are one line."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxspec
from tests.models.test_train_draft import _train
from tests.models.test_train_draft_resume import _stop

TEXT = (
    "The river runs past the old clock in the garden. A lamp burns in the window while the "
    "train goes by with music and paper, and a stone rests under the cloud. "
)
# the text is read teacher-forced (no answers: the data is the same at every run and made in
# a second); blocks of 4 on the target's 512 ids; the budget in trained positions, so the
# learning rate's schedule does not depend on the clock
OPTIONS = ["--kind", "dflash", "--mask-id", 3, "--block-size", 4, "--answer-minutes", 0, "--text-minutes", 5]
OPTIONS += ["--batch-rows", 128, "--warmup", 5]
PROMPT = list(range(10, 22))


def drafts_exactly(target: Path, drafter: Path, *, kind: str, settings=((3, 0), (3, 6))):
    """The drafter loads beside its target as `kind`, drafts, and every greedy answer is
    standard decoding's, at each (gamma, tree) of `settings`; returns the pair."""
    pair = mlxspec.load_pair(str(target), str(drafter))
    assert pair.draft.kind == kind
    standard = mlxspec.generate(pair, PROMPT, max_tokens=40, gamma=0).tokens
    for gamma, tree in settings:
        result = mlxspec.generate(pair, PROMPT, max_tokens=40, gamma=gamma, tree=tree)
        assert result.tokens == standard and result.stats.drafted > 0, (gamma, tree)
    return pair


@pytest.fixture(scope="module")
def target(factory) -> Path:
    return factory.pair("llama")[0]


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dflash-text") / "text.txt"
    path.write_text(TEXT * 80)  # some 20 chunks of 384 ids: one held out
    return path


@pytest.fixture(scope="module")
def trained(target, text, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dflash-run") / "drafter"
    done = _train("--target", target, "--out", out, "--text", text, "--tokens", 40000, *OPTIONS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"DFlash drafter written to {out}"), done.stdout
    return out


def test_the_trained_drafter_is_the_published_layout_and_drafts_exactly(trained, target):
    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 4
    assert config["dflash_config"] == {"target_layer_ids": [0, 1], "mask_token_id": 3}  # every layer of 2
    weights = mx.load(str(trained / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight"} <= set(weights)
    assert not any(name.startswith(("embed_tokens", "lm_head")) for name in weights)  # the target's
    card = (trained / "README.md").read_text()
    assert card.startswith("# DFlash block drafter for") and "train-draft --target" in card and "--kind dflash" in card

    drafts_exactly(target, trained, kind="dflash", settings=((3, 0), (3, 6), ("auto", "auto")))


def test_the_loss_falls_well_below_where_it_started(trained, target):
    """The objective's loss (as a KL) on the run's own training examples, and its held-out greedy
    agreement at block position 1, for the drafter the run started as (on the features
    standardised as it trained on them) and the one it wrote (on raw ones: the scale is
    folded into its fc)."""
    import mlx_lm

    from mlxspec.drafters.dflash_model import load_draft
    from mlxspec.training.dflash import DFlashObjective, new_drafter
    from mlxspec.training.store import load_shards
    from mlxspec.training.trainer import standardize

    model, _, config = mlx_lm.load(str(target), return_config=True)
    objective = DFlashObjective(block_size=4, mask_id=3, vocab_size=512)
    figures = {}
    for name in ("written", "started"):
        examples = load_shards(trained / "data")
        if name == "written":
            drafter = load_draft(trained).bind(model)
        else:
            standardize(examples, np.load(trained / "data" / "feature_scale.npy"))
            drafter = new_drafter(model, config, layer_ids=(0, 1), block_size=4, layers=1, mask_id=3, seed=0)
            objective.calibrate(drafter, [e for e in examples if not e.held_out])
        train_set, held = [e for e in examples if not e.held_out][:8], [e for e in examples if e.held_out]
        batch = objective.batch(train_set, [objective.labels(e) for e in train_set], key=(1,))
        # the KL to the target's distributions: the loss less their own entropy
        probs, weights = np.array(batch["label_probs"]), np.array(batch["weights"])
        entropy = (-(probs * np.log(np.maximum(probs, 1e-12))).sum(-1) * weights).sum() / weights.sum()
        kl = objective.loss(drafter, batch, 0.0).item() - entropy
        figures[name] = (kl, objective.evaluate(drafter, held, [objective.labels(e) for e in held])["alpha"][0])
    assert held and figures["written"][0] < figures["started"][0] / 2, figures
    assert figures["written"][1] > figures["started"][1] + 0.05, figures


@pytest.mark.parametrize("begun", ["now", "before draft vocabularies"])
def test_a_run_stopped_mid_training_resumes_to_the_drafter_of_one_never_stopped(trained, target, text, tmp_path, begun):
    """Also a run checkpointed before DFlash drafters had a draft vocabulary: its run.json
    says a draft_vocab (every run recorded the EAGLE-3 default), but it kept no vocabulary
    and its checkpoint's drafter scores the whole vocabulary, which it goes on doing."""
    out = tmp_path / "stopped"
    said = _stop(
        ["--target", target, "--out", out, "--text", text, "--tokens", 40000, *OPTIONS],
        after="held-out α",
        how=signal.SIGINT,
        seconds=1,
    )
    step = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert f"interrupted at step {step}: checkpoint saved" in said, said
    if begun != "now":  # what such a run's folder holds
        (out / "data" / "vocabulary.npy").unlink()
        record = json.loads((out / "checkpoint" / "state.json").read_text())
        record["files"].pop("data/vocabulary.npy")
        (out / "checkpoint" / "state.json").write_text(json.dumps(record))
        settings = json.loads((out / "run.json").read_text())
        (out / "run.json").write_text(json.dumps(settings | {"draft_vocab": 96}))
    resumed = _train("--target", target, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming training at step {step}" in resumed.stderr and "text:" not in resumed.stderr
    states = [json.loads((d / "checkpoint" / "state.json").read_text()) for d in (trained, out)]
    assert (states[1]["step"], states[1]["tokens"]) == (states[0]["step"], states[0]["tokens"])
    drafters = [mx.load(str(d / "model.safetensors")) for d in (trained, out)]
    assert drafters[0].keys() == drafters[1].keys()
    for name in drafters[0]:
        assert mx.array_equal(drafters[0][name], drafters[1][name]).item(), name


def test_a_draft_vocabulary_is_trained_written_and_drafts_exactly(target, text, tmp_path):
    """--draft-vocab below the target's ids: the drafter scores the ids the target writes
    most with its own LM head (EAGLE-3's d2t beside it), loads as kind dflash and drafts
    exactly; its held-out agreement is read with its ids mapped to the target's."""
    out = tmp_path / "part"
    done = _train("--target", target, "--out", out, "--text", text, "--tokens", 40000, *OPTIONS, "--draft-vocab", 96)
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    weights = mx.load(str(out / "model.safetensors"))
    assert config["draft_vocab_size"] == 96 and weights["lm_head.weight"].shape == (96, 64)
    chosen = np.load(out / "data" / "vocabulary.npy")
    assert np.array_equal(np.arange(96) + np.array(weights["d2t"]), chosen)
    assert "96-id draft vocabulary" in (out / "README.md").read_text()
    alpha = float(done.stdout.split("held-out α per position ")[1].split()[0])
    # the whole vocabulary reaches 0.10 here: ids left unmapped would agree about never
    assert alpha > 0.05, done.stdout

    pair = drafts_exactly(target, out, kind="dflash")
    assert pair.draft.model.config.draft_vocab_size == 96


@pytest.mark.parametrize(
    "flags, complaint",
    [
        (["--kind", "medusa"], "--kind must be eagle3 or dflash"),
        (["--kind", "dflash", "--steps", 4], "--steps is an option of --kind eagle3"),
        (["--block-size", 8], "--block-size is an option of --kind dflash"),
        (["--kind", "dflash", "--block-size", 1], "--block-size must be a whole number from 2"),
        (["--kind", "dflash", "--layers", 0], "--layers must be a whole number from 1"),
        (["--kind", "dflash", "--norm-before-residual"], "--norm-before-residual is an option of --kind eagle3"),
    ],
)
def test_a_bad_dflash_option_is_one_line(flags, complaint, target, tmp_path):
    done = _train("--target", target, "--out", tmp_path / "run", *flags)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and complaint in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_with_no_spare_id_asks_for_a_mask_id_in_one_line(target, text, tmp_path):
    """The tiny tokenizer's ids are all its text's or its chat turns': no mask id to take."""
    flags = ["--kind", "dflash", "--text", text, "--answer-minutes", 0, "--tokens", 100]
    done = _train("--target", target, "--out", tmp_path / "run", *flags)
    errors = [line for line in done.stderr.strip().splitlines() if line.startswith("error")]
    assert done.returncode == 1 and len(errors) == 1 and "--mask-id" in errors[0], done.stderr
    assert not (tmp_path / "run").exists()  # nothing --resume would take for a run


@pytest.mark.parametrize("vocabulary", [None, np.arange(3, 500, 5)])
def test_training_reads_each_block_as_the_drafter_drafts_it(target, vocabulary):
    """The training forward (every block at once, each after the context before its anchor)
    gives the logits the drafter gives drafting: the context read into its cache, then the
    block; over the whole vocabulary and over a draft vocabulary."""
    import mlx_lm

    from mlxspec.training.dflash import block_logits, new_drafter

    model, _, config = mlx_lm.load(str(target), return_config=True)
    draft = new_drafter(
        model, config, layer_ids=(0, 1), block_size=5, layers=2, mask_id=3, seed=4, vocabulary=vocabulary
    )
    rng = np.random.default_rng(0)
    features = mx.array(rng.normal(size=(2, 30, 128)).astype(np.float32))
    anchors = np.array([[1, 9, 20], [4, 12, 25]])
    ids = rng.integers(5, 500, size=(2, 30))
    blocks = np.full((2, 3, 5), 3)
    blocks[:, :, 0] = np.take_along_axis(ids, anchors, axis=1)
    trained = block_logits(draft, features, mx.array(blocks), mx.array(anchors))
    for b in range(2):
        for n, anchor in enumerate(anchors[b]):
            cache = draft.make_cache()
            draft.read_context(features[b : b + 1, :anchor], cache)
            drafted = draft(mx.array(blocks[b : b + 1, n]), cache)[0, 1:]
            assert mx.allclose(trained[b, n], drafted, atol=1e-4).item(), (b, n)
