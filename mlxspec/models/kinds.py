"""The drafter kinds, each registered once: how a kind is recognised (from the draft's name,
or from the folder that name finds), how it loads beside its target, and the drafter it
becomes over the target's cursor. `load_pair`, the session's cursors
(generation.make_cursors), the prompt-cache checks, bench and costs ask here; the kinds'
names are plain constants (drafters/__init__.py), and a new kind is one entry below, its
drafter module and its tests.

    draft model    a separate model sharing the target's tokenizer: a cursor and cache of its own
    prompt lookup  `--draft ngram`: no model; the drafting policy proposes from the text itself
                   (drafters/lookup.py, drafters/history/), beside any other kind too
    EAGLE-3 head   a folder in the published layout: reads the target's hidden states
    MTP head       `--draft mtp`: the target's own head, read from its checkpoint
    DFlash         a folder in the published layout: a block drafter over the target's hidden
                   states, drafting a chain in one forward

MLX and the drafters load only when a kind is detected in a folder, loads or makes its
drafter: the views ask which kind a preset names without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..drafters import DFLASH, DRAFT_MODEL, EAGLE3, MTP, PROMPT_LOOKUP
from ..errors import IncompatiblePair
from .loading import LoadedModel


@dataclass(frozen=True)
class Kind:
    name: str  # the constant: a loaded draft's LoadedModel.kind, and the draft's name where `named`
    named: bool = False  # the draft's name is the kind's own (--draft ngram, --draft mtp): no folder to find
    by_lookup: bool = False  # no model: the drafting policy proposes from the text (Pair.ngram)
    in_target: bool = False  # read from the target's own files: nothing to fetch; acceptance shown by position
    reads_features: bool = False  # reads the target's hidden states: the target's cursor keeps them
    shown_as: str | None = None  # how views name the drafting, where the draft is no model of its own
    detect: Callable[[Path], bool] | None = None  # a found folder holds this kind
    # (the draft's name, its folder or None, the target: LoadedModel) -> the draft; None: no model
    load: Callable[[str, Path | None, LoadedModel], LoadedModel | None] = lambda name, path, target: None
    # (the draft, the target's cursor, name=, cache_options=) -> the drafter; None: the policy drafts
    drafter: Callable[..., object] | None = None
    # the draft's model -> what a batch's packed cache runs (decoding/packed.py); None: the model
    packed: Callable[[object], object] | None = None


def named(draft: str | None) -> Kind | None:
    """The kind a draft's name itself says (prompt lookup, the target's own head), or None for
    a name to find (a folder, a repo id, a file)."""
    kind = KINDS.get(draft) if isinstance(draft, str) else None
    return kind if kind is not None and kind.named else None


def of_folder(path: Path) -> Kind:
    """The kind of the draft found at `path`: the first whose check knows the folder, else a
    draft model."""
    return next((k for k in KINDS.values() if k.detect is not None and k.detect(path)), KINDS[DRAFT_MODEL])


def of(draft: LoadedModel | None) -> Kind | None:
    """A loaded draft's kind; None without one."""
    return None if draft is None else KINDS[draft.kind]


def check_compatible(target_tokenizer, draft_tokenizer) -> None:
    """Same token-to-id map and same end-of-sequence ids, or IncompatiblePair naming the
    first difference."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        target_by_id = {i: t for t, i in target_vocab.items()}
        draft_by_id = {i: t for t, i in draft_vocab.items()}
        for i in sorted(set(target_by_id) | set(draft_by_id)):
            a, b = target_by_id.get(i), draft_by_id.get(i)
            if a != b:
                raise IncompatiblePair(
                    f"draft and target tokenizers differ: id {i} is {_token(a)} for the target "
                    f"and {_token(b)} for the draft; pick a draft from the same model family"
                )
    target_eos, draft_eos = set(target_tokenizer.eos_token_ids), set(draft_tokenizer.eos_token_ids)
    if target_eos != draft_eos:
        raise IncompatiblePair(
            f"draft and target end sequences on different ids: target {sorted(target_eos)}, draft {sorted(draft_eos)}"
        )


def _token(t: str | None) -> str:
    return "missing" if t is None else repr(t)


# -- a draft model
def _load_draft_model(name: str, path: Path | None, target: LoadedModel) -> LoadedModel:
    from ..decoding import caches
    from .loading import load

    draft = load(str(path))
    draft.name = name
    caches.check_supported(draft.model, f"draft {name}")
    check_compatible(target.tokenizer, draft.tokenizer)
    return draft


def _model_drafter(draft: LoadedModel, target, *, name: str, cache_options):
    from ..drafters.model import ModelDrafter

    return ModelDrafter(draft.model, name, draft.width, target.width, cache_options=cache_options)


# -- an EAGLE-3 head: a head over the target's own hidden states, its tokenizer the target's
def _is_eagle3_head(path: Path) -> bool:
    from ..drafters.eagle3_head import is_head_folder

    return is_head_folder(path)


def _load_eagle3(name: str, path: Path | None, target: LoadedModel) -> LoadedModel:
    from .heads import load_eagle3

    return load_eagle3(name, path, target)


def _eagle3_drafter(draft: LoadedModel, target, *, name: str, cache_options):
    from ..drafters.eagle3 import Eagle3Drafter

    return Eagle3Drafter(draft.model, target, name=name)


def _packed_head(model):
    from ..drafters.eagle3 import PackedHead

    return PackedHead(model)  # its one attention layer handed the batch's layout


# -- a DFlash block drafter: layers over the target's hidden states, its embedding and LM head the target's
def _is_dflash(path: Path) -> bool:
    from ..drafters.dflash_model import is_dflash_folder

    return is_dflash_folder(path)


def _load_dflash(name: str, path: Path | None, target: LoadedModel) -> LoadedModel:
    from .heads import load_dflash

    return load_dflash(name, path, target)


def _dflash_drafter(draft: LoadedModel, target, *, name: str, cache_options):
    from ..drafters.dflash import DFlashDrafter

    return DFlashDrafter(draft.model, target, name=name)


def _packed_block(model):
    from ..drafters.dflash import PackedBlock

    return PackedBlock(model)  # each lane's block and context rows in one read


# -- the target's own MTP head
def _load_mtp(name: str, path: Path | None, target: LoadedModel) -> LoadedModel:
    from .heads import load_mtp

    return load_mtp(target)


def _mtp_drafter(draft: LoadedModel, target, *, name: str, cache_options):
    from ..drafters.mtp import MtpDrafter

    return MtpDrafter(draft.model, target, name=name)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(DRAFT_MODEL, load=_load_draft_model, drafter=_model_drafter),
        Kind(PROMPT_LOOKUP, named=True, by_lookup=True),
        Kind(
            EAGLE3,
            reads_features=True,
            detect=_is_eagle3_head,
            load=_load_eagle3,
            drafter=_eagle3_drafter,
            packed=_packed_head,
        ),
        Kind(
            DFLASH,
            reads_features=True,
            detect=_is_dflash,
            load=_load_dflash,
            drafter=_dflash_drafter,
            packed=_packed_block,
        ),
        Kind(
            MTP,
            named=True,
            in_target=True,
            reads_features=True,
            shown_as="the model's MTP head",
            load=_load_mtp,
            drafter=_mtp_drafter,
            packed=_packed_head,
        ),
    )
}
