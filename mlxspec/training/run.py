"""One `mlxspec train-draft` run, start to finish: the folder, the data, training, the drafter
(an EAGLE-3 head, or with --kind dflash a DFlash block drafter: training/dflash.py).

DIR/run.json          the run's settings (what --resume continues; what marks a run)
DIR/data/             shards of examples, progress.json and taps.json (store.py)
DIR/checkpoint/       drafter and optimizer state, step and data cursor (checkpoint.py)
DIR/config.json, model.safetensors, README.md
                      the finished drafter and its card, moved in only at the end
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ..drafters import DFLASH
from ..errors import TrainingError
from .adopt import adopt_data, source_taps
from .card import dflash_summary, eagle3_summary, model_card
from .checkpoint import State, check_checkpoint, checkpoint_folder, load_checkpoint, read_state, write_finished
from .data import DataPlan, build_data, choose_vocabulary
from .sequences import check_text_files, read_prompt_file
from .settings import RUN_FILE, Settings, load_target, save_settings
from .shape import TargetShape
from .store import TAPS_FILE, clear_unrecorded, keep_columns, load_shards, read_progress, read_taps, write_taps
from .trainer import (
    INITIAL_LOGIT_STD,
    Eagle3Objective,
    draft_index,
    feature_scale,
    fold_feature_scale,
    new_head,
    standardize,
    train,
)

BUNDLED_PROMPTS = 6000


class Progress:
    """What a run reports as it goes (the CLI draws it; tests may ignore it)."""

    def data(self, source: str, record: dict, tokens: int, fraction: float) -> None: ...
    def trained(self, state: State, fraction: float) -> None: ...
    def evaluated(self, figures: dict) -> None: ...
    def note(self, message: str) -> None: ...
    def reading(self, stage: str, done: int, total: int) -> None: ...  # a long read: the corpus
    def status(self, message: str) -> None: ...  # a step begins: for people watching, not scripts


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
    save_settings(settings, out)


def abandon(out: Path) -> None:
    """Undo `start` for a run refused before it wrote any data (a target that does not load
    or cannot be tapped): no folder is left that --resume would take for a run."""
    if not (out / "data").exists():
        shutil.rmtree(out / "data.partial", ignore_errors=True)  # a --data-from adoption cut short: links
        (out / RUN_FILE).unlink(missing_ok=True)
        try:
            out.rmdir()
        except OSError:
            pass  # not empty: not ours to remove


def check_inputs(settings: Settings, progress: Progress | None = None) -> None:
    """The files a run reads besides the target, read or checked before any work: the
    prompts and the corpus parsed, each --text a readable file."""
    if settings.prompts_file:
        read_prompt_file(Path(settings.prompts_file))
    if settings.corpus:
        read_corpus(settings.corpus, progress)
    check_text_files([Path(f) for f in settings.text_files])


def read_corpus(name: str, progress: Progress | None):
    """The corpus's conversations, read (once a process) with a bar, said in a line."""
    from .conversations import load_corpus

    report = (lambda done, total: progress.reading("parsing the corpus", done, total)) if progress else None
    corpus = load_corpus(name, report=report)
    if not corpus.conversations:
        raise TrainingError(f"--corpus {name}: no conversation with a user turn in it")
    if progress:
        progress.note(f"corpus: {corpus.summary()}")
    return corpus


def spent_seconds(out: Path) -> float:
    """The run's time that earlier sessions spent on work they kept: answers and text in
    shards, training up to the last checkpointed step (time cut off by Ctrl-C is not kept)."""
    record = read_progress(out / "data")
    saved = checkpoint_folder(out / "checkpoint")
    trained = read_state(saved)[0].seconds if saved else 0.0
    # data a --data-from run began with took its source's time, not this run's
    return record["answer_seconds"] + record["text_seconds"] - record["adopted_seconds"] + trained


@dataclass
class Kept:
    """What earlier sessions of the run left, read back and checked before any new work."""

    examples: list
    vocabulary: np.ndarray | None
    scale: np.ndarray | None
    checkpoint: Path | None


