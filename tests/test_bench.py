"""`mlxspec bench` end to end on tiny models: the report's schema, CSV, plot, bad input."""

from __future__ import annotations

import csv
import json

import pytest

from mlxspec.cli import main
from tests.test_cli import run


@pytest.fixture(scope="module")
def quick_report(factory, tmp_path_factory):
    target, draft = factory.pair("llama")
    out = tmp_path_factory.mktemp("bench")
    argv = [
        "bench",
        "-t",
        str(target),
        "-d",
        str(draft),
        "--quick",
        "--raw",
        "--max-tokens",
        "24",
        "--json",
        "--csv",
        str(out / "runs.csv"),
        "--plot",
        str(out / "speedup.png"),
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, out


def test_quick_bench_reports_every_measurement(quick_report, capsys):
    code, _ = quick_report
    assert code == 0


def test_bench_json_schema(factory, capsys, tmp_path):
    target, draft = factory.pair("llama")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "def add(a, b):", "category": "code"}\n{"prompt": "Once upon a time", "category": "story"}\n'
    )
    code, out, _ = run(
        capsys,
        "bench",
        "-t",
        str(target),
        "-d",
        str(draft),
        "--prompts",
        str(prompts),
        "--raw",
        "-g",
        "1,3",
        "--temp",
        "0,0.7",
        "--max-tokens",
        "16",
        "--repeats",
        "2",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert {"mlx", "mlx_lm", "platform", "device"} <= set(report["machine"])
    assert report["pair"] == {"target": str(target), "draft": str(draft)}
    costs = report["costs"]
    assert costs["c"] > 0 and len(costs["verify_curve"]) == 9 and costs["verify_curve"][0] == 1.0
    overall = [s for s in report["settings"] if s["category"] == "all"]
    assert {(s["temp"], s["gamma"]) for s in overall} == {(0.0, 1), (0.0, 3), (0.7, 1), (0.7, 3)}
    for s in overall:
        assert s["standard_tps"] > 0 and s["speculative_tps"] > 0
        assert s["speedup"] == pytest.approx(s["speculative_tps"] / s["standard_tps"])
        assert 0 <= s["acceptance_rate"] <= 1 and s["tokens_per_round"] >= 1
        assert s["predicted_speedup"] > 0 and s["vs_predicted"] == pytest.approx(s["speedup"] / s["predicted_speedup"])
        assert s["peer_speculative_tps"] > 0 and s["peer_standard_tps"] > 0 and s["peer_acceptance_rate"] is not None
        assert len(s["per_position"]) <= s["gamma"]
    assert {s["category"] for s in report["settings"]} == {"all", "code", "story"}
    assert set(report["recommended_gamma"]) == {"0.0", "0.7"}
    runs = report["runs"]
    # 2 prompts x 2 temps x (standard + 2 gammas) x 2 methods
    assert len(runs) == 24 and all(len(r["repeat_tokens_per_second"]) == 2 for r in runs)
    assert all(r["peak_memory_gb"] > 0 for r in runs)


def test_the_peer_is_the_same_computation_at_temperature_zero(load_pair):
    """mlx-lm's speculative decoding run by the bench gives the same ids as mlxspec at
    temperature 0, so their speeds compare like for like."""
    import mlxspec
    from mlxspec.peers import mlx_lm_generate

    pair = load_pair("qwen3")
    ids = pair.tokenizer.encode("import os")
    ours = mlxspec.generate(pair, ids, max_tokens=24, gamma=3)
    for gamma in (0, 3):
        peer = mlx_lm_generate(pair, ids, max_tokens=24, gamma=gamma)
        assert peer.tokens == ours.tokens
    # the same drafts are accepted (the last round differs: mlx-lm drafts even for the last token)
    assert abs(peer.stats.accepted - ours.stats.accepted) <= 1 and peer.stats.rounds == ours.stats.rounds


def test_csv_and_plot_are_written(quick_report):
    _, out = quick_report
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and {
        "prompt",
        "category",
        "method",
        "mode",
        "gamma",
        "temp",
        "tokens_per_second",
        "acceptance_rate",
    } <= set(rows[0])
    assert {r["method"] for r in rows} == {"mlxspec", "mlx-lm"}
    png = (out / "speedup.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gamma", "0,2"], "must be >= 1"),
        (["--gamma", "two"], "comma-separated list"),
        (["--temp", "-1"], "temperature must be >= 0"),
        (["--prompts", "/no/such.jsonl"], "no prompts file"),
    ],
)
def test_bench_bad_input(capsys, factory, args, message):
    target, draft = factory.pair("llama")
    code, _, err = run(capsys, "bench", "-t", str(target), "-d", str(draft), *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_prompts_file_with_a_bad_line(capsys, factory, tmp_path):
    target, draft = factory.pair("llama")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    code, _, err = run(capsys, "bench", "-t", str(target), "-d", str(draft), "--prompts", str(bad))
    assert code == 2 and f"{bad}:2" in err


def test_bench_auto_and_prompt_lookup(factory, capsys, tmp_path):
    target, _ = factory.pair("llama")
    prompts = tmp_path / "edit.jsonl"
    text = "def area(width, height):\\n    return width * height\\n"
    prompts.write_text(
        json.dumps({"prompt": f"{text}\nRepeat the code above exactly:\n{text}", "category": "edit"}) + "\n"
    )
    code, out, _ = run(
        capsys,
        "bench",
        "-t",
        str(target),
        "-d",
        "ngram",
        "--prompts",
        str(prompts),
        "--raw",
        "-g",
        "auto,3",
        "--temp",
        "0",
        "--max-tokens",
        "24",
        "--repeats",
        "1",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert report["pair"]["draft"] is None
    assert all(r["method"] == "mlxspec" for r in report["runs"])  # mlx-lm has no prompt lookup
    settings = {s["gamma"]: s for s in report["settings"] if s["category"] == "all"}
    assert set(settings) == {"auto", 3}
    assert settings[3]["ngram_rounds"] > 0 and settings["auto"]["mean_gamma"] is not None


def test_a_setting_named_twice_runs_once():
    from mlxspec.bench import BenchConfig, plan_size
    from mlxspec.prompts import suite

    config = BenchConfig(prompts=suite(quick=True)[:1], gammas=[2, "auto", 2], temps=[0.0, 0.0], repeats=1, peers=False)
    assert config.gammas == [2, "auto"] and config.temps == [0.0]
    assert plan_size(config) == 3  # standard, gamma 2, auto
