"""`mlxspec bench` end to end on tiny models: the report's schema, CSV, plot, bad input."""

from __future__ import annotations

import csv
import json

import pytest

from mlxspec.cli import main
from tests.cli.test_cli import run


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


@pytest.mark.slow
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
    unexplained = {str(s["temp"]) for s in overall if s["unexplained"]}
    assert set(report["recommended_gamma"]) >= {"0.0", "0.7"} - unexplained, overall
    runs = report["runs"]
    # 2 prompts x 2 temps x (standard + 2 gammas) x 2 methods
    assert len(runs) == 24 and all(len(r["repeat_tokens_per_second"]) == 2 for r in runs)
    assert all(r["peak_memory_gb"] > 0 for r in runs)


def test_the_peer_is_the_same_computation_at_temperature_zero(load_pair):
    """mlx-lm's speculative decoding run by the bench gives the same ids as mlxspec at
    temperature 0, so their speeds compare like for like."""
    import mlxspec
    from mlxspec.measure.peers import mlx_lm_generate

    pair = load_pair("qwen3")
    ids = pair.tokenizer.encode("import os")
    ours = mlxspec.generate(pair, ids, max_tokens=24, gamma=3)
    for gamma in (0, 3):
        peer = mlx_lm_generate(pair, ids, max_tokens=24, gamma=gamma)
        assert peer.tokens == ours.tokens
    # the same drafts are accepted (the last round differs: mlx-lm drafts even for the last token)
    assert abs(peer.stats.accepted - ours.stats.accepted) <= 1 and peer.stats.rounds == ours.stats.rounds


@pytest.mark.slow
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
        (["--gamma", "two"], "gamma (draft length) must be a whole number from 0 to 64 or 'auto', got 'two'"),
        # issue 39: an empty item was dropped, an empty list meant auto, a digit only to isdigit an internal error
        (["--tree", "0,,8"], "--tree has an empty item in '0,,8'"),
        (["--tree", ""], "--tree is empty"),
        (["--gamma", " "], "--gamma is empty"),
        (["--tree", "²"], "tree (nodes per round) must be a whole number from 0 to 256 or 'auto', got '²'"),
        (["--gamma", "2,1500"], "gamma (draft length) must be at most 64, got 1500"),
        (["--temp", "0,"], "--temp has an empty item"),
        (["--temp", "-1"], "temperature must be >= 0"),
        (["--prompts", "/no/such.jsonl"], "no prompts file"),
        (["--prompts", "/bin/sh"], "not UTF-8 text"),  # binary: an internal error once (issue 28)
        (["--prompts", "/"], "is a folder"),
        (["--max-tokens", "0"], "--max-tokens"),  # 0 once meant "the default"
        (["--repeats", "0"], "--repeats"),
        (["--temp", "nan"], "temperature must be >= 0"),
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
    from mlxspec.measure.bench import BenchConfig, plan_size
    from mlxspec.measure.prompts import suite

    config = BenchConfig(prompts=suite(quick=True)[:1], gammas=[2, "auto", 2], temps=[0.0, 0.0], repeats=1, peers=False)
    assert config.gammas == [2, "auto"] and config.temps == [0.0]
    assert plan_size(config) == 3  # standard, gamma 2, auto


