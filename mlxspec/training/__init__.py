"""Training drafters on this machine: an EAGLE-3 head or a DFlash block drafter distilled
from the target's own answers and features (`mlxspec train-draft`).

corpus.py builds the bundled prompt set and sequences.py what the target reads; data.py has
the target write the data (answers.py: its answers written in batches, hidden states and
distributions kept as it writes them; text read by teacher-forced prefill), which store.py
keeps in shards; trainer.py
unrolls the head with training-time test and measures held-out acceptance (dflash.py: a
block drafter's objective), and checkpoint.py keeps its checkpoint and writes the finished
drafter."""
