"""What matters in training an EAGLE-3 head, on one run's data: variants trained for the same
minutes each and read on the same held-out examples.

    python demos/eagle3/ablate.py --run DIR [--variants baseline,answers-only,...] [--minutes 30]
        [--json]

`--run` is a `train-draft` run folder whose data is written (its shards: the target's
answers and the text it read, features and top-k distributions); nothing there is changed.
A DFlash drafter's run serves too: its heads read the taps nearest EAGLE-3's own, with the
head's default settings.
Each variant starts a fresh head as `train-draft` does (`training/run.py`: the draft
vocabulary chosen from the data it trains on, features standardised, the output
calibrated) and trains it with `training/trainer.train` for `--minutes`, then reads α per
draft step and Σ min(p, q) at step 1 on the run's held-out examples, split into the
target's own answers and fixed text. Variants (the papers' questions, issue 41):

    baseline       the run's settings (draft vocabulary, steps, the first step's share)
    answers-only   trained on the target's regenerated answers alone (EAGLE-3's data)
    text-only      trained on the fixed text alone (EAGLE-1: fixed answers, teacher-forced)
    vocab-N        a draft vocabulary of N ids
    steps-N        N training-time-test steps unrolled (1: no training-time test)
    single-F       the first draft step alone for a share F of the time

One variant runs at a time, on one thread; for a comparison, run the variants in one call,
on a quiet machine. Prints a table, or with --json every figure as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


DEFAULT_VARIANTS = "baseline,answers-only,text-only,vocab-32768,steps-1,single-0"


@dataclass
class Variant:
    name: str
    examples: str = "all"  # all, answers, text
    draft_vocab: int | None = None
    steps: int | None = None
    single_step_share: float | None = None


def parse_variant(name: str) -> Variant:
    if name == "baseline":
        return Variant(name)
    if name in ("answers-only", "text-only"):
        return Variant(name, examples=name.split("-")[0])
    kind, _, value = name.partition("-")
    try:
        if kind == "vocab":
            return Variant(name, draft_vocab=int(value))
        if kind == "steps":
            return Variant(name, steps=int(value))
        if kind == "single":
            return Variant(name, single_step_share=float(value))
    except ValueError:
        pass
    raise SystemExit(f"error: unknown variant {name!r} (baseline, answers-only, text-only, vocab-N, steps-N, single-F)")


class Quiet:
    """train()'s progress: a line on stderr every few minutes."""

    def __init__(self, name: str):
        self.name, self.last = name, 0.0

    def trained(self, state, fraction: float) -> None:
        if time.perf_counter() - self.last > 120:
            self.last = time.perf_counter()
            print(
                f"  {self.name}: {fraction:.0%}, step {state.step}, loss {state.loss:.3f}", file=sys.stderr, flush=True
            )

    def evaluated(self, figures: dict) -> None:
        pass

    def note(self, message: str) -> None:
        print(f"  {self.name}: {message}", file=sys.stderr, flush=True)

    def status(self, message: str) -> None:
        pass

    def data(self, *args) -> None:
        pass

    def reading(self, *args) -> None:
        pass


