"""Loading a draft head beside its target: an EAGLE-3 head or a DFlash block drafter found by
its config, or the target's own MTP head read from its checkpoint; checked against the
target, the target's layers (or its final norm) tapped for the features the head reads."""

from __future__ import annotations

from pathlib import Path

from ..decoding import capture
from ..drafters import DFLASH, EAGLE3, MTP
from ..drafters.eagle3_head import check_fits, load_head, read_config, target_embedding
from ..errors import IncompatibleHead


def _check_width(draft_to_target, target, *, name: str) -> None:
    """A drafter's ids map within the target's logits (its config may name fewer ids than
    its output holds, never more)."""
    if draft_to_target.max().item() >= target.width:
        raise IncompatibleHead(f"{name}: d2t maps draft ids past the target's {target.width} logits")


def load_eagle3(name: str, path: Path, target):
    """A LoadedModel (kind "eagle3") for the head at `path`, fitted to `target` (a
    LoadedModel); taps the target's layers it reads."""
    import mlx.core as mx

    from .loading import LoadedModel

    _refuse_shard(target, "an EAGLE-3 head")
    layers = capture.num_layers(target.model)  # refuses a family it cannot tap, naming it
    # the config against the target first: a misfit is named by its field, not by a shape
    ids = check_fits(read_config(path), target_config=target.config, target_layers=layers, name=name)
    head = load_head(path, dtype=mx.float32 if mx.default_device() == mx.cpu else None)
    _check_width(head.draft_to_target, target, name=name)
    if "embed_tokens" not in head:
        head.share_embedding(target_embedding(target.model))
    capture.install(target.model, ids)
    weight_bytes = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
    return LoadedModel(
        name=name,
        path=Path(path),
        model=head,
        tokenizer=target.tokenizer,
        config={"aux_layer_ids": list(ids), "draft_vocab_size": head.config.draft_vocab_size},
        width=target.width,
        weight_bytes=weight_bytes,
        kind=EAGLE3,
    )


def load_mtp(target):
    """A LoadedModel (kind "mtp") for the MTP head in `target`'s own checkpoint (a
    LoadedModel); taps the target's final norm for the hidden state the head reads."""
    import mlx.core as mx

    from ..drafters.mtp_head import (
        CONVERTED_FILE,
        HIDDEN_AFTER_NORM,
        head_tensor_name,
        load_head,
        nextn_index,
        tensor_files,
    )
    from .loading import LoadedModel

    _refuse_shard(target, "an MTP head")
    dtype = mx.float32 if mx.default_device() == mx.cpu else None
    head = load_head(Path(target.path), target.model, target.config, name=target.name, dtype=dtype)
    capture.install_final(target.model, after_norm=HIDDEN_AFTER_NORM)
    nextn = nextn_index(target.config)
    files = {f for name, f in tensor_files(Path(target.path)).items() if head_tensor_name(name, nextn) is not None}
    files |= {Path(target.path) / CONVERTED_FILE} if (Path(target.path) / CONVERTED_FILE).exists() else set()
    return LoadedModel(
        name=f"{target.label} MTP head",
        path=Path(target.path),
        model=head,
        tokenizer=target.tokenizer,
        config={"family": target.config.get("model_type")},
        width=target.width,
        weight_bytes=sum(f.stat().st_size for f in files if f.exists()),
        kind=MTP,
    )


def load_dflash(name: str, path: Path, target):
    """A LoadedModel (kind "dflash") for the DFlash drafter at `path`, fitted to `target` (a
    LoadedModel): its embedding and LM head the target's; taps the target's layers it reads."""
    import mlx.core as mx

    from ..drafters.dflash_model import check_fits as check_dflash_fits
    from ..drafters.dflash_model import load_draft
    from ..drafters.dflash_model import read_config as read_dflash_config
    from .loading import LoadedModel

    _refuse_shard(target, "a DFlash drafter")
    layers = capture.num_layers(target.model)  # refuses a family it cannot tap, naming it
    config = read_dflash_config(path)
    check_dflash_fits(config, target_config=target.config, target_layers=layers, name=name)
    draft = load_draft(path, dtype=mx.float32 if mx.default_device() == mx.cpu else None).bind(target.model)
    if draft.draft_to_target is not None:
        _check_width(draft.draft_to_target, target, name=name)
    capture.install_outputs(target.model, config.target_layer_ids)
    return LoadedModel(
        name=name,
        path=Path(path),
        model=draft,
        tokenizer=target.tokenizer,
        config={"target_layer_ids": list(config.target_layer_ids), "block_size": config.block_size},
        width=target.width,
        weight_bytes=sum(f.stat().st_size for f in Path(path).glob("*.safetensors")),
        kind=DFLASH,
    )


def _refuse_shard(target, what: str) -> None:
    if getattr(target, "shard", None) is not None:
        raise IncompatibleHead(
            f"{what} reads the target's hidden states, which a target split across ranks "
            "does not bring back to rank 0: run it in one process"
        )
