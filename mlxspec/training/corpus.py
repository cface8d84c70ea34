"""Chat prompts for distilling a draft (a small model or an EAGLE-3 head), built from text every Debian
machine with Python has, in the bench suite's five categories (code completion, code
explanation, chat, creative writing, summarising). The bench's own prompts are never used:
`mlxspec bench` measures on prompts the draft has not seen.

Sources: the standard library's functions (signature and docstring) and module docstrings,
man pages' one-line descriptions, Debian's package descriptions, and topic lists below.
A seed fixes every choice, so a split (train / held out) is the same on every machine.
"""

from __future__ import annotations

import ast
import random
import re
import subprocess
import sysconfig
from pathlib import Path

PACKAGES = "/var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4"

# Topics a person asks a small assistant about. The bench's topics (a lighthouse, a cat in the
# rain, rice dinners, job interviews, a railway depot) are left out on purpose.
THINGS = """a bicycle, an old clock, a garden in winter, a mountain village, the night sky, a
train station, a library, a market square, a river at dawn, a snowstorm, a beehive, an
abandoned factory, a fishing boat, a city park, a desert road, a paper boat, a violin, a
forest path, a summer festival, a kitchen at midnight, a robot learning to paint, a tiny
dragon, a lost umbrella, an island, a lighthouse keeper's dog, a spaceship, a bakery, a
chess game, the first day of school, an autumn leaf, a thunderstorm, a quiet harbour, a
castle, a market in Marrakesh, a volcano, the ocean floor, a bus ride, a letter never
sent, a garden gnome, a pair of old shoes, a windmill, a snowman, a campfire, a subway
train, a sunflower, a jazz club, a map of the stars""".replace("\n", " ").split(", ")
GENRES = [
    "science fiction",
    "fantasy",
    "horror",
    "romance",
    "adventure",
    "detective",
    "comedy",
    "fairy tale",
    "western",
    "historical",
]
PLACES = [
    "a space station",
    "a small bookshop",
    "a desert town",
    "a haunted hotel",
    "a submarine",
    "an orchard",
    "a mountain hut",
    "a crowded train",
    "a circus",
    "a museum at night",
    "a frozen lake",
    "a rooftop garden",
    "an old observatory",
    "a ferry crossing",
    "a jungle temple",
    "a school library",
    "a bakery at dawn",
]
FORMS = [
    "a short poem",
    "a haiku",
    "a limerick",
    "a four-line rhyme",
    "a short story",
    "a fable",
    "a diary entry",
    "a song chorus",
    "a description",
    "a letter",
]
CHAT = [
    "How can I sleep better at night?",
    "What are some good habits for learning a new language?",
    "How do I make a simple budget for the month?",
    "What should I pack for a weekend hiking trip?",
    "How do I stay focused when working from home?",
    "Give me three tips for running my first 5 km race.",
    "What is a healthy breakfast I can make in five minutes?",
    "How do I start learning to play the guitar?",
    "What are some fun things to do on a rainy weekend?",
    "How can I be more productive in the morning?",
    "How do I write a polite email asking for a deadline extension?",
    "What questions should I ask when renting a flat?",
    "How do I take care of a houseplant?",
    "Give me ideas for a birthday present for my sister.",
    "How can I reduce stress before an exam?",
    "What are the benefits of drinking water?",
    "How do I prepare for a long flight?",
    "What is the best way to learn to cook?",
    "Suggest a plan for a day trip to the seaside.",
    "How do I keep my laptop running fast?",
    "What are three easy pasta recipes?",
    "How should I prepare for a first meeting with a new team?",
    "How do I organise my desk?",
    "Give me five ideas for a team-building activity.",
    "How do I choose a good book to read?",
    "What can I do to save energy at home?",
]
CONCEPTS = [
    "a dictionary",
    "a set",
    "a generator",
    "a decorator",
    "a class",
    "a lambda function",
    "list comprehension",
    "recursion",
    "an exception",
    "a context manager",
    "a module",
    "a virtual environment",
    "type hints",
    "an iterator",
    "a thread",
    "a process",
    "a closure",
    "f-strings",
    "slicing",
    "the `with` statement",
    "a dataclass",
    "`*args` and `**kwargs`",
    "`is` and `==`",
    "a shallow copy and a deep copy",
    "a while loop and a for loop",
    "a method and a function",
    "`append` and `extend`",
    "a stack and a queue",
]


def _stdlib_files(seed_bucket: int | None = None) -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "lib2to3", "turtledemo"}
    return sorted(f for f in lib.rglob("*.py") if not skip & set(f.relative_to(lib).parts))


def stdlib_functions(limit: int = 4000) -> list[tuple[str, str, str]]:
    """(signature line, docstring, whole source) of documented top-level functions and methods."""
    found = []
    for path in _stdlib_files():
        try:
            source = path.read_text(errors="ignore")
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 20 or node.end_lineno - node.lineno > 25:
                continue
            body = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            indent = len(body) - len(body.lstrip())
            body = "\n".join(line[indent:] for line in body.splitlines())
            found.append((body.splitlines()[0], doc.strip().split("\n\n")[0], body))
            if len(found) >= limit:
                return found
    return found


