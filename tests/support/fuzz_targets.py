"""Fuzz targets shared by tests/models/test_fuzz.py (a CI-sized run) and demos/fuzz_inputs.py (a
longer one): damaged GGUF headers and prompt-cache metadata must be imported or read, and
JSON schemas (deep, wide, with references) compiled and started by the grammar engine, or
refused with one of mlxspec's errors in one line; anything else (a bare exception, a
message with numpy's text in it, a crash of the process) fails."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from mlxspec.errors import MlxspecError

RAW_TEXT = ("numpy", "ndarray", "dtype", "reshape", "buffer", "Sorry")  # what a library's own message shows


def outcome(call) -> str:
    """'ok', or the refusal's class name; AssertionError for anything a user should not see."""
    try:
        call()
    except MlxspecError as e:
        message = str(e)
        assert "\n" not in message.strip(), message
        assert not any(word in message for word in RAW_TEXT), message
        return type(e).__name__
    return "ok"


# --- GGUF headers ---------------------------------------------------------------------------
def header_edits(header_size: int):
    """Up to four overwrites inside the header (bytes, or a 4/8-byte count set to an extreme)
    and an optional cut of the file."""
    extreme = st.sampled_from([0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1]).flatmap(
        lambda n: st.sampled_from([n.to_bytes(8, "little"), (n % 2**32).to_bytes(4, "little")])
    )
    edit = st.tuples(st.integers(0, header_size - 1), st.one_of(st.binary(min_size=1, max_size=8), extreme))
    return st.tuples(st.lists(edit, min_size=1, max_size=4), st.one_of(st.none(), st.integers(0, header_size + 64)))


def damaged_header(source: bytes, edits, cut) -> bytes:
    raw = bytearray(source)
    for at, data in edits:
        raw[at : at + len(data)] = data
    return bytes(raw if cut is None else raw[:cut])


def import_damaged(source: bytes, edits, cut) -> str:
    from mlxspec.models.gguf import import_gguf

    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "fuzz.gguf"
        path.write_bytes(damaged_header(source, edits, cut))
        return outcome(lambda: import_gguf(path, dtype="float32", out=Path(work) / "out"))


# --- prompt-cache metadata ------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
FIELDS = ["text", "ids", "user", "system", "raw", "models", "cache_options", "tensors", "digest", "format"]


def meta_edits():
    """Changes to mlxspec's metadata (a field replaced or dropped, an id changed, a model's
    record changed) or to mlx-lm's (a layer's class or state); `reseal` writes a digest of
    the result, so the checks past the digest are reached too."""
    field = st.tuples(st.just("field"), st.sampled_from(FIELDS), st.one_of(st.just("<drop>"), JSON))
    id_ = st.tuples(st.just("id"), st.integers(0, 63), st.integers(-5, 2**33))
    model = st.tuples(
        st.just("model"), st.sampled_from(["name", "config", "weight_bytes", "width", "layers", "<role>"]), JSON
    )
    layer = st.tuples(st.just("layout"), st.integers(0, 40), st.text(max_size=12))
    return st.tuples(st.lists(st.one_of(field, id_, model, layer), min_size=1, max_size=3), st.booleans())


def apply_meta_edits(source: Path, out: Path, edits, reseal: bool) -> None:
    import mlx.core as mx

    from mlxspec.prompt_cache.checks import digest, layout

    arrays, flat = mx.load(str(source), return_metadata=True)
    meta = json.loads(flat["0.mlxspec"])
    keys = sorted(k for k in flat if k != "0.mlxspec")
    for kind, key, value in edits:
        if kind == "field":
            meta.pop(key, None) if value == "<drop>" else meta.__setitem__(key, value)
        elif kind == "id" and isinstance(meta.get("ids"), list) and meta["ids"]:
            meta["ids"][key % len(meta["ids"])] = value
        elif kind == "model" and isinstance(meta.get("models"), dict):
            target = meta["models"].get("target")
            if key == "<role>":
                meta["models"]["other"] = value
            elif isinstance(target, dict):
                target[key] = value
        elif kind == "layout" and keys:
            flat[keys[key % len(keys)]] = value
    if reseal:
        try:
            meta["digest"] = digest(meta["ids"], arrays, layout(flat))
        except (KeyError, TypeError, ValueError, OverflowError):
            pass  # ids a digest cannot be taken of: the metadata check refuses them first
    mx.save_safetensors(str(out), arrays, metadata={**flat, "0.mlxspec": json.dumps(meta)})