def read_back(out: Path, settings: Settings, shape: TargetShape) -> Kept:
    """The shards, the decided arrays and the checkpoint earlier sessions wrote, each
    checked (one line naming a damaged file) before the run does anything new."""
    data = out / "data"
    size = min(settings.draft_vocab, shape.vocab_size)
    checkpoint = checkpoint_folder(out / "checkpoint")
    if checkpoint:
        check_checkpoint(checkpoint)
    return Kept(
        examples=load_shards(data, vocab_size=shape.vocab_size, feature_width=shape.data_width, columns=shape.columns),
        vocabulary=read_kept(
            data / VOCABULARY, lambda v: vocabulary_problem(v, vocab_size=shape.vocab_size, size=size)
        ),
        scale=read_kept(data / SCALE, lambda v: scale_problem(v, width=shape.feature_width)),
        checkpoint=checkpoint,
    )


VOCABULARY, SCALE = "vocabulary.npy", "feature_scale.npy"


def run(*, out: Path, settings: Settings, progress: Progress) -> dict:
    """Everything after the folder check: returns the final figures. The session ends by its
    deadline: --minutes from now, less what earlier sessions of the run spent on work they
    kept (spent_seconds)."""
    import mlx.core as mx

    from ..decoding.capture import num_layers

    began = time.perf_counter()
    clear_unrecorded(out / "data", note=progress.note)  # what a run killed mid-write left
    check_inputs(settings)  # the command has read them already (a corpus is read once a process)
    progress.status(f"loading {settings.target}")
    target = load_target(settings.target)
    model, tokenizer = target.model, target.tokenizer
    layers = num_layers(model)
    data = out / "data"
    adopting = settings.data_from is not None and not data.exists()  # a run begun from another's data
    source = Path(settings.data_from) if adopting else None
    stream = source_taps(source, config=target.config, layers=layers) if source else read_taps(data, layers=layers)
    shape = TargetShape.of(target.config, layers, kind=settings.kind, stream=stream)
    mask_id = None
    if settings.kind == DFLASH:  # refused before any work where the tokenizer has none
        from .dflash import choose_mask_id

        mask_id = choose_mask_id(tokenizer, vocab_size=shape.vocab_size, given=settings.mask_id)
    taps = shape.tap(model)  # a target that cannot be tapped, refused as well before any file is written
    if source:
        adopt_data(source, data, shape.stream)
    elif stream is None:
        if settings.data_from is not None:  # adopted data always says where it was tapped
            raise TrainingError(f"{data / TAPS_FILE} is missing: where its data was tapped is not known; start again")
        write_taps(data, shape.stream)  # the data says where it was tapped, for any run that reads it
    # (read once the data is in place: spent_seconds leaves out an adopted source's time, adopted_seconds)
    until = math.inf if settings.minutes is None else began + settings.minutes * 60 - spent_seconds(out)
    kept = read_back(out, settings, shape)
    plan = data_plan(settings, vocab_size=shape.vocab_size)
    record, made = build_data(
        model, tokenizer, taps, out / "data", plan, report=progress.data, until=until,
        reading=progress.reading, note=progress.note,
    )  # fmt: skip
    examples = kept.examples + keep_columns(made, shape.columns)
    if not examples:
        raise TrainingError("the target wrote no usable data (give more --minutes, prompts, --text or --max-disk)")
    train_set = [e for e in examples if not e.held_out] or examples
    held_out = [e for e in examples if e.held_out]
    bound: tuple[Path, ...] = ()
    vocabulary = kept.vocabulary
    if vocabulary is None and settings.kind == DFLASH and kept.checkpoint is not None:
        # a DFlash run checkpointed before drafters had a draft vocabulary: its drafter
        # scores the target's whole vocabulary, as it did when it began
        vocabulary = np.arange(shape.vocab_size)
    else:
        if vocabulary is None:  # decided once: a resumed run reads it back
            eos = sorted(set(tokenizer.eos_token_ids))
            # from the examples trained on: the held-out ones judge the head, and choose nothing
            chosen = choose_vocabulary(train_set, eos=eos, vocab_size=shape.vocab_size, size=settings.draft_vocab)
            vocabulary = keep(data / VOCABULARY, chosen)
        bound += (data / VOCABULARY,)
    head, objective = new_drafter_and_objective(model, target.config, settings, shape, vocabulary, mask_id=mask_id)
    if settings.standardize:  # fixed once, so that a resumed run trains on the same standardised features
        scale = (
            kept.scale if kept.scale is not None else keep(data / SCALE, feature_scale(train_set, seed=settings.seed))
        )
        standardize(examples, scale)
        bound += (data / SCALE,)

    state = start_state(head, objective, kept.checkpoint, train_set, progress)
    state = train(
        head=head,
        objective=objective,
        train_set=train_set,
        held_out=held_out,
        folder=out,
        state=state,
        seed=settings.seed,
        peak_lr=settings.lr,
        progress=progress,
        until=until,
        tokens=settings.tokens,
        warmup=settings.warmup,
        batch_rows=settings.batch_rows,
        bound=bound,
    )
    figures = objective.evaluate(head, held_out, [objective.labels(e) for e in held_out]) if held_out else {}
    progress.evaluated(figures) if figures else None
    facts = {
        "answers": sum(1 for e in examples if e.train_from > 0),
        "answer_tokens": int(sum(len(e.ids) - e.train_from - 1 for e in examples if e.train_from > 0)),
        "text_tokens": int(sum(len(e.ids) for e in examples if e.train_from == 0)),
        "held_out_examples": len(held_out),
        "data_seconds": record["answer_seconds"] + record["text_seconds"],
        "adopted_seconds": record["adopted_seconds"],
        "train_seconds": state.seconds,
        "trained_positions": state.tokens,
        "steps_taken": state.step,
        "epochs": state.epoch + state.batch / max(1, len(train_set)),
        "session_seconds": time.perf_counter() - began,
        "prompts_used": record["prompts_done"],
    }
    if settings.standardize:
        fold_feature_scale(head, scale)  # the published drafter reads the target's raw features
    if settings.kind == DFLASH:
        from ..drafters.dflash_model import load_draft, save_draft

        card = model_card(
            settings, facts, figures, state, what=dflash_summary(settings, shape, mask_id, len(vocabulary))
        )
        # bfloat16 as heads are written (and z-lab's drafters published): half the disk
        write_finished(head, out, card, save=partial(save_draft, dtype=mx.bfloat16), load=load_draft)
    else:
        head.config.extra["mlxspec"] = {"trained_by": "mlxspec train-draft", "held_out": figures} | {
            k: facts[k] for k in ("answer_tokens", "text_tokens", "trained_positions")
        }
        card = model_card(settings, facts, figures, state, eagle3_summary(settings, shape, len(vocabulary)))
        write_finished(head, out, card)
    mx.clear_cache()
    return facts | {"held_out": figures}


