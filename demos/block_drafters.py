"""A preset's head beside a DFlash block drafter or another EAGLE-3 head, on one target in one
run.

    python demos/block_drafters.py --pair gemma3-270m [--dflash DIR] [--head DIR] [--temp 0,0.7]
        [--max-tokens 64] [--quick] [--prompts FILE.jsonl] [--no-lookup] [--repeats N] [--json]

For every prompt and temperature, each method runs in turn on the same prompt and seed (so
a slow spell of the machine is shared out among them): standard decoding, the preset's head
as a chain and as a tree, and the same for each drafter named: --head, another EAGLE-3 head
("new head": a retrained one beside the shipped one), --dflash, a DFlash drafter (its chain,
and its DDTree tree); `--tree auto` for every tree and `--gamma auto` throughout; then all of
them again beside prompt lookup (--no-lookup: not). Prompts follow the preset (raw text for
a base model's preset).

Prints, per temperature and method: tokens a second over the decode time (every repeat's
rounds together), the speedup over standard decoding in the same run (the median over
`--repeats` of each repeat's own), τ (tokens a round), α per depth (of the drafts tested at
that depth, the share accepted), nodes a round (a chain's drafts, a tree's nodes), and the
drafter's cost a round (seconds of drafting over a standard step's, from the rounds the
engine timed apart). --json prints every figure as one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.decoding.events import Done, Round  # noqa: E402
from mlxspec.generation import stream  # noqa: E402
from mlxspec.measure.prompts import load_jsonl, suite  # noqa: E402
from mlxspec.stats import Stats  # noqa: E402

DEPTHS = 6  # α per depth shown to this depth


@dataclass
class Tally:
    """One method's rounds over every prompt at one temperature."""

    stats: Stats = field(default_factory=Stats)
    nodes: int = 0  # drafts verified: a chain's ids, a tree's nodes
    drafting_rounds: int = 0  # rounds that verified drafts (not plain target steps)
    drafter_seconds: float = 0.0  # drafting by the model drafter, in the rounds timed apart
    drafter_rounds: int = 0

    def add(self, event: Round) -> None:
        if event.source != "target":
            self.drafting_rounds += 1
            self.nodes += event.nodes or len(event.drafted)
        if event.source == "model" and event.draft_seconds is not None:
            self.drafter_seconds += event.draft_seconds
            self.drafter_rounds += 1

    @classmethod
    def merged(cls, tallies: list[Tally]) -> Tally:
        """Every repeat's rounds together."""
        total = cls()
        for tally in tallies:
            total.stats = total.stats.merge(tally.stats)
            total.nodes += tally.nodes
            total.drafting_rounds += tally.drafting_rounds
            total.drafter_seconds += tally.drafter_seconds
            total.drafter_rounds += tally.drafter_rounds
        return total

    def figures(self, standard_step: float | None) -> dict:
        s = self.stats
        drafter = self.drafter_seconds / self.drafter_rounds if self.drafter_rounds else None
        return {
            "tokens_per_second": s.tokens_per_second,
            "tokens_per_round": s.tokens_per_round,
            "alpha": s.acceptance_rate,
            "alpha_per_depth": s.per_position_acceptance[:DEPTHS],
            "nodes_per_round": self.nodes / self.drafting_rounds if self.drafting_rounds else None,
            "plain_share": s.plain_share,
            "drafter_seconds_per_round": drafter,
            "drafter_cost": drafter / standard_step if drafter and standard_step else None,
            "tokens": s.tokens,
            "rounds": s.rounds,
        }


def methods(pair: str, head: str | None, dflash: str | None, *, lookup: bool = True) -> dict:
    """name -> (pair, options): each drafter loaded beside a target of its own (each taps
    the layers it reads)."""
    own = mlxspec.load_pair(pair=pair, ngram=False)
    drafters = [("head" if own.draft.kind == "eagle3" else "draft", own, "tree")]  # a preset's draft may be a model
    if head:
        drafters.append(("new head", mlxspec.load_pair(pair=pair, draft=head), "tree"))
    if dflash:
        drafters.append(("DFlash", mlxspec.load_pair(pair=pair, draft=dflash), "DDTree"))
    chain, tree = {"gamma": "auto", "tree": 0}, {"gamma": "auto", "tree": "auto"}
    table = {"standard": (own, {"gamma": 0, "ngram": False})}
    for beside in (False, True) if lookup else (False,):
        said = " + lookup" if beside else ""
        for name, loaded, trees in drafters:
            table[f"{name} chain{said}"] = (loaded, chain | {"ngram": beside})
            table[f"{name} {trees}{said}"] = (loaded, tree | {"ngram": beside})
    return table


