"""How fast and how big the history index is (mlxspec/drafters/history/): a history of
about a million tokens in documents of one kind (a shared skeleton with varying fields and a
free tail, as agents' answers are), then queries from places in those documents (matches),
random contexts (no match), and the skeleton itself (a suffix with hundreds of occurrences).

    OPENBLAS_NUM_THREADS=1 python demos/history_index_speed.py [--tokens 1000000]

Bytes per token: the index's arrays (`nbytes`) and what tracemalloc sees while building it.
Query times: median and 90th percentile of `propose(context, max_nodes=16)`; building: the
documents added one at a time, as a server adds each request's; loading: one `load` of the
saved file. No MLX.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxspec.drafters.history import HistoryIndex, footprint  # noqa: E402

VOCAB = 49_152  # SmolLM2's


def documents(tokens: int, rng) -> tuple[list[list[int]], np.ndarray]:
    skeleton = rng.integers(0, VOCAB, 60)
    made, total = [], 0
    while total < tokens:
        document = []
        for k in range(rng.integers(3, 12)):
            document += skeleton[k * 5 : (k + 1) * 5].tolist() + (rng.zipf(1.3, rng.integers(1, 6)) % VOCAB).tolist()
        document += (rng.zipf(1.2, rng.integers(50, 400)) % VOCAB).tolist()
        made.append(document)
        total += len(document)
    return made, skeleton


def timed(index: HistoryIndex, contexts) -> tuple[float, float, float]:
    times, nodes = [], []
    for context in contexts:
        start = time.perf_counter()
        found = index.propose(context, max_nodes=16)
        times.append((time.perf_counter() - start) * 1e6)
        nodes.append(len(found.tree) if found else 0)
    return statistics.median(times), float(np.percentile(times, 90)), statistics.mean(nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    made, skeleton = documents(args.tokens, rng)
    limit = 1 << (args.tokens - 1).bit_length()

    tracemalloc.start()
    start = time.perf_counter()
    index = HistoryIndex(limit_tokens=limit)
    for document in made:
        index.add(document)
    built = time.perf_counter() - start
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(
        f"{index.size:,} slots in {index.documents:,} documents (limit {limit:,}): built in {built:.1f} s "
        f"({built / len(made) * 1e3:.2f} ms a document); arrays {index.nbytes / limit:.1f} B/token at the limit "
        f"(footprint {footprint(limit) / limit:.1f}), tracemalloc {traced / index.size:.1f} B/token held"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "h.npz"
        index.save(path)
        start = time.perf_counter()
        HistoryIndex(limit_tokens=limit).load(path)
        print(f"saved: {path.stat().st_size / 1e6:.1f} MB; loaded again in {time.perf_counter() - start:.2f} s")

    matches = []
    for _ in range(args.queries):
        document = made[rng.integers(len(made))]
        cut = int(rng.integers(5, len(document)))
        matches.append(document[max(0, cut - 32) : cut])
    misses = [rng.integers(0, VOCAB, 32).tolist() for _ in range(args.queries // 2)]
    common = [skeleton[: 5 * k].tolist()[-32:] for k in range(1, 12)] * 20
    for name, contexts in (("match", matches), ("no match", misses), ("skeleton", common)):
        median, p90, nodes = timed(index, contexts)
        print(f"query, {name:<9}: median {median:6.0f} us, p90 {p90:6.0f} us, {nodes:4.1f} nodes proposed on average")


if __name__ == "__main__":
    main()