def new_drafter_and_objective(model, config: dict, settings: Settings, shape: TargetShape, vocabulary, *, mask_id):
    """A fresh drafter of `settings.kind` over the draft `vocabulary` (the target's ids it
    scores) and the objective it trains with: what a run starts from, and what
    demos/eagle3/ablate.py varies."""
    index = draft_index(vocabulary, shape.vocab_size)
    if settings.kind == DFLASH:
        from .dflash import DFlashObjective, new_drafter

        whole = len(vocabulary) == shape.vocab_size  # the published layout: the target's LM head
        drafter = new_drafter(
            model, config, layer_ids=shape.aux, block_size=settings.block_size,
            layers=settings.draft_layers, mask_id=mask_id, seed=settings.seed,
            vocabulary=None if whole else vocabulary,
        )  # fmt: skip
        objective = DFlashObjective(
            block_size=settings.block_size, mask_id=mask_id, vocab_size=shape.vocab_size,
            draft_index=None if whole else index,
        )  # fmt: skip
        return drafter, objective
    head = new_head(
        model, config, vocabulary=vocabulary, aux_layer_ids=shape.aux, seed=settings.seed,
        norm_before_residual=settings.norm_before_residual,
    )  # fmt: skip
    return head, Eagle3Objective(index, settings.steps, settings.single_step_share)


