"""A CI-sized fuzz run (hypothesis) over GGUF headers and prompt-cache metadata (issue 19)
and JSON schemas for the grammar engine (issue 28): every input is imported, read or
compiled, or refused in one line with one of mlxspec's errors. demos/fuzz_inputs.py runs the
same targets longer."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings

from mlxspec.prompt_cache import store as prompt_cache
from tests.models.test_prompt_cache import TEXT
from tests.support import fuzz_targets as fuzz
from tests.support.gguf_files import write_gguf

EXAMPLES = 1000  # each target: about 6 s here
SCHEMA_EXAMPLES = 300  # compiled in this process: a schema that overflowed the engine's stack would end the run
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None
)


@pytest.fixture(scope="module")
def gguf_source(factory, tmp_path_factory):
    from gguf import GGUFReader

    path = write_gguf(factory.pair("llama")[0], tmp_path_factory.mktemp("fuzz") / "fuzz.gguf")
    return path.read_bytes(), int(GGUFReader(path).data_offset)


@pytest.fixture(scope="module")
def cache_file(load_pair, tmp_path_factory):
    from mlxspec.generation import Session

    pair = load_pair("llama")
    path = tmp_path_factory.mktemp("fuzz") / "made.safetensors"
    prompt_cache.save(path, Session(pair), TEXT, raw=True)
    return path, pair


def test_fuzzed_gguf_headers_are_imported_or_refused_in_one_line(gguf_source, tmp_path, monkeypatch):
    source, header = gguf_source
    monkeypatch.setenv("MLXSPEC_CACHE", str(tmp_path))
    seen = Counter()

    @SETTINGS
    @given(fuzz.header_edits(header))
    def run(case):
        seen[fuzz.import_damaged(source, *case)] += 1

    run()
    assert sum(seen.values()) >= EXAMPLES and len(seen) > 1, seen


def test_fuzzed_prompt_cache_metadata_is_read_or_refused_in_one_line(cache_file):
    path, pair = cache_file
    seen = Counter()

    @SETTINGS
    @given(fuzz.meta_edits())
    def run(case):
        seen[fuzz.read_damaged(path, pair, *case)] += 1

    run()
    assert sum(seen.values()) >= EXAMPLES and len(seen) > 1, seen


def test_fuzzed_grammar_schemas_compile_or_are_refused_in_one_line():
    import mlxspec

    pair = mlxspec.load_pair()  # the bundled pair: its tokenizer
    seen = Counter()

    @settings(SETTINGS, max_examples=SCHEMA_EXAMPLES)
    @given(fuzz.grammar_schemas())
    def run(schema):
        seen[fuzz.start_schema(pair, schema)] += 1

    run()
    assert sum(seen.values()) >= SCHEMA_EXAMPLES and seen["ok"] and seen["InvalidOption"], seen


# --- train-draft's run folder (issue 28) ----------------------------------------------------------
RUN_EXAMPLES = 300  # each file: some 10-40 s here
RUN_SETTINGS = settings(
    max_examples=RUN_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None
)


@pytest.fixture(scope="module")
def run_folder(factory, tmp_path_factory):
    """A finished tiny train-draft run (a few seconds of training) and what its files fit."""
    from tests.models.test_train_draft import _prompts, _train

    target = factory.pair("llama")[0]
    work = tmp_path_factory.mktemp("fuzz-run")
    done = _train(
        "--target", target, "--out", work / "run", "--prompts", _prompts(work / "p.jsonl", 16), "--tokens", 2000,
        "--answer-minutes", 0.02, "--max-tokens", 16, "--batch", 8, "--draft-vocab", 64,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return work / "run", fuzz.run_shape(work / "run", target)


@pytest.mark.alone  # timed against the wall clock: each read of a damaged file within 10 s
@pytest.mark.parametrize("kind", list(fuzz.RUN_FILES))
def test_fuzzed_run_files_are_read_sound_or_refused_in_one_line(run_folder, kind):
    run, shape = run_folder
    seen = Counter()

    @RUN_SETTINGS
    @given(fuzz.run_file_edits(kind, (run / fuzz.RUN_FILES[kind]).stat().st_size))
    def check(edit):
        seen[fuzz.read_run_file(run, kind, edit, shape)] += 1

    check()
    assert sum(seen.values()) >= RUN_EXAMPLES and "TrainingError" in seen, seen
