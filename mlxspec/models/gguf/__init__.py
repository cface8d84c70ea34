"""GGUF files (llama.cpp, LM Studio, Ollama) in, mlx-lm model folders out.

`import_gguf` converts once and keeps the folder: by default in mlxspec's cache, named
after the file and the dtype, and reused for the same content under any name (keyed by its
size and sha256; a file already recorded by path, size and time is not hashed again). The folder is an
ordinary mlx-lm model (config.json, model*.safetensors, tokenizer.json), written under a
temporary name and renamed when complete, so an interrupted conversion leaves nothing that
looks finished. gguf-py (llama.cpp's own package) reads the file; see `tensors` for how
each type is stored, `architectures` for the names and llama.cpp's changes to the weights,
`tokenizer` for the vocabulary.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ...errors import InsufficientMemory, InvalidOption, MlxspecError, ModelLoadError
from ..paths import cache_root
from . import checks
from . import tensors as conv
from .architectures import UnsupportedGGUF, architecture, rope_scaling_from_factors, unpermute_rows
from .record import MANIFEST, read_manifest, sha256, weight_record, write_manifest
from .tokenizer import build as build_tokenizer

GGUF_MAGIC = b"GGUF"
READABLE_VERSIONS = (2, 3)  # gguf-py's
SHARD_BYTES = 2 * 2**30  # one safetensors file at most: bounds the memory a conversion holds
DTYPES = ("auto",) + conv.DTYPES

__all__ = [
    "DTYPES",
    "GGUFError",
    "UnsupportedGGUF",
    "default_dtype",
    "find_import",
    "import_gguf",
    "imported_folder",
    "is_current",
    "is_gguf",
]

Progress = Callable[[int, int, str], None]  # (done, total, what): bytes of tensors converted
Hashing = Callable[[int, int], None]  # (done, total): bytes of a source read for its sha256
HASH_SHOWN_FROM = 1 << 29  # a source this big shows its hashing (about a second or two per GiB)
MAX_COPIES = 8  # the other names of an import's source its record keeps


class GGUFError(ModelLoadError):
    """A file that is not a (complete) GGUF file."""


def is_gguf(path: Path) -> bool:
    """A file named .gguf, or one that starts with GGUF's magic bytes."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def default_dtype() -> str:
    """float32 on MLX's CPU backend, where quantized matrix products grow with the tokens
    read at once (so verifying several costs several steps) and float32 ones do not;
    bfloat16 on a GPU."""
    import mlx.core as mx

    return "float32" if mx.default_device() == mx.cpu else "bfloat16"


def imported_folder(path: str | Path, dtype: str = "auto", *, on_hash: Hashing | None = None) -> Path:
    """Where `import_gguf(path, dtype=dtype)` keeps its import: the cache's folder that holds
    this file's content as `dtype` (`find_import`), else one named after the file and dtype."""
    path = Path(path).expanduser().resolve()
    dtype = default_dtype() if dtype == "auto" else dtype
    return find_import(path, dtype, on_hash=on_hash) or _named_folder(path, dtype)


