"""A run's data as it lies on disk: examples in shards, where they were tapped, how far
making them got.

An example is one sequence: `ids` (L,), `features` (L, F) float16 (float32 where float16
would overflow), `top_ids` (L, K) and `top_probs` (L, K), and `train_from`: the first
position whose distribution is learnt (the prompt's last position for an answer, so that
only answer tokens are targets; 0 for text). Examples are kept in shards
(DIR/data/shard-NNNN.npz, written to a temporary name and renamed), so a resumed run reads
them instead of asking the target again; progress.json counts the shards and the sources'
work and time, and taps.json says where on the target's residual stream the features were
read. Every file is checked as it is read: nothing damaged is read as data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import TrainingError

TOP_K = 32  # the target's distribution kept at each position: its K likeliest ids


@dataclass
class Example:
    ids: np.ndarray  # (L,) int32
    features: np.ndarray  # (L, F) float16, or float32 where float16 would overflow
    top_ids: np.ndarray  # (L, K) int32
    top_probs: np.ndarray  # (L, K) float16
    train_from: int
    held_out: bool
    greedy: bool  # an answer the target wrote greedily (held-out agreement is read on these)


def save_shard(path: Path, examples: list[Example]) -> None:
    """One shard, whole or not at all: written beside, then renamed."""
    partial = path.with_name(path.stem + ".partial.npz")
    try:
        np.savez(
            partial,
            ids=np.concatenate([e.ids for e in examples]).astype(np.int32),
            lengths=np.array([len(e.ids) for e in examples], dtype=np.int64),
            features=np.concatenate([e.features for e in examples]),
            top_ids=np.concatenate([e.top_ids for e in examples]),
            top_probs=np.concatenate([e.top_probs for e in examples]),
            train_from=np.array([e.train_from for e in examples], dtype=np.int64),
            held_out=np.array([e.held_out for e in examples], dtype=bool),
            greedy=np.array([e.greedy for e in examples], dtype=bool),
        )
        partial.rename(path)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise TrainingError(f"cannot write {path}: {e.strerror or e}") from None


SHARD_PATTERN = "shard-[0-9][0-9][0-9][0-9].npz"


def shard_number(path: Path) -> int:
    """A shard's number, from its name (SHARD_PATTERN)."""
    return int(path.name[6:10])


PARTIAL_PATTERN = "shard-[0-9][0-9][0-9][0-9].partial.npz"  # save_shard's, before its rename
_SHARD_KINDS = {  # key: (dimensions, the kind of its values)
    "ids": (1, np.integer),
    "lengths": (1, np.integer),
    "features": (2, np.floating),
    "top_ids": (2, np.integer),
    "top_probs": (2, np.floating),
    "train_from": (1, np.integer),
    "held_out": (1, np.bool_),
    "greedy": (1, np.bool_),
}


def load_shards(
    folder: Path, *, vocab_size: int | None = None, feature_width: int | None = None, columns: np.ndarray | None = None
) -> list[Example]:
    """Every shard's examples, each shard checked whole first (`vocab_size`: the target's, for
    the ids; `feature_width`: what the taps give): a damaged shard is refused in one line
    naming it, never read as examples it does not hold. `columns`: the feature columns kept
    (a drafter reading some of the data's taps), taken a shard at a time."""
    examples = []
    for path in sorted(Path(folder).glob(SHARD_PATTERN)):
        data = _read_shard(path)
        problem = shard_problem(data, vocab_size=vocab_size, feature_width=feature_width)
        if problem:
            raise TrainingError(f"{path}: not a data shard of this run ({problem}); {_SHARD_FIX}")
        if columns is not None:
            data["features"] = data["features"][:, columns]
        offsets = np.concatenate([[0], np.cumsum(data["lengths"])])
        for i in range(len(data["lengths"])):
            a, b = offsets[i], offsets[i + 1]
            examples.append(
                Example(
                    data["ids"][a:b],
                    data["features"][a:b],
                    data["top_ids"][a:b],
                    data["top_probs"][a:b],
                    int(data["train_from"][i]),
                    bool(data["held_out"][i]),
                    bool(data["greedy"][i]),
                )
            )
    return examples