def train_variant(variant: Variant, *, run: Path, settings, model, config, shape, tokenizer, minutes: float) -> dict:
    from mlxspec.training.checkpoint import State
    from mlxspec.training.data import choose_vocabulary
    from mlxspec.training.run import new_drafter_and_objective
    from mlxspec.training.store import load_shards
    from mlxspec.training.trainer import Eagle3Objective, feature_scale, standardize, train

    examples = load_shards(
        run / "data", vocab_size=shape.vocab_size, feature_width=shape.data_width, columns=shape.columns
    )
    held = [e for e in examples if e.held_out]
    chosen = {"all": lambda e: True, "answers": lambda e: e.train_from > 0, "text": lambda e: e.train_from == 0}
    train_set = [e for e in examples if not e.held_out and chosen[variant.examples](e)]
    if not train_set or not held:
        raise SystemExit(f"error: {run} has no {variant.examples} examples to train on, or none held out")
    settings = replace(
        settings,
        draft_vocab=variant.draft_vocab or settings.draft_vocab,
        steps=variant.steps or settings.steps,
        single_step_share=(
            settings.single_step_share if variant.single_step_share is None else variant.single_step_share
        ),
    )
    eos = sorted(set(tokenizer.eos_token_ids))
    vocabulary = choose_vocabulary(train_set, eos=eos, vocab_size=shape.vocab_size, size=settings.draft_vocab)
    if settings.standardize:
        standardize(train_set + held, feature_scale(train_set, seed=settings.seed))
    head, objective = new_drafter_and_objective(model, config, settings, shape, vocabulary, mask_id=None)
    progress = Quiet(variant.name)
    objective.calibrate(head, train_set)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        state = train(
            head=head, objective=objective, train_set=train_set, held_out=held, folder=Path(folder),
            state=State(), seed=settings.seed, peak_lr=settings.lr, progress=progress,
            until=started + minutes * 60, warmup=settings.warmup, batch_rows=settings.batch_rows,
        )  # fmt: skip
    figures = {}
    for part, keep in (("answers", lambda e: e.train_from > 0), ("text", lambda e: e.train_from == 0)):
        subset = [e for e in held if keep(e)]
        if subset:
            evaluation = Eagle3Objective(objective.draft_index, 3, 0.0).evaluate(
                head, subset, [objective.labels(e) for e in subset]
            )
            figures[part] = {"alpha": evaluation["alpha"], "expected_acceptance": evaluation["expected_acceptance"]}
    return {
        "variant": variant.name,
        "train_examples": len(train_set),
        "train_positions": int(sum(len(e.ids) - e.train_from - 1 for e in train_set)),
        "draft_vocab": len(vocabulary),
        "steps": settings.steps,
        "trained_positions": state.tokens,
        "training_steps": state.step,
        "minutes": (time.perf_counter() - started) / 60,
        "held_out": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a train-draft run folder with its data written")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--minutes", type=float, default=30.0, help="training time of each variant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variants.split(",")]

    from mlxspec.drafters import EAGLE3
    from mlxspec.training.settings import load_target, read_settings
    from mlxspec.training.shape import data_shape

    settings = read_settings(args.run)
    if settings.kind != EAGLE3:  # a DFlash run's data: heads read the taps nearest their own (TargetShape)
        from mlxspec.cli.train_draft import KIND_OPTIONS

        settings = replace(settings, kind=EAGLE3, **KIND_OPTIONS[EAGLE3])
    from mlxspec.decoding.capture import num_layers

    target = load_target(settings.target)
    shape = data_shape(args.run, settings, target.config, num_layers(target.model))
    results = []
    for variant in variants:
        print(f"{variant.name}: training {args.minutes:g} min", file=sys.stderr, flush=True)
        results.append(
            train_variant(
                variant,
                run=args.run,
                settings=settings,
                model=target.model,
                config=target.config,
                shape=shape,
                tokenizer=target.tokenizer,
                minutes=args.minutes,
            )  # fmt: skip
        )
    if args.json:
        print(json.dumps({"run": str(args.run), "minutes": args.minutes, "variants": results}))
        return
    print(f"{args.run}: {args.minutes:g} min of training each; held out: α per draft step 1-3, Σ min(p, q) at step 1")
    print(f"  {'variant':<14} {'trained on':>10} {'vocab':>6} {'steps':>5}   {'answers':<24} {'text':<24}")
    for r in results:
        cells = []
        for part in ("answers", "text"):
            f = r["held_out"].get(part)
            alpha = " ".join(f"{a:.3f}" for a in f["alpha"]) if f else "–"
            cells.append(f"{alpha} ({f['expected_acceptance']:.3f})" if f else "–")
        print(
            f"  {r['variant']:<14} {r['train_positions']:>10} {r['draft_vocab']:>6} {r['steps']:>5}"
            f"   {cells[0]:<24} {cells[1]:<24}"
        )


if __name__ == "__main__":
    main()