def read_damaged(source: Path, pair, edits, reseal: bool) -> str:
    from mlxspec.generation import Session
    from mlxspec.prompt_cache import store as prompt_cache

    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "fuzz.safetensors"
        apply_meta_edits(source, path, edits, reseal)
        return outcome(lambda: prompt_cache.restore(prompt_cache.read(path), Session(pair)))


def copy_of(path: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(path, folder))


# --- grammar schemas (issue 28) ---------------------------------------------------------------
# One level of a chain of $defs, each a step to the next: the shapes that measured the grammar
# engine's stack (mlxspec/grammar.py, COMPILE_STACK_BYTES).
CHAIN_STEPS = {
    "object": lambda ref: {"type": "object", "properties": {"x": {"$ref": ref}}, "required": ["x"]},
    "array": lambda ref: {"type": "array", "items": {"$ref": ref}},
    "anyOf": lambda ref: {"anyOf": [{"$ref": ref}, {"type": "null"}]},
    "allOf": lambda ref: {"allOf": [{"$ref": ref}]},
    "alias": lambda ref: {"$ref": ref},
    "additional": lambda ref: {"type": "object", "additionalProperties": {"$ref": ref}},
    "diamond": lambda ref: {"type": "object", "properties": {"a": {"$ref": ref}, "b": {"$ref": ref}}},
}


def ref_chain(levels: int, step: str = "object") -> dict:
    """`levels` $defs, each (a `step`) referring to the next, the last an integer: 1,000
    object levels overflowed llguidance's stack and killed the process."""
    defs = {f"d{i}": CHAIN_STEPS[step](f"#/$defs/d{i + 1}") for i in range(levels)}
    defs[f"d{levels}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def wide_schema(properties: int, *, refs: bool = False) -> dict:
    """An object with `properties` optional properties (each a $ref to a def of its own when
    `refs`)."""
    if not refs:
        return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(properties)}}
    defs = {f"d{i}": {"type": "object", "properties": {"v": {"type": "integer"}}} for i in range(properties)}
    return {
        "type": "object",
        "properties": {f"p{i}": {"$ref": f"#/$defs/d{i}"} for i in range(properties)},
        "$defs": defs,
    }


def lark_chain(rules: int) -> str:
    """A Lark grammar of `rules` rules each naming the next, the last "x": 3,000 overflowed."""
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules)) + f'r{rules}: "x"\n'


LEAF = st.sampled_from(
    [
        {"type": "integer"},
        {"type": "string", "maxLength": 4},
        {"type": "boolean"},
        {"type": "null"},
        {"enum": ["a", "b"]},
        {"type": "string", "pattern": "^[a-z]{1,3}$"},
        {},
    ]
)


def _node(inner):
    names = st.text("abcxyz", min_size=1, max_size=3)
    ref = st.sampled_from(["#", "#/$defs/a", "#/$defs/b", "#/$defs/missing", "#/properties"]).map(lambda r: {"$ref": r})
    return st.one_of(
        st.dictionaries(names, inner, max_size=4).map(lambda props: {"type": "object", "properties": props}),
        st.dictionaries(names, inner, min_size=1, max_size=3).map(
            lambda props: {"type": "object", "properties": props, "required": sorted(props)}
        ),
        inner.map(lambda items: {"type": "array", "items": items}),
        st.lists(inner, min_size=1, max_size=3).map(lambda options: {"anyOf": options}),
        st.lists(inner, min_size=1, max_size=2).map(lambda parts: {"allOf": parts}),
        ref,
    )


