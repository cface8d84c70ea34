"""The target's own MTP head as the drafter (`--draft mtp`).

The head reads, at each position j the target has read, token j+1 beside the target's last
hidden state at j and predicts token j+2 (mtp_head.py): exactly the row bookkeeping of an
EAGLE-3 head, so the drafter is that one (eagle3.py) over another head. The target's cursor
keeps its final normed hidden state of every position (capture.install_final); the head's
KV cache follows the target's history, rows made from the head's own outputs (γ > 1 chains
it on its own normed output, as vLLM's proposer does) are trimmed when a round settles, and
rows for a rejected stretch are trimmed when the target's history moves on. q is the head's
warped distribution over the target's whole vocabulary, so the rule keeps every emitted id
exactly the target's, whatever the head proposes.
"""

from __future__ import annotations

from pathlib import Path

from ..decoding import capture
from . import MTP
from .eagle3 import Eagle3Drafter

NAME = "mtp"  # as a draft name: the target's own MTP head


class MtpDrafter(Eagle3Drafter):
    kind = MTP


def load_mtp(target):
    """A LoadedModel (kind "mtp") for the MTP head in `target`'s own checkpoint (a
    LoadedModel); taps the target's final norm for the hidden state the head reads."""
    import mlx.core as mx

    from ..errors import IncompatibleHead
    from ..models.loading import LoadedModel
    from .mtp_head import CONVERTED_FILE, HIDDEN_AFTER_NORM, head_tensor_name, load_head, nextn_index, tensor_files

    if getattr(target, "shard", None) is not None:
        raise IncompatibleHead(
            "an MTP head reads the target's hidden states, which a target split across ranks "
            "does not bring back to rank 0: run it in one process"
        )
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
