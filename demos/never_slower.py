"""The bars of adaptive drafting, measured on this machine (issue: "never slower").

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/never_slower.py [--max-tokens 256] [--repeats 5] [--bars 1,2,3,4,5]

1. A useless draft (random weights, sharing the bundled tokenizer): `--gamma auto` against
   standard decoding; it should fall back to plain decoding (bar: >= 0.95x).
2. The bundled pair: `auto` against the best fixed γ of the sweep, per prompt category,
   without being told which is best (bar: >= 0.97x).
3. Prompts whose answers repeat their input (edits, copies): `--draft ngram` against
   standard decoding (bar: faster).
4. A draft that costs more than its target (the bundled pair used the other way round: the
   5-layer model drafts for the 2-layer one, accepted often): `auto` against standard
   decoding (bar: >= 0.95x), where a fixed γ loses badly.
5. A round that costs many plain steps (what MLX's CUDA backend does with multi-token calls,
   and its CPU backend with quantized weights, whose matrix products grow with the tokens
   read at once): the smollm2 preset with its target quantized to 4 bits here, its EAGLE-3
   head drafting: `auto` against standard decoding (bar: >= 0.95x).

Everything runs through `mlxspec.measure.bench` (medians over repeats taken in turn across settings,
prompt processing and warm-up excluded), at temperature 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.measure.bench import BenchConfig, run_bench  # noqa: E402
from mlxspec.measure.prompts import BenchPrompt, suite  # noqa: E402
from mlxspec.models import synthetic  # noqa: E402
from mlxspec.models.pairs import BUNDLED_DRAFT, BUNDLED_TARGET  # noqa: E402

_SNIPPETS = [
    'def clamp(value, low, high):\n    """Limit value to the range [low, high]."""\n    if value < low:\n      '
    "  return low\n    if value > high:\n        return high\n    return value\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        "
    "self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n",
    "def read_lines(path):\n    with open(path) as f:\n        for line in f:\n            line = "
    "line.strip()\n            if line and not line.startswith('#'):\n                yield line\n",
    "import os\nimport sys\n\n\ndef main(argv):\n    for name in argv[1:]:\n        if os.path.exists(name):\n "
    "           print(name, os.path.getsize(name))\n    return 0\n",
    "def count_words(text):\n    counts = {}\n    for word in text.split():\n        word = word.lower()\n     "
    "   counts[word] = counts.get(word, 0) + 1\n    return counts\n",
]


def repeat_suite() -> list[BenchPrompt]:
    """Each prompt shows a block of code, then starts it again: the answer copies the input."""
    prompts = []
    for i, code in enumerate(_SNIPPETS):
        first = code.splitlines(keepends=True)[0]
        prompts.append(BenchPrompt("edit", f"{code}\n\n# A copy of the code above:\n{first}", f"copy{i}"))
    return prompts


def useless_draft(folder: Path) -> Path:
    """A draft as cheap as the bundled one but knowing nothing: random weights."""
    config = json.loads((BUNDLED_DRAFT / "config.json").read_text())
    config.pop("quantization", None)
    synthetic.build_model(
        config,
        folder,
        tokenizer_dir=BUNDLED_DRAFT,
        vocab_size=config["vocab_size"],
        seed=7,
        eos_token_ids=config.get("eos_token_id"),
    )
    return folder


def bench(pair, prompts, gammas, args):
    config = BenchConfig(
        prompts=prompts,
        gammas=gammas,
        temps=[0.0],
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        peers=False,
        raw=True,
    )
    return run_bench(pair, config)


def useless_draft_bar(args, results: dict) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        pair = mlxspec.load_pair(str(BUNDLED_TARGET), str(useless_draft(Path(scratch) / "useless")))
        report = bench(pair, suite(quick=True), ["auto", 2, 4], args)
    auto = next(s for s in report.settings if s.category == "all" and s.gamma == "auto")
    results["useless draft: auto / standard"] = auto.speedup
    print(
        f"1. useless draft: auto {auto.speculative_tps:.1f} tok/s vs standard {auto.standard_tps:.1f} tok/s "
        f"= {auto.speedup:.3f}x (bar 0.95); α {auto.stats.acceptance_rate}, "
        f"plain steps {auto.stats.plain_rounds}, mean γ {auto.stats.mean_gamma:.2f}"
    )
    for s in (s for s in report.settings if s.category == "all" and s.gamma != "auto"):
        print(f"   fixed γ {s.gamma}: {s.speedup:.3f}x")


def bundled_pair_bar(args, results: dict) -> None:
    pair = mlxspec.load_pair()
    report = bench(pair, suite(quick=False), ["auto", 1, 2, 3, 4, 6], args)
    print("2. bundled pair, auto against the best fixed γ per category (bar 0.97):")
    for category in sorted({s.category for s in report.settings}):
        rows = [s for s in report.settings if s.category == category]
        auto = next(s for s in rows if s.gamma == "auto")
        best = max((s for s in rows if s.gamma != "auto"), key=lambda s: s.speculative_tps)
        ratio = auto.speculative_tps / best.speculative_tps
        results[f"bundled {category}: auto / best fixed"] = ratio
        print(
            f"   {category:17s} auto {auto.speculative_tps:7.1f} tok/s ({auto.speedup:.2f}x, mean γ "
            f"{auto.stats.mean_gamma:.1f})"
            f"  best fixed γ {best.gamma}: {best.speculative_tps:7.1f} tok/s ({best.speedup:.2f}x)  ratio {ratio:.3f}"
        )


def ngram_bar(args, results: dict) -> None:
    pair = mlxspec.load_pair(draft="ngram")
    report = bench(pair, repeat_suite(), [2, 4, 6, "auto"], args)
    print("3. prompts that repeat their input, --draft ngram against standard decoding (bar: > 1):")
    for s in (s for s in report.settings if s.category == "all"):
        results[f"ngram γ {s.gamma} / standard"] = s.speedup
        print(
            f"   γ {s.gamma}: {s.speculative_tps:.1f} vs {s.standard_tps:.1f} tok/s = {s.speedup:.3f}x, "
            f"α {s.stats.acceptance_rate if s.stats.acceptance_rate is None else round(s.stats.acceptance_rate, 3)}, "
            f"n-gram rounds {s.stats.ngram_rounds}"
        )


def dear_draft_bar(args, results: dict) -> None:
    """Bar 4: auto against standard decoding with a draft dearer than its target."""
    pair = mlxspec.load_pair(str(BUNDLED_DRAFT), str(BUNDLED_TARGET))
    report = bench(pair, suite(quick=True), ["auto", 1, 3], args)
    auto, generations = _auto_against_standard(report, results, "dear draft")
    print(
        f"4. draft dearer than its target: auto {auto.speculative_tps:.1f} tok/s vs standard "
        f"{auto.standard_tps:.1f} tok/s = {auto.speedup:.3f}x (bar 0.95); {generations} generations of "
        f"{args.max_tokens}: {auto.stats.model_rounds / generations:.1f} drafting rounds and "
        f"{auto.stats.plain_rounds / generations:.0f} plain steps each; each repeat "
        f"{', '.join(f'{x:.3f}' for x in auto.repeat_speedups)}x"
    )
    _fixed_gammas(report, results, "dear draft")


def costly_round_bar(args, results: dict) -> None:
    """Bar 5: auto against standard decoding where a verify of k ids costs about k steps."""
    import mlx.nn as nn

    pair = mlxspec.load_pair(pair="smollm2", ngram=False)
    nn.quantize(pair.target.model, group_size=64, bits=4)  # the head's own weights stay float
    report = bench(pair, suite(quick=True), ["auto", 3], args)
    auto, generations = _auto_against_standard(report, results, "costly round")
    curve = " ".join(f"{v:.2f}" for v in report.costs.verify_curve[:5])
    print(
        f"5. a round that costs many plain steps (4-bit target, v(1..5) = {curve}): auto "
        f"{auto.speculative_tps:.1f} tok/s vs standard {auto.standard_tps:.1f} tok/s = {auto.speedup:.3f}x "
        f"(bar 0.95); {auto.stats.model_rounds / generations:.1f} drafting rounds of {args.max_tokens} ids "
        f"each; each repeat {', '.join(f'{x:.3f}' for x in auto.repeat_speedups)}x"
    )
    _fixed_gammas(report, results, "costly round")


def _auto_against_standard(report, results: dict, name: str):
    """The auto setting over all prompts, its speedup kept in `results`, and its generations."""
    auto = next(s for s in report.settings if s.category == "all" and s.gamma == "auto")
    results[f"{name}: auto / standard"] = auto.speedup
    return auto, sum(len(run.repeats) for run in auto.speculative)


def _fixed_gammas(report, results: dict, name: str) -> None:
    for s in (s for s in report.settings if s.category == "all" and s.gamma != "auto"):
        results[f"{name}: γ {s.gamma} / standard"] = s.speedup
        print(f"   fixed γ {s.gamma}: {s.speedup:.3f}x, α {s.stats.acceptance_rate:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bars", default="1,2,3,4,5", help="which bars to run, e.g. 4 or 1,4")
    args = parser.parse_args()
    bars = {int(b) for b in args.bars.split(",")}
    results = {}
    if 1 in bars:
        useless_draft_bar(args, results)
    if 2 in bars:
        bundled_pair_bar(args, results)
    if 3 in bars:
        ngram_bar(args, results)
    if 4 in bars:
        dear_draft_bar(args, results)
    if 5 in bars:
        costly_round_bar(args, results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