def grammar_schemas():
    """JSON schemas that try the grammar engine's depth, width and references: chains of $defs
    of every step up to twice MAX_SCHEMA_DEPTH and beyond, wide objects, and random nests of
    objects, arrays, anyOf and allOf with $refs to the root, to defs (themselves random) and
    to nothing."""
    chain = st.builds(ref_chain, st.integers(1, 1200), st.sampled_from(sorted(CHAIN_STEPS)))
    wide = st.builds(wide_schema, st.integers(1, 300), refs=st.booleans())
    nest = st.recursive(LEAF, _node, max_leaves=12)
    with_defs = st.tuples(nest, nest, nest).map(lambda t: {**t[0], "$defs": {"a": t[1], "b": t[2]}})
    return st.one_of(chain, wide, nest, with_defs)


def start_schema(pair, schema) -> str:
    """'ok' when the engine compiles `schema` and starts a reply under it, else the refusal's
    class name (one line): never a crash, never another exception."""
    from mlxspec.grammar import GrammarSpec, check_spec

    def check():
        spec = GrammarSpec.json_schema(schema, label="the schema")
        check_spec(spec, pair.tokenizer, width=pair.target.width, eos_ids=pair.eos_ids)

    return outcome(check)


# --- train-draft's run folder (issue 28) ----------------------------------------------------------
# A finished tiny run (`run_folder`) is copied, one of its files damaged, and read back by the
# function a resumed run reads it with: refused in one line, or read sound (checked here
# without the library's own checks), never an internal error, never slow.
RUN_FILES = {
    "shard": "data/shard-0000.npz",
    "progress.json": "data/progress.json",
    "taps.json": "data/taps.json",
    "state.json": "checkpoint/state.json",
    "run.json": "run.json",
    "vocabulary.npy": "data/vocabulary.npy",
    "feature_scale.npy": "data/feature_scale.npy",
    "head.safetensors": "checkpoint/head.safetensors",
}
SLOW = 10.0  # seconds any one read may take at most
_CHECKPOINT = ("checkpoint/state.json", "checkpoint/head.safetensors", "checkpoint/optimizer.safetensors")
_BOUND = ("data/vocabulary.npy", "data/feature_scale.npy")  # the arrays a checkpoint records the sha256 of
READS_WITH = {  # the other files a read of each needs
    "shard": (),
    "progress.json": ("data/shard-0000.npz",),
    "taps.json": (),
    "state.json": _CHECKPOINT + _BOUND,
    "run.json": (),
    "vocabulary.npy": _CHECKPOINT + _BOUND,
    "feature_scale.npy": _CHECKPOINT + _BOUND,
    "head.safetensors": _CHECKPOINT + _BOUND,
}


def byte_edits(size: int):
    """Up to four overwrites anywhere in a file of `size` bytes and an optional cut."""
    edit = st.tuples(st.integers(0, max(size - 1, 0)), st.binary(min_size=1, max_size=8))
    return st.tuples(st.lists(edit, min_size=1, max_size=4), st.one_of(st.none(), st.integers(0, size)))


def json_edits():
    """A JSON file's fields replaced or dropped (a few at a time), or the file replaced by any
    JSON value or by text that is not JSON."""
    field = st.tuples(st.text(max_size=16) | st.sampled_from(JSON_FIELDS), st.one_of(st.just("<drop>"), JSON))
    whole = st.one_of(JSON.map(lambda v: ("<whole>", v)), st.text(max_size=20).map(lambda t: ("<text>", t)))
    return st.one_of(st.lists(field, min_size=1, max_size=3), whole.map(lambda w: [w]))


