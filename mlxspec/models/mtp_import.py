"""`mlxspec models add-mtp`: give a conversion that lost its MTP head the original's.

mlx-lm 0.32 drops `mtp.*` (and nextn layers) when it converts, so most 4-bit folders on
mlx-community have no head. The original checkpoint has it: its safetensors index names the
shard(s) that hold it, and only those are fetched (or read, from a local folder). The head
is converted as mlx-lm converts the body (drafters/mtp_head.py), quantized as the body is
(its bits and group size, its family's predicate) unless bf16 is asked for, and stored
beside the model as `mtp.safetensors`, where `--draft mtp` finds it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import IncompatibleHead, MlxspecError, ModelNotFound
from . import loading

PRECISIONS = ("body", "bf16")
INDEX = "model.safetensors.index.json"


def add_mtp(
    name: str,
    *,
    source: str,
    precision: str = "body",
    reporter: loading.Reporter | None = None,
    offline: bool | None = None,
) -> Path:
    """Store the MTP head of `source` (the original checkpoint: a folder or a repo id) beside
    the model `name`; returns the file written. Raises one line when the original has no
    head or its head does not fit the model."""
    import mlx.core as mx

    from ..drafters import mtp_head

    reporter = reporter or loading.Reporter()
    reporter.status(f"Loading {name}")
    loaded = loading.load(name, offline=offline)
    config = loaded.config
    mtp_head.check_family(config, name)
    _check_writable(Path(loaded.path))  # before any shard is fetched
    existing = Path(loaded.path) / mtp_head.CONVERTED_FILE
    if existing.is_file() and not mtp_head.written_by_mlxspec(existing):  # MTPLX writes one of this name
        raise IncompatibleHead(f"{existing} was written by another tool: move it away, or add-mtp would overwrite it")
    nextn = mtp_head.nextn_index(config)
    family = mtp_head.family_of(config)
    original = _head_files(source, family=family, nextn=nextn, reporter=reporter, offline=offline)
    tensors, _ = mtp_head.read_head_tensors(original, nextn=nextn)
    if not tensors:
        what = f"model.layers.{nextn}.*" if nextn is not None else "mtp.*"
        raise IncompatibleHead(f"{source} has no MTP head either (no {what} tensors in its index)")
    head = mtp_head.head_from(
        tensors, model=loaded.model, config=config, hub_folder=original, quantized=None, name=name
    )
    quantization = config.get("quantization")
    quantized = {}
    if precision == "body" and quantization:
        quantized = mtp_head.quantize_head(
            head,
            model=loaded.model,
            group_size=int(quantization["group_size"]),
            bits=int(quantization["bits"]),
            mode=quantization.get("mode", "affine"),
        )
    else:
        head.set_dtype(mx.bfloat16)
    mx.eval(head.parameters())
    try:
        path = mtp_head.save_converted(head, loaded.path, quantized=quantized, source=source)
    except (OSError, RuntimeError) as e:  # mlx says "Failed to open file" as a RuntimeError
        raise MlxspecError(f"cannot write the MTP head beside {loaded.path}: {loading._first_line(e)}") from None
    reporter.note(f"wrote {path}")
    return path


def _check_writable(folder: Path) -> None:
    """The head is stored beside the model: say so now if it cannot be, not after a download."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".mlxspec-write-check-"):
            pass
    except OSError as e:
        raise MlxspecError(
            f"cannot write the MTP head beside {folder} ({e.strerror}): copy the model to a folder you can write"
        ) from None


def _head_files(
    source: str, *, family: str, nextn: int | None, reporter: loading.Reporter, offline: bool | None
) -> Path:
    """A folder holding the original's index and the shard(s) with its head: the folder
    itself when it is local, else a download of those files alone."""
    local = Path(source).expanduser()
    if local.is_dir():
        if not (local / INDEX).exists() and not list(local.glob("model*.safetensors")):
            raise ModelNotFound(f"{source} holds no safetensors weights")
        _check_family(local / "config.json", family=family, source=source)
        return local
    if loading.looks_like_path(source):
        raise ModelNotFound(f"no folder {source}")
    return _fetch_head_shards(source, family=family, nextn=nextn, reporter=reporter, offline=offline)


def _check_family(config: Path, *, family: str, source: str) -> None:
    """The original is the model's own family (read before any shard is fetched): another
    family's head would be refused later for its names or shapes, or said to be missing."""
    if not config.exists():
        return
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ModelNotFound(f"{config}: not a readable config ({type(e).__name__})") from None
    theirs = str(raw.get("model_type", "")) if isinstance(raw, dict) else ""
    if theirs and theirs != family:
        raise IncompatibleHead(f"{source} is {theirs}, the model is {family}: give the model's own original checkpoint")


def _fetch_head_shards(
    repo: str, *, family: str, nextn: int | None, reporter: loading.Reporter, offline: bool | None
) -> Path:
    """Only the original's config, index and the shard(s) its index says hold the head."""
    from huggingface_hub import hf_hub_download

    from ..drafters.mtp_head import head_tensor_name, weight_map

    def fetch(filename: str) -> Path:
        try:
            return Path(
                hf_hub_download(repo, filename, local_files_only=bool(offline), cache_dir=loading.hub_cache_dir())
            )
        except Exception as e:  # huggingface_hub raises many types; each means "not here"
            raise ModelNotFound(f"cannot fetch {filename} from {repo}: {loading._first_line(e)}") from None

    _check_family(fetch("config.json"), family=family, source=repo)
    index = fetch(INDEX)
    shards = sorted({file for tensor, file in weight_map(index).items() if head_tensor_name(tensor, nextn) is not None})
    if not shards:
        what = f"model.layers.{nextn}.*" if nextn is not None else "mtp.*"
        raise IncompatibleHead(f"{repo} has no MTP head either (its index names no {what} tensors)")
    for done, shard in enumerate(shards):
        reporter.progress(f"Fetching the MTP head from {repo}", done, len(shards))
        fetch(shard)
    reporter.progress(f"Fetching the MTP head from {repo}", len(shards), len(shards))
    return index.parent
