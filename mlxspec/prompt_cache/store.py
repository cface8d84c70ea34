"""A prompt's caches in a file, so that a long beginning (a system prompt, a document) is
read once and every later call reads only what follows it (mlx-lm's `cache_prompt`).

The file is mlx-lm's prompt-cache format (safetensors: each layer's state and class), both
models' layers in one list, and in its metadata what mlxspec needs to use it again: the
cached text as the template rendered it, the ids the caches hold, which models (and with
which cache options) made it. It is refused for other models or options.

A later prompt is the cached text followed by more: its rendering must start with the
cached rendering, and its ids are the cached ids followed by the rest's (the session then
reads only the rest). Where the rendering does not start so (another system prompt), the
prompt is encoded whole and the session keeps what the caches share with it. Either way a
generation emits exactly what it would from empty caches.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InvalidOption, ModelLoadError
from ..models.pairs import fit_context
from ..models.templates import render
from ..text import check_text
from . import checks

FORMAT = "mlxspec-prompt-cache/2"  # 2: with the tensors' names and a digest of ids and tensors
_SENTINEL = "\ue000"  # a private-use character: where the cached text ends in a rendering


@dataclass(frozen=True)
class PromptCache:
    """What a prompt-cache file says about itself (its arrays are read by `restore`)."""

    path: Path
    text: str  # the rendering the cached ids spell (the chat template's, up to the end of `user`)
    ids: tuple[int, ...]  # the cached prompt's ids; the caches hold all but the last
    user: str  # the cached text as given: the start of the first message
    system: str | None
    raw: bool  # no chat template: the ids are the text's own
    models: dict  # "target" (and "draft"): name, config hash, weight bytes, layers
    cache_options: dict  # max_kv_size, kv_bits, kv_group_size

    def describe(self) -> str:
        names = " + ".join(m["name"].rstrip("/").split("/")[-1] for m in self.models.values())
        return f"{len(self.ids)} tokens of {names}"


def rendering(pair, text: str, *, system: str | None = None, raw: bool = False) -> tuple[str, list[int]]:
    """The start of a prompt that begins with `text`: the chat template's rendering up to the
    end of `text` in the first user message (after the system prompt), or the text itself
    when raw or the model has no template; and its ids."""
    check_text(text, "the text to cache")
    check_text(system, "the system prompt")
    tokenizer = pair.tokenizer
    if raw or not tokenizer.has_chat_template:
        return text, list(tokenizer.encode(text))
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text + _SENTINEL}
    ]
    rendered = render(tokenizer, messages, tokenize=False)
    at = rendered.find(_SENTINEL)
    if at < 0 or not rendered[:at].endswith(text):
        raise InvalidOption("this chat template does not keep a message as written: cache the prompt with --raw")
    start = rendered[:at]
    return start, list(tokenizer.encode(start, add_special_tokens=False))


def prompt_ids(cache: PromptCache, pair, prompt: str, *, think: bool | None = None) -> list[int]:
    """The ids of the cached text followed by `prompt` (a generation's prompt): the cached ids,
    then the rest's (the template's: the end of the message, the generation prompt)."""
    tokenizer = pair.tokenizer
    if cache.raw or not tokenizer.has_chat_template:
        return list(cache.ids) + list(tokenizer.encode(prompt, add_special_tokens=False))
    messages = ([{"role": "system", "content": cache.system}] if cache.system else []) + [
        {"role": "user", "content": cache.user + prompt}
    ]
    extra = {} if think is None else {"enable_thinking": think}
    full = render(tokenizer, messages, tokenize=False, **extra)
    if not full.startswith(cache.text):  # the template renders the start differently now
        return list(tokenizer.encode(full, add_special_tokens=False))
    return list(cache.ids) + list(tokenizer.encode(full[len(cache.text) :], add_special_tokens=False))


def fingerprint(model) -> dict:
    """What tells one model from another: its config file's hash, weight bytes, layers."""
    config = Path(model.path) / "config.json"
    digest = hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.exists() else ""
    return {"name": model.name, "config": digest, "weight_bytes": model.weight_bytes, "width": model.width}


def _same(model, made: dict) -> bool:
    """The model the file was made with (by its files, whatever it was called)."""
    mine = fingerprint(model)
    return all(mine[key] == made.get(key) for key in ("config", "weight_bytes", "width"))


