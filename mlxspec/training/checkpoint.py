"""A training run's checkpoint and its finished drafter, each written whole or not at all.

The checkpoint (DIR/checkpoint/) is the drafter's weights, the optimizer's state and the
`State` (step, data cursor, time, held-out figures), written into a folder beside and
swapped in; state.json records the sha256 of every file the checkpoint was trained with, so
a file cut short, changed or replaced since is refused in one line, never trained on. The
finished drafter is written and loaded back before it is moved in, its config.json last.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..drafters.eagle3_head import load_head, save_head
from ..errors import TrainingError
from ..models.gguf.record import sha256
from .store import is_number, is_whole, write_json


@dataclass
class State:
    step: int = 0
    epoch: int = 0
    batch: int = 0  # the data cursor: next batch of this epoch
    seconds: float = 0.0  # training time so far: up to the end of the last whole step, each session
    tokens: int = 0  # trained positions so far (rows with a target, summed over steps)
    loss: float = float("nan")
    history: list = field(default_factory=list)  # held-out figures as training went


def _save_arrays(path: Path, arrays: dict) -> None:
    """Write a safetensors file whole or not at all: beside it first, read back, renamed."""
    partial = path.with_name(path.stem + ".partial.safetensors")
    try:
        mx.save_safetensors(str(partial), arrays)
        if len(mx.load(str(partial))) != len(arrays):
            raise OSError("the file read back is incomplete")
        partial.rename(path)
    except (OSError, RuntimeError, ValueError) as e:
        partial.unlink(missing_ok=True)
        raise TrainingError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from None


def non_finite(arrays: dict) -> str | None:
    """The name of the first floating array holding NaN or infinity, or None."""
    for name, array in arrays.items():
        if mx.issubdtype(array.dtype, mx.floating) and not mx.isfinite(array).all().item():
            return name
    return None


def check_finite(arrays: dict, what: str) -> None:
    """Refuse to keep weights that are not all finite: a diverged run saves nothing."""
    if (name := non_finite(arrays)) is not None:
        raise TrainingError(
            f"training diverged: {what} {name} holds NaN or infinite values, so nothing was saved; "
            "start again with a smaller --lr"
        )


CHECKPOINT_FILES = ("head.safetensors", "optimizer.safetensors")


def save_checkpoint(folder: Path, head: dict, optimizer: dict, state: State, *, bound: tuple[Path, ...] = ()) -> None:
    """The head, the optimizer's state and the State as one set: written into a folder
    beside, then swapped in, so a crash leaves the old set or the new, never a mix. state.json
    records the sha256 of each file of the set and of the `bound` files (beside the folder:
    the run's vocabulary and feature scale), so that a file changed since is refused."""
    check_finite(head, "the head's")
    check_finite(optimizer, "the optimizer's")
    partial, old = folder.with_name(folder.name + ".partial"), folder.with_name(folder.name + ".old")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    except OSError as e:
        raise TrainingError(f"cannot write {partial}: {e.strerror or e}") from None
    _save_arrays(partial / "head.safetensors", head)
    _save_arrays(partial / "optimizer.safetensors", optimizer)
    files = {name: sha256(partial / name) for name in CHECKPOINT_FILES}
    files |= {_bound_name(folder, path): sha256(path) for path in bound}
    write_json(partial / "state.json", state.__dict__ | {"files": files})
    try:
        if folder.exists():  # else .old may be the only whole set (a swap cut short): keep it
            shutil.rmtree(old, ignore_errors=True)
            folder.rename(old)
        partial.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise TrainingError(f"cannot write {folder}: {e.strerror or e}") from None


def _bound_name(folder: Path, path: Path) -> str:
    """A bound file's name as state.json records it: relative to the run's folder."""
    return Path(path).relative_to(Path(folder).parent).as_posix()


def checkpoint_folder(folder: Path) -> Path | None:
    """The checkpoint a resumed run reads: folder, or the set a crash mid-swap left as .old."""
    for candidate in (folder, folder.with_name(folder.name + ".old")):
        if (candidate / "state.json").is_file():
            return candidate
    return None


def check_checkpoint(folder: Path) -> State:
    """The State of the checkpoint in `folder`, its files checked against the sha256 it
    recorded (its own and the run's arrays it was trained with): a file cut short, with bytes
    changed or replaced, is refused in one line."""
    state, files = read_state(folder)
    for name, digest in files.items():
        path = folder / name if name in CHECKPOINT_FILES else folder.parent / name
        if not path.is_file():
            raise TrainingError(f"{folder}: the checkpoint lacks {path.name}; {_CHECKPOINT_FIX}")
        if sha256(path) != digest:
            raise TrainingError(f"{path} is not the file this checkpoint wrote (its sha256 differs); {_CHECKPOINT_FIX}")
    return state


def load_checkpoint(folder: Path, head: nn.Module) -> State:
    """The State of the checkpoint in `folder`, its drafter's weights loaded into `head`; a
    checkpoint whose files are not the ones it recorded (cut short, bytes changed), whose
    state is out of range or whose weights are not finite is refused in one line."""
    state = check_checkpoint(folder)
    try:
        weights = mx.load(str(folder / "head.safetensors"))
        head.load_weights(list(weights.items()))
    except Exception as e:  # a file from before digests were kept, damaged: one line
        raise TrainingError(
            f"{folder}: the checkpoint's head does not read back ({type(e).__name__}); {_CHECKPOINT_FIX}"
        ) from None
    try:
        check_finite(weights, "the checkpoint's head")
    except TrainingError:
        raise TrainingError(
            f"{folder}: the checkpoint's head holds NaN or infinite weights; {_CHECKPOINT_FIX}"
        ) from None
    return state


_CHECKPOINT_FIX = "move the checkpoint folder away to train from the start (the data is kept)"
_STATE_COUNTS = ("step", "epoch", "batch", "tokens")


def read_state(folder: Path) -> tuple[State, dict]:
    """A checkpoint's State and the digests of its files (empty for a checkpoint written
    before they were kept), checked: whole counts and seconds at least 0, a held-out record
    of figures."""
    file = folder / "state.json"
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise TrainingError(
            f"{file}: not a readable checkpoint state ({type(e).__name__}); {_CHECKPOINT_FIX}"
        ) from None
    if not isinstance(raw, dict):
        raise TrainingError(f"{file}: not a checkpoint state (a JSON object); {_CHECKPOINT_FIX}")
    files = raw.pop("files", {})
    problem = _state_problem(raw, files)
    if problem:
        raise TrainingError(f"{file}: {problem}; {_CHECKPOINT_FIX}")
    return State(**raw), files


def _state_problem(raw: dict, files) -> str | None:
    known = {f.name for f in fields(State)}
    if unknown := sorted(set(raw) - known):
        return f"{unknown[0]!r} is not a field of a checkpoint's state"
    for key in _STATE_COUNTS:
        if not is_whole(raw.get(key)) or raw[key] < 0:
            return f"{key} is {raw.get(key)!r}, not a whole number >= 0"
    if not is_number(raw.get("seconds")) or not 0 <= raw["seconds"] < math.inf:
        return f"seconds is {raw.get('seconds')!r}, not a number of seconds >= 0"
    if not is_number(raw.get("loss")):
        return f"loss is {raw.get('loss')!r}, not a number"
    if not isinstance(raw.get("history"), list) or not all(_figures(h) for h in raw["history"]):
        return "its held-out record (history) is not a list of figures"
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and ".." not in Path(k).parts and not Path(k).is_absolute()
        for k, v in files.items()
    ):
        return "its record of files is not names and digests"
    if files and not set(CHECKPOINT_FILES) <= set(files):
        return "its record of files lacks the head or the optimizer"
    return None