def data_plan(settings: Settings, *, vocab_size: int) -> DataPlan:
    from .conversations import prompts_of
    from .corpus import build_prompts

    conversations = read_corpus(settings.corpus, None).conversations if settings.corpus else []
    if settings.prompts_file:
        prompts = read_prompt_file(Path(settings.prompts_file))
    elif conversations:  # every user turn with its conversation's earlier turns, in an order of the seed
        prompts = [p for c in conversations for p in prompts_of(c)]
        np.random.default_rng(settings.seed).shuffle(prompts)
    else:
        prompts = [p["prompt"] for p in build_prompts(BUNDLED_PROMPTS, seed=settings.seed)]
    return DataPlan(
        prompts=prompts,
        text_files=[Path(f) for f in settings.text_files],
        answer_seconds=settings.answer_minutes * 60,
        text_seconds=settings.text_minutes * 60,
        max_tokens=settings.max_tokens,
        batch=settings.batch,
        seed=settings.seed,
        raw=settings.raw,
        vocab_size=vocab_size,
        conversations=conversations,
        corpus_tokens=settings.corpus_tokens,
        max_disk=settings.max_disk,
        # with no --minutes the schedule does not depend on the clock, nor do the data's forwards
        paced=settings.minutes is not None,
    )


def start_state(head, objective, checkpoint: Path | None, train_set: list, progress: Progress) -> State:
    """The checkpoint's state (its drafter's weights loaded), or a fresh one with the
    drafter's output calibrated."""
    if checkpoint:
        state = load_checkpoint(checkpoint, head)
        progress.note(f"resuming training at step {state.step}")
        return state
    factor = objective.calibrate(head, train_set)
    if factor < 1.0:
        progress.note(
            f"the drafter's output scaled by {factor:.3g} to start from logits of spread {INITIAL_LOGIT_STD:g}"
        )
    return State()


def read_kept(path: Path, problem) -> np.ndarray | None:
    """An array the run decided once and a resumed run reads back (None: not decided yet);
    refused in one line when it does not read, or `problem(array)` names what is wrong."""
    if not path.is_file():
        return None
    try:
        value = np.load(path, allow_pickle=False)
    except Exception as e:  # EOFError, ValueError, ...: cut short or not an array file
        raise TrainingError(
            f"{path}: not a readable array (damaged or cut short: {type(e).__name__}); {_KEPT_FIX}"
        ) from None
    if reason := problem(value):
        raise TrainingError(f"{path}: {reason}; {_KEPT_FIX}")
    return value


def keep(path: Path, value: np.ndarray) -> np.ndarray:
    try:
        np.save(path, value)
    except OSError as e:
        raise TrainingError(f"cannot write {path}: {e.strerror or e}") from None
    return value


_KEPT_FIX = "delete it and the run works it out again from its data"


def vocabulary_problem(value: np.ndarray, *, vocab_size: int, size: int) -> str | None:
    """What makes a saved draft vocabulary other than choose_vocabulary's, or None."""
    if not isinstance(value, np.ndarray) or value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
        return "not a list of token ids"
    if len(value) != size:
        return f"{len(value)} ids, not the {size} of this run's draft vocabulary"
    if value.min() < 0 or value.max() >= vocab_size or (np.diff(value) <= 0).any():
        return f"not distinct ids in increasing order within the target's {vocab_size}"
    return None


def scale_problem(value: np.ndarray, *, width: int) -> str | None:
    """What makes a saved feature scale other than feature_scale's, or None."""
    if not isinstance(value, np.ndarray) or value.ndim != 1 or not np.issubdtype(value.dtype, np.floating):
        return "not a row of numbers"
    if len(value) != width:
        return f"{len(value)} columns, the target's features have {width}"
    if not (np.isfinite(value).all() and (value > 0).all()):
        return "scales that are not finite positive numbers"
    return None