_SHARD_FIX = "move it away (its examples are then left out) or start the run again"


def _read_shard(path: Path) -> dict:
    """The shard's arrays; a file that does not read back whole (cut short, bytes changed: the
    zip's checksums fail) is one line, whatever numpy or zipfile raised."""
    try:
        with np.load(path, allow_pickle=False) as npz:  # each key read once: indexing reads it again
            return {key: npz[key] for key in npz.files}
    except Exception as e:  # BadZipFile, EOFError, ValueError, ...: the file is damaged
        raise TrainingError(
            f"{path}: not a readable data shard (damaged or cut short: {type(e).__name__}); {_SHARD_FIX}"
        ) from None


def shard_problem(data: dict, *, vocab_size: int | None, feature_width: int | None) -> str | None:
    """What makes a shard's arrays other than save_shard writes them, or None."""
    for key, (ndim, kind) in _SHARD_KINDS.items():
        array = data.get(key)
        if array is None:
            return f"no {key}"
        if array.ndim != ndim or not np.issubdtype(array.dtype, kind):
            return f"{key} is not a {ndim}-D array of {kind.__name__.rstrip('_')} values"
    lengths, rows = data["lengths"], len(data["ids"])
    if not all(len(data[key]) == len(lengths) for key in ("train_from", "held_out", "greedy")):
        return "its per-example arrays differ in length"
    if (lengths < 1).any() or int(lengths.sum()) != rows:
        return "its lengths do not add up to its ids"
    if not all(len(data[key]) == rows for key in ("features", "top_ids", "top_probs")):
        return "its per-position arrays differ in length"
    if data["top_ids"].shape[1] != TOP_K or data["top_probs"].shape[1] != TOP_K:
        return f"its distributions are not the top {TOP_K} ids"
    if feature_width is not None and data["features"].shape[1] != feature_width:
        return f"its features are {data['features'].shape[1]} wide, the target's taps give {feature_width}"
    if ((data["train_from"] < 0) | (data["train_from"] >= lengths)).any():
        return "a first trained position lies outside its example"
    top = vocab_size if vocab_size is not None else np.iinfo(np.int64).max
    for key in ("ids", "top_ids"):
        if rows and (data[key].min() < 0 or data[key].max() >= top):
            return f"{key} outside the target's vocabulary"
    if not np.isfinite(data["features"]).all():
        return "features that are not finite"
    probs = data["top_probs"].astype(np.float32)
    if not (np.isfinite(probs).all() and (probs >= 0).all() and (probs <= 1).all()):
        return "probabilities outside [0, 1]"
    return None


TAPS_FILE = "taps.json"  # where the data's features were tapped (a folder without one: the run's own kind's)


def read_taps(folder: Path, *, layers: int) -> tuple[int, ...] | None:
    """The stream positions the data's features were tapped at (capture.install_stream),
    checked against the target's `layers`; None where the folder does not say."""
    file = Path(folder) / TAPS_FILE
    if not file.is_file():
        return None
    try:
        saved = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise TrainingError(f"{file}: not a readable record of the data's taps ({type(e).__name__})") from None
    stream = saved.get("stream") if isinstance(saved, dict) else None
    if not (isinstance(stream, list) and stream and all(is_whole(p) and 0 <= p <= layers for p in stream)):
        raise TrainingError(f"{file}: stream must be a list of positions from 0 to the target's {layers} layers")
    return tuple(stream)


def write_taps(folder: Path, stream: tuple[int, ...]) -> None:
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainingError(f"cannot create {folder}: {e.strerror or e}") from None
    write_json(Path(folder) / TAPS_FILE, {"stream": list(stream)})


PROGRESS_FILE = "progress.json"
_PROGRESS_COUNTS = ("prompts_done", "text_done", "shards")
# adopted_seconds: of those seconds, what the run a --data-from run began from spent (not this run's time)
_PROGRESS_SECONDS = ("answer_seconds", "text_seconds", "adopted_seconds")