def _figures(entry) -> bool:
    """One held-out record: step, tokens, α per position, Σ min(p, q), positions."""
    return (
        isinstance(entry, dict)
        and all(is_whole(entry.get(k)) and entry[k] >= 0 for k in ("step", "tokens", "positions"))
        and isinstance(entry.get("alpha"), list)
        and all(is_number(a) and 0 <= a <= 1 for a in entry["alpha"])
        and is_number(entry.get("expected_acceptance"))
        and math.isfinite(entry["expected_acceptance"])
    )


def write_finished(head, folder: Path, card: str, *, save=save_head, load=load_head) -> None:
    """The finished head: written and loaded back in folder/.partial, then moved in, its
    config.json last, so a folder without it (an interrupted run) never loads as a head.
    Weights that are not all finite are refused: a diverged run leaves no head."""
    check_finite(dict(tree_flatten(head.parameters())), "the head's")
    partial = folder / ".partial"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        save(head, partial)
        load(partial)  # what was written reads back as a drafter of its kind
        (partial / "README.md").write_text(card)
        (partial / "README.md").rename(folder / "README.md")
        (partial / "model.safetensors").rename(folder / "model.safetensors")
        (partial / "config.json").rename(folder / "config.json")
        partial.rmdir()
    except (OSError, RuntimeError) as e:
        (folder / "config.json").unlink(missing_ok=True)
        raise TrainingError(f"cannot write the head into {folder}: {getattr(e, 'strerror', None) or e}") from None
    except Exception as e:  # load_head's own complaint: a file cut short by the disk
        (folder / "config.json").unlink(missing_ok=True)
        raise TrainingError(f"cannot write the head into {folder}: {e}") from None
