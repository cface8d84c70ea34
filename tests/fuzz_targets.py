"""Fuzz targets shared by tests/test_fuzz.py (a CI-sized run) and demos/fuzz_inputs.py (a
longer one): damaged GGUF headers and prompt-cache metadata must be imported or read, and
JSON schemas (deep, wide, with references) compiled and started by the grammar engine, or
refused with one of mlxspec's errors in one line; anything else (a bare exception, a
message with numpy's text in it, a crash of the process) fails."""

from __future__ import annotations

import json
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
    from mlxspec.gguf_import import import_gguf

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

    from mlxspec.prompt_cache_checks import digest, layout

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
    from mlxspec import prompt_cache
    from mlxspec.generation import Session

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
