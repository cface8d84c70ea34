"""The benchmark's prompt suite: categories where acceptance differs (predictable code,
free prose), and loading a user's own suite from JSON lines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidOption
from ..text import read_text_file

_ARTICLE = (
    "The city council voted on Tuesday to convert the old railway depot into a public library "
    "and community workshop. The building, empty since 1994, will keep its brick facade and "
    "iron roof trusses, while the interior gets reading rooms, a maker space with 3D printers "
    "and sewing machines, and a cafe run by a local cooperative. Construction starts in March "
    "and should take eighteen months; the budget of 12 million comes mostly from a state grant, "
    "with the rest raised by a neighbourhood bond. Opponents argued that the money should go to "
    "road repairs, but the measure passed seven votes to two."
)


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    prompt: str
    name: str


SUITE: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        "code completion",
        'def merge_sorted(left: list[int], right: list[int]) -> list[int]:\n    """Merge two sorted lists into '
        'one sorted list."""\n',
        "merge",
    ),
    BenchPrompt(
        "code completion",
        'import os\nimport sys\n\n\ndef walk_files(root):\n    """Yield the path of every regular file below '
        'root."""\n    for dirpath, dirnames, filenames in os.walk(root):\n',
        "walk",
    ),
    BenchPrompt(
        "code explanation",
        "Explain what this Python function does, line by line:\n\ndef chunks(items, n):\n    for i in range(0, "
        "len(items), n):\n        yield items[i:i + n]\n",
        "chunks",
    ),
    BenchPrompt(
        "code explanation",
        "What is the difference between a list and a tuple in Python, and when should I use each?",
        "list-tuple",
    ),
    BenchPrompt(
        "chat",
        "I have a job interview tomorrow for a junior developer position. What should I prepare tonight?",
        "interview",
    ),
    BenchPrompt(
        "chat", "Give me three ideas for a quick vegetarian dinner with rice and whatever vegetables I have.", "dinner"
    ),
    BenchPrompt(
        "creative writing",
        "Write the opening paragraph of a mystery story set in a lighthouse during a storm.",
        "lighthouse",
    ),
    BenchPrompt("creative writing", "Write a short poem about a cat watching the rain from a window.", "cat-poem"),
    BenchPrompt("summarising", f"{_ARTICLE}\n\nSummarise the article above in two sentences.", "depot-summary"),
    BenchPrompt(
        "summarising", f"{_ARTICLE}\n\nList the key facts of the article above as bullet points.", "depot-facts"
    ),
)


def suite(quick: bool = False) -> list[BenchPrompt]:
    """The bundled suite; `quick` keeps one prompt per category."""
    if not quick:
        return list(SUITE)
    seen, out = set(), []
    for p in SUITE:
        if p.category not in seen:
            seen.add(p.category)
            out.append(p)
    return out


def load_jsonl(path: str | Path) -> list[BenchPrompt]:
    """One JSON object per line: {"prompt": "...", "category": "..." (optional), "name": ... (optional)}."""
    path = Path(path)
    if not path.exists():
        raise InvalidOption(f"no prompts file at {path}")
    prompts = []
    for number, line in enumerate(read_text_file(path, "--prompts").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidOption(f"{path}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise InvalidOption(f'{path}:{number}: each line needs a non-empty "prompt" string')
        prompts.append(
            BenchPrompt(str(item.get("category", "custom")), item["prompt"], str(item.get("name", f"line{number}")))
        )
    if not prompts:
        raise InvalidOption(f"{path} has no prompts")
    return prompts