def test_doubtful_predictions_are_flagged_and_empty_runs_are_dashes():
    """A measured/predicted ratio far from 1 gets a mark and a footnote; a category whose
    speculative run ended on its first token (a sampled end-of-sequence) shows "–", not a
    slowdown, and stays out of the means."""
    import io

    from rich.console import Console

    from mlxspec.drafting.verdict import doubtful
    from mlxspec.measure.bench import BenchConfig, Run, speed, summarize
    from mlxspec.measure.costs import Costs
    from mlxspec.stats import Stats
    from mlxspec.views import bench as view

    def run_of(category, gamma, stats):
        return Run(category, category, "mlxspec", gamma, 1.0, repeats=[stats])

    standard = Stats(tokens=100, emitted=100, rounds=100, decode_seconds=1.0, plain_rounds=100)
    fast = Stats(tokens=100, emitted=100, rounds=40, drafted=80, tested=60, accepted=30, decode_seconds=0.4)
    fast.gamma, fast.model_rounds = 2, 40
    empty = Stats(tokens=0, emitted=1, rounds=1, drafted=2, tested=1, decode_seconds=0.01, model_rounds=1, gamma=2)
    runs = [
        run_of("code", 0, standard),
        run_of("code", 2, fast),
        run_of("chat", 0, standard),
        run_of("chat", 2, empty),
    ]
    costs = Costs(target_step=0.01, draft_step=0.004, verify_curve=(1.0, 1.1, 1.2))
    config = BenchConfig(prompts=[], gammas=[2], temps=[1.0], trees=[0], peers=False)
    settings = summarize(runs, costs, config)
    chat = next(s for s in settings if s.category == "chat")
    overall = next(s for s in settings if s.category == "all")
    assert chat.speedup is None and speed(chat.speculative) is None
    assert overall.speculative_tps == pytest.approx(250.0)  # the empty run is not counted as slow
    assert doubtful(overall.vs_predicted) and overall.vs_predicted > 1.5
    report = bare_report(costs, runs, settings)
    for width in (160, 100):
        out = io.StringIO()
        Console(file=out, width=width).print(view.render(report, width))
        text = out.getvalue()
        words = " ".join(text.split())
        assert f"{overall.vs_predicted:.2f}†" in text and "do not explain: measured/predicted outside 0.5–1.5" in words
        row = next(line for line in text.splitlines() if line.strip().startswith("chat"))
        assert row.split() == ["chat", "–"]  # no speed, no slowdown, no acceptance figure
    assert not doubtful(1.2) and not doubtful(None) and doubtful(0.4)


def bare_report(costs, runs, settings):
    """A report of these measurements on an unnamed machine and pair."""
    from mlxspec.measure.bench import BenchReport

    machine = {"device": "cpu", "mlx": "0", "mlx_lm": "0"}
    return BenchReport(
        machine=machine, pair={"target": "T", "draft": "D"}, config={}, costs=costs, runs=runs, settings=settings
    )


def test_plain_runs_noise_and_thin_acceptance_are_said_so():
    """A setting that accepted no draft reads "plain", never a speedup, and is never
    recommended; a speedup inside its repeats' spread carries the noise mark, the spread
    beside it; α is "–" when fewer than 8 drafts were tested."""
    import io

    from rich.console import Console

    from mlxspec.measure.bench import BenchConfig, Run, summarize
    from mlxspec.measure.costs import Costs
    from mlxspec.stats import Stats
    from mlxspec.views import bench as view

    def timed(seconds, **counts):
        return Stats(tokens=100, emitted=100, decode_seconds=seconds, **counts)

    standard = [timed(1.0, rounds=100, plain_rounds=100), timed(1.2, rounds=100, plain_rounds=100)]
    # auto: two drafts tried, none accepted, then plain steps; faster on the wobble alone
    plain = [timed(0.9, rounds=100, drafted=2, tested=1, model_rounds=1, plain_rounds=99) for _ in range(2)]
    # gamma 2: drafts accepted, but the repeats disagree by more than the speedup
    close = [timed(0.8, rounds=60, drafted=60, tested=40, accepted=20, model_rounds=60), timed(1.3, rounds=60)]
    close[1].drafted, close[1].tested, close[1].accepted, close[1].model_rounds = 60, 40, 20, 60
    runs = [
        Run("p", "code", "mlxspec", 0, 0.0, repeats=standard),
        Run("p", "code", "mlxspec", "auto", 0.0, tree="auto", repeats=plain),
        Run("p", "code", "mlxspec", 2, 0.0, tree="auto", repeats=close),
    ]
    costs = Costs(target_step=0.01, draft_step=0.004, verify_curve=(1.0, 1.1, 1.2))
    settings = summarize(runs, costs, BenchConfig(prompts=[], gammas=["auto", 2], temps=[0.0], peers=False))
    auto, two = (next(s for s in settings if s.category == "all" and s.gamma == g) for g in ("auto", 2))
    assert auto.speedup > 1 and auto.verdict == "plain" and auto.stats.shown_acceptance_rate is None
    assert two.repeat_speedups == pytest.approx([1.25, 1.2 / 1.3]) and two.verdict == "noise"
    assert abs(two.speedup - 1) < two.spread
    report = bare_report(costs, runs, settings)
    assert report.best(0.0) is two  # the plain setting is never the recommendation
    out = io.StringIO()
    Console(file=out, width=160).print(view.render(report, 160))
    text = out.getvalue()
    auto_row = next(line for line in text.splitlines() if line.split()[:2] == ["0", "auto"])
    assert "plain" in auto_row and "x" not in auto_row.split()[4] and auto_row.split()[6] == "–"
    two_row = next(line for line in text.splitlines() if line.split()[:2] == ["0", "2"])
    assert f"{two.speedup:.2f}x≈" in two_row and f"{two.spread:.2f}" in two_row and "0.50" in two_row
    assert "≈ within noise" in text and "plain: decoded plainly" in text and "no measurable difference" in text


