"""Tampered or damaged prompt-cache files are refused in one line naming the file (issue 19,
item 4): a key tensor shorter than the offset, a NaN tensor, rewritten ids of the right
length, a missing tensor, a file of the older format (no digest)."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from mlxspec.prompt_cache import store as prompt_cache
from mlxspec.prompt_cache.checks import digest, layout
from tests.cli.test_cli import run
from tests.models.test_prompt_cache import TEXT


@pytest.fixture(scope="module")
def made(factory, tmp_path_factory):
    """A prompt cache of the llama pair (KVCache layers), and the pair's paths."""
    import mlxspec
    from mlxspec.generation import Session

    target, draft = (str(p) for p in mlxspec_paths(factory))
    path = tmp_path_factory.mktemp("cache") / "made.safetensors"
    pair = mlxspec.load_pair(target, draft)
    prompt_cache.save(path, Session(pair), TEXT, raw=True)
    return path, target, draft


def mlxspec_paths(factory):
    return factory.pair("llama")


def rewrite(source, out, change, *, reseal: bool = False):
    """A copy of the file with `change(arrays, meta)` applied; `reseal` writes a digest of the
    changed file (a consistent file whose tensors are wrong, as a bug would write)."""
    arrays, flat = mx.load(str(source), return_metadata=True)
    meta = json.loads(flat["0.mlxspec"])
    change(arrays, meta)
    if reseal:
        meta["tensors"], meta["digest"] = sorted(arrays), digest(meta["ids"], arrays, layout(flat))
    mx.save_safetensors(str(out), arrays, metadata={**flat, "0.mlxspec": json.dumps(meta)})
    return out


def shorten_keys(arrays, meta):
    held = len(meta["ids"]) - 1  # the caches' offset
    arrays["0.0"] = arrays["0.0"][..., : held - 3, :]


def nan_values(arrays, meta):
    arrays["1.1"] = mx.full(arrays["1.1"].shape, float("nan"), dtype=arrays["1.1"].dtype)


def other_ids(arrays, meta):
    meta["ids"] = [(i + 1) % 300 for i in meta["ids"]]


def drop_tensor(arrays, meta):
    del arrays["2.1"]


def older_format(arrays, meta):
    meta["format"] = "mlxspec-prompt-cache/1"
    del meta["digest"], meta["tensors"]


CASES = {
    "key tensor shorter than the offset": (shorten_keys, True, "layer 0's keys hold"),
    "key tensor shorter, digest not updated": (shorten_keys, False, "does not match the digest"),
    "NaN tensor": (nan_values, False, "tensor 1.1 holds NaN"),
    "rewritten ids of the right length": (other_ids, False, "does not match the digest"),
    "missing tensor": (drop_tensor, False, "lacks tensor 2.1"),
    "the older format": (older_format, False, "prompt cache of another format"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_prompt_cache_is_refused_in_one_line(capsys, made, tmp_path, case):
    path, target, draft = made
    change, reseal, message = CASES[case]
    bad = rewrite(path, tmp_path / "bad.safetensors", change, reseal=reseal)
    code, out, err = run(capsys, "generate", "x", "--prompt-cache", str(bad), "-t", target, "-d", draft, "--json")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert message in err and str(bad) in err, err


def test_the_untouched_file_still_loads(capsys, made):
    path, target, draft = made
    code, out, err = run(capsys, "generate", "x", "--prompt-cache", str(path), "-t", target, "-d", draft, "--json")
    assert code == 0 and json.loads(out)["tokens"], err
