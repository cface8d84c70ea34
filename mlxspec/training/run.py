"""One `mlxspec train-draft` run, start to finish: the folder, the data, training, the head.

DIR/run.json          the run's settings (what --resume continues; what marks a run)
DIR/data/             shards of examples and progress.json (data.py)
DIR/checkpoint/       head and optimizer state, step and data cursor (trainer.py)
DIR/config.json, model.safetensors, README.md
                      the finished head and its card, moved in only at the end
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .data import DataPlan, TrainingError, _write_json, build_data, choose_vocabulary, load_shards, read_prompt_file
from .trainer import (
    INITIAL_LOGIT_STD,
    Budget,
    State,
    calibrate_output,
    checkpoint_folder,
    evaluate,
    feature_scale,
    fold_feature_scale,
    label,
    load_checkpoint,
    new_head,
    standardize,
    train,
    write_finished,
)

RUN_FILE = "run.json"
BUNDLED_PROMPTS = 6000


@dataclass
class Settings:
    target: str
    prompts_file: str | None
    text_files: list[str]
    minutes: float | None
    tokens: int | None
    draft_vocab: int
    steps: int
    answer_minutes: float
    text_minutes: float
    max_tokens: int
    batch: int
    seed: int
    lr: float
    command: str
    warmup: int = 100  # steps of linear warmup
    raw: bool = False  # prompts without the chat template (a base model)
    # the residual stream from normed fused features (runs started before this option
    # existed had the raw ones)
    norm_before_residual: bool = False
    batch_rows: int = 2048  # rows (positions) a training batch
    single_step_share: float = 0.0  # the budget's share spent on draft step 1 alone, first
    # features divided by each column's RMS for training, fc folded back at the end (runs
    # started before this option existed always did)
    standardize: bool = True


class Progress:
    """What a run reports as it goes (the CLI draws it; tests may ignore it)."""

    def data(self, source: str, record: dict, tokens: int, fraction: float) -> None: ...
    def trained(self, state: State, fraction: float) -> None: ...
    def evaluated(self, figures: dict) -> None: ...
    def note(self, message: str) -> None: ...


def check_folder(out: Path, *, resume: bool) -> None:
    """Refuse, before any work, a folder that is not what the flags say it is."""
    marker = out / RUN_FILE
    if resume:
        if not marker.is_file():
            raise TrainingError(f"{out} is not a training run (it has no {RUN_FILE}); start one without --resume")
        if (out / "config.json").is_file():
            raise TrainingError(f"{out}: this run has finished; its head is there (train another into a new folder)")
        return
    if marker.is_file():
        raise TrainingError(f"{out} already holds a training run; add --resume to continue it")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrainingError(f"{out} exists and is not an empty folder; choose a new --out")


def start(settings: Settings, out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainingError(f"cannot create {out}: {e.strerror or e}") from None
    _write_json(out / RUN_FILE, asdict(settings))


def abandon(out: Path) -> None:
    """Undo `start` for a run refused before it wrote any data (a target that does not load
    or cannot be tapped): no folder is left that --resume would take for a run."""
    if not (out / "data").exists():
        (out / RUN_FILE).unlink(missing_ok=True)
        try:
            out.rmdir()
        except OSError:
            pass  # not empty: not ours to remove


def read_settings(out: Path) -> Settings:
    try:
        return Settings(**json.loads((out / RUN_FILE).read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise TrainingError(f"{out / RUN_FILE}: not a readable training run ({e})") from None


def run(*, out: Path, settings: Settings, progress: Progress) -> dict:
    """Everything after the folder check: returns the final figures."""
    import mlx.core as mx
    import mlx_lm

    from ..capture import default_aux_layers, install, num_layers
    from .corpus import build_prompts

    began = time.perf_counter()
    progress.note(f"loading {settings.target}")
    try:
        model, tokenizer, target_config = mlx_lm.load(settings.target, return_config=True)
    except Exception as e:  # no such folder or repo, or not a model mlx-lm reads
        raise TrainingError(f"cannot load the target {settings.target}: {e}") from None
    aux = default_aux_layers(num_layers(model))
    taps = install(model, aux)
    if settings.prompts_file:
        prompts = read_prompt_file(Path(settings.prompts_file))
    else:
        prompts = [p["prompt"] for p in build_prompts(BUNDLED_PROMPTS, seed=settings.seed)]
    plan = DataPlan(
        prompts=prompts,
        text_files=[Path(f) for f in settings.text_files],
        answer_seconds=settings.answer_minutes * 60,
        text_seconds=settings.text_minutes * 60,
        max_tokens=settings.max_tokens,
        batch=settings.batch,
        seed=settings.seed,
        raw=settings.raw,
        vocab_size=int((target_config.get("text_config") or target_config)["vocab_size"]),
    )
    data = out / "data"
    build_data(model, tokenizer, taps, data, plan, report=progress.data)
    record = json.loads((data / "progress.json").read_text())
    examples = load_shards(data)
    if not examples:
        raise TrainingError("the target wrote no usable data (give more --minutes, prompts or --text)")
    eos = sorted(set(tokenizer.eos_token_ids))
    vocab_size = int((target_config.get("text_config") or target_config)["vocab_size"])
    vocabulary = kept(
        data / "vocabulary.npy",
        lambda: choose_vocabulary(examples, eos=eos, vocab_size=vocab_size, size=settings.draft_vocab),
    )
    draft_index = np.full(vocab_size, -1, np.int64)
    draft_index[vocabulary] = np.arange(len(vocabulary))
    train_set = [e for e in examples if not e.held_out] or examples
    held_out = [e for e in examples if e.held_out]
    # fixed once, so that a resumed run trains on the same standardised features
    if settings.standardize:
        scale = kept(data / "feature_scale.npy", lambda: feature_scale(train_set, seed=settings.seed))
        standardize(examples, scale)

    head = new_head(
        model,
        target_config,
        vocabulary=vocabulary,
        aux_layer_ids=aux,
        seed=settings.seed,
        norm_before_residual=settings.norm_before_residual,
    )
    saved = checkpoint_folder(out / "checkpoint")
    if saved:
        state = load_checkpoint(saved, head)
        progress.note(f"resuming training at step {state.step}")
    else:
        state = State()
        factor = calibrate_output(head, train_set, draft_index)
        if factor < 1.0:
            progress.note(
                f"the head's output scaled by {factor:.3g} to start from logits of spread {INITIAL_LOGIT_STD:g}"
            )
    data_seconds = record["answer_seconds"] + record["text_seconds"]
    seconds = None if settings.minutes is None else max(settings.minutes * 60 - data_seconds, 1.0)
    budget = Budget(seconds=seconds, tokens=settings.tokens)
    state = train(
        head=head,
        train_set=train_set,
        held_out=held_out,
        draft_index=draft_index,
        folder=out,
        steps=settings.steps,
        budget=budget,
        state=state,
        seed=settings.seed,
        peak_lr=settings.lr,
        progress=progress,
        warmup=settings.warmup,
        batch_rows=settings.batch_rows,
        single_step_share=settings.single_step_share,
    )
    figures = evaluate(head, held_out, [label(e, draft_index) for e in held_out], settings.steps) if held_out else {}
    progress.evaluated(figures) if figures else None
    facts = {
        "answers": sum(1 for e in examples if e.train_from > 0),
        "answer_tokens": int(sum(len(e.ids) - e.train_from - 1 for e in examples if e.train_from > 0)),
        "text_tokens": int(sum(len(e.ids) for e in examples if e.train_from == 0)),
        "held_out_examples": len(held_out),
        "data_seconds": data_seconds,
        "train_seconds": state.seconds,
        "trained_positions": state.tokens,
        "steps_taken": state.step,
        "epochs": state.epoch + state.batch / max(1, len(train_set)),
        "session_seconds": time.perf_counter() - began,
        "prompts_used": record["prompts_done"],
    }
    head.config.extra["mlxspec"] = {"trained_by": "mlxspec train-draft", "held_out": figures} | {
        k: facts[k] for k in ("answer_tokens", "text_tokens", "trained_positions")
    }
    if settings.standardize:
        fold_feature_scale(head, scale)  # the published head reads the target's raw features
    write_finished(head, out, model_card(settings, facts, figures, state, aux, len(vocabulary)))
    mx.clear_cache()
    return facts | {"held_out": figures}


def kept(path: Path, compute) -> np.ndarray:
    """An array the run decides once: read back when a resumed run finds it, else computed
    and saved."""
    if path.is_file():
        return np.load(path)
    value = compute()
    try:
        np.save(path, value)
    except OSError as e:
        raise TrainingError(f"cannot write {path}: {e.strerror or e}") from None
    return value


def model_card(settings: Settings, facts: dict, figures: dict, state: State, aux, vocab: int) -> str:
    alpha = figures.get("alpha") or []
    rows = "\n".join(f"| {k} | {a:.3f} |" for k, a in enumerate(alpha, 1))
    history = "\n".join(
        f"| {h['step']} | {h['tokens']} | "
        + ", ".join(f"{a:.3f}" for a in h["alpha"])
        + f" | {h['expected_acceptance']:.3f} |"
        for h in state.history
    )
    source = f"prompts from {settings.prompts_file}" if settings.prompts_file else "the bundled prompt set"
    text = ", ".join(settings.text_files) or "none"
    return f"""# EAGLE-3 draft head for {Path(settings.target).name}