def run(pair, prompt: str, *, tally: Tally, **options) -> None:
    for event in stream(pair, prompt, **options):
        if isinstance(event, Round):
            tally.add(event)
        elif isinstance(event, Done):
            tally.stats = tally.stats.merge(event.stats)


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="gemma3-270m", help="the preset whose target both drafters fit")
    parser.add_argument("--dflash", help="a DFlash drafter (a folder in the published layout)")
    parser.add_argument("--head", help="another EAGLE-3 head, beside the preset's own")
    parser.add_argument("--no-lookup", action="store_true", help="leave out the rows beside prompt lookup")
    parser.add_argument("--temp", default="0,0.7")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="one prompt per category")
    parser.add_argument("--prompts", help='a JSON-lines file of {"prompt": ...} (default: the bench suite)')
    parser.add_argument("--repeats", type=int, default=1, help="runs of every prompt; speedups are their medians")
    parser.add_argument("--json", action="store_true", help="every figure as one JSON object on stdout")
    args = parser.parse_args()
    temps = [float(t) for t in args.temp.split(",")]

    table = methods(args.pair, args.head, args.dflash, lookup=not args.no_lookup)
    prompts = load_jsonl(args.prompts) if args.prompts else suite(quick=args.quick)
    target = table["standard"][0].target.label
    heading = f"{target}; {len(prompts)} prompts; {args.max_tokens} tokens; gamma auto, trees auto"
    print(heading, file=sys.stderr if args.json else sys.stdout)

    for pair, options in table.values():  # a warm-up of each, not counted
        run(pair, prompts[0].prompt, tally=Tally(), max_tokens=8, seed=0, **options)

    report = {"target": target, "dflash": args.dflash, "head": args.head, "prompts": len(prompts), "temps": {}}
    for temp in temps:
        repeats = []  # per repeat: name -> its Tally
        for repeat in range(args.repeats):
            tallies = {name: Tally() for name in table}
            for number, prompt in enumerate(prompts):
                for name, (pair, options) in table.items():
                    run(
                        pair,
                        prompt.prompt,
                        tally=tallies[name],
                        max_tokens=args.max_tokens,
                        temp=temp,
                        seed=number + repeat * len(prompts),
                        **options,
                    )
                print(
                    f"  T {temp}, repeat {repeat + 1}: {number + 1}/{len(prompts)} prompts", file=sys.stderr, flush=True
                )
            repeats.append(tallies)
        standard = Tally.merged([r["standard"] for r in repeats]).stats
        step = 1 / standard.tokens_per_second if standard.tokens_per_second else None
        rows = {name: Tally.merged([r[name] for r in repeats]).figures(step) for name in table}
        for name, row in rows.items():  # each repeat's speed over its own standard decoding's
            speeds = [r[name].stats.tokens_per_second for r in repeats]
            bases = [r["standard"].stats.tokens_per_second for r in repeats]
            row["speedups"] = [a / b if a and b else None for a, b in zip(speeds, bases)]
            known = [x for x in row["speedups"] if x is not None]
            row["speedup"] = statistics.median(known) if known else None
        report["temps"][str(temp)] = rows
        if args.json:
            continue
        print(f"\nT {temp}")
        print(f"  {'method':<22} {'tok/s':>6} {'speedup':>8} {'τ':>5} {'nodes':>6} {'c':>6} {'plain':>6}   α per depth")
        for name, row in rows.items():
            depths = " ".join(fmt(a) for a in row["alpha_per_depth"])
            print(
                f"  {name:<22} {fmt(row['tokens_per_second'], '.1f'):>6} {fmt(row['speedup']):>7}x"
                f" {fmt(row['tokens_per_round']):>5} {fmt(row['nodes_per_round'], '.1f'):>6}"
                f" {fmt(row['drafter_cost'], '.3f'):>6} {row['plain_share']:>6.0%}   {depths}"
            )
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
