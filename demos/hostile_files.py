"""Issue 28's hostile inputs (items 2-5: runs that never end, damaged run folders, head and MTP
metadata, prompt caches, options out of range) through the real commands, each in a
subprocess with a time bound (needs the test extra: pip install -e ".[test]").

    python demos/hostile_files.py [--only WORD]

Each refusal must exit non-zero with one line on stderr, no "internal error", no traceback,
within its bound; a Ctrl-C must end the command in seconds with exit 130; the budgeted runs
(the controls) must succeed within their time. Tiny random models are built first (about a
minute). Prints a line per input and a count per group.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import ModelFactory, stdlib_texts  # noqa: E402
from tests.models.test_eagle3 import HOSTILE_CONFIGS  # noqa: E402
from tests.models.test_train_draft import _prompts  # noqa: E402
from tests.models.test_train_draft_inputs import DAMAGE, OUT_OF_RANGE, SLOW_TARGET  # noqa: E402
from tests.support import mtp_models  # noqa: E402

ENV = os.environ | {"HF_HUB_OFFLINE": "1", "MLXSPEC_DEBUG": ""}
CTRL_C_SECONDS = 5.0  # a Ctrl-C ends the command within this


@dataclass
class Case:
    group: str
    name: str
    argv: list
    bound: float = 60.0  # seconds the command may take
    said: str | None = None  # what the one line must hold
    code: int | None = None  # the exit it must have (None: any but 0)
    setup: Callable[[], None] | None = None  # run just before (a damaged copy made)
    succeeds: bool = False  # a control: exit 0 within the bound
    interrupt: float | None = None  # Ctrl-C after this many seconds: exit 130 within CTRL_C_SECONDS
    midway: bool = False  # refused after work began: progress lines for scripts, then the one error line last
    stdin: bytes = b""
    notes: list = field(default_factory=list)


def check(case: Case) -> list[str]:
    """What is wrong with how the command ended (empty: as it must)."""
    if case.setup:
        case.setup()
    command = [sys.executable, "-m", "mlxspec", *map(str, case.argv)]
    started = time.perf_counter()
    if case.interrupt is not None:
        return _interrupted(case, command)
    try:
        done = subprocess.run(command, input=case.stdin, capture_output=True, cwd=ROOT, env=ENV, timeout=case.bound)
    except subprocess.TimeoutExpired:
        return [f"still running after {case.bound:.0f} s (killed)"]
    elapsed = time.perf_counter() - started
    stderr = done.stderr.decode(errors="replace")
    lines = [line for line in stderr.splitlines() if line.strip()]
    case.notes.append(f"{elapsed:.1f} s")
    if case.succeeds:
        return [] if done.returncode == 0 else [f"exit {done.returncode}: {lines[-1:] or ''}"]
    problems = []
    if done.returncode == 0 or (case.code is not None and done.returncode != case.code):
        problems.append(f"exit {done.returncode}")
    errors = [line for line in lines if "error" in line.split(":")[0]] if case.midway else lines
    if len(errors) != 1 or (lines and errors[-1:] != lines[-1:]):
        problems.append(f"{len(errors)} error lines on stderr" if case.midway else f"{len(lines)} lines on stderr")
    if "internal error" in stderr or "Traceback" in stderr:
        problems.append("an internal error or a traceback")
    if case.said and not any(case.said in line for line in lines):
        problems.append(f"no {case.said!r} in the line")
    case.notes.append(lines[-1] if lines else "(nothing on stderr)")
    return problems


def _interrupted(case: Case, command: list) -> list[str]:
    running = subprocess.Popen(command, stderr=subprocess.PIPE, cwd=ROOT, env=ENV)
    try:
        time.sleep(case.interrupt)
        running.send_signal(signal.SIGINT)
        sent = time.perf_counter()
        stderr = running.communicate(timeout=case.bound)[1].decode(errors="replace")
    except subprocess.TimeoutExpired:
        running.kill()
        return [f"still running {case.bound:.0f} s after Ctrl-C (killed)"]
    took = time.perf_counter() - sent
    case.notes.append(f"ended {took:.1f} s after Ctrl-C")
    problems = [] if running.returncode == 130 else [f"exit {running.returncode}"]
    if took > CTRL_C_SECONDS:
        problems.append(f"took {took:.1f} s to stop")
    if "Traceback" in stderr or "internal error" in stderr:
        problems.append("an internal error or a traceback")
    return problems


# --- the inputs ---------------------------------------------------------------------------------------
def build(work: Path) -> dict:
    """Tiny models and folders the cases read: a pair, a finished train-draft run with its
    head removed (for --resume), an EAGLE-3 head, a Qwen3.5 model with its MTP head and a
    4-bit conversion without it."""
    from mlxspec.models import synthetic
    from tests.support.heads import make_head

    synthetic.train_tokenizer(stdlib_texts(), 512, work / "tokenizer")
    factory = ModelFactory(work, work / "tokenizer")
    target, draft = factory.pair("llama")
    prompts = _prompts(work / "p.jsonl", 16)
    run = work / "run"
    command = [sys.executable, "-m", "mlxspec", "train-draft", "--target", str(target), "--out", str(run)]
    command += ["--prompts", str(prompts), "--tokens", "3000", "--answer-minutes", "0.02", "--max-tokens", "16"]
    subprocess.run([*command, "--batch", "8", "--draft-vocab", "64"], check=True, capture_output=True, env=ENV)
    for name in ("config.json", "model.safetensors", "README.md"):
        (run / name).unlink()
    slow = factory.model("llama-slow", arch="llama", seed=3, overrides=SLOW_TARGET)
    words = [f"{w} {i}" for i, w in enumerate(" ".join(["river clock garden lamp window"] * 10).split())]
    long_prompts = work / "long.jsonl"
    long_prompts.write_text("\n".join(json.dumps({"prompt": " ".join(words[i:] + words[:i])}) for i in range(32)))
    hub = mtp_models.write_hub_model(
        "qwen3_5", work / "hub", tokenizer_dir=factory.tokenizer_dir, eos_token_ids=factory.eos
    )
    conversion = factory.quantized(hub, 4)
    return {
        "work": work,
        "target": target,
        "draft": draft,
        "prompts": prompts,
        "slow": slow,
        "long_prompts": long_prompts,
        "run": run,
        "head": make_head(target, work / "head"),
        "hub": hub,
        "conversion": conversion,
    }


def cases(m: dict) -> list[Case]:
    return _train_draft_cases(m) + _resume_cases(m) + _budget_cases(m) + _other_command_cases(m) + _head_cases(m)


def _train_draft_cases(m: dict) -> list[Case]:
    """Options out of range (bundled prompts: one that slipped through would run for
    minutes) and files and names refused before a run folder is made."""
    out = m["work"] / "out"

    def train(*flags):
        return ["train-draft", "--target", m["target"], "--out", out, *flags]

    def fresh():
        shutil.rmtree(out, ignore_errors=True)

    found = [
        Case("train-draft options", " ".join(map(str, flags)), train("--minutes", 0.05, *flags), 20, option, 2, fresh)
        for flags, option in OUT_OF_RANGE
    ]
    binary = m["work"] / "binary.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    for name, flags, said in [
        ("a binary --prompts", ["--prompts", binary], "not UTF-8"),
        ("--prompts a folder", ["--prompts", m["work"]], "is a folder"),
        ("--text a folder", ["--text", m["work"]], "--text"),
        ("--text missing", ["--text", m["work"] / "missing.txt"], "no such file"),
    ]:
        found.append(Case("train-draft inputs", name, train(*flags), 20, said, 1, fresh))
    for name in ("/nonexistent/model", "bundled:no-such-model", "pypi:", "pypi:../../etc"):
        argv = ["train-draft", "--target", name, "--out", out]
        found.append(Case("train-draft inputs", f"--target {name}", argv, 20, None, 1, fresh))
    return found


def _resume_cases(m: dict) -> list[Case]:
    """A copy of the run folder with one file damaged, resumed."""
    found = []
    for damage, (file, change) in DAMAGE.items():
        copy = m["work"] / f"damaged-{len(found)}"

        def setup(copy=copy, file=file, change=change):
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(m["run"], copy)
            change(copy / file)

        argv = ["train-draft", "--target", m["target"], "--out", copy, "--resume"]
        found.append(Case("train-draft --resume", damage, argv, 60, Path(file).name, 1, setup))
    return found


def _budget_cases(m: dict) -> list[Case]:
    """Answers of up to 800 tokens (a shard of them takes ~20 s here): the budget holds, a
    Ctrl-C anywhere ends the command in seconds; a learning rate of 1e30 diverges."""
    out = m["work"] / "out"
    long = ["--prompts", m["prompts"], "--max-tokens", 800, "--batch", 64, "--draft-vocab", 64]
    short = ["--prompts", m["prompts"], "--max-tokens", 16, "--draft-vocab", 64, "--answer-minutes", 0.02]

    def train(*flags):
        return ["train-draft", "--target", m["target"], "--out", out, *flags]

    def fresh():
        shutil.rmtree(out, ignore_errors=True)

    found = [
        Case("train-draft budgets", "--minutes 0.2: done in 12 s (+10 to start)", train("--minutes", 0.2, *long), 22,
             setup=fresh, succeeds=True),
        Case("train-draft budgets", "--lr 1e30: diverges, no head", train("--tokens", 20000, *short, "--lr", 1e30), 60,
             "diverged", 1, fresh, midway=True),
    ]  # fmt: skip
    for after in (1.5, 3.0, 6.0):  # loading, answers, training
        argv = train("--minutes", 0.3, *long)
        found.append(Case("train-draft Ctrl-C", f"Ctrl-C after {after} s", argv, 30, setup=fresh, interrupt=after))
    slow = ["train-draft", "--target", m["slow"], "--out", out, "--prompts", m["long_prompts"], "--minutes", 1]
    for after in (5.0, 9.0, 12.0, 20.0, 40.0):  # a target this CPU reads at a few hundred ids a second
        argv = [*slow, "--answer-minutes", 0.5, "--draft-vocab", 64]
        found.append(Case("train-draft Ctrl-C", f"a 25M target, Ctrl-C after {after} s", argv, 60, setup=fresh,
                          interrupt=after))  # fmt: skip
    return found


def _other_command_cases(m: dict) -> list[Case]:
    work, target = m["work"], m["target"]
    text = "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n\n"

    def cache(text, out="c.safetensors"):
        return ["cache-prompt", text, "-o", work / out, "-t", target, "--no-draft", "--raw"]

    found = [
        Case("cache-prompt", "-o without .safetensors", cache(text, "c"), 20, ".safetensors", 2),
        Case("cache-prompt", "a text past the context", cache(text * 60), 30, "reads at most", 1),
        Case("cache-prompt", "a one-token text", cache("a"), 30, "1 token", 2),
    ]
    for name, flags, said in [
        ("a binary --prompts", ["--prompts", work / "binary.jsonl"], "not UTF-8"),
        ("--max-tokens 0", ["--max-tokens", 0], "--max-tokens"),
        ("--repeats 0", ["--repeats", 0], "--repeats"),
        ("--temp nan", ["--temp", "nan"], "temperature"),
    ]:
        found.append(Case("bench", name, ["bench", "-t", target, "-d", m["draft"], *flags], 30, said, 2))
    for flag in ("--max-body-mb", "--header-timeout", "--idle-timeout"):
        for value in ("nan", "inf", "-1"):
            found.append(Case("serve", f"{flag} {value}", ["serve", flag, value], 20, flag, 2))
    for flag, value in (("--temp", "nan"), ("--top-p", "nan"), ("--min-p", "inf"), ("--draft-min-p", "nan")):
        argv = ["generate", "hi", "-t", target, "--no-draft", flag, value]
        found.append(Case("generate", f"{flag} {value}", argv, 20, None, 2))
    return found


def _head_cases(m: dict) -> list[Case]:
    """EAGLE-3 head configs and weights (a copy of a head, changed), given as --draft."""
    found = []

    def changed(change):
        head = m["work"] / f"head-{len(found)}"

        def setup():
            shutil.rmtree(head, ignore_errors=True)
            shutil.copytree(m["head"], head)
            change(head)

        return head, setup

    def in_config(change):
        return lambda head: (head / "config.json").write_text(
            json.dumps(change(json.loads((head / "config.json").read_text())))
        )

    for name, (change, said) in HOSTILE_CONFIGS.items():
        head, setup = changed(in_config(change))
        argv = ["generate", "hello", "-t", m["target"], "--draft", head, "-m", 4]
        found.append(Case("EAGLE-3 head configs", name, argv, 30, said, None, setup))
    for name, change in (
        ("an empty model.safetensors", lambda head: (head / "model.safetensors").write_bytes(b"")),
        ("model.safetensors cut short", lambda head: _cut(head / "model.safetensors")),
    ):
        head, setup = changed(change)
        argv = ["generate", "hello", "-t", m["target"], "--draft", head, "-m", 4]
        found.append(Case("EAGLE-3 head files", name, argv, 30, "model.safetensors", None, setup))
    return found + _mtp_cases(m)


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _mtp_cases(m: dict) -> list[Case]:
    work, hub = m["work"], m["hub"]
    shard = mtp_models.HUB_HEAD_SHARD
    outside = work / "outside"
    outside.mkdir(exist_ok=True)
    shutil.copy(hub / shard, outside / "head.safetensors")

    def original(name: str, change) -> Path:
        folder = work / name
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(hub, folder)
        index_file = folder / "model.safetensors.index.json"
        index = json.loads(index_file.read_text())
        change(index, folder)
        index_file.write_text(json.dumps(index))
        return folder

    def point(to: str):
        def change(index, folder):
            (folder / shard).unlink()
            index["weight_map"] = {k: (to if v == shard else v) for k, v in index["weight_map"].items()}

        return change

    found = []
    for name, change in (
        ("weight_map names ../outside/head.safetensors", point("../outside/head.safetensors")),
        ("weight_map names ../../../../etc/passwd", point("../../../../etc/passwd")),
        ("weight_map names an absolute path", point(str(outside / "head.safetensors"))),
        ("weight_map a list", lambda index, folder: index.update(weight_map=sorted(index["weight_map"]))),
        ("weight_map names a number", lambda index, folder: index["weight_map"].update({"mtp.fc.weight": 7})),
    ):
        folder = original(f"mtp-{len(found)}", change)
        argv = ["generate", "def", "-t", folder, "--draft", "mtp", "-m", 4]
        found.append(Case("MTP metadata", f"generate: {name}", argv, 30))
        conversion = work / f"conversion-{len(found)}"

        def setup(conversion=conversion):
            shutil.rmtree(conversion, ignore_errors=True)
            shutil.copytree(m["conversion"], conversion)

        argv = ["models", "add-mtp", conversion, "--from", folder]
        found.append(Case("MTP metadata", f"add-mtp: {name}", argv, 60, setup=setup))
    converted = work / "converted"

    def not_json():
        import mlx.core as mx

        shutil.rmtree(converted, ignore_errors=True)
        shutil.copytree(m["conversion"], converted)
        add = [sys.executable, "-m", "mlxspec", "models", "add-mtp", str(converted), "--from", str(hub)]
        subprocess.run(add, check=True, capture_output=True, env=ENV)
        stored = str(converted / "mtp.safetensors")
        tensors, metadata = mx.load(stored, return_metadata=True)
        mx.save_safetensors(stored, tensors, metadata=metadata | {"mlxspec.quantized": "{not json"})

    argv = ["generate", "def", "-t", converted, "--draft", "mtp", "-m", 4]
    found.append(Case("MTP metadata", "mlxspec.quantized not JSON", argv, 30, "mlxspec.quantized", setup=not_json))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the inputs whose group or name holds this word")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        os.environ["MLXSPEC_CACHE"] = ENV["MLXSPEC_CACHE"] = str(Path(work) / "cache")
        print("building tiny models and a run folder...", flush=True)
        chosen = [c for c in cases(build(Path(work))) if not args.only or args.only in f"{c.group} {c.name}"]
        passed, failed = Counter(), Counter()
        for case in chosen:
            problems = check(case)
            (failed if problems else passed)[case.group] += 1
            mark = "ok  " if not problems else "FAIL"
            print(f"{mark} {case.group}: {case.name} ({'; '.join(map(str, case.notes))})", flush=True)
            for problem in problems:
                print(f"       {problem}", flush=True)
    print()
    for group in dict.fromkeys(c.group for c in chosen):
        print(f"{group}: {passed[group]} of {passed[group] + failed[group]} as they must be")
    total = sum(passed.values())
    print(f"all: {total} of {len(chosen)} inputs as they must be; {sum(failed.values())} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
