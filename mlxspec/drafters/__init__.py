"""Drafters, one module per kind behind one interface (decoding/drafter.py): a separate draft
model (model.py), an EAGLE-3 head reading the target's hidden states (eagle3.py), the
target's own MTP head reading its last hidden state (mtp.py), a DFlash block drafter filling
a block of mask ids in one forward beside the target's hidden states (dflash.py), prompt lookup over the text
(lookup.py) and over earlier prompts and answers (history/), which are lookups, not
drafters: a `chain` or a `trie` of what followed a match (prompt lookup's trie is its chain)
and `hear`, asked beside any drafter by the drafting policy. The model and head drafters' `propose(plan)` makes
the plan's chain or tree: chain.py is the step loop they share, tree_growth.py the trees
they grow.

The kinds' names, plain constants (no MLX); models/kinds.py registers what each is."""

DRAFT_MODEL = "model"  # a separate draft model
PROMPT_LOOKUP = "ngram"  # prompt lookup, no model (--draft ngram)
EAGLE3 = "eagle3"  # an EAGLE-3 head over the target's hidden states
MTP = "mtp"  # the target's own multi-token-prediction head (--draft mtp)
DFLASH = "dflash"  # a DFlash block drafter over the target's hidden states
