"""The target split across two ranks by MLX's distributed layer: `mlx.launch --backend ring
-n 2` on 127.0.0.1 (the ring backend over loopback), real tiny models, no mocks.

Rank 0 drafts and decides, the other rank runs its share of each target forward
(mlxspec/distributed.py), so what must hold is what holds on one machine: at temperature 0
the ids equal single-process standard decoding's, for fixed draft lengths, auto, prompt
lookup and sessions; sampled, the joint law of the first ids is the target's. And a rank
that dies stops the other with one clear line, not a hang.

Each launch starts two Python processes on a 2-core machine (a few seconds each), so the
jobs of one pair share a launch (tests/support/distributed_job.py runs them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import mlxspec
from mlxspec.decoding.sampling import SamplingParams
from mlxspec.distributed.ranks import free_ring_ports
from mlxspec.models.synthetic import ARCHITECTURES
from tests.support.chisquare import critical_value, goodness_of_fit

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "support" / "distributed_job.py"
PROMPT = list(range(10, 22))
MAX_TOKENS = 40
LAUNCH_TIMEOUT = 240  # seconds a launch may take before the test fails (and kills it)
LOST = "the connection to another rank was lost"

# the joint law of the first 3 ids over a 6-id vocabulary (tests/exactness/test_distribution.py's
# harness): fewer runs than its 4000, as every run crosses the ranks a few times (~60 ms a
# run here, against ~7 ms in one process)
JOINT_RUNS = 1000
SIGNIFICANCE = 1e-3


def launcher() -> list[str]:
    found = Path(sys.executable).with_name("mlx.launch")
    return [str(found)] if found.exists() else [shutil.which("mlx.launch") or "mlx.launch"]


def start(*command: str) -> subprocess.Popen:
    """mlx.launch 2 ranks on 127.0.0.1 running `command` (after the python interpreter)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    args = [*launcher(), "--backend", "ring", "-n", "2", "--starting-port", str(free_ring_ports())]
    return subprocess.Popen(
        [*args, "--python", sys.executable, *command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the ranks too: killed as a group if a test times out
    )


def finish(process: subprocess.Popen, timeout: float = LAUNCH_TIMEOUT) -> tuple[str, str]:
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the launch did not end within {timeout} s; stderr:\n{err[-2000:]}")


def mlxspec_command() -> list[str]:
    return ["-m", "mlxspec"]


def run_jobs(tmp_path, target, draft, shard: str, jobs: list[dict], sabotage: bool = False) -> dict:
    out = tmp_path / "results.json"
    spec = {
        "target": str(target),
        "draft": str(draft) if draft else None,
        "shard": shard,
        "jobs": jobs,
        "out": str(out),
        "sabotage": sabotage,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    stdout, stderr = finish(start(str(JOB), str(tmp_path / "spec.json")))
    assert out.exists(), f"rank 0 wrote nothing; stderr:\n{stderr[-3000:]}"
    return json.loads(out.read_text())


def standard_ids(pair, prompt, max_tokens: int = MAX_TOKENS) -> list[int]:
    return mlxspec.generate(pair, prompt, max_tokens=max_tokens, gamma=0).tokens


MODES = {
    "standard": dict(gamma=0),
    "gamma1": dict(gamma=1),
    "gamma3": dict(gamma=3),
    "auto": dict(gamma="auto"),
    "ngram+draft": dict(gamma=3, ngram=True),
    "learned-stop": dict(gamma=3, draft_min_p="auto"),
}


def greedy_jobs(max_tokens: int = MAX_TOKENS) -> list[dict]:
    jobs = [
        {"name": name, "kind": "generate", "prompt": PROMPT, "options": dict(options, max_tokens=max_tokens)}
        for name, options in MODES.items()
    ]
    jobs.append(
        {
            "name": "ngram-only",
            "kind": "generate",
            "prompt": PROMPT,
            "options": {"gamma": 3, "max_tokens": max_tokens},
            "ngram_only": True,
        }
    )
    return jobs


def check_greedy(results: dict, reference: list[int]) -> None:
    assert len(reference) == MAX_TOKENS
    for name, result in results.items():
        if "tokens" not in result:
            continue
        assert result["tokens"] == reference, name
        # every collective rank 0 built: the prefill's forward and one per round
        assert result["built"] == result["transfers"] + result["per_forward"], name
    assert results["gamma3"]["rounds"] < MAX_TOKENS  # drafts were accepted: fewer crossings
    assert 0.05 < results["gamma3"]["acceptance_rate"] < 1.0


@pytest.mark.slow
def test_pipeline_greedy_equals_single_process_standard(tmp_path, factory, load_pair):
    """qwen2 split by layers (one per rank): every mode's ids equal one process's standard
    decoding, and a session's calls (caches trimmed back to a shared prefix on both ranks)
    equal fresh decodes."""
    target, draft = factory.pair("qwen2")
    reference = standard_ids(load_pair("qwen2"), PROMPT)
    follow_up = PROMPT + reference[:20] + [30, 31]  # shares a prefix with the first call's history
    jobs = greedy_jobs() + [
        {
            "name": "session",
            "kind": "session",
            "prompts": [PROMPT, follow_up, PROMPT[:6]],
            "options": {"gamma": 3, "max_tokens": 24},
        }
    ]
    results = run_jobs(tmp_path, target, draft, "pipeline", jobs)
    check_greedy(results, reference)
    pair = load_pair("qwen2")
    fresh = [standard_ids(pair, p, 24) for p in (PROMPT, follow_up, PROMPT[:6])]
    assert results["session"]["calls"] == fresh
    # pipeline on rank 0 of 2: the header and the hop from rank 1 (mlx-lm's final all_gather
    # is left out: only rank 0 reads the output)
    assert results["standard"]["per_forward"] == 2


@pytest.mark.slow
def test_a_follower_that_misses_rewinds_is_caught(tmp_path, factory, load_pair):
    """The negative control: when the other rank keeps the drafts rank 0 rejected, the ids
    leave standard decoding's (the test above can fail)."""
    target, draft = factory.pair("qwen2")
    job = {"name": "gamma3", "kind": "generate", "prompt": PROMPT, "options": {"gamma": 3, "max_tokens": MAX_TOKENS}}
    result = run_jobs(tmp_path, target, draft, "pipeline", [job], sabotage=True)["gamma3"]
    assert result["tokens"] != standard_ids(load_pair("qwen2"), PROMPT)


@pytest.mark.slow
def test_tensor_greedy_equals_single_process_standard(tmp_path, factory, load_pair):
    """qwen3 (no pipeline in mlx-lm) split tensor-parallel: two all_sums per layer."""
    target, draft = factory.pair("qwen3")
    results = run_jobs(tmp_path, target, draft, "tensor", greedy_jobs())
    check_greedy(results, standard_ids(load_pair("qwen3"), PROMPT))
    layers = ARCHITECTURES["qwen3"]["num_hidden_layers"]
    assert results["standard"]["per_forward"] == 1 + 2 * layers


@pytest.fixture(scope="module")
def small_pair_paths(factory):
    """Two-layer qwen2s over 6 ids (a layer per rank), sharp and different: the pair of
    tests/exactness/test_distribution.py, in an architecture mlx-lm can pipeline."""
    config = dict(ARCHITECTURES["qwen2"], hidden_size=32, intermediate_size=64)
    target = factory.model("dist2-target", arch=config, vocab_size=6, seed=11, head_scale=5.0)
    draft = factory.model("dist2-draft", arch=config, vocab_size=6, seed=12, like=target, noise=0.8)
    return target, draft


@pytest.mark.slow
def test_sampled_joint_law_is_the_targets(tmp_path, small_pair_paths):
    """Temperature 1, gamma 2 (rejections, recoveries and bonuses all occur, so both ranks'
    caches are rolled back often), the target split by layers: chi-square of the joint law
    of the first three ids against the exact law computed in this single process. With 1000
    runs a deviation of effect size w = 0.3 gives a non-centrality of 90 (power about 0.99 at
    significance 1e-3; tests/exactness/test_distribution.py holds the one-process engine to w = 0.15)."""
    from tests.exactness.test_distribution import exact_law

    target, draft = small_pair_paths
    job = {"name": "gamma2", "kind": "joint", "sampling": {"temp": 1.0}, "gamma": 2, "runs": JOINT_RUNS, "seed": 1000}
    result = run_jobs(tmp_path, target, draft, "pipeline", [job])["gamma2"]
    single = mlxspec.load_pair(str(target), str(draft))
    law = exact_law(single.target.model, SamplingParams(temp=1.0))
    counts = Counter({tuple(outcome): n for outcome, n in result["counts"]})
    assert sum(counts.values()) == JOINT_RUNS
    statistic, df = goodness_of_fit(counts, law)
    threshold = critical_value(df, SIGNIFICANCE)
    assert statistic <= threshold, f"chi2 {statistic:.1f} > {threshold:.1f}"


@pytest.mark.slow
def test_cli_generate_json_on_rank_0_only(factory, load_pair):
    """The command line as a user types it: one JSON object on stdout (rank 0's), the other
    rank silent."""
    target, draft = factory.pair("qwen2")
    command = ["generate", "x", "-t", str(target), "-d", str(draft), "--shard", "pipeline", "-g", "3"]
    out, err = finish(start(*mlxspec_command(), *command, "-m", str(MAX_TOKENS), "--raw", "--json"))
    data = json.loads(out)  # exactly one object: nothing else on stdout
    pair = load_pair("qwen2")
    assert data["tokens"] == standard_ids(pair, list(pair.tokenizer.encode("x")))
    assert data["stats"]["transfers_per_token"] > 0
    assert "error" not in err


@pytest.mark.slow
def test_cli_race_on_rank_0_only(factory):
    target, draft = factory.pair("qwen2")
    command = ["race", "x", "-t", str(target), "-d", str(draft), "--shard", "pipeline", "-g", "2", "-m", "24"]
    out, err = finish(start(*mlxspec_command(), *command, "--raw", "--json"))
    data = json.loads(out)
    assert data["identical"] is True, data
    assert "error" not in err


@pytest.mark.slow
@pytest.mark.alone  # timed against the wall clock: the survivor ends within 30 s
@pytest.mark.parametrize("victim", [1, 0])
def test_a_dead_rank_stops_the_other_with_one_clear_line(factory, victim):
    """Kill one rank mid-generation (SIGKILL: no goodbye): the other ends within seconds, and
    one line says why, rather than a rank waiting forever for a transfer."""
    target, draft = factory.pair("qwen2")
    command = ["generate", "x", "-t", str(target), "-d", str(draft), "--shard", "pipeline", "-g", "3"]
    process = start(*mlxspec_command(), *command, "-m", "100000", "--raw")
    try:
        first = process.stdout.read(1)  # rank 0 is streaming: both ranks are in the loop
        assert first, process.stderr.read()
        ranks = _ranks_of(process.pid)
        assert set(ranks) == {0, 1}, ranks
        os.kill(ranks[victim], signal.SIGKILL)
        killed = time.monotonic()
        out, err = finish(process, timeout=30)
        assert time.monotonic() - killed < 30
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    # the survivor says so when its next transfer fails first; else mlx.launch, which stops
    # it, names the rank that died
    said = f"rank {1 - victim}: {LOST}" in err or f"Node with rank {victim} exited with code -9" in err
    assert said, err[-2000:]


def _ranks_of(launcher_pid: int) -> dict[int, int]:
    """The launcher's children (the ranks, exec'd from their shell) by MLX_RANK."""
    found = {}
    for _ in range(100):
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                if f"PPid:\t{launcher_pid}\n" not in status.read_text():
                    continue
                environ = (status.parent / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for entry in environ:
                if entry.startswith(b"MLX_RANK="):
                    found[int(entry.split(b"=")[1])] = int(status.parent.name)
        if len(found) == 2:
            return found
        time.sleep(0.1)
    return found


# --- in one process: what is refused before anything crosses ---------------------------------
def test_shard_alone_says_how_to_launch(capsys, factory):
    from mlxspec.cli import main

    target, draft = factory.pair("qwen2")
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "x", "-t", str(target), "-d", str(draft), "--shard", "pipeline"])
    assert exit_info.value.code == 2
    assert "mlx.launch" in capsys.readouterr().err


def test_unsplittable_architecture_and_caches_are_refused(factory):
    import mlx.core as mx
    import mlx_lm

    from mlxspec.distributed import split as distributed
    from mlxspec.errors import UnsupportedCache, UnsupportedShard

    group = mx.distributed.init()
    qwen3, _ = mlx_lm.load(str(factory.pair("qwen3")[0]), lazy=True)
    with pytest.raises(UnsupportedShard, match=r"cannot be split by layers .*use --shard tensor"):
        distributed.split(qwen3, "pipeline", group, "qwen3-target")
    sliding, _ = mlx_lm.load(str(factory.pair("llama_sliding")[0]), lazy=True)
    with pytest.raises(UnsupportedCache, match="roll back by trimming"):
        distributed.check_mirrorable(sliding, "llama_sliding")


def test_max_kv_size_with_shard_is_refused(capsys, factory):
    from mlxspec.cli import main

    target, draft = factory.pair("qwen2")
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "x", "-t", str(target), "-d", str(draft), "--shard", "tensor", "--max-kv-size", "64"])
    assert exit_info.value.code == 2
    assert "--max-kv-size" in capsys.readouterr().err


def test_a_tensor_split_whose_heads_do_not_divide_is_refused_on_both_ranks(factory):
    """5 heads over 2 ranks: refused before the split, in one line (rank 0's: both ranks find
    it alike and both exit), not mid-forward as an internal error."""
    overrides = {"hidden_size": 80, "num_attention_heads": 5, "num_key_value_heads": 5, "head_dim": 16}
    target = factory.model("llama-5-heads", arch="llama", seed=3, overrides=overrides)
    process = start(*mlxspec_command(), "generate", "x", "-t", str(target), "--no-draft", "--shard", "tensor", "--raw")
    out, err = finish(process, timeout=120)
    assert out == "" and "exited with code 1" in err, (out, err)  # mlx.launch itself exits 0 either way
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "internal error" not in err, err
    assert "5 attention heads, which do not divide among 2 ranks" in lines[0] and lines[0].startswith("error: rank 0:")