def _refuse_heads(session) -> None:
    """A head reads the target's hidden states of every cached position, which a file of KV
    caches does not hold."""
    draft, kind = session.pair.draft, session.pair.kind
    if kind is not None and kind.reads_features:
        head = draft.label if kind.in_target else f"the {draft.kind} head {draft.label}"  # "X MTP head"
        raise InvalidOption(
            f"prompt-cache files hold KV caches, not the hidden states {head} reads: "
            "use them with a draft model, prompt lookup or --no-draft"
        )


def save(
    path: str | Path, session, text: str, *, system: str | None = None, raw: bool = False, progress=None
) -> PromptCache:
    """Read the start of a prompt beginning with `text` into the session's caches (both
    models') and write them to `path`. Returns what the file says about itself. The text is
    measured against the target's context before anything is read, and read a chunk at a
    time (`progress(done, total)` after each; Ctrl-C is taken between chunks)."""
    from mlx_lm.models.cache import save_prompt_cache

    _refuse_heads(session)
    pair = session.pair
    start, ids = rendering(pair, text, system=system, raw=raw)
    if len(ids) < 2:
        raise InvalidOption(
            f"nothing to cache: the text is {len(ids)} token{'s' * (len(ids) != 1)}, and a cache holds the ids "
            "before a prompt's last "
            "(read with what follows): give a longer text, or a --system prompt"
        )
    fit_context(pair, len(ids), 1)  # as generate: a prompt that fills the context is refused, here before reading
    cursors = {"target": session.target} | ({"draft": session.draft} if session.draft else {})
    _read(session, ids, progress or (lambda done, total: None))
    models = {role: fingerprint(getattr(pair, role)) | {"layers": len(c.cache.layers)} for role, c in cursors.items()}
    info = PromptCache(
        path=Path(path),
        text=start,
        ids=tuple(ids),
        user=text,
        system=system,
        raw=raw or not pair.tokenizer.has_chat_template,
        models=models,
        cache_options=asdict(session.target.cache_options),
    )
    layers = [layer for c in cursors.values() for layer in c.cache.layers]
    meta = {k: v for k, v in asdict(info).items() if k != "path"}
    try:
        save_prompt_cache(str(path), layers, {"mlxspec": json.dumps({"format": FORMAT, **meta})})
        _seal(path, meta)
    except OSError as e:
        raise InvalidOption(f"cannot write {path}: {e.strerror}") from None
    return info


READ_STEP = 512  # ids read between progress reports (and chances for Ctrl-C)


def _read(session, ids: list[int], progress) -> None:
    """Prefill both models with `ids` (all but the last), READ_STEP ids at a time."""
    from ..decoding.engine import prefill

    total = len(ids) - 1
    for end in [*range(READ_STEP, total, READ_STEP), total]:
        prefill(session.target, session.draft, ids[: end + 1])
        progress(end, total)


def _seal(path: str | Path, meta: dict) -> None:
    """Add the names of the tensors mlx-lm wrote and the digest of ids and tensors to the
    file's metadata (read back, so both are of exactly what the file holds)."""
    import mlx.core as mx

    arrays, flat = mx.load(str(path), return_metadata=True)
    sealed = {
        "format": FORMAT,
        **meta,
        "tensors": sorted(arrays),
        "digest": checks.digest(meta["ids"], arrays, checks.layout(flat)),
    }
    flat = {**flat, "0.mlxspec": json.dumps(sealed)}
    mx.save_safetensors(str(path), arrays, metadata=flat)


def read(path: str | Path) -> PromptCache:
    """A prompt-cache file's description, checked to be one of mlxspec's (nothing loaded)."""
    import mlx.core as mx

    path = Path(path).expanduser()
    if not path.is_file():
        raise InvalidOption(f"no prompt cache at {path} (make one with `mlxspec cache-prompt`)")
    try:
        arrays, metadata = mx.load(str(path), return_metadata=True)
        meta = json.loads(_metadata(metadata)["mlxspec"])
    except Exception:
        raise ModelLoadError(f"{path} is not a prompt cache made by `mlxspec cache-prompt`") from None
    if not isinstance(meta, dict) or meta.pop("format", None) != FORMAT:
        raise ModelLoadError(f"{path} is a prompt cache of another format: make it again with `mlxspec cache-prompt`")
    checks.check_metadata(path, meta)
    checks.check_tensors(path, meta, arrays, metadata)
    fields = {k: meta[k] for k in ("text", "user", "system", "raw", "models", "cache_options")}
    return PromptCache(path=path, ids=tuple(meta["ids"]), **fields)


