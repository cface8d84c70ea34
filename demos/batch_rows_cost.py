"""What a target forward costs by rows (generations) and ids per row, on a 128-id context: the
curve a batch's verify rides. Milliseconds per forward, medians of three passes.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/batch_rows_cost.py --pair smollm2 --ids 1,3,5 --rows 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from mlxspec.models.pairs import load_pair  # noqa: E402

CONTEXT = 128


def forward_seconds(model, *, rows: int, ids: int, repeats: int = 8) -> float:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.random.randint(0, 1000, (rows, CONTEXT)), cache=cache)[:, -1])
    step = mx.random.randint(0, 1000, (rows, ids))
    for timed in (False, True):  # a pass to warm up, then the timed one
        started = time.perf_counter()
        for _ in range(repeats if timed else 2):
            mx.eval(model(step, cache=cache))
            for layer in cache:
                layer.trim(ids)  # back to the context: every forward reads the same
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--ids", default="1,3,5", help="ids per row, comma-separated")
    parser.add_argument("--rows", type=int, default=9, help="rows 1 to this")
    args = parser.parse_args()
    model = load_pair(pair=args.pair, no_draft=True).target.model
    widths = [int(i) for i in args.ids.split(",")]
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(3):  # passes interleaved, so a slow spell of the machine spreads over all
        for ids in widths:
            for rows in range(1, args.rows + 1):
                times.setdefault((ids, rows), []).append(forward_seconds(model, rows=rows, ids=ids))
    for ids in widths:
        cells = "  ".join(
            f"{rows}×{ids} {statistics.median(times[ids, rows]) * 1e3:.0f}" for rows in range(1, args.rows + 1)
        )
        print(f"ids per row {ids}: {cells}  (ms)")


if __name__ == "__main__":
    main()
