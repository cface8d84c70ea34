"""`train-draft --data-from RUN`: a run that begins from another run's data for the same
target, its shards linked and its taps recorded (the data is most of a run's time, and one
teacher's data trains a head and a DFlash drafter alike)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import TrainingError
from .settings import RUN_FILE, Settings, find_target, read_settings
from .shape import TargetShape
from .store import (
    PROGRESS_FILE,
    SHARD_PATTERN,
    UnrecordedShard,
    read_progress,
    read_taps,
    shard_number,
    write_json,
    write_taps,
)


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
    shards = [path for path in sorted(theirs.glob(SHARD_PATTERN)) if shard_number(path) < record["shards"]]
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
    write_json(partial / PROGRESS_FILE, record | {"full": False, "adopted_seconds": adopted})
    write_taps(partial, stream)
    partial.rename(data)
