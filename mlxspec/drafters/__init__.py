"""Drafters, one module per kind behind one interface (base.Drafter): a separate draft model
(model.py), an EAGLE-3 head reading the target's hidden states (eagle3.py) and the target's own
MTP head reading its last hidden state (mtp.py). Prompt lookup
proposes through the drafting policy (drafting/lookup.py) and needs no drafter."""

MODEL_DRAFT, EAGLE3, MTP = "model", "eagle3", "mtp"  # LoadedModel.kind of a pair's draft
HEAD_KINDS = (EAGLE3, MTP)  # drafters that read the target's hidden states
