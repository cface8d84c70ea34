"""Drafters, one module per kind behind one interface (base.Drafter): a separate draft model
(model.py) and an EAGLE-3 head reading the target's hidden states (eagle3.py). Prompt lookup
proposes through the drafting policy (drafting/lookup.py) and needs no drafter."""

MODEL_DRAFT, EAGLE3 = "model", "eagle3"  # LoadedModel.kind of a pair's draft
