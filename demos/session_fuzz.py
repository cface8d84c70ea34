"""Sessions walked through many random sequences of calls, on every cache family and with
drafters that read the target's features (EAGLE-3 heads, MTP heads, DFlash drafters): the
longer run of tests/exactness/test_sessions.py (needs the test extra: pip install -e ".[test]").

    python demos/session_fuzz.py [--examples 500] [--steps 8] [--family NAME ...] [--fixed] [--timed]
    python demos/session_fuzz.py --sabotage --family RotatingKVCache

Each sequence starts a session and makes up to `--steps` calls: extend the history, cut it
(around earlier prompts' ends, window edges, or anywhere) and go on, retry the last prompt,
undo the last call; in every decoding mode (gamma 0, 1-6, auto, prompt lookup), some cut
short (the stream closed or Ctrl-C thrown in after k rounds, or a Ctrl-C at the n-th call
inside mlxspec or mlx-lm). Every call's ids must equal a fresh standard decode's of the same
prompt, every drafted round a fresh draft's proposals, and both cursors must be truthful.

`--examples` is per family; random seeds each run (`--fixed`: the CI test's). `--sabotage`
restores checkpoints by length alone, as before issue 12: the walk should then fail.

Nothing timed is walked by default: `--gamma auto` at fixed lengths and trees, and no learned
early stop (it reads the draft's speed); `--timed` walks them timed. A walk can still draw
differently when hypothesis runs the same choices again: a Ctrl-C at the n-th function call
lands elsewhere once caches are warm, and timed choices change a call's rounds, and with
them what the walk draws next. Hypothesis then raises FlakyStrategyDefinition and stops; where
no call had failed, the family is walked again from fresh seeds until it has run
`--examples` sequences (the restarts are counted). A failed call is printed as it failed,
before hypothesis replays it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import Phase, settings  # noqa: E402
from hypothesis.errors import FlakyStrategyDefinition  # noqa: E402

import mlxspec  # noqa: E402
from mlxspec.decoding.cursor import Cursor  # noqa: E402
from mlxspec.models import synthetic  # noqa: E402
from tests.conftest import ModelFactory, stdlib_texts  # noqa: E402
from tests.exactness.test_sessions import (  # noqa: E402
    FAMILIES,
    HEAD_FAMILIES,
    MODES,
    WALKS,
    by_length_alone,
    load_family,
    untimed,
    walk,
)

MAX_RESTARTS = 50  # fresh walks for a family whose walks keep drawing differently on a replay


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500, help="random sequences per cache family")
    parser.add_argument("--steps", type=int, default=8, help="calls per sequence, at most")
    parser.add_argument(
        "--family", action="append", choices=list(FAMILIES) + list(HEAD_FAMILIES), help="only these (repeatable)"
    )
    parser.add_argument("--fixed", action="store_true", help="the CI test's seeds instead of random ones")
    parser.add_argument("--sabotage", action="store_true", help="restore checkpoints by length alone")
    parser.add_argument("--timed", action="store_true", help="walk auto and the early stop with their timed choices")
    parser.add_argument("--models", type=Path, help="build the tiny models here (default: a temporary folder)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        root = args.models or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        tokenizer = root / "tokenizer"
        if not (tokenizer / "tokenizer.json").exists():
            synthetic.train_tokenizer(stdlib_texts(), 512, tokenizer)
        factory = ModelFactory(root, tokenizer)

        def load_pair(arch, bits=None):
            return mlxspec.load_pair(*map(str, factory.pair(arch, bits)))

        if args.sabotage:
            Cursor._checkpoint_within = by_length_alone
        walks = settings(
            WALKS,
            max_examples=args.examples,
            stateful_step_count=args.steps,
            derandomize=args.fixed,
            phases=[Phase.generate] if args.sabotage else WALKS.phases,
        )
        totals, failures = Counter(), []
        for name in args.family or [*FAMILIES, *HEAD_FAMILIES]:
            family = load_family(load_pair, name, factory=factory)
            modes = dict(MODES) if args.timed else untimed(MODES)
            t0, restarts = time.perf_counter(), 0
            try:
                with patch.dict(MODES, modes, clear=True):  # the walk reads MODES as it draws
                    while True:
                        try:
                            left = args.examples - family.tally["sequences"]
                            walk(family, settings(walks, max_examples=max(left, 1)))
                            break
                        except FlakyStrategyDefinition:
                            if family.first_failure is not None or args.fixed or restarts == MAX_RESTARTS:
                                raise
                            restarts += 1
                            if family.tally["sequences"] >= args.examples:
                                break
                verdict = "ok" if not restarts else f"ok ({restarts} restarts)"
            except FlakyStrategyDefinition as e:
                verdict = "inconclusive" if family.first_failure is None else "FAILED"
                if family.first_failure is not None:
                    failures.append((name, e, family.first_failure))
            except Exception as e:  # noqa: BLE001 - a failure is the report
                verdict = f"FAILED ({type(e).__name__})"
                failures.append((name, e, family.first_failure))
            tally = family.tally
            totals.update(tally)
            others = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()) if k not in ("sequences", "calls"))
            print(
                f"{name:24} {verdict:20} {tally['sequences']:5} sequences {tally['calls']:6} calls "
                f"{time.perf_counter() - t0:7.1f} s  ({others})",
                flush=True,
            )
        print(f"{'all':24} {len(failures)} failed        {totals['sequences']:5} sequences {totals['calls']:6} calls")
        for name, error, first in failures:  # hypothesis adds the failing steps as notes
            print(f"\n--- {name} ---\n{error}\n" + "\n".join(getattr(error, "__notes__", [])))
            if first:
                print(f"\nthe first call that failed, before hypothesis replayed it:\n{first}")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
