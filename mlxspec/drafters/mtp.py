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

from . import MTP
from .eagle3 import Eagle3Drafter


class MtpDrafter(Eagle3Drafter):
    kind = MTP