def _named_folder(path: Path, dtype: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-") or "model"
    return cache_root() / "models" / f"{stem}-{dtype}"


def find_import(path: Path, dtype: str, *, on_hash: Hashing | None = None) -> Path | None:
    """The folder in mlxspec's cache holding the import of this file's content as `dtype`,
    keyed by the content: a record that names this file as it is now (path, size, time), else
    one made from a file of the same size and sha256 (a copy under another name, a registry
    package's GGUF), which then names this file too. The file is hashed only when a record of
    its size exists (`on_hash(done, total)` for a big one); None when no folder holds it."""
    key = _source_key(path)
    named = _named_folder(path, dtype)
    models = cache_root() / "models"
    others = sorted(f for f in models.iterdir() if f != named) if models.is_dir() else []
    candidates = []
    for folder in [named, *others]:
        manifest = read_manifest(folder)
        if not manifest or manifest.get("dtype") != dtype:
            continue
        if _names(manifest, key):
            return folder
        if manifest.get("size") == key["size"] and manifest.get("source_sha256"):
            candidates.append((folder, manifest))
    for folder, manifest in candidates:
        if _source_sha256(key, on_hash) == manifest["source_sha256"]:
            _remember(folder, manifest, key)
            return folder
    return None


def _source_key(path: Path) -> dict:
    stat = path.stat()
    return {"source": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


_digests: dict[tuple, str] = {}  # this process's sha256 of each source as it was (path, size, time)


def _source_sha256(key: dict, on_hash: Hashing | None = None) -> str:
    """The source's sha256, read once per process while it is unchanged; a big file's reading
    shown through `on_hash`."""
    memo = (key["source"], key["size"], key["mtime_ns"])
    if memo not in _digests:
        shown = on_hash if on_hash and key["size"] >= HASH_SHOWN_FROM else None
        _digests[memo] = sha256(Path(key["source"]), shown)
    return _digests[memo]


def _names(manifest: dict, key: dict) -> bool:
    """The record names this source as it is now: as its own, or among the copies found by
    their sha256."""
    return key == {k: manifest.get(k) for k in key} or key in manifest.get("copies", [])


def _remember(folder: Path, manifest: dict, key: dict) -> None:
    """The record names `key` as its source from now on (what `verify` hashes), the source it
    named before kept among its copies, so that either is found without hashing."""
    before = {k: manifest.get(k) for k in key}
    copies = [c for c in [*manifest.get("copies", []), before] if isinstance(c, dict) and c != key]
    write_manifest(folder, {**manifest, **key, "copies": copies[-MAX_COPIES:]})


def is_current(folder: Path, path: str | Path, dtype: str) -> bool:
    """Whether `folder` holds this file's import as `dtype`, the file unchanged since."""
    dtype = default_dtype() if dtype == "auto" else dtype
    return _matches(folder, _source_key(Path(path).expanduser().resolve()), dtype)


def _matches(folder: Path, key: dict, dtype: str, on_hash: Hashing | None = None) -> bool:
    """The folder holds this source's import as `dtype`: the file its record names (path, size,
    time), or one of the same size and sha256, which the record then names too."""
    manifest = read_manifest(folder)
    if not manifest or manifest.get("dtype") != dtype:
        return False
    if _names(manifest, key):
        return True
    if manifest.get("size") != key["size"] or _source_sha256(key, on_hash) != manifest.get("source_sha256"):
        return False
    _remember(folder, manifest, key)
    return True


def import_gguf(
    path: str | Path,
    *,
    dtype: str = "auto",
    out: str | Path | None = None,
    on_progress: Progress | None = None,
    on_hash: Hashing | None = None,
    force: bool = False,
) -> Path:
    """Convert a GGUF file into an mlx-lm folder and return the folder. With `out` None,
    mlxspec's cache (`imported_folder`): the import of the same content, under any name, is
    reused. `on_hash(done, total)` shows a big file's sha256 being read."""
    path = Path(path).expanduser()
    if dtype not in DTYPES:
        raise InvalidOption(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    dtype = default_dtype() if dtype == "auto" else dtype
    if not path.is_file():
        raise GGUFError(f"no GGUF file at {path}")
    source = path.resolve()
    folder = Path(out).expanduser() if out else imported_folder(source, dtype, on_hash=on_hash)
    key = _source_key(source)
    if not force and _matches(folder, key, dtype, on_hash):
        return folder
    reader = _open(source)
    meta = _metadata(reader)
    try:
        arch = architecture(meta)
        plans = {t.name: _plan(t, dtype) for t in reader.tensors}
        config = arch.config(meta)
        total = _check_room(reader, plans, folder, dtype)
        tokenizer = build_tokenizer(meta, context_length=config.get("max_position_embeddings"))
    except MlxspecError:
        raise
    except Exception as e:  # a field of the wrong kind, or missing, in a damaged header
        what = f"it lacks {e.args[0]}" if isinstance(e, KeyError) and e.args else f"{type(e).__name__} reading it"
        raise GGUFError(f"{source}: its metadata is damaged or incomplete ({what})") from None

    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        quantized = _write_weights(
            reader, arch, meta, config, plans=plans, folder=partial, total=total, on_progress=on_progress
        )
        config.update(tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors))
        config["eos_token_id"] = tokenizer.eos_ids
        if tokenizer.bos_id is not None:
            config["bos_token_id"] = tokenizer.bos_id
        if quantized:
            config["quantization"] = {"group_size": conv.GROUP_SIZE, "bits": max(quantized)}
        (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (partial / "tokenizer.json").write_text(tokenizer.tokenizer_json)
        (partial / "tokenizer_config.json").write_text(
            json.dumps(tokenizer.config, indent=2, ensure_ascii=False) + "\n"
        )
        record = {**key, "dtype": dtype, "architecture": arch.name, "source_sha256": _source_sha256(key, on_hash)}
        record["weights"] = weight_record(partial)  # stamps survive the rename below
        (partial / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return folder


def _open(path: Path):
    import warnings

    from gguf import GGUFReader

    check_header(path)
    try:
        with warnings.catch_warnings():  # numpy's overflow warnings on a damaged header: the error says it
            warnings.simplefilter("ignore")
            reader = GGUFReader(path)
    except Exception:  # gguf-py raises ValueError, IndexError, ... on a bad file; its text is numpy's
        raise GGUFError(f"{path} is not a complete GGUF file (truncated or damaged header)") from None
    size = path.stat().st_size
    if any(t.data_offset + t.n_bytes > size for t in reader.tensors) or not reader.tensors:
        raise GGUFError(f"{path} is not a complete GGUF file (its tensors run past its {size} bytes)")
    checks.check_layout(path, reader, size)
    return reader


def check_header(path: Path) -> None:
    """Raises unless the file starts as a GGUF file of a version mlxspec reads: checked before
    anything is said about importing it."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    if len(head) < 8:
        raise GGUFError(f"{path} is not a complete GGUF file (it ends inside its header)")
    little, big = int.from_bytes(head[4:], "little"), int.from_bytes(head[4:], "big")
    if little not in READABLE_VERSIONS and big not in READABLE_VERSIONS:
        versions = " and ".join(map(str, READABLE_VERSIONS))
        raise UnsupportedGGUF(f"{path} is GGUF version {little}, which mlxspec cannot read (it reads {versions})")


def _metadata(reader) -> dict:
    meta = {}
    for name, field in reader.fields.items():
        try:
            meta[name] = field.contents()
        except Exception:  # a field gguf-py cannot decode is one mlxspec does not need
            continue
    return meta


def _plan(tensor, dtype: str) -> conv.Plan:
    type_name = tensor.tensor_type.name
    if not conv.supported(type_name):
        raise UnsupportedGGUF(f"tensor {tensor.name} has quantization type {type_name}, which gguf-py cannot read")
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    float_dtype = dtype if dtype in conv.FLOAT_DTYPES else "float16"
    quantizable = not tensor.name.endswith(("norm.weight", ".bias")) and tensor.name != "rope_freqs.weight"
    return conv.plan(type_name, shape, dtype=dtype, float_dtype=float_dtype, quantizable=quantizable)


def _check_room(reader, plans: dict, folder: Path, dtype: str) -> int:
    """Refuse a conversion that would not fit on disk or in memory; returns the bytes of
    tensors to convert (for progress)."""
    from ..memory import gib, machine_memory

    need = sum(plans[t.name].output_bytes(int(t.n_elements)) for t in reader.tensors)
    where = folder.parent
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if need * 1.02 > free:
        raise InsufficientMemory(
            f"importing as {dtype} needs about {gib(need)} of disk and {where} has {gib(free)} free: "
            "free some space, or choose a smaller --dtype (q4, q8)"
        )
    largest = max(int(t.n_elements) for t in reader.tensors) * 4  # dequantized as float32
    working = min(need, SHARD_BYTES) + 2 * largest
    if working > machine_memory():
        raise InsufficientMemory(
            f"importing needs about {gib(working)} of memory and this machine allows {gib(machine_memory())}"
        )
    return sum(int(t.n_bytes) for t in reader.tensors)


def _write_weights(
    reader, arch, meta: dict, config: dict, *, plans: dict, folder: Path, total: int, on_progress
) -> set[int]:
    """Convert every tensor, in shards of at most SHARD_BYTES; returns the bit widths used."""
    import mlx.core as mx

    report = on_progress or (lambda done, total, what: None)
    shard, shard_bytes, shards, done, bits = {}, 0, [], 0, set()

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            mx.save_safetensors(str(folder / name), shard, metadata={"format": "mlx"})
            shards.append((name, list(shard)))
            shard, shard_bytes = {}, 0

    for tensor in reader.tensors:
        report(done, total, tensor.name)
        name = arch.tensor_name(tensor.name)
        if name is None:
            if tensor.name == "rope_freqs.weight":
                factors = _read(tensor, conv.dequantize, tensor.tensor_type.name, tensor.data, (-1,))
                checks.check_values(tensor.name, tensor.tensor_type.name, factors)
                config["rope_scaling"] = rope_scaling_from_factors(factors, config)
            done += int(tensor.n_bytes)
            continue
        arrays = _read(tensor, _convert, tensor, name, plans[tensor.name], arch, meta)
        if plans[tensor.name].bits:
            bits.add(plans[tensor.name].bits)
        size = sum(a.nbytes for a in arrays.values())
        if shard_bytes and shard_bytes + size > SHARD_BYTES:
            flush()
        shard.update(arrays)
        shard_bytes += size
        done += int(tensor.n_bytes)
    flush()
    report(total, total, "done")
    if len(shards) > 1:
        weight_map = {key: name for name, keys in shards for key in keys}
        index = {
            "metadata": {"total_size": sum((folder / n).stat().st_size for n, _ in shards)},
            "weight_map": weight_map,
        }
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    elif shards:
        (folder / shards[0][0]).rename(folder / "model.safetensors")
    return bits


def _convert(tensor, name: str, plan: conv.Plan, arch, meta: dict) -> dict:
    """One GGUF tensor -> {mlx-lm name: array}: a float array, or weight/scales/biases."""
    import mlx.core as mx
    import numpy as np

    type_name = tensor.tensor_type.name
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    heads = arch.permutation_heads(tensor.name, meta)
    fix = (lambda rows: unpermute_rows(rows, heads)) if heads else (lambda rows: rows)
    stem = name.removesuffix(".weight")
    float_type = getattr(mx, plan.dtype)
    if plan.bits and conv.NATIVE_BITS.get(type_name) == plan.bits:
        weight, scales, biases = (fix(a) for a in conv.native_triple(type_name, tensor.data, shape[0]))
        checks.check_blocks(tensor.name, type_name, scales, biases, 2**plan.bits - 1)
        return {
            name: mx.array(weight),
            f"{stem}.scales": mx.array(scales).astype(float_type),
            f"{stem}.biases": mx.array(biases).astype(float_type),
        }
    values = fix(conv.dequantize(type_name, tensor.data, shape))
    checks.check_values(tensor.name, type_name, values)
    if arch.norm_offset and arch.is_norm(tensor.name):
        values = values - np.float32(arch.norm_offset)
    array = mx.array(values)
    if plan.bits:
        weight, scales, biases = mx.quantize(array, group_size=conv.GROUP_SIZE, bits=plan.bits)
        return {name: weight, f"{stem}.scales": scales.astype(float_type), f"{stem}.biases": biases.astype(float_type)}
    return {name: array.astype(float_type)}


def _read(tensor, convert, *args):
    """`convert(*args)` with numpy's warnings off (the checks judge the values) and its errors
    (a shape that does not fit the data) as one line naming the tensor."""
    import numpy as np

    try:
        with np.errstate(all="ignore"):
            return convert(*args)
    except (ValueError, TypeError, IndexError) as e:
        shape = "x".join(str(int(d)) for d in reversed(tensor.shape.tolist()))
        raise checks.DamagedGGUF(
            f"tensor {tensor.name} ({tensor.tensor_type.name}, {shape}) cannot be converted: "
            f"its data does not fit its type and shape ({type(e).__name__})"
        ) from None
