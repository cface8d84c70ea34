"""What the target reads, as ids: prompts (a text, or a conversation ending with the
user's turn) with the assistant's answer begun, --text files cut into chunks, and a
corpus's whole conversations in the target's chat template (raw text for a base model).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import TrainingError
from .split import HELD_OUT_EVERY, conversation_is_held_out

TEXT_CHUNK = 384  # tokens per fixed-text example


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
