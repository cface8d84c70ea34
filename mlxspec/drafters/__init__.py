"""Drafters, one module per kind behind one interface (base.Drafter): a separate draft model
(model.py), an EAGLE-3 head reading the target's hidden states (eagle3.py), the target's own
MTP head reading its last hidden state (mtp.py), and prompt lookup (lookup.py), which needs
only the interface's `propose` and `hear` (no cache, point-mass proposals) and proposes
beside any of the others, through the drafting policy."""

MODEL_DRAFT, EAGLE3, MTP = "model", "eagle3", "mtp"  # LoadedModel.kind of a pair's draft
HEAD_KINDS = (EAGLE3, MTP)  # drafters that read the target's hidden states
