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
that only answer tokens are targets; 0 for text). Examples are kept in shards
(DIR/data/shard-NNNN.npz, written to a temporary name and renamed), so a resumed run reads
them instead of asking the target again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import MlxspecError

TOP_K = 32
SAMPLED_SHARE = 0.3  # answers sampled at temperature 0.7, the rest greedy
HELD_OUT_EVERY = 16  # example k is held out when k % 16 == 0
TEXT_CHUNK = 384  # tokens per fixed-text example
MAX_PROMPT = 448  # longer prompts are left out (the prefill's logits grow with length)
FLOAT16_LIMIT = 6e4


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


def prefill(model, taps, sequences: list[list[int]], *, vocab_size: int) -> list[tuple]:
    """Teacher-forced prefill: per sequence (features (L, F) float16, top ids (L, K),
    top probs (L, K) float16). Sequences of similar length are right-padded together (about
    half a GB of float32 logits at once); the causal mask keeps padding out of every real
    position."""
    batch_tokens = max(256, 2**27 // vocab_size)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list = [None] * len(sequences)
    start = 0
    while start < len(order):
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


def generate_answers(model, prompts: list[list[int]], *, max_tokens: int, eos: list[int], seed: int, batch: int):
    """The target's answers to `prompts`, all generated together by mlx-lm's BatchGenerator
    (continuous batching, `batch` sequences at a time). Returns (answers, greedy flags)."""
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
        prefill_batch_size=min(batch, 16),
    )
    try:
        uids = generator.insert(prompts, samplers=[cold if g else hot for g in greedy])
        answers = {uid: [] for uid in uids}
        while responses := generator.next_generated():
            for r in responses:
                answers[r.uid].append(int(r.token))  # the eos id too: the head learns to end
    finally:
        generator.close()
    return [answers[uid] for uid in uids], greedy


def text_sequences(tokenizer, files: list[Path]) -> list[list[int]]:
    """Fixed text, tokenised and cut into chunks of TEXT_CHUNK tokens."""
    chunks = []
    for file in files:
        try:
            text = Path(file).read_text(errors="ignore")
        except OSError as e:
            raise TrainingError(f"cannot read --text {file}: {e.strerror or e}") from None
        ids = tokenizer.encode(text)
        chunks += [ids[i : i + TEXT_CHUNK] for i in range(0, len(ids), TEXT_CHUNK) if len(ids) - i >= 16]
    return chunks


def encode_prompts(tokenizer, prompts: list[str], *, raw: bool = False) -> list[list[int]]:
    """Prompts as the target reads them: in its chat template, or as raw text when it has
    none or `raw` is asked (a base model)."""
    out = []
    for prompt in prompts:
        if not raw and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        else:
            ids = tokenizer.encode(prompt)
        out.append(list(ids))
    return out


def read_prompt_file(path: Path) -> list[str]:
    """A JSONL file of prompts: each line {"prompt": "..."} (or a bare JSON string)."""
    prompts = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise TrainingError(f"cannot read --prompts {path}: {e.strerror or e}") from None
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


def load_shards(folder: Path) -> list[Example]:
    examples = []
    for path in sorted(Path(folder).glob("shard-[0-9][0-9][0-9][0-9].npz")):
        try:
            with np.load(path) as npz:  # each key read once: indexing an NpzFile reads its array again
                data = {key: npz[key] for key in npz.files}
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
        except (OSError, ValueError, KeyError) as e:
            raise TrainingError(f"{path}: not a readable data shard ({e}); delete it to regenerate") from None
    return examples


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


def build_data(model, tokenizer, taps, folder: Path, plan: DataPlan, *, report) -> None:
    """Fill `folder` with shards: answers to the prompts (until their time is spent), then
    fixed text (likewise). Shards already there are kept; the record DIR/data/progress.json
    says how far each source got, so a resumed run goes on where it stopped."""
    folder.mkdir(parents=True, exist_ok=True)
    record_file = folder / "progress.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    record = {"prompts_done": 0, "text_done": 0, "answer_seconds": 0.0, "text_seconds": 0.0, "shards": 0} | record
    eos = sorted(set(tokenizer.eos_token_ids))
    encoded = encode_prompts(tokenizer, plan.prompts, raw=plan.raw)
    chunk = max(plan.batch * 2, 2)  # prompts a shard

    def write(examples: list[Example], **moved) -> None:
        save_shard(folder / f"shard-{record['shards']:04d}.npz", examples)
        record.update(shards=record["shards"] + 1, **{k: record[k] + v for k, v in moved.items()})
        _write_json(record_file, record)

    while record["prompts_done"] < len(encoded) and record["answer_seconds"] < plan.answer_seconds:
        started = time.perf_counter()
        first = record["prompts_done"]
        group = [p for p in encoded[first : first + chunk]]
        keep = [i for i, p in enumerate(group) if len(p) <= MAX_PROMPT]
        answers, greedy = generate_answers(
            model,
            [group[i] for i in keep],
            max_tokens=plan.max_tokens,
            eos=eos,
            seed=plan.seed + first,
            batch=plan.batch,
        )
        sequences = [group[i] + a for i, a in zip(keep, answers)]
        made = prefill(model, taps, sequences, vocab_size=plan.vocab_size)
        examples = [
            Example(
                np.array(s, dtype=np.int32),
                f,
                t,
                p,
                len(group[i]) - 1,
                (first + i) % HELD_OUT_EVERY == 0,
                g,
            )
            for s, (f, t, p), i, g in zip(sequences, made, keep, greedy)
            if len(s) - len(group[i]) >= 2
        ]
        if examples:
            write(examples, prompts_done=len(group), answer_seconds=time.perf_counter() - started)
        else:
            record["prompts_done"] += len(group)
        report("answers", record, sum(len(a) for a in answers), record["answer_seconds"] / plan.answer_seconds)

    texts = text_sequences(tokenizer, plan.text_files) if plan.text_files else []
    while record["text_done"] < len(texts) and record["text_seconds"] < plan.text_seconds:
        started = time.perf_counter()
        first = record["text_done"]
        group = texts[first : first + 32]
        made = prefill(model, taps, group, vocab_size=plan.vocab_size)
        examples = [
            Example(np.array(s, dtype=np.int32), f, t, p, 0, (first + i) % HELD_OUT_EVERY == 0, False)
            for i, (s, (f, t, p)) in enumerate(zip(group, made))
        ]
        write(examples, text_done=len(group), text_seconds=time.perf_counter() - started)
        report("text", record, sum(len(s) for s in group), record["text_seconds"] / plan.text_seconds)


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