def module_docs() -> list[str]:
    """Long English paragraphs: the standard library's module docstrings."""
    paragraphs = []
    for path in _stdlib_files():
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(errors="ignore")))
        except (SyntaxError, ValueError):
            continue
        for paragraph in (doc or "").split("\n\n"):
            text = " ".join(paragraph.split())
            if 250 <= len(text) <= 1200 and text.count(">>>") == 0:
                paragraphs.append(text)
    return paragraphs


def package_descriptions() -> list[tuple[str, str]]:
    """(package, one-line description) from Debian's package list."""
    try:
        text = subprocess.run(["lz4cat", PACKAGES], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return re.findall(r"^Package: (\S+)\n(?:.*\n)*?Description: (.+)$", text, re.MULTILINE)


def man_descriptions() -> list[tuple[str, str]]:
    """(command, what it does) from the man pages' NAME lines."""
    try:
        text = subprocess.run(["whatis", "-s", "1", "-w", "*"], capture_output=True, text=True).stdout
    except OSError:
        return []
    found = re.findall(r"^(\S+) \(1\)\s+- (.+)$", text, re.MULTILINE)
    return [(c, d) for c, d in found if len(d) > 15 and len(c) <= 20 and "unknown subject" not in d]


def build_prompts(count: int, *, seed: int) -> list[dict]:
    """`count` prompts, {"category", "prompt"}, in the bench's proportions (one fifth each)."""
    rng = random.Random(seed)
    functions = stdlib_functions()
    docs = module_docs()
    packages = package_descriptions()
    commands = man_descriptions()
    makers = {
        "code completion": lambda: _code_completion(rng, functions),
        "code explanation": lambda: _code_explanation(rng, functions, commands),
        "chat": lambda: _chat(rng, packages, commands),
        "creative writing": lambda: _creative(rng),
        "summarising": lambda: _summarising(rng, docs, packages),
    }
    names = list(makers)
    return [{"category": names[i % 5], "prompt": makers[names[i % 5]]()} for i in range(count)]


def _code_completion(rng, functions) -> str:
    signature, doc, body = rng.choice(functions)
    style = rng.random()
    if style < 0.5:  # a stub to complete, as the bench's are
        return f'{signature}\n    """{doc}"""\n'
    if style < 0.8:
        return f"Write a Python function that does this: {doc}"
    return f'Complete this Python function:\n\n{signature}\n    """{doc}"""\n    # your code here'


def _code_explanation(rng, functions, commands) -> str:
    style = rng.random()
    if style < 0.45:
        _, _, body = rng.choice(functions)
        return (
            rng.choice(
                [
                    "Explain what this Python function does, line by line:",
                    "What does this code do?",
                    "Explain this function to a beginner:",
                    "Review this code and suggest improvements:",
                ]
            )
            + f"\n\n{body}\n"
        )
    if style < 0.75:
        a, b = rng.sample(CONCEPTS, 2)
        return rng.choice(
            [
                f"What is the difference between {a} and {b} in Python?",
                f"Explain {a} in Python with a short example.",
                f"When should I use {a} in Python?",
            ]
        )
    command, what = rng.choice(commands) if commands else ("ls", "list directory contents")
    return rng.choice(
        [
            f"What does the Linux command `{command}` do?",
            f"How do I use `{command}`? It is described as: {what}.",
            f"Show an example of using the `{command}` command.",
        ]
    )


def _chat(rng, packages, commands) -> str:
    style = rng.random()
    if style < 0.6 or not packages:
        return rng.choice(CHAT)
    name, what = rng.choice(packages)
    return rng.choice(
        [
            f"What is {name}? Its description says: {what}.",
            f"I want to use {name} ({what}). Where do I start?",
            f"Tell me about {what.lower().rstrip('.')}.",
        ]
    )


def _creative(rng) -> str:
    style = rng.random()
    if style < 0.5:
        return f"Write {rng.choice(FORMS)} about {rng.choice(THINGS)}."
    if style < 0.8:
        return f"Write the opening paragraph of a {rng.choice(GENRES)} story set in {rng.choice(PLACES)}."
    return f"Tell me a story about {rng.choice(THINGS)} in {rng.choice(PLACES)}."


def _summarising(rng, docs, packages) -> str:
    if docs and rng.random() < 0.75:
        text = rng.choice(docs)
        ask = rng.choice(
            [
                "Summarise the text above in two sentences.",
                "List the key facts of the text above as bullet points.",
                "Explain the text above in simple words.",
                "What is the main point of the text above?",
            ]
        )
        return f"{text}\n\n{ask}"
    chosen = rng.sample(packages, 5) if len(packages) >= 5 else [("mlx", "array framework")]
    listing = "\n".join(f"- {name}: {what}" for name, what in chosen)
    return f"{listing}\n\nSummarise what these software packages are for."
