"""The head's training data, written by the target itself.

Two sources: the target's own answers to a prompt set (generated in batches by mlx-lm's
BatchGenerator, greedy for most and sampled at temperature 0.7 for the rest), and fixed text
read as it is. Either is then read once more by the target in a teacher-forced prefill
with taps on the head's feature layers (capture.py), which gives, at every position j, the
hidden states entering those layers (the head's input) and the target's distribution for
token j+1 (its top-K ids and probabilities: the soft labels).

An example is one sequence: `ids` (L,), `features` (L, 3·hidden) float16 (float32 where
float16 would overflow), `top_ids` (L, K) and `top_probs` (L, K), and `train_from`: the
first position whose distribution is learnt (the prompt's last position for an answer, so
that only answer tokens are targets; 0 for text). An answer keeps only the last CONTEXT rows
of its prompt before that position. Examples are kept in shards
(DIR/data/shard-NNNN.npz, written to a temporary name and renamed), so a resumed run reads
them instead of asking the target again.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import MlxspecError
from .split import HELD_OUT_EVERY, conversation_is_held_out

TOP_K = 32
SAMPLED_SHARE = 0.3  # answers sampled at temperature 0.7, the rest greedy
TEXT_CHUNK = 384  # tokens per fixed-text example
MAX_PROMPT = 448  # longer prompts are left out (the prefill's logits grow with length)
CONTEXT = 64  # prompt rows kept before an answer's first target (all training reads of them)
FLOAT16_LIMIT = 6e4
STEP_SECONDS = 1.0  # the work between two looks at the clock (and chances for Ctrl-C), about
PREFILL_BATCH = 4  # prompts a step of answer generation reads at once


class TrainingError(MlxspecError):
    """A training run that cannot go on: a folder that is not a run, a full disk, no data."""


@dataclass
class Example:
    ids: np.ndarray  # (L,) int32
    features: np.ndarray  # (L, F) float16, or float32 where float16 would overflow
    top_ids: np.ndarray  # (L, K) int32
    top_probs: np.ndarray  # (L, K) float16
    train_from: int
    held_out: bool
    greedy: bool  # an answer the target wrote greedily (held-out agreement is read on these)


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
        top = mx.argpartition(-logits, TOP_K - 1, axis=-1)[..., :TOP_K]
        # the true probabilities (not renormalised over the top K): exp(logit - logsumexp)
        probs = mx.exp(mx.take_along_axis(logits, top, axis=-1) - mx.logsumexp(logits, axis=-1, keepdims=True))
        mx.eval(features, top, probs)
        features, top, probs = np.array(features), np.array(top).astype(np.int32), np.array(probs.astype(mx.float16))
        pace.observe(width * len(group), time.perf_counter() - began)
        if np.abs(features).max() < FLOAT16_LIMIT:  # kept in float32 where they would overflow (Gemma's do)
            features = features.astype(np.float16)
        for row, i in enumerate(group):
            n = len(sequences[i])
            # sort each position's top K by probability, so column 0 is the target's argmax
            order_k = np.argsort(-probs[row, :n].astype(np.float32), axis=-1)
            out[i] = (
                features[row, :n],
                np.take_along_axis(top[row, :n], order_k, axis=-1),
                np.take_along_axis(probs[row, :n], order_k, axis=-1),
            )
    return out


def generate_answers(
    model,
    prompts: list[list[int]],
    *,
    max_tokens: int,
    eos: list[int],
    seed: int,
    batch: int,
    until: float = math.inf,
    pace: Pace | None = None,
):
    """The target's answers to `prompts`, all generated together by mlx-lm's BatchGenerator
    (continuous batching, `batch` sequences at a time), cut where they stand when the clock
    passes `until` (perf_counter seconds: a step at a time, each reading no more prompt ids
    than `pace` allows, so a budget holds however long the answers). Returns (answers,
    greedy flags)."""
    pace = pace or Pace()
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    rng = np.random.default_rng(seed)
    greedy = [bool(g) for g in rng.random(len(prompts)) >= SAMPLED_SHARE]
    mx.random.seed(seed)  # mlx-lm's sampler reads the global key
    hot, cold = make_sampler(temp=0.7), make_sampler(temp=0.0)
    generator = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=[[t] for t in eos],
        completion_batch_size=batch,
        # a step reads about pace.positions prompt ids beside its decoding: the clock (and
        # Ctrl-C) is heard every second or so even on a CPU
        prefill_batch_size=min(batch, PREFILL_BATCH),
        prefill_step_size=max(16, pace.positions // min(batch, PREFILL_BATCH)),
    )
    try:
        uids = generator.insert(prompts, samplers=[cold if g else hot for g in greedy])
        answers = {uid: [] for uid in uids}
        while time.perf_counter() < until:
            reading, responses = generator.next()  # one step (next_generated runs until a token comes)
            if not reading and not responses:
                break
            for r in responses:
                answers[r.uid].append(int(r.token))  # the eos id too: the head learns to end
    finally:
        generator.close()
    return [answers[uid] for uid in uids], greedy


def check_text_files(files: list[Path]) -> None:
    """Each --text a file that can be read (before the target is even loaded)."""
    for file in files:
        path = Path(file)
        if not path.exists():
            raise TrainingError(f"--text {file}: no such file")
        if not path.is_file():
            raise TrainingError(f"--text {file} is not a file (a folder?): give text files")
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except OSError as e:
            raise TrainingError(f"cannot read --text {file}: {e.strerror or e}") from None


def text_sequences(tokenizer, files: list[Path]) -> list[list[int]]:
    """Fixed text, tokenised and cut into chunks of TEXT_CHUNK tokens."""
    chunks = []
    for file in files:
        try:
            text = Path(file).read_text(errors="ignore")
        except OSError as e:
            raise TrainingError(f"cannot read --text {file}: {e.strerror or e}") from None
        chunks += _chunks(tokenizer.encode(text))
    return chunks


def _chunks(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + TEXT_CHUNK] for i in range(0, len(ids), TEXT_CHUNK) if len(ids) - i >= 16]


def is_held_out(item, index: int) -> bool:
    """Whether the example made from `item`, the `index`-th of its source, is held out from
    training: a conversation, or a prompt cut from one, by its own text
    (split.py: the same split for every run over a corpus); a prompt's
    text or a --text chunk when index % HELD_OUT_EVERY == 0."""
    return conversation_is_held_out(item) if isinstance(item, list) else index % HELD_OUT_EVERY == 0


def conversation_sequences(
    tokenizer, conversations: list, *, tokens: int, raw: bool, reading=None
) -> tuple[list[list[int]], list[bool]]:
    """Whole conversations as the target reads them (its chat template), in order until
    `tokens` ids, cut into chunks of TEXT_CHUNK as text is, and whether each chunk's
    conversation is held out; a conversation the template refuses is left out.
    `reading("reading the corpus", ids, tokens)` as it goes."""
    chunks, held, total = [], [], 0
    for conversation in conversations:
        if total >= tokens:
            break
        ids = encode_conversation(tokenizer, conversation, raw=raw, generation_prompt=False)[: tokens - total]
        total += len(ids)
        cut = _chunks(ids)
        chunks += cut
        held += [is_held_out(conversation, 0)] * len(cut)
        if reading:
            reading("reading the corpus", total, tokens)
    if reading:
        reading("reading the corpus", tokens, tokens)
    return chunks, held


def encode_conversation(tokenizer, messages: list[dict], *, raw: bool, generation_prompt: bool) -> list[int]:
    """A conversation as the target reads it: in its chat template (ending with the
    assistant's turn begun: `generation_prompt`), or its turns' raw text when it has none or
    `raw` is asked (a base model); [] when the template refuses it."""
    from ..errors import ChatTemplateError
    from ..models.templates import render

    if raw or not getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode("\n\n".join(m["content"] for m in messages)))
    try:
        return render(tokenizer, messages, generation_prompt=generation_prompt)
    except ChatTemplateError:
        return []  # a system turn or an order this template does not take


def encode_prompts(tokenizer, prompts: list, *, raw: bool = False, limit: int | None = None) -> list[list[int]]:
    """Prompts as the target reads them, the assistant's answer begun: a prompt is a text
    (one user turn) or a conversation ending with the user's turn ([] when the template
    refuses it). A conversation longer than `limit` ids loses its earliest exchanges (a
    system turn kept) until it fits or only its last turn is left."""
    out = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        least = 2 if messages[0]["role"] == "system" else 1  # the system turn and the last user turn
        # first by characters: over 8 an id is more than text takes (some 4 in English, 3 in code)
        while limit is not None and len(messages) > least and _chars(messages) > 8 * limit:
            messages = _shorter(messages)
        ids = encode_conversation(tokenizer, messages, raw=raw, generation_prompt=True)
        while limit is not None and len(ids) > limit and len(messages) > least:
            messages = _shorter(messages)
            ids = encode_conversation(tokenizer, messages, raw=raw, generation_prompt=True)
        out.append(ids)
    return out


def _shorter(messages: list[dict]) -> list[dict]:
    """A conversation without its first exchange (a user turn and its answer; a system turn kept)."""
    head = messages[:1] if messages[0]["role"] == "system" else []
    return head + messages[len(head) + 2 :]


def _chars(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages)


def read_prompt_file(path: Path) -> list[str]:
    """A JSONL file of prompts: each line {"prompt": "..."} (or a bare JSON string)."""
    from ..text import read_text_file

    prompts = []
    lines = read_text_file(path, "--prompts", TrainingError).splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise TrainingError(f"{path}, line {number}: not JSON") from None
        text = item if isinstance(item, str) else item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(text, str) or not text:
            raise TrainingError(f'{path}, line {number}: expected {{"prompt": "..."}}')
        prompts.append(text)
    if not prompts:
        raise TrainingError(f"{path}: no prompts")
    return prompts


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
    _write_json(Path(folder) / TAPS_FILE, {"stream": list(stream)})


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
                _write_json(folder / PROGRESS_FILE, record)
                return False
            path = folder / f"shard-{record['shards']:04d}.npz"
            save_shard(path, examples)
            used += path.stat().st_size
            record["shards"] += 1
            made.extend(examples)
        record.update({k: record[k] + v for k, v in moved.items()})
        _write_json(folder / PROGRESS_FILE, record)
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


def keep_columns(examples: list[Example], columns: np.ndarray | None) -> list[Example]:
    """`examples` with only the feature `columns` a drafter reads (None: as they are)."""
    return examples if columns is None else [replace(e, features=e.features[:, columns]) for e in examples]


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def shard_bytes(examples: list[Example]) -> int:
    """The bytes a shard of `examples` will take on disk, at least: its arrays, and more than
    the npy and zip headers of its eight (some 200 bytes each)."""
    arrays = sum(e.ids.nbytes + e.features.nbytes + e.top_ids.nbytes + e.top_probs.nbytes for e in examples)
    return arrays + 18 * len(examples) + 4096


def _answers(model, tokenizer, taps, plan: DataPlan, record: dict, *, write, report, until: float, pace) -> bool:
    """The target's answers, a shard of 2 x batch prompts at a time, until the prompts or the
    answers' time run out. Generation stops early enough for the prefill that follows to
    fit the time as well (their ratio measured as shards go). False: the disk's bound was
    reached."""
    eos = sorted(set(tokenizer.eos_token_ids))
    chunk = plan.batch * 2  # prompts a shard
    phase_end = min(until, time.perf_counter() + plan.answer_seconds - record["answer_seconds"])
    prefill_share = 1.0  # seconds of prefill per second of generation (it reads the prompts again)
    while record["prompts_done"] < len(plan.prompts) and (started := time.perf_counter()) < phase_end:
        first = record["prompts_done"]
        group = encode_prompts(tokenizer, plan.prompts[first : first + chunk], raw=plan.raw, limit=MAX_PROMPT)
        keep = [i for i, p in enumerate(group) if 0 < len(p) <= MAX_PROMPT]
        answers, greedy = generate_answers(
            model,
            [group[i] for i in keep],
            max_tokens=plan.max_tokens,
            eos=eos,
            seed=plan.seed + first,
            batch=plan.batch,
            until=started + (phase_end - started) / (1 + prefill_share),
            pace=pace,
        )
        generated = time.perf_counter()
        answered = [(i, a, g) for i, a, g in zip(keep, answers, greedy) if len(a) >= 2]  # enough to learn from
        sequences = [group[i] + a for i, a, _ in answered]
        made = prefill(model, taps, sequences, vocab_size=plan.vocab_size, until=phase_end, pace=pace)
        prefill_share = min(4.0, max(0.05, (time.perf_counter() - generated) / max(generated - started, 1e-3)))
        examples = [
            _answer_example(s, m, len(group[i]) - 1, held_out=is_held_out(plan.prompts[first + i], first + i), greedy=g)
            for s, m, (i, _, g) in zip(sequences, made, answered)
            if m is not None
        ]
        if not write(examples, prompts_done=len(group), answer_seconds=time.perf_counter() - started):
            return False
        share = max(record["answer_seconds"] / plan.answer_seconds, record["prompts_done"] / len(plan.prompts))
        report("answers", record, sum(len(a) for a in answers), share)
    return True


def _answer_example(sequence: list[int], made: tuple, train_from: int, *, held_out: bool, greedy: bool) -> Example:
    """An answer's example, its prompt cut to the last CONTEXT rows before its first target:
    training reads no earlier row (trainer.window), and a conversation's prompt of up to
    MAX_PROMPT ids would otherwise take most of the disk and memory its answer needs. Copies,
    so that the prefill's batch arrays are freed."""
    cut = max(0, train_from - CONTEXT)
    features, top_ids, top_probs = (a[cut:].copy() for a in made)
    return Example(
        np.array(sequence[cut:], dtype=np.int32), features, top_ids, top_probs, train_from - cut, held_out, greedy
    )


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


def _write_json(path: Path, value) -> None:
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(json.dumps(value, indent=2) + "\n")
        partial.rename(path)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise TrainingError(f"cannot write {path}: {e.strerror or e}") from None
