"""The finished drafter's README: what it is, the data it learnt from, its held-out
acceptance and how training went."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import State
from .settings import Settings
from .shape import TargetShape


def eagle3_summary(settings: Settings, shape: TargetShape, vocab: int) -> tuple[str, str]:
    """An EAGLE-3 head's card: its title and what it is."""
    return "EAGLE-3 draft head", (
        f"one decoder layer over the target's\nhidden states entering layers {list(shape.aux)}, "
        f"{vocab}-id draft vocabulary, training-time\ntest unrolled {settings.steps} steps"
    )


def dflash_summary(settings: Settings, shape: TargetShape, mask_id: int, vocab: int) -> tuple[str, str]:
    """A DFlash drafter's card: its title and what it is (training/dflash.py's recipe)."""
    scores = (
        "its embedding and LM head\nare the target's"
        if vocab == shape.vocab_size
        else f"its embedding is the target's;\nits own LM head scores a {vocab}-id draft vocabulary"
    )
    return "DFlash block drafter", (
        f"{settings.draft_layers} decoder layer(s) over the\noutputs of the target's layers "
        f"{list(shape.aux)}, blocks of {settings.block_size} (mask id {mask_id}),\n"
        f"random anchors, the target's own distributions as labels; {scores}"
    )


def model_card(settings: Settings, facts: dict, figures: dict, state: State, what: tuple[str, str]) -> str:
    """The finished drafter's README: `what` (its title, what it is), the data, held-out
    acceptance and how it went."""
    title, summary = what
    alpha = figures.get("alpha") or []
    rows = "\n".join(f"| {k} | {a:.3f} |" for k, a in enumerate(alpha, 1))
    history = "\n".join(
        f"| {h['step']} | {h['tokens']} | "
        + ", ".join(f"{a:.3f}" for a in h["alpha"])
        + f" | {h['expected_acceptance']:.3f} |"
        for h in state.history
    )
    source = (
        f"prompts from {settings.prompts_file}"
        if settings.prompts_file
        else f"the user turns of --corpus {settings.corpus}"
        if settings.corpus
        else "the bundled prompt set"
    )
    text = ", ".join(settings.text_files + [f"--corpus {settings.corpus}"] * bool(settings.corpus)) or "none"
    begun = (
        f"\n- Begun from the data of {settings.data_from} ({facts['adopted_seconds'] / 60:.1f} min of the data's"
        " time is that run's; its shards linked, read where they were tapped)."
    ) * bool(settings.data_from)
    held_rule = "every 16th example" + (
        " (of the corpus: whole conversations, those whose first user turn's sha256 is 0 mod 16)"
        if settings.corpus
        else ""
    )
    return f"""# {title} for {Path(settings.target).name}

Trained on this machine by `mlxspec train-draft` ({summary}). Load it with `--draft DIR`
beside its target.

    {settings.command}

## Data
- {facts["answers"]} answers by the target itself ({source}; {facts["prompts_used"]} prompts
  read), {facts["answer_tokens"]} answer tokens, generated in batches of {settings.batch}
  (70% greedy, 30% sampled at temperature 0.7, at most {settings.max_tokens} tokens each).
- Fixed text read by teacher-forced prefill: {facts["text_tokens"]} tokens ({text}).
- Features and the target's top-32 distributions at every position trained on, as a
  teacher-forced read of each answer and text chunk gives them; {held_rule} held out
  ({facts["held_out_examples"]} examples).
- Data took {facts["data_seconds"] / 60:.1f} min; training {facts["train_seconds"] / 60:.1f} min
  ({facts["steps_taken"]} steps, {facts["trained_positions"]} trained positions summed over
  steps, {facts["epochs"]:.1f} epochs).{begun}

## Held-out acceptance
Greedy agreement with the target per draft position, conditional (position k over the
chains whose first k-1 drafts agreed):

| position | α |
|---|---|
{rows}

Expected acceptance at position 1, sum(min(p, q)) at temperature 1:
{figures.get("expected_acceptance", float("nan")):.3f} over {figures.get("positions", 0)} positions.

## As training went (held-out subset)
| step | trained positions | α per position | Σ min(p, q) |
|---|---|---|---|
{history}
"""