def test_a_bench_says_its_plan_and_time_first_and_explains_its_columns(capsys, tmp_path):
    """Before any generation: the plan (prompts × temperatures × settings × repeats) and, once a
    target step is timed, the time it should take; under the table, what each column means; in
    --json, a bundled draft by the name the presets give it, not its folder in the package."""
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):", "category": "code"}\n')
    args = ["bench", "--prompts", str(prompts), "--raw", "-g", "2", "--temp", "0", "-m", "8", "--repeats", "1"]
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["pair"] == {"target": "bundled:tiny-target", "draft": "bundled:tiny-draft"}
    plan = "plan: 1 prompt × 1 temperature × 4 settings (standard, γ 2, standard (mlx-lm), γ 2 (mlx-lm)) × 1 repeat"
    lines = err.strip().splitlines()
    assert lines[-2].startswith(f"{plan} = 4 generations of up to 8 tokens"), err
    assert lines[-1].startswith("estimated ") and " from here (a target step takes " in lines[-1]
    assert report["estimated_seconds"] > 0
    code, out, _ = run(capsys, *args)
    words = " ".join(out.split())  # the legend wraps at the table's width
    assert code == 0 and "α: the share of the drafts the target checked that it accepted" in words
    assert "c: a draft step's time over a target step's" in words and "±: half the range" in words


def test_a_peer_left_out_is_said_with_its_reason(capsys, factory, tmp_path, monkeypatch):
    """mlx-lm has no prompt lookup: no mlx-lm columns, and a line under the table says why."""
    target, _ = factory.pair("llama")
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):", "category": "code"}\n')
    monkeypatch.setenv("COLUMNS", "100")  # the narrow layout, whose second table had mlx-lm's columns
    args = ["bench", "-t", str(target), "-d", "ngram", "--prompts", str(prompts), "--raw", "-g", "2", "--temp", "0"]
    code, out, err = run(capsys, *args, "-m", "8", "--repeats", "1")
    assert code == 0, err
    assert "mlx-lm not measured: it has no prompt-lookup drafting to compare with" in out + err
    assert not any(column in out for column in ("mlx-lm spec", "mlx-lm α", "vs mlx-lm")) and "+ prompt lookup" in out


def test_quick_is_one_temperature_auto_and_the_pairs_own_length(capsys):
    """--quick: one prompt per category, T 0, γ auto and the pair's recommended length (the
    bundled pair's 4), one repeat: 15 generations here, said before they run."""
    code, _, err = run(capsys, "bench", "--quick", "-m", "4", "--no-peers", "--json")
    assert code == 0, err
    plan = "plan: 5 prompts × 1 temperature × 3 settings (standard, γ auto, γ 4) × 1 repeat = 15 generations"
    assert plan in err


def test_the_progress_bar_counts_the_plans_generations(tmp_path):
    """Issue 39: the plan said 15 generations and the bar counted 17 (the warm-up and the cost
    model counted as items). On a terminal the bar counts the plan's generations, n/15."""
    import os
    import pty
    import re
    import subprocess
    import sys

    leader, follower = pty.openpty()
    with open(tmp_path / "report.json", "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlxspec", "bench", "--quick", "-m", "4", "--no-peers", "--json"],
            stdout=out,
            stderr=follower,
            env={**os.environ, "COLUMNS": "160"},
        )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert process.wait(timeout=300) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "= 15 generations" in text
    counts = [(int(done), int(total)) for done, total in re.findall(r"\b(\d+)/(\d+)\b", text)]
    assert counts and {total for _, total in counts} == {15} and max(done for done, _ in counts) <= 15, counts


