"""What drafting from history would give on the agents replay, before the engine has it:
greedy decoding simulated over recorded answers, one proposer against another.

    python demos/agents_bench.py --pair smollm2 --quick --only standard --json answers.json
    python demos/history_replay.py answers.json [--width 8]

At temperature 0 the target's answer is known (the recorded standard decoding). A round's
proposal is accepted as far as it agrees with that answer, and the target adds one id (the
bonus, or the id it put where the proposal went wrong), so tokens per round (τ) is exact for
each proposer; what a round costs (the ids verified, the drafting) is the engine's to weigh,
so the ids verified per round are shown beside τ. The requests go in the replay's order, one
session: history grows as it would in `mlxspec serve`.

Proposers, each proposing at most --width ids a round:
- lookup: today's prompt lookup (lookup.PromptLookup, `--draft ngram`: the latest occurrence
  of the longest suffix of 2 to 4 ids in this request's prompt and answer);
- local: the history drafter with no history (its own prompt and answer, every occurrence,
  SuffixDecoding's budget and probability cut), a chain;
- history: the same beside the session's history, a chain, and as a tree of --width nodes.
Answers are re-tokenized from their text (the ids decoded may differ in rare places).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demos.agents_bench import WORKLOADS, Sizes, reply_of  # noqa: E402
from mlxspec.decoding.tree import TokenTree  # noqa: E402
from mlxspec.drafters.history import HistoryDrafter, HistoryStore  # noqa: E402
from mlxspec.drafters.lookup import PromptLookup  # noqa: E402


@dataclass
class Walked:
    tokens: int = 0
    rounds: int = 0
    verified: int = 0

    def line(self, name: str) -> str:
        tau = self.tokens / self.rounds if self.rounds else 0.0
        per_round = self.verified / self.rounds if self.rounds else 0.0
        return f"  {name:<16} τ {tau:5.2f}   ids verified per round {per_round:5.2f}   rounds {self.rounds}"


def accepted(proposal, answer: list[int]) -> int:
    """How many proposed ids the greedy target takes: along a chain, or down a tree."""
    if proposal is None or not len(proposal):
        return 0
    tree = proposal if isinstance(proposal, TokenTree) else TokenTree.chain(proposal)
    wanted = [answer[depth] if depth < len(answer) else -1 for depth in tree.depths]
    path, _ = tree.greedy_path(wanted)
    return len(path)


def walk(propose, hear, answer: list[int], width: int, tally: Walked) -> None:
    at = 0
    while at < len(answer):
        proposal = propose(width)
        step = answer[at : at + accepted(proposal, answer[at:]) + 1]
        hear(step)
        at += len(step)
        tally.rounds += 1
        tally.tokens += len(step)
        tally.verified += len(proposal) if proposal else 0


def requests(workload: str, sizes: Sizes, mode: str, texts: list[str]):
    """The replay's requests with the recorded answers: (messages, answer text, max_tokens)."""
    script = WORKLOADS[workload](sizes, mode)
    request = next(script)
    for text in texts:
        yield request["messages"], text, request["max_tokens"]
        try:
            request = script.send(reply_of(text))
        except StopIteration:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("answers", type=Path, help="the --json of an agents_bench run")
    parser.add_argument("--width", type=int, default=8, help="most ids proposed a round")
    parser.add_argument("--config", default="standard", help="whose answers (default standard)")
    args = parser.parse_args()
    recorded = json.loads(args.answers.read_text())
    run, figures = recorded["run"], recorded["figures"]
    sizes, mode = Sizes(**run["sizes"]), run["mode"]

    import mlxspec
    from mlxspec.generation import encode_messages

    pair = mlxspec.load_pair(pair=run["pair"], no_draft=True)
    tokenizer, eos = pair.tokenizer, sorted(pair.tokenizer.eos_token_ids)[0]
    store = HistoryStore(limit_tokens=1 << 20)
    width = args.width
    for workload in WORKLOADS:
        key = f"{workload}/{args.config}"
        if key not in figures:
            continue
        tallies = {name: Walked() for name in ("lookup", "local", "history chain", "history tree")}
        for messages, text, max_tokens in requests(workload, sizes, mode, figures[key]["texts"]):
            prompt = encode_messages(tokenizer, messages)
            answer = list(tokenizer.encode(text, add_special_tokens=False))
            answer = answer[:max_tokens] if len(answer) >= max_tokens else [*answer, eos]
            lookup = PromptLookup(prompt)
            walk(lookup.chain, lookup.hear, answer, width, tallies["lookup"])
            local = HistoryDrafter(None).begin(prompt)
            walk(local.chain, local.hear, answer, width, tallies["local"])
            for name, trie in (("history chain", False), ("history tree", True)):
                with HistoryDrafter(store.index(name.replace(" ", "-"))).begin(prompt) as drafter:
                    walk(drafter.trie if trie else drafter.chain, drafter.hear, answer, width, tallies[name])
        print(f"{workload} ({len(figures[key]['texts'])} requests, at most {width} ids proposed a round):")
        for name, tally in tallies.items():
            print(tally.line(name))


if __name__ == "__main__":
    main()
