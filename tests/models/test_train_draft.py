"""`mlxspec train-draft` on a tiny random-weight llama target, through the real command in a
subprocess: the head it writes loads and agrees with the target on held-out answers more
often than a random head does; --resume on a folder that is not a run, and a disk that
fills up part way, end in one line with nothing left that loads as a head."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORDS = "river clock garden lamp window train music paper stone cloud bread letter".split()


def _prompts(path: Path, count: int = 64) -> Path:
    lines = [
        json.dumps({"prompt": f"Tell me about the {WORDS[i % 12]} and the {WORDS[(i * 5) % 12]}."})
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(*args, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk: writes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    env = os.environ | {"HF_HUB_OFFLINE": "1", "MLXSPEC_DEBUG": ""}
    return subprocess.run(
        [sys.executable, "-m", "mlxspec", "train-draft", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        preexec_fn=limit if limit_bytes else None,
    )


@pytest.fixture(scope="module")
def target(factory) -> Path:
    return factory.pair("llama")[0]


# the default recipe (EAGLE-3's own layer, the first draft step alone for the first 60% of
# the budget) and the other choice of every option the defaults make
RECIPES = {
    "default": [],
    "the others": ["--norm-before-residual", "--raw-features", "--single-step-share", 0, "--batch-rows", 2048],
}


@pytest.mark.alone  # its data phase is a wall-clock budget (--answer-minutes): on a busy machine it made none
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_trained_head_loads_and_beats_a_random_head(recipe, target, tmp_path):
    import mlx.core as mx
    import mlx_lm
    import numpy as np

    from mlxspec.drafters.eagle3_head import Eagle3Head, load_head
    from mlxspec.training.store import load_shards
    from mlxspec.training.trainer import draft_index, evaluate, label

    out = tmp_path / "head"
    done = _train(
        "--target", target, "--out", out, "--prompts", _prompts(tmp_path / "p.jsonl"), "--tokens", 60000,
        "--answer-minutes", 0.05, "--max-tokens", 48, "--batch", 32, "--draft-vocab", 256, "--warmup", 5,
        *RECIPES[recipe],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    head = load_head(out, dtype=mx.float32)
    assert head.config.draft_vocab_size == 256
    # the residual from the normed fused features is a field vLLM reads as well; fc reads raw
    # features (folded back from the standardised ones it was trained on, by default)
    normed = recipe != "default"
    assert head.config.norm_before_residual == normed
    assert json.loads((out / "config.json").read_text()).get("norm_before_residual", False) == normed
    run = json.loads((out / "run.json").read_text())
    assert (run["single_step_share"], run["standardize"]) == ((0, False) if normed else (0.6, True))
    card = (out / "README.md").read_text()
    assert "held-out" in card.lower() and "train-draft --target" in card

    model, _ = mlx_lm.load(str(target))
    from mlxspec.drafters.eagle3_head import target_embedding

    head.share_embedding(target_embedding(model))
    held = [e for e in load_shards(out / "data") if e.held_out]
    assert held
    index = draft_index(np.array(head.draft_to_target), head.config.vocab_size)
    labels = [label(e, index) for e in held]
    trained = evaluate(head, held, labels, 3)
    mx.random.seed(7)
    random = Eagle3Head(head.config)
    random.share_embedding(target_embedding(model))
    object.__setattr__(random, "draft_to_target", head.draft_to_target)
    chance = evaluate(random, held, labels, 3)
    assert trained["alpha"][0] > chance["alpha"][0] + 0.05, (trained, chance)
    assert trained["expected_acceptance"] > chance["expected_acceptance"]


@pytest.mark.parametrize(
    "flags, complaint",
    [
        (["--single-step-share", 1], "--single-step-share"),
        (["--single-step-share", -0.5], "--single-step-share"),
        (["--batch-rows", 0], "--batch-rows"),
    ],
)
def test_training_options_out_of_range_are_one_line(flags, complaint, target, tmp_path):
    done = _train("--target", target, "--out", tmp_path / "run", *flags)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and complaint in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_resume_refuses_a_folder_that_is_not_a_run(target, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    done = _train("--target", target, "--out", tmp_path / "other", "--resume")
    assert done.returncode != 0
    errors = [line for line in done.stderr.strip().splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "not a training run" in errors[0], done.stderr


def test_a_full_disk_leaves_nothing_loadable_and_resume_finishes(target, tmp_path):
    from mlxspec.drafters.eagle3_head import is_head_folder, load_head
    from mlxspec.errors import ModelLoadError

    out = tmp_path / "full"
    # 400 kB a file: the data shards fit, the checkpoint's optimizer state does not
    done = _train(
        "--target", target, "--out", out, "--prompts", _prompts(tmp_path / "p.jsonl", 16), "--tokens", 3000,
        "--answer-minutes", 0.02, "--max-tokens", 16, "--batch", 2, "--draft-vocab", 512, limit_bytes=400_000,
    )  # fmt: skip
    assert done.returncode != 0
    errors = [line for line in done.stderr.strip().splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "cannot write" in errors[0], done.stderr
    assert done.stderr.strip().endswith(errors[0])
    assert not is_head_folder(out)
    with pytest.raises(ModelLoadError):
        load_head(out)
    # room again: --resume reads the shards already written and finishes the run
    resumed = _train("--target", target, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "answers:" not in resumed.stderr  # the target was not asked again
    assert load_head(out).config.draft_vocab_size == 512


def test_ctrl_c_saves_a_checkpoint_that_resume_continues(target, tmp_path):
    """Ctrl-C mid-training: exit 130, no head, a checkpoint of the last whole step; --resume
    reads it and goes on from that step (its held-out record kept), not from the start."""
    from mlxspec.drafters.eagle3_head import is_head_folder, load_head

    out = tmp_path / "run"
    env = os.environ | {"HF_HUB_OFFLINE": "1", "MLXSPEC_DEBUG": ""}
    command = [sys.executable, "-m", "mlxspec", "train-draft", "--target", str(target), "--out", str(out)]
    options = ["--prompts", str(_prompts(tmp_path / "p.jsonl", 32)), "--tokens", "40000", "--answer-minutes", "0.02"]
    options += ["--max-tokens", "32", "--batch", "16", "--draft-vocab", "256", "--batch-rows", "256"]
    running = subprocess.Popen(command + options, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        for line in running.stderr:  # the held-out figures before the first step: training begins
            if line.startswith("held-out α"):
                break
        time.sleep(1)  # some 60 steps of the ~400 the budget allows
        running.send_signal(signal.SIGINT)
        rest = running.communicate(timeout=60)[1]
    finally:
        running.kill()
    assert running.returncode == 130, rest
    said = [line for line in rest.splitlines() if line.startswith("interrupted at step")]
    assert len(said) == 1 and said[0].endswith("checkpoint saved"), rest
    # and how to go on, in a line a log keeps whole
    again = f"mlxspec train-draft --target {target} --out {out} --resume continues"
    assert f"stopped: {out} keeps the data made and the last checkpoint; {again}" in rest.splitlines(), rest
    assert not is_head_folder(out) and not (out / "config.json").exists()
    saved = json.loads((out / "checkpoint" / "state.json").read_text())
    assert saved["step"] > 0 and said[0].startswith(f"interrupted at step {saved['step']}:")

    resumed = _train("--target", target, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming training at step {saved['step']}" in resumed.stderr
    assert "answers:" not in resumed.stderr  # the data was kept too
    final = json.loads((out / "checkpoint" / "state.json").read_text())
    assert final["step"] > saved["step"] and final["tokens"] >= 40000
    assert final["history"][: len(saved["history"])] == saved["history"]
    assert load_head(out).config.draft_vocab_size == 256


def test_the_finished_head_is_whole_or_absent(target, tmp_path):
    """write_finished under a file-size limit below the head's size: an error, no config.json."""
    import mlx_lm
    import numpy as np

    from mlxspec.drafters.eagle3_head import is_head_folder
    from mlxspec.errors import TrainingError
    from mlxspec.training.checkpoint import write_finished
    from mlxspec.training.trainer import new_head

    model, _, config = mlx_lm.load(str(target), return_config=True)
    head = new_head(model, config, vocabulary=np.arange(512), aux_layer_ids=(0, 1, 1), seed=0)
    folder = tmp_path / "final"
    folder.mkdir()
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, before[1]))
    try:
        with pytest.raises(TrainingError, match="cannot write"):
            write_finished(head, folder, "card")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
        signal.signal(signal.SIGXFSZ, handler)
    assert not is_head_folder(folder)
    write_finished(head, folder, "card")
    assert is_head_folder(folder) and not (folder / ".partial").exists()