JSON_FIELDS = [
    *("prompts_done", "text_done", "answer_seconds", "text_seconds", "shards"),  # progress.json
    *("step", "epoch", "batch", "seconds", "tokens", "loss", "history", "files"),  # state.json
    *("target", "minutes", "tokens", "draft_vocab", "steps", "answer_minutes", "text_minutes", "max_tokens"),
    *("batch", "seed", "lr", "warmup", "batch_rows", "single_step_share", "raw", "standardize", "text_files"),
]


def array_edits():
    """An array (a shard's, or a kept .npy) changed as a bug or a hand might: another dtype,
    cut, flattened, a value set to NaN, infinity, a negative or a huge number."""
    change = st.sampled_from(["float16", "float32", "int32", "int64", "bool", "cut", "flat", "2d", "empty"])
    poke = st.tuples(st.just("poke"), st.sampled_from([float("nan"), float("inf"), -1, -(2**31), 2**31 - 1, 1e30]))
    return st.lists(st.one_of(change, poke), min_size=1, max_size=2)


SHARD_KEYS = ["ids", "lengths", "features", "top_ids", "top_probs", "train_from", "held_out", "greedy"]


def apply_array_edits(array, edits):
    import numpy as np

    for edit in edits:
        if isinstance(edit, tuple):
            if array.size:
                array = array.astype(np.float64 if isinstance(edit[1], float) else array.dtype, copy=True)
                with np.errstate(all="ignore"):
                    array.flat[array.size // 2] = edit[1]
        elif edit == "cut":
            array = array[: max(len(array) // 2, 0)] if array.ndim else array
        elif edit == "flat":
            array = array.reshape(-1)
        elif edit == "2d":
            array = array.reshape(1, -1)
        elif edit == "empty":
            array = array[:0]
        else:
            with np.errstate(all="ignore"):
                array = array.astype(edit)
    return array


def run_file_edits(kind: str, size: int):
    """How a file of `kind` (RUN_FILES) of `size` bytes is damaged."""
    raw = byte_edits(size).map(lambda e: ("bytes", e))
    if kind.endswith(".json"):
        return st.one_of(raw, json_edits().map(lambda e: ("json", e)))
    if kind == "shard":
        arrays = st.tuples(st.sampled_from(SHARD_KEYS + ["<drop>"]), array_edits()).map(lambda e: ("arrays", e))
        return st.one_of(raw, arrays)
    if kind.endswith(".npy"):
        return st.one_of(raw, array_edits().map(lambda e: ("array", e)))
    # head.safetensors: bytes changed, and (resealed) the same with its digest rewritten, so
    # that the reading past the digest is reached too
    return st.tuples(st.sampled_from(["bytes", "resealed"]), byte_edits(size))


def damage_run_file(path: Path, edit) -> None:
    import numpy as np

    how, what = edit
    if how in ("bytes", "resealed"):
        path.write_bytes(damaged_header(path.read_bytes(), *what))
        if how == "resealed":
            _reseal(path)
    elif how == "json":
        path.write_text(_edited_json(path.read_text(), what))
    elif how == "array":
        np.save(path, apply_array_edits(np.load(path), what), allow_pickle=False)
    elif how == "arrays":
        key, edits = what
        with np.load(path) as npz:
            arrays = {k: npz[k] for k in npz.files}
        if key == "<drop>":
            arrays.pop(SHARD_KEYS[len(edits) % len(SHARD_KEYS)], None)
        else:
            arrays[key] = apply_array_edits(arrays[key], edits)
        with open(path, "wb") as f:  # np.savez would add .npz to a name without it
            np.savez(f, **arrays)


def _edited_json(text: str, edits) -> str:
    if edits[0][0] == "<text>":
        return edits[0][1]
    if edits[0][0] == "<whole>":
        return json.dumps(edits[0][1])
    data = json.loads(text)
    for key, value in edits:
        data.pop(key, None) if value == "<drop>" else data.__setitem__(key, value)
    return json.dumps(data)


def _reseal(path: Path) -> None:
    """The checkpoint's record of this file's sha256 made to match it again."""
    from mlxspec.models.gguf.record import sha256

    state = path.parent / "state.json"
    data = json.loads(state.read_text())
    data["files"][path.name] = sha256(path)
    state.write_text(json.dumps(data))


def read_run_file(run: Path, kind: str, edit, shape: dict) -> str:
    """Damage one file of a copy of `run` and read it back as --resume reads it."""
    import time

    with tempfile.TemporaryDirectory() as work:
        copy = Path(work) / "run"
        for name in {RUN_FILES[kind], *READS_WITH[kind]}:  # linked, not copied: only the damaged file is
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            if name == RUN_FILES[kind]:
                shutil.copy(run / name, copy / name)
            else:
                os.link(run / name, copy / name)
        damage_run_file(copy / RUN_FILES[kind], edit)
        started = time.perf_counter()
        ended = outcome(lambda: _read_back(copy, kind, shape))
        assert time.perf_counter() - started < SLOW, (kind, edit)
        return ended


def _read_back(run: Path, kind: str, shape: dict) -> None:
    """What --resume does with the file, and checks that what it read is sound."""
    import math

    import numpy as np

    from mlxspec.training import checkpoint, store
    from mlxspec.training import run as runs
    from mlxspec.training import settings as settings_of

    if kind == "shard":
        for e in store.load_shards(run / "data", vocab_size=shape["vocab_size"], feature_width=shape["width"]):
            n = len(e.ids)
            assert n == len(e.features) == len(e.top_ids) == len(e.top_probs) and 0 <= e.train_from < n
            assert np.isfinite(e.features).all() and 0 <= e.ids.min() and e.ids.max() < shape["vocab_size"]
    elif kind == "progress.json":
        record = store.read_progress(run / "data")
        assert all(type(record[k]) is int and record[k] >= 0 for k in ("prompts_done", "text_done", "shards"))
        assert all(math.isfinite(record[k]) and record[k] >= 0 for k in ("answer_seconds", "text_seconds"))
    elif kind == "taps.json":  # where the data was tapped: positions on the target's stream
        stream = store.read_taps(run / "data", layers=shape["layers"])
        assert stream and all(type(p) is int and 0 <= p <= shape["layers"] for p in stream)
    elif kind == "run.json":
        settings = settings_of.read_settings(run)
        assert math.isfinite(settings.lr) and settings.lr > 0 and settings.batch >= 1 and settings.max_tokens >= 2
        assert settings.minutes is None or (math.isfinite(settings.minutes) and settings.minutes > 0)
    elif kind.endswith(".npy"):
        problem = {
            "vocabulary.npy": lambda v: runs.vocabulary_problem(v, vocab_size=shape["vocab_size"], size=shape["draft"]),
            "feature_scale.npy": lambda v: runs.scale_problem(v, width=shape["width"]),
        }[kind]
        value = runs.read_kept(run / RUN_FILES[kind], problem)
        assert value is not None and np.isfinite(value).all()
        checkpoint.check_checkpoint(run / "checkpoint")  # the checkpoint was trained with the file as it was
    else:  # state.json, head.safetensors
        head = _head(shape)
        state = checkpoint.load_checkpoint(run / "checkpoint", head)
        assert min(state.step, state.epoch, state.batch, state.tokens) >= 0 and math.isfinite(state.seconds)
        from mlx.utils import tree_flatten

        assert checkpoint.non_finite(dict(tree_flatten(head.parameters()))) is None


def _head(shape: dict):
    from mlxspec.drafters.eagle3_head import Eagle3Head

    return Eagle3Head(shape["config"])


def run_shape(run: Path, target: Path) -> dict:
    """What a run's files must fit, from its finished head and its target's config."""
    from mlxspec.drafters.eagle3_head import read_config

    config = read_config(run)
    target_config = json.loads((Path(target) / "config.json").read_text())
    return {
        "vocab_size": int(target_config["vocab_size"]),
        "width": config.feature_width,
        "draft": config.draft_vocab_size,
        "config": config,
        "layers": int(target_config["num_hidden_layers"]),
    }
