"""Training drafters on this machine: an EAGLE-3 head distilled from the target's own
answers and features (`mlxspec train-draft`).

corpus.py builds the bundled prompt set; data.py has the target write the data (answers
generated in batches, then hidden states and distributions by teacher-forced prefill) and
keeps it in shards; trainer.py unrolls the head with training-time test, measures held-out
acceptance, checkpoints and writes the finished head with its model card."""
