"""Speculative decoding with the target split across ranks: one process against two ranks
(mlx.launch, ring backend on 127.0.0.1), standard against speculative decoding, with the
cross-rank transfers per emitted token, the figure that matters on a real network (each
transfer waits at least one network round trip).

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/distributed_bench.py [--max-tokens 96] [--repeats 3] [--gammas 2,4,auto]

Two pairs by default: the bundled tiny pair (qwen3, which mlx-lm splits tensor-parallel
only: 2 all_sums per layer) and a random qwen2 pair whose draft is a noisy copy of its
target (split by layers, pipeline). `--target/--draft/--shard` measure one pair of yours.

The two-rank runs start this script again under mlx.launch (`--job`); rank 0 counts every
collective it builds while decoding (prompt processing excluded) by wrapping
mx.distributed's functions (distributed.counting), so the transfers are counted, not
derived; the engine's own figure (Stats.transfers, forwards x transfers per forward) is
printed beside it. "mlx-lm's forward" is what one forward of the same sharded model costs
as mlx_lm runs it (every rank gets the output: pipeline adds an all_gather), for reference.

Timings: each method on the same prompts and seeds, a warm-up generation first, medians of
the repeats taken in turn; on a shared 2-core CPU, two ranks on one machine compete for it,
so tokens/s across 1 and 2 ranks are not what two Macs would see; transfers are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402
from mlxspec.decoding.events import Prefill  # noqa: E402
from mlxspec.distributed.ranks import free_ring_ports  # noqa: E402
from mlxspec.measure.prompts import suite  # noqa: E402
from mlxspec.models.pairs import BUNDLED_DRAFT, BUNDLED_TARGET  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def methods(gammas: list) -> list:
    return [0, *gammas]


def measure(pair, prompts: list[list[int]], gammas: list, args, counting=None) -> dict:
    """Per method: tokens/s (median over repeats of total tokens / total decode seconds over
    the prompts), alpha, tau, and the transfers rank 0 built while decoding."""
    for gamma in methods(gammas):  # warm-up: compiles and first-call costs, not counted
        mlxspec.generate(pair, prompts[0], max_tokens=8, gamma=gamma, seed=0)
    speeds = {g: [] for g in methods(gammas)}
    totals = {g: mlxspec.Stats() for g in methods(gammas)}
    built = {g: 0 for g in methods(gammas)}
    for repeat in range(args.repeats):
        for gamma in methods(gammas):
            tokens = seconds = 0
            for ids in prompts:
                done, during = _run(pair, ids, gamma, args, seed=repeat, counting=counting)
                stats = done.stats
                tokens, seconds = tokens + stats.tokens, seconds + stats.decode_seconds
                totals[gamma] = totals[gamma].merge(stats)
                built[gamma] += during
            speeds[gamma].append(tokens / seconds if seconds else 0.0)
    return {
        str(g): {
            "tokens_per_second": statistics.median(speeds[g]),
            "acceptance_rate": totals[g].acceptance_rate,
            "tokens_per_round": totals[g].tokens_per_round,
            "tokens": totals[g].tokens,
            "rounds": totals[g].rounds,
            "engine_transfers": totals[g].transfers,
            "counted_transfers": built[g],
        }
        for g in methods(gammas)
    }


def _run(pair, ids, gamma, args, *, seed: int, counting):
    """One generation; the collectives built after the prompt was read (0 in one process)."""
    if counting is None:
        events = list(mlxspec.stream(pair, ids, max_tokens=args.max_tokens, gamma=gamma, temp=args.temp, seed=seed))
        return events[-1], 0
    with counting() as count:
        at_prefill = 0
        for event in mlxspec.stream(pair, ids, max_tokens=args.max_tokens, gamma=gamma, temp=args.temp, seed=seed):
            if isinstance(event, Prefill):
                at_prefill = count.total()
        return event, count.total() - at_prefill


def encoded_prompts(pair, args) -> list[list[int]]:
    from mlxspec.generation import encode_prompt

    return [encode_prompt(pair, p.prompt, raw=True) for p in suite(True)[: args.prompts]]


def job(args) -> None:
    """Under mlx.launch: rank 0 measures the split pair; the other rank follows."""
    import mlx.core as mx

    from mlxspec.distributed import split as distributed

    pair = mlxspec.load_pair(args.target, args.draft, shard=args.shard)  # the others never return
    gammas = _gammas(args.gammas)
    results = measure(pair, encoded_prompts(pair, args), gammas, args, counting=distributed.counting)
    leader = pair.target.model
    with distributed.counting() as as_mlx_lm:  # one forward as mlx_lm builds it (never evaluated)
        from mlx_lm.models.cache import make_prompt_cache

        leader._sharded(mx.array([[0]]), cache=make_prompt_cache(leader._sharded))
    info = pair.target.shard
    Path(args.job).write_text(
        json.dumps(
            {
                "results": results,
                "per_forward": info.transfers_per_forward,
                "mlx_lm_per_forward": as_mlx_lm.total(),
                "label": info.label,
            }
        )
    )


def _gammas(text: str) -> list:
    return [g if g == "auto" else int(g) for g in (part.strip() for part in text.split(",")) if g]


def two_ranks(target: str, draft: str, shard: str, args) -> dict:
    launcher = Path(sys.executable).with_name("mlx.launch")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "ranks.json"
        command = [
            str(launcher) if launcher.exists() else "mlx.launch",
            "--backend",
            "ring",
            "-n",
            "2",
            "--starting-port",
            str(free_ring_ports()),
            "--python",
            sys.executable,
            str(Path(__file__).resolve()),
            "--job",
            str(out),
            "--target",
            target,
            "--draft",
            draft,
            "--shard",
            shard,
            *_shared(args),
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if not out.exists():
            raise SystemExit(f"the two-rank run failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def _shared(args) -> list[str]:
    return [
        "--max-tokens",
        str(args.max_tokens),
        "--repeats",
        str(args.repeats),
        "--gammas",
        args.gammas,
        "--temp",
        str(args.temp),
        "--prompts",
        str(args.prompts),
    ]


def random_qwen2_pair(folder: Path) -> tuple[str, str]:
    """Random qwen2 target (4 layers, so 2 per rank) and a noisy copy as its draft, on the
    bundled tokenizer."""
    from mlxspec.models import synthetic

    base = dict(synthetic.ARCHITECTURES["qwen2"], hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    target, draft = folder / "qwen2-target", folder / "qwen2-draft"
    synthetic.build_model(base, target, tokenizer_dir=BUNDLED_TARGET, seed=1, head_scale=4.0)
    synthetic.build_model(base, draft, tokenizer_dir=BUNDLED_TARGET, seed=2, like=target, noise=0.05)
    return str(target), str(draft)


def table(name: str, single: dict, ranks: dict, gammas: list) -> str:
    per = ranks["per_forward"]
    lines = [
        f"{name}: split {ranks['label']}; a target forward crosses {per} times on rank 0 "
        f"(as mlx_lm runs the same sharded model: {ranks['mlx_lm_per_forward']})",
        "",
        "| ranks | method | tok/s | vs standard | α | τ | transfers/token (counted) | (engine) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, results in (("1", single), ("2", ranks["results"])):
        standard = results["0"]["tokens_per_second"]
        for gamma in methods(gammas):
            r = results[str(gamma)]
            method = "standard" if gamma == 0 else f"speculative γ {gamma}"
            alpha = f"{r['acceptance_rate']:.2f}" if r["acceptance_rate"] is not None else "–"
            tau = f"{r['tokens_per_round']:.2f}" if gamma else "1.00"
            counted = f"{r['counted_transfers'] / r['tokens']:.2f}" if label == "2" else "0"
            engine = f"{r['engine_transfers'] / r['tokens']:.2f}" if label == "2" else "0"
            speedup = r["tokens_per_second"] / standard if standard else 0
            lines.append(
                f"| {label} | {method} | {r['tokens_per_second']:.1f} | {speedup:.2f}x | {alpha} | {tau} | "
                f"{counted} | {engine} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--shard", choices=("pipeline", "tensor"))
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gammas", default="2,4,auto")
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--prompts", type=int, default=5, help="prompts of the quick suite (one per category)")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        return job(args)
    gammas = _gammas(args.gammas)
    with tempfile.TemporaryDirectory() as folder:
        if args.target:
            pairs = [(args.target, args.target, args.draft, args.shard or "pipeline")]  # name, target, draft, how
        else:
            qwen2 = random_qwen2_pair(Path(folder))
            pairs = [
                ("bundled pair (qwen3, trained)", str(BUNDLED_TARGET), str(BUNDLED_DRAFT), "tensor"),
                ("random qwen2, draft = noisy copy", *qwen2, "pipeline"),
            ]
        print(f"{args.max_tokens} tokens, {args.prompts} prompts, median of {args.repeats}, temperature {args.temp}")
        for name, target, draft, shard in pairs:
            single_pair = mlxspec.load_pair(target, draft)
            single = measure(single_pair, encoded_prompts(single_pair, args), gammas, args)
            del single_pair
            ranks = two_ranks(target, draft, shard, args)
            print()
            print(table(name, single, ranks, gammas), flush=True)


if __name__ == "__main__":
    main()
