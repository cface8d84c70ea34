"""`--gamma auto` before and after a change, in one process: standard decoding (twice: the
noise floor), the controller of a git revision (`--base`, default main) and the worktree's,
generations taken in turn and in rotating order, on never_slower's pairs: a useless draft,
a draft dearer than its target, the bundled pair.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \\
        python demos/auto_before_after.py [--base main] [--repeats 5] [--max-tokens 256] [--pairs useless,dear,bundled]

Prints per pair the median over repeats of auto's tokens/s over standard decoding's, the
drafting rounds per generation, and what those rounds cost beyond plain decoding, in plain
steps of the same generation (their seconds over its median plain step, less the ids they
emitted): on a shared machine wall-clock ratios swing by ±20% between generations, while
that count, taken within one generation, does not.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "demos"))

from never_slower import useless_draft  # noqa: E402

import mlxspec  # noqa: E402
from mlxspec.decoding.events import Round  # noqa: E402
from mlxspec.drafting import Controller, ControllerConfig  # noqa: E402
from mlxspec.generation import Session, encode_prompt, generate, stream  # noqa: E402
from mlxspec.measure.prompts import suite  # noqa: E402
from mlxspec.models.pairs import BUNDLED_DRAFT, BUNDLED_TARGET  # noqa: E402


def drafting_at(revision: str, folder: Path):
    """mlxspec/drafting as it was at `revision`, imported beside today's (its imports of the
    rest of mlxspec are today's)."""
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{revision}:mlxspec/drafting"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in (n for n in listing if n.endswith(".py")):
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:mlxspec/drafting/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (folder / name).write_text(source)
    spec = importlib.util.spec_from_file_location(
        "mlxspec._drafting_base", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return importlib.import_module("mlxspec._drafting_base.controller")


def generation(pair, ids, *, gamma, controller, seed, max_tokens):
    """Its rounds' seconds and ids; the drafting rounds' count and cost beyond plain steps."""
    session = Session(pair, controller=controller) if controller else None
    events = [
        e
        for e in stream(pair, ids, max_tokens=max_tokens, gamma=gamma, seed=seed, session=session)
        if isinstance(e, Round)
    ]
    drafting = [e for e in events if e.drafted or e.gamma]
    plains = sorted(e.seconds for e in events if not (e.drafted or e.gamma))
    excess = None
    if plains and gamma:
        excess = sum(e.seconds for e in drafting) / plains[len(plains) // 2] - sum(len(e.emitted) for e in drafting)
    return sum(e.seconds for e in events), sum(len(e.emitted) for e in events), len(drafting), excess


def compare(name: str, pair, before, args) -> None:
    """One pair: every setting, repeats in turn; a line per repeat and the summary."""
    gamma_hint, weight = pair.gamma_hint, pair.draft_weight
    settings = {
        "standard": lambda: (0, None),
        "standard again": lambda: (0, None),
        "before": lambda: ("auto", before.Controller(before.ControllerConfig(start_gamma=gamma_hint))),
        "after": lambda: ("auto", Controller(ControllerConfig(start_gamma=gamma_hint, draft_weight=weight))),
    }
    prompts = [encode_prompt(pair, p.prompt, raw=True) for p in suite(quick=True)]
    generate(pair, prompts[0], max_tokens=8, gamma="auto")  # warm-up
    ratios = {k: [] for k in settings if k != "standard"}
    rounds = {k: 0 for k in ("before", "after")}
    excess = {k: [] for k in ("before", "after")}
    for repeat in range(args.repeats):
        seconds, tokens = dict.fromkeys(settings, 0.0), dict.fromkeys(settings, 0)
        for n, ids in enumerate(prompts):
            order = list(settings)
            shift = (repeat + n) % len(order)  # each setting takes each place in turn
            for key in order[shift:] + order[:shift]:
                gamma, controller = settings[key]()
                s, t, r, x = generation(
                    pair, ids, gamma=gamma, controller=controller, seed=repeat, max_tokens=args.max_tokens
                )
                seconds[key] += s
                tokens[key] += t
                if key in rounds:
                    rounds[key] += r
                    if x is not None:
                        excess[key].append(x)
        standard = tokens["standard"] / seconds["standard"]
        for key in ratios:
            ratios[key].append(tokens[key] / seconds[key] / standard)
        line = ", ".join(f"{k} {v[-1]:.3f}x" for k, v in ratios.items())
        print(f"{name} repeat {repeat}: standard {standard:.0f} tok/s; {line}", flush=True)
    generations = args.repeats * len(prompts)
    print(
        f"== {name}: median over standard: "
        + ", ".join(f"{k} {statistics.median(v):.3f}x" for k, v in ratios.items())
        + "; drafting rounds a generation: "
        + ", ".join(f"{k} {rounds[k] / generations:.1f}" for k in rounds)
        + "; their cost beyond plain decoding, plain steps a generation: "
        + ", ".join(f"{k} {statistics.mean(excess[k]) if excess[k] else 0.0:.1f}" for k in excess),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the git revision whose controller runs as 'before'")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--pairs", default="useless,dear,bundled")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base_folder = Path(scratch) / "base"
        base_folder.mkdir()
        before = drafting_at(args.base, base_folder)
        loaders = {
            "useless": lambda: mlxspec.load_pair(str(BUNDLED_TARGET), str(useless_draft(Path(scratch) / "useless"))),
            "dear": lambda: mlxspec.load_pair(str(BUNDLED_DRAFT), str(BUNDLED_TARGET)),
            "bundled": lambda: mlxspec.load_pair(),
        }
        for name in args.pairs.split(","):
            compare(name, loaders[name](), before, args)


if __name__ == "__main__":
    main()