def _metadata(flat: dict) -> dict:
    """The user metadata of mlx-lm's format (flattened as "0.KEY")."""
    return {key.split(".", 1)[1]: value for key, value in flat.items() if key.startswith("0.")}


def check(cache: PromptCache, session) -> None:
    """Refuse a file made for other models or with other cache options than the session's."""
    pair = session.pair
    made = cache.models["target"]
    if not _same(pair.target, made):
        raise InvalidOption(
            f"{cache.path} was made for target {made['name']}, not {pair.target.name}: make it again with "
            "`mlxspec cache-prompt` for these models"
        )
    if max(cache.ids) >= pair.target.width:
        raise checks.DamagedPromptCache(f"{cache.path} holds id {max(cache.ids)}, past {pair.target.name}'s vocabulary")
    mine = asdict(session.target.cache_options)
    if cache.cache_options != mine:
        raise InvalidOption(
            f"{cache.path} was made with {_flags(cache.cache_options)}, not {_flags(mine)}: give the same cache options"
        )


def _flags(options: dict) -> str:
    """Cache options as the command line gives them."""
    flags = [f"--max-kv-size {options['max_kv_size']}"] if options.get("max_kv_size") else []
    flags += [f"--kv-bits {options['kv_bits']}"] if options.get("kv_bits") else []
    if options.get("kv_bits") and options.get("kv_group_size") != 64:
        flags.append(f"KV group size {options['kv_group_size']}")
    return " ".join(flags) or "the default caches"


def restore(cache: PromptCache, session) -> list[str]:
    """Put the file's caches into the session (its cursors then hold the cached ids). A
    draft the file has no layers for (or other ones) starts empty. Returns the roles restored."""
    from mlx_lm.models import cache as mlx_cache

    from ..decoding import caches
    from ..decoding.cursor import Checkpoint

    _refuse_heads(session)
    check(cache, session)
    # mlx-lm rebuilds each layer by its class name in its own module: mlxspec's class too
    if not hasattr(mlx_cache, "KeptRotatingKVCache"):
        mlx_cache.KeptRotatingKVCache = caches.KeptRotatingKVCache
    try:
        layers = mlx_cache.load_prompt_cache(str(cache.path))
    except Exception as e:
        raise ModelLoadError(f"cannot read the caches in {cache.path}: {str(e).splitlines()[0][:200]}") from None
    checks.check_layers(cache.path, layers)
    if len(layers) != sum(made["layers"] for made in cache.models.values()):
        raise checks.DamagedPromptCache(f"{cache.path} holds {len(layers)} cache layers, not the ones its models made")
    held = list(cache.ids[:-1])
    restored, start = [], 0
    for role in ("target", "draft"):
        made = cache.models.get(role)
        if made is None:
            continue
        part, start = layers[start : start + made["layers"]], start + made["layers"]
        cursor = getattr(session, role)
        model = getattr(session.pair, role)
        if cursor is None or not _same(model, made) or len(cursor.cache.layers) != len(part):
            continue  # another draft (or none) reads the prompt itself
        fresh = cursor.cache_options.make(cursor.model, cursor.name)
        if [type(layer) for layer in fresh.layers] != [type(layer) for layer in part]:
            raise InvalidOption(f"{cache.path} holds other cache layers than {cursor.name} builds: make it again")
        loaded = caches.ModelCache(part, cursor.name)
        loaded.length = len(held)
        try:
            loaded._check()
        except caches.CacheRollbackError:
            raise ModelLoadError(f"{cache.path} is inconsistent: its caches do not hold its ids") from None
        cursor.reset()
        cursor.cache, cursor.tokens = loaded, list(held)
        if loaded.needs_snapshots:
            cursor.checkpoints = [Checkpoint(tuple(held), loaded.mark())]
        restored.append(role)
    return restored
