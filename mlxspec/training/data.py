"""The drafter's training data, written by the target itself.

Two sources: the target's own answers to a prompt set (answers.py: written in batches,
greedy for most and sampled at temperature 0.7 for the rest), and fixed text read as it is
(--text files, then a corpus's conversations, in a teacher-forced prefill). Either way the
target runs with taps on the drafter's feature layers (capture.py), which give, at every
position j, the hidden states at those taps (the drafter's input) beside the target's
distribution for token j+1 (its top-K ids and probabilities: the soft labels). An answer
keeps only the last CONTEXT rows of its prompt before its first target. The examples are
written a shard at a time as they are made (store.py), so a stopped run goes on where it
stopped.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import TrainingError
from .answers import LEAST_ANSWER, Written, answered, compact, kept_from, sorted_top, top_of, write_answers
from .sequences import conversation_sequences, encode_prompts, is_held_out, text_sequences
from .split import HELD_OUT_EVERY
from .store import (
    PROGRESS_FILE,
    SHARD_PATTERN,
    Example,
    read_progress,
    save_shard,
    shard_bytes,
    write_json,
)

MAX_PROMPT = 448  # longer prompts are left out (what an answer's prompt costs: read, cached, disk)
STEP_SECONDS = 1.0  # the work between two looks at the clock (and chances for Ctrl-C), about


class Pace:
    """How many positions a forward may read to take about STEP_SECONDS here, measured as the
    target reads: a fast machine reads in large batches, and a slow one (a CPU) still looks
    at the clock, and hears Ctrl-C, every second or so. `measured` False: always `positions`,
    so the forwards' shapes, and with them the data's last bits, do not depend on the clock
    (a run with a --tokens budget: the same shards whenever it is stopped and resumed; a
    CPU's BLAS may round a row differently in a batch of another size)."""

    def __init__(self, positions: int = 256, *, least: int = 32, measured: bool = True):
        self.positions, self.least, self.measured = positions, least, measured

    def observe(self, positions: int, seconds: float) -> None:
        if self.measured:
            self.positions = max(self.least, int(positions / max(seconds, 1e-3) * STEP_SECONDS))


def prefill(
    model, taps, sequences: list[list[int]], *, vocab_size: int, until: float = math.inf, pace: Pace | None = None
) -> list:
    """Teacher-forced prefill: per sequence (features (L, F) float16, top ids (L, K),
    top probs (L, K) float16), or None for those left when the clock passed `until`
    (perf_counter seconds). Sequences of similar length are right-padded together (about
    half a GB of float32 logits at once, and no more positions than `pace` allows); the
    causal mask keeps padding out of every real position."""
    pace = pace or Pace()
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list = [None] * len(sequences)
    start = 0
    while start < len(order) and (began := time.perf_counter()) < until:
        batch_tokens = min(pace.positions, max(256, 2**27 // vocab_size))
        width = len(sequences[order[start]])
        group = [order[start]]
        while start + len(group) < len(order):
            nxt = len(sequences[order[start + len(group)]])
            if nxt * (len(group) + 1) > batch_tokens:
                break
            group.append(order[start + len(group)])
            width = nxt
        start += len(group)
        inputs = mx.array([sequences[i] + [0] * (width - len(sequences[i])) for i in group], dtype=mx.uint32)
        logits = model(inputs).astype(mx.float32)
        features = taps.take().astype(mx.float32)
        top, probs = top_of(logits)
        mx.eval(features, top, probs)
        features, top, probs = np.array(features), np.array(top).astype(np.int32), np.array(probs.astype(mx.float16))
        pace.observe(width * len(group), time.perf_counter() - began)
        features = compact(features)
        for row, i in enumerate(group):
            n = len(sequences[i])
            out[i] = (features[row, :n], *sorted_top(top[row, :n], probs[row, :n]))
    return out


@dataclass
class DataPlan:
    prompts: list[str]
    text_files: list[Path]
    answer_seconds: float
    text_seconds: float
    max_tokens: int
    batch: int
    seed: int
    raw: bool = False
    vocab_size: int = 49152  # the target's logits' width (sizes the prefill's batches)
    conversations: list = field(default_factory=list)  # read teacher-forced after the --text files
    corpus_tokens: int = 0  # of the conversations' tokens, read at most
    max_disk: int | None = None  # bytes the shards may take; none is written past it
    paced: bool = True  # forwards sized by the clock (Pace); False: the same shapes on every run


TEXT_GROUP = 32  # text chunks read a shard


def build_data(
    model, tokenizer, taps, folder: Path, plan: DataPlan, *, report, until: float = math.inf, reading=None, note=None
) -> tuple[dict, list[Example]]:
    """Fill `folder` with shards: answers to the prompts, then fixed text, each source for
    its own time and neither past `until` (perf_counter seconds: the run's deadline). Shards
    already there are kept; the record DIR/data/progress.json says how far each source got
    and the time it took, so a resumed run goes on where it stopped. Returns the record and
    the examples written now. No shard is written that would take the shards past
    `plan.max_disk` bytes: the data ends there (`note` says so). `reading(stage, done,
    total)` follows the corpus being rendered and tokenised."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainingError(f"cannot create {folder}: {e.strerror or e}") from None
    record, made = read_progress(folder), []
    used = sum(path.stat().st_size for path in folder.glob(SHARD_PATTERN))

    def write(examples: list[Example], **moved) -> bool:
        """The examples as the next shard (none: no shard), and what they moved on; False
        (nothing written) when the shard would take the data past --max-disk."""
        nonlocal used
        if examples:
            size = shard_bytes(examples)
            if plan.max_disk is not None and used + size > plan.max_disk:
                if note:
                    note(
                        f"the data holds {_size(used)} and the next shard ({_size(size)}) would pass "
                        f"--max-disk {_size(plan.max_disk)}: no more data is written"
                    )
                record["full"] = True  # a resumed run does not make the shard again to refuse it
                write_json(folder / PROGRESS_FILE, record)
                return False
            path = folder / f"shard-{record['shards']:04d}.npz"
            save_shard(path, examples)
            used += path.stat().st_size
            record["shards"] += 1
            made.extend(examples)
        record.update({k: record[k] + v for k, v in moved.items()})
        write_json(folder / PROGRESS_FILE, record)
        return True

    if record["full"]:
        if note:
            bound = _size(plan.max_disk or 0)
            note(f"the data holds {_size(used)}, stopped at --max-disk {bound}: no more data is written")
        return record, made
    pace = Pace(measured=plan.paced)  # shared: the answers' prefill teaches the text's
    if _answers(model, tokenizer, taps, plan, record, write=write, report=report, until=until, pace=pace):
        _text(model, tokenizer, taps, plan, record, write=write, report=report, until=until, pace=pace, reading=reading)
    return record, made


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _answers(model, tokenizer, taps, plan: DataPlan, record: dict, *, write, report, until: float, pace) -> bool:
    """The target's answers, and what it saw writing them (answers.py), a shard of 2 x batch
    prompts at a time, until the prompts or the answers' time run out. False: the disk's
    bound was reached."""
    eos = sorted(set(tokenizer.eos_token_ids))
    chunk = plan.batch * 2  # prompts a shard
    phase_end = min(until, time.perf_counter() + plan.answer_seconds - record["answer_seconds"])
    while record["prompts_done"] < len(plan.prompts) and (started := time.perf_counter()) < phase_end:
        first = record["prompts_done"]
        group = encode_prompts(tokenizer, plan.prompts[first : first + chunk], raw=plan.raw, limit=MAX_PROMPT)
        keep = [i for i, p in enumerate(group) if 0 < len(p) <= MAX_PROMPT]
        made = write_answers(
            model,
            taps,
            [group[i] for i in keep],
            max_tokens=plan.max_tokens,
            eos=eos,
            seed=plan.seed + first,
            batch=plan.batch,
            pace=pace,
            vocab_size=plan.vocab_size,
            until=phase_end,
        )
        examples = [
            _answer_example(group[i], m, held_out=is_held_out(plan.prompts[first + i], first + i))
            for i, m in zip(keep, made)
            if m is not None and len(m.ids) >= LEAST_ANSWER
        ]
        # the group's prompts from the first the clock left unanswered are not done
        count = answered(made)
        done = keep[count] if count < len(keep) else len(group)
        if not write(examples, prompts_done=done, answer_seconds=time.perf_counter() - started):
            return False
        share = max(record["answer_seconds"] / plan.answer_seconds, record["prompts_done"] / len(plan.prompts))
        report("answers", record, sum(len(m.ids) for m in made if m is not None), share)
    return True


def _answer_example(prompt: list[int], made: Written, *, held_out: bool) -> Example:
    """An answer's example: its prompt cut to the rows answers.py kept (the last CONTEXT
    before its first target: a conversation's prompt of up to MAX_PROMPT ids would otherwise
    take most of the disk and memory its answer needs), then the answer."""
    cut = kept_from(prompt)
    ids = np.array(prompt[cut:] + made.ids, dtype=np.int32)
    return Example(ids, made.features, made.top_ids, made.top_probs, len(prompt) - 1 - cut, held_out, made.greedy)


def _text(model, tokenizer, taps, plan: DataPlan, record: dict, *, write, report, until: float, pace, reading) -> None:
    """Fixed text read by the target (the --text files', then the corpus's conversations),
    TEXT_GROUP chunks a shard, until it or its time runs out."""
    phase_end = min(until, time.perf_counter() + plan.text_seconds - record["text_seconds"])
    if not (plan.text_files or plan.conversations) or time.perf_counter() >= phase_end:
        return
    texts = text_sequences(tokenizer, plan.text_files)
    held = [k % HELD_OUT_EVERY == 0 for k in range(len(texts))]
    if plan.conversations:
        chunks, flags = conversation_sequences(
            tokenizer, plan.conversations, tokens=plan.corpus_tokens, raw=plan.raw, reading=reading
        )
        texts, held = texts + chunks, held + flags
    while record["text_done"] < len(texts) and (started := time.perf_counter()) < phase_end:
        first = record["text_done"]
        group = texts[first : first + TEXT_GROUP]
        made = prefill(model, taps, group, vocab_size=plan.vocab_size, until=phase_end, pace=pace)
        examples = [
            Example(np.array(s, dtype=np.int32), *m, 0, held[first + i], False)
            for i, (s, m) in enumerate(zip(group, made))
            if m is not None
        ]
        if not write(examples, text_done=len(group), text_seconds=time.perf_counter() - started):
            return
        share = max(record["text_seconds"] / plan.text_seconds, record["text_done"] / len(texts))
        report("text", record, sum(len(s) for s in group), share)


def choose_vocabulary(examples: list[Example], *, eos: list[int], vocab_size: int, size: int) -> np.ndarray:
    """The draft vocabulary: the ids the target writes most (its argmax at every trained
    position, and the answers' own tokens), eos ids always; sorted by target id."""
    size = min(size, vocab_size)
    counts = np.zeros(vocab_size, dtype=np.float64)
    for e in examples:
        if e.held_out:
            continue
        np.add.at(counts, e.top_ids[e.train_from :, 0], 1.0)
        np.add.at(counts, e.ids[e.train_from + 1 :], 1.0)
        np.add.at(counts, e.ids, 1e-3)  # ties: what the prompts and text hold
    counts[eos] = np.inf
    chosen = np.argsort(-counts, kind="stable")[:size]
    return np.sort(chosen).astype(np.int64)
