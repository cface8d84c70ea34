"""Damaged GGUF headers, prompt-cache metadata and train-draft's run files (shards,
progress.json, state.json, run.json, vocabulary.npy, feature_scale.npy, the checkpoint's
head.safetensors), and JSON schemas for the grammar engine (deep, wide, self-referring),
many more than the CI run of tests/models/test_fuzz.py (needs the test extra: pip install -e
".[test]").

    python demos/fuzz_inputs.py [--examples 20000] [--fixed] [--only gguf|cache|grammar|run ...]

Each input must be imported, read or compiled (and what is read sound), or refused with one
of mlxspec's errors in one line without a library's own text (numpy's, gguf-py's), each
within seconds; a schema that crashed the grammar engine would end the run. Prints how many
inputs each target ran and how each ended. Random seeds each run (`--fixed`: the CI test's).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from tests.conftest import ModelFactory, stdlib_texts  # noqa: E402
from tests.support import fuzz_targets as fuzz  # noqa: E402

TARGETS = ("gguf", "cache", "grammar", "run")  # run: train-draft's run files


def counted(seen: Counter, target_of):
    """A test of one input that counts how each ended."""

    def run(case):
        seen[target_of(case)] += 1

    return run


def train_run(target: Path, work: Path) -> tuple[Path, dict]:
    """A finished tiny train-draft run (a few seconds), as tests/models/test_fuzz.py makes one."""
    import subprocess

    from tests.models.test_train_draft import _prompts

    out = work / "run"
    command = [sys.executable, "-m", "mlxspec", "train-draft", "--target", str(target), "--out", str(out)]
    command += ["--prompts", str(_prompts(work / "p.jsonl", 16)), "--tokens", "2000", "--answer-minutes", "0.02"]
    command += ["--max-tokens", "16", "--batch", "8", "--draft-vocab", "64"]
    subprocess.run(command, check=True, capture_output=True, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    return out, fuzz.run_shape(out, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000, help="inputs per target")
    parser.add_argument("--fixed", action="store_true", help="the CI test's fixed seeds")
    parser.add_argument("--only", action="append", choices=TARGETS, help="run only these targets")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import mlxspec
    from mlxspec.generation import Session
    from mlxspec.models import synthetic
    from mlxspec.prompt_cache import store as prompt_cache
    from tests.models.test_prompt_cache import TEXT
    from tests.support.gguf_files import write_gguf

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        os.environ["MLXSPEC_CACHE"] = str(work / "cache")
        synthetic.train_tokenizer(stdlib_texts(), 512, work / "tokenizer")
        factory = ModelFactory(work, work / "tokenizer")
        target, draft = factory.pair("llama")
        gguf = write_gguf(target, work / "fuzz.gguf")
        from gguf import GGUFReader

        source, header = gguf.read_bytes(), int(GGUFReader(gguf).data_offset)
        pair = mlxspec.load_pair(str(target), str(draft))
        cache = work / "made.safetensors"
        prompt_cache.save(cache, Session(pair), TEXT, raw=True)

        options = settings(
            max_examples=args.examples,
            deadline=None,
            derandomize=args.fixed,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        bundled = mlxspec.load_pair()  # its tokenizer, for the grammar engine
        runs = {
            "gguf": ("GGUF headers", fuzz.header_edits(header), lambda case: fuzz.import_damaged(source, *case)),
            "cache": ("prompt-cache metadata", fuzz.meta_edits(), lambda case: fuzz.read_damaged(cache, pair, *case)),
            "grammar": ("grammar schemas", fuzz.grammar_schemas(), lambda schema: fuzz.start_schema(bundled, schema)),
        }
        if not args.only or "run" in args.only:
            run, shape = train_run(target, work)
            for kind, name in fuzz.RUN_FILES.items():
                strategy = fuzz.run_file_edits(kind, (run / name).stat().st_size)
                runs[f"run-{kind}"] = (
                    f"train-draft's {kind}",
                    strategy,
                    lambda edit, kind=kind: fuzz.read_run_file(run, kind, edit, shape),
                )
        for key, (name, strategy, target_of) in runs.items():
            if args.only and key.split("-")[0] not in args.only:
                continue
            seen, start = Counter(), time.perf_counter()
            options(given(strategy)(counted(seen, target_of)))()
            ended = ", ".join(f"{kind} {count}" for kind, count in seen.most_common())
            print(f"{name}: {sum(seen.values())} inputs in {time.perf_counter() - start:.0f} s ({ended})", flush=True)


if __name__ == "__main__":
    main()
