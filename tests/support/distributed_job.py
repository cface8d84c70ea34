"""Run by tests/exactness/test_distributed.py under `mlx.launch -n 2`: every rank loads the pair a JSON
spec names with the target split across the ranks; rank 0 runs the spec's jobs and writes
what each emitted (the other ranks follow inside load_pair and exit with it).

    python tests/support/distributed_job.py SPEC.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout, on every rank

import mlxspec  # noqa: E402
from mlxspec.decoding.sampling import SamplingParams  # noqa: E402
from mlxspec.distributed import split as distributed  # noqa: E402


def generate(pair, job: dict) -> dict:
    if job.get("ngram_only"):
        pair = mlxspec.Pair(pair.target, None, ngram=True)
    with distributed.counting() as built:  # every collective rank 0 builds, prefill included
        result = mlxspec.generate(pair, job["prompt"], **job["options"])
    stats = result.stats
    return {
        "tokens": result.tokens,
        "rounds": stats.rounds,
        "transfers": stats.transfers,
        "built": built.total(),
        "acceptance_rate": stats.acceptance_rate,
        "per_forward": pair.target.shard.transfers_per_forward,
    }


def session(pair, job: dict) -> dict:
    """Calls through one session: each brings both caches back to what it shares with the
    last (trims, mirrored on every rank) and reads the rest."""
    kept = mlxspec.Session(pair)
    return {"calls": [mlxspec.generate(pair, p, session=kept, **job["options"]).tokens for p in job["prompts"]]}


def joint(pair, job: dict) -> dict:
    from tests.exactness.test_distribution import sample_joint

    params = SamplingParams(**job["sampling"])
    counts = sample_joint(pair, params, job["gamma"], job["runs"], job["seed"])
    return {"counts": [[list(outcome), n] for outcome, n in counts.items()]}


JOBS = {"generate": generate, "session": session, "joint": joint}


def sabotage_followers() -> None:
    """A negative control: the other ranks never roll their caches back (they keep every
    rejected draft), as a follower that missed rank 0's rewinds would."""
    from mlxspec.decoding.caches import ModelCache
    from mlxspec.distributed import ranks

    if not ranks.is_main():
        ModelCache.trim_to = lambda self, length: True


def main(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    if spec.get("sabotage"):
        sabotage_followers()
    pair = mlxspec.load_pair(spec["target"], spec.get("draft"), shard=spec["shard"])
    results = {job["name"]: JOBS[job["kind"]](pair, job) for job in spec["jobs"]}
    Path(spec["out"]).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