@pytest.mark.parametrize("width", [160, 80])
def test_every_figure_is_whole_at_any_width(capsys, monkeypatch, width):
    """Issue 39: `bench --pair smollm2 --quick` at 160 columns cut its own figures ("spe… 1.4…",
    "α …"): the drafting column's free text took the width. Through the command at 160 and 80
    columns, every figure cell is whole; the drafting text wraps, or goes under the table."""
    import re

    monkeypatch.setenv("COLUMNS", str(width))
    args = ["bench", "--quick", "-m", "8", "--tree", "0,8"]  # the bundled pair, mlx-lm beside it
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "…" not in out and all(len(line) <= width for line in out.splitlines()), out
    header, _, *rest = out.split("All prompts")[1].strip("\n").splitlines()
    rows = rest[: rest.index("")] if "" in rest else rest
    figure = re.compile(r"^(–|plain|\d+\.\d+x?≈?†?)$")
    labels = ("auto, chain", "auto, tree 8", "4, chain", "4, tree 8")
    assert len(rows) == len(labels), out
    for row, label in zip(rows, labels):
        before, _, cells = row.partition(f" {label} ")
        assert before.split() == ["0"], row
        # std, spec, speedup, ±, α, τ, predicted, meas/pred; then drafting or mlx-lm's figures
        assert all(figure.match(cell) for cell in cells.split()[:8]), row
    if "drafting" not in header:  # the drafting text under the table, whole
        assert "Drafting" in out and "nodes/tree" in out


def test_one_repeat_recommends_nothing(capsys):
    """Issue 39: `bench --quick` recommended "γ auto (1.96x)" from one repeat, with no ± band.
    One repeat measures no spread: no speedup is told from noise and nothing is recommended, in
    the text or in --json; the best is said, with what would measure it."""
    args = ["bench", "--quick", "-m", "8", "--no-peers"]
    code, out, err = run(capsys, *args, "--json")
    report = json.loads(out)
    assert code == 0 and report["recommended_gamma"] == {}, err
    assert all(s["verdict"] in ("noise", "plain") for s in report["settings"]), report["settings"]
    code, out, _ = run(capsys, *args)
    words = " ".join(out.split())
    assert code == 0 and "recommended T0: none from one repeat (best γ " in words
    assert "--repeats 3 measures it" in words and "with one repeat no spread is measured" in words


def test_a_speedup_its_own_figures_cannot_explain_is_flagged():
    """Issue 39: γ auto at 1.96x with τ 1.08 (each pass of the target gave 1.08 tokens, so at
    most about 1.08x) and v(2) timed at 0.45 (a 2-token pass faster than a 1-token one). The
    speedup is marked †, v(2) too, the prediction takes v ≥ 1, and no recommendation rests on
    the figure."""
    import io

    from rich.console import Console

    from mlxspec.measure.bench import BenchConfig, Run, summarize
    from mlxspec.measure.costs import Costs
    from mlxspec.stats import Stats
    from mlxspec.views import bench as view

    def timed(seconds, **counts):
        return Stats(tokens=100, emitted=100, decode_seconds=seconds, **counts)

    standard = [timed(1.0, rounds=100, plain_rounds=100), timed(1.02, rounds=100, plain_rounds=100)]
    auto = [timed(0.51, rounds=93, drafted=20, tested=12, accepted=7, model_rounds=10, plain_rounds=83) for _ in "ab"]
    for stats in auto:
        stats.gamma = "auto"
    runs = [
        Run("p", "code", "mlxspec", 0, 0.0, repeats=standard),
        Run("p", "code", "mlxspec", "auto", 0.0, repeats=auto),
    ]
    costs = Costs(target_step=0.01, draft_step=0.002, verify_curve=(1.0, 0.45, 1.2))
    settings = summarize(runs, costs, BenchConfig(prompts=[], gammas=["auto"], temps=[0.0], trees=[0], peers=False))
    setting = next(s for s in settings if s.category == "all")
    assert setting.speedup == pytest.approx(1.98, abs=0.01) and setting.stats.tokens_per_round < 1.1
    assert setting.unexplained and costs.verify_cost(2) == 1.0 and costs.noisy_verify == [2]
    report = bare_report(costs, runs, settings)
    assert report.to_dict()["recommended_gamma"] == {} and report.to_dict()["settings"][0]["unexplained"]
    out = io.StringIO()
    Console(file=out, width=160).print(view.render(report, 160))
    text = " ".join(out.getvalue().split())
    assert "0.45†" in text and "v(2) below 1" in text and "do not explain" in text and "above τ" in text
    assert f"{setting.vs_predicted:.2f}†" in text or "–†" in text
    assert f"recommended T0: none yet (best γ auto, chain gave {setting.speedup:.2f}x†" in text
