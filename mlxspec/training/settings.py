"""A `train-draft` run's settings: what the command was told, each checked as the run uses it,
saved in DIR/run.json and read back by --resume; and the target they name, found and loaded
as every command finds and loads a model."""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from ..drafters import DFLASH, EAGLE3
from ..drafters.dflash_model import MAX_BLOCK, MAX_LAYERS
from ..errors import TrainingError
from .store import is_number, is_whole, write_json

RUN_FILE = "run.json"
KINDS = (EAGLE3, DFLASH)
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


def save_settings(settings: Settings, out: Path) -> None:
    """The run's settings, whole: written when it starts, and again when a resumed run is
    given a new time plan."""
    write_json(out / RUN_FILE, asdict(settings))


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