def test_the_head_trains_on_standardised_features_and_reads_raw_ones():
    """Columns of scales 40 and 800 with an outlier column at 2e4 (Gemma 3 270M's shape)
    are trained on at unit scale; folded back into fc, the head gives the same logits on
    the raw features as it gave on the standardised ones."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import KVCache

    from mlxspec.drafters.eagle3_head import Eagle3Head, HeadConfig
    from mlxspec.training.store import Example
    from mlxspec.training.trainer import feature_scale, fold_feature_scale, standardize

    rng = np.random.default_rng(0)
    scales = np.repeat([40.0, 200.0, 800.0], 16)
    raw = rng.standard_normal((64, 48)) * scales
    raw[:, 5] += 2e4  # an outlier column in every position
    raw[0] = 1e5  # a first position's massive activations: left out
    example = Example(
        ids=np.zeros(64, np.int32), features=raw.astype(np.float32), top_ids=np.zeros((64, 1), np.int32),
        top_probs=np.ones((64, 1), np.float16), train_from=0, held_out=False, greedy=False,
    )  # fmt: skip
    scale = feature_scale([example])
    standardize([example], scale)
    assert np.allclose(np.sqrt((example.features[1:] ** 2).mean(0)), 1.0, rtol=0.05)
    config = HeadConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        vocab_size=50, draft_vocab_size=50, aux_layer_ids=(0, 1, 2), target_hidden_size=16,
    )  # fmt: skip
    head = Eagle3Head(config, own_embedding=True)
    ids = mx.array([list(range(1, 9))])
    trained, _ = head(ids, mx.array(example.features[None, :8]), KVCache())
    fold_feature_scale(head, scale)
    published, _ = head(ids, mx.array(raw[None, :8].astype(np.float32)), KVCache())
    assert mx.allclose(trained, published, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_training_unrolls_the_head_as_the_engine_drafts_with_it(norm_before_residual, tmp_path):
    """Training-time test's unrolled steps give the logits the engine's forward gives (rows
    read in one block, then chained), with either residual; the flag survives a save."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from mlxspec.drafters.eagle3_head import Eagle3Head, HeadConfig, load_head, save_head
    from mlxspec.training.trainer import unroll

    config = HeadConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        vocab_size=50, draft_vocab_size=50, aux_layer_ids=(0, 1, 2), target_hidden_size=16,
        norm_before_residual=norm_before_residual,
    )  # fmt: skip
    mx.random.seed(0)
    head = Eagle3Head(config, own_embedding=True)
    head.midlayer.hidden_norm.weight = mx.random.uniform(0.5, 2.0, (32,))
    width, steps = 7, 3
    tokens = mx.random.randint(0, 50, (1, width + steps + 1))
    features = mx.random.normal((1, width, 48)) * 30
    unrolled = unroll(head, tokens, features, steps)
    for row in range(width):
        cache = KVCache()
        logits, out = head(tokens[:, 1 : row + 2], features[:, : row + 1], cache)
        for step in range(steps):
            assert mx.allclose(logits[0, -1], unrolled[step][0, row], atol=1e-4), (row, step)
            if step + 1 < steps:
                logits, out = head(tokens[:, row + step + 2 : row + step + 3], out[:, -1:], cache, chained=True)
    save_head(head, tmp_path / "head", dtype=mx.float32)
    assert load_head(tmp_path / "head").config.norm_before_residual == norm_before_residual