Trained on this machine by `mlxspec train-draft` (one decoder layer over the target's
hidden states entering layers {list(aux)}, {vocab}-id draft vocabulary, training-time
test unrolled {settings.steps} steps). Load it with `--draft DIR` beside its target.

    {settings.command}

## Data
- {facts["answers"]} answers by the target itself ({source}; {facts["prompts_used"]} prompts
  read), {facts["answer_tokens"]} answer tokens, generated in batches of {settings.batch}
  (70% greedy, 30% sampled at temperature 0.7, at most {settings.max_tokens} tokens each).
- Fixed text read by teacher-forced prefill: {facts["text_tokens"]} tokens ({text}).
- Features and the target's top-32 distributions from a teacher-forced prefill of each
  sequence; every 16th example held out ({facts["held_out_examples"]} examples).
- Data took {facts["data_seconds"] / 60:.1f} min; training {facts["train_seconds"] / 60:.1f} min
  ({facts["steps_taken"]} steps, {facts["trained_positions"]} trained positions summed over
  steps, {facts["epochs"]:.1f} epochs).

## Held-out acceptance
Greedy agreement with the target per draft position, conditional (position k over the
chains whose first k-1 drafts agreed):

| position | α |
|---|---|
{rows}

Expected acceptance at position 1, sum(min(p, q)) at temperature 1:
{figures.get("expected_acceptance", float("nan")):.3f} over {figures.get("positions", 0)} positions.

## As training went (held-out subset)
| step | trained positions | α per position | Σ min(p, q) |
|---|---|---|---|
{history}
"""