def read_progress(folder: Path) -> dict:
    """How far the data got (progress.json: prompts and text chunks done, the seconds each
    took, shards written), checked: whole counts and finite seconds, at least 0, and as many
    shards as the folder holds; a fresh record when there is none yet."""
    record = {"prompts_done": 0, "text_done": 0, "answer_seconds": 0.0, "text_seconds": 0.0, "shards": 0}
    record["adopted_seconds"] = 0.0
    record["full"] = False  # a shard was refused for --max-disk: the run makes no more data
    file = Path(folder) / PROGRESS_FILE
    if file.is_file():
        try:
            saved = json.loads(file.read_text())
        except (OSError, ValueError) as e:
            raise TrainingError(f"{file}: not a readable progress record ({type(e).__name__})") from None
        if not isinstance(saved, dict):
            raise TrainingError(f"{file}: not a progress record (a JSON object of counts and seconds)")
        record |= {key: saved[key] for key in record if key in saved}
    for key in _PROGRESS_COUNTS:
        if not is_whole(record[key]) or record[key] < 0:
            raise TrainingError(f"{file}: {key} is {record[key]!r}, not a whole number >= 0")
    for key in _PROGRESS_SECONDS:
        if not is_number(record[key]) or not math.isfinite(record[key]) or record[key] < 0:
            raise TrainingError(f"{file}: {key} is {record[key]!r}, not a number of seconds >= 0")
    if not isinstance(record["full"], bool):
        raise TrainingError(f"{file}: full is {record['full']!r}, not true or false")
    written = [shard_number(path) for path in Path(folder).glob(SHARD_PATTERN)]
    if written and record["shards"] == max(written):
        raise UnrecordedShard(Path(folder) / f"shard-{record['shards']:04d}.npz", record)
    if written and record["shards"] < max(written):
        raise TrainingError(
            f"{file} says {record['shards']} shards were written, the folder holds shard-{max(written):04d}: "
            "the record does not belong to these shards"
        )
    return record


class UnrecordedShard(TrainingError):
    """The next shard is on disk but progress.json does not count it: the run was stopped
    between the shard's rename and its record's (clear_unrecorded)."""

    def __init__(self, path: Path, record: dict):
        super().__init__(f"{path} was written but not recorded")
        self.path, self.record = path, record  # the record, checked, of the shards before it


def clear_unrecorded(folder: Path, *, note=None) -> None:
    """What a run killed mid-write leaves in its data folder, cleared before anything reads
    it: a shard cut short in writing (its .partial.npz), and a shard written whole whose
    record was not (killed between the two renames), which is removed and made again (a
    run's data is the same however often it is stopped: the prompts, their seeds and the
    text chunks of a shard are fixed by the record)."""
    for partial in Path(folder).glob(PARTIAL_PATTERN):
        partial.unlink(missing_ok=True)
    try:
        read_progress(folder)
    except UnrecordedShard as e:
        e.path.unlink()
        if note:
            note(f"{e.path.name} was written but not recorded (the run was stopped between the two): made again")


def is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def keep_columns(examples: list[Example], columns: np.ndarray | None) -> list[Example]:
    """`examples` with only the feature `columns` a drafter reads (None: as they are)."""
    return examples if columns is None else [replace(e, features=e.features[:, columns]) for e in examples]


def shard_bytes(examples: list[Example]) -> int:
    """The bytes a shard of `examples` will take on disk, at least: its arrays, and more than
    the npy and zip headers of its eight (some 200 bytes each)."""
    arrays = sum(e.ids.nbytes + e.features.nbytes + e.top_ids.nbytes + e.top_probs.nbytes for e in examples)
    return arrays + 18 * len(examples) + 4096


def write_json(path: Path, value) -> None:
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(json.dumps(value, indent=2) + "\n")
        partial.rename(path)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise TrainingError(f"cannot write {path}: {e.strerror or e}") from None
