"""`mlxspec race`: the view as a pure function of recorded events, the own-clock scheduler,
and the command end to end."""

from __future__ import annotations

import io

from rich.console import Console

from mlxspec.decoding.events import Done, Prefill, Round
from mlxspec.measure import race as racing
from mlxspec.measure import sides
from mlxspec.options import Options
from mlxspec.views import race as view
from mlxspec.views.tokens import STYLES
from tests.cli.test_cli import run


def round_event(i, drafted, accepted, emitted, pieces, seconds, discarded=""):
    return Round(
        index=i,
        gamma=len(drafted),
        drafted=tuple(drafted),
        accepted=accepted,
        emitted=tuple(emitted),
        draft_seconds=seconds / 3,
        verify_seconds=seconds * 2 / 3,
        seconds=seconds,
        pieces=tuple(pieces),
        discarded=discarded,
    )


def recorded_sides(diverge=False):
    """Standard: 6 tokens at 0.1 s each. Speculative: two rounds, 6 tokens in 0.25 s."""
    standard = racing.Side("standard", "Big", 0)
    speculative = racing.Side("speculative", "Big + Small", 3)
    words = ["The", " cat", " sat", " on", " the", " mat"]
    standard.apply(Prefill(5, 5, 0.01))
    for i, w in enumerate(words):
        standard.apply(round_event(i, (), 0, [i + 10], [w], 0.1))
    speculative.apply(Prefill(5, 5, 0.02))
    speculative.apply(round_event(0, [10, 11, 99], 2, [10, 11, 12], words[:3], 0.12, discarded=" dog"))
    last = 99 if diverge else 15
    speculative.apply(round_event(1, [13, 14], 2, [13, 14, last], words[3:], 0.13))
    return standard, speculative


def more_rounds(speculative, rounds=2):
    """Two more rounds of three drafts, one accepted in each: eleven tested in all."""
    for i in range(rounds):
        speculative.apply(round_event(2 + i, [20, 21, 22], 1, [20, 30], ["a", "b"], 0.1, discarded="c"))


def screen(standard, speculative, width, height=None, **options):
    console = Console(width=width, file=io.StringIO(), record=True, color_system="truecolor")
    console.print(view.render(standard, speculative, width=width, height=height, temp=0, **options))
    return console


def test_panels_figures_and_footer():
    standard, speculative = recorded_sides()
    text = screen(standard, speculative, 160).export_text()
    assert "Standard · Big" in text and "Speculative · Big + Small" in text
    assert "6 tokens · 0.60 s · 10.0 tok/s" in text
    # five drafts tested: too few for α to mean anything, so no α and no prediction from it
    assert "6 tokens · 0.25 s · 24.0 tok/s · 2 rounds · α – · τ 3.00 · γ 3" in text
    assert "speedup 2.40x" in text and "identical so far ✓" in text
    assert "predicted" not in text
    more_rounds(speculative)
    text = screen(standard, speculative, 160).export_text()
    assert "α 0.67" in text and "predicted" in text and "E[τ]/(γc+1)" in text
    # side by side: both panels' titles on one line
    assert any("Standard" in line and "Speculative" in line for line in text.splitlines())


def test_tokens_are_styled_by_fate():
    standard, speculative = recorded_sides()
    text = view.fate_text(speculative.segments)
    styles = {text.plain[span.start : span.end]: str(span.style) for span in text.spans}
    assert styles["The"] == STYLES["accepted"] and styles[" sat"] == STYLES["recovered"]
    assert styles[" mat"] == STYLES["bonus"]
    assert " dog" not in text.plain
    shown = view.fate_text(speculative.segments, show_rejected=True)
    assert shown.plain.startswith("The cat dog sat")  # thrown away where it was cut
    assert any(shown.plain[s.start : s.end] == " dog" and "strike" in str(s.style) for s in shown.spans)


def test_narrow_terminals_stack_the_panels():
    standard, speculative = recorded_sides()
    lines = screen(standard, speculative, 80).export_text().splitlines()
    assert not any("Standard" in line and "Speculative" in line for line in lines)
    top = next(i for i, line in enumerate(lines) if "Standard" in line)
    assert next(i for i, line in enumerate(lines) if "Speculative" in line) > top


def test_live_height_keeps_the_newest_lines():
    standard, speculative = recorded_sides()
    for i in range(60):
        standard.apply(round_event(10 + i, (), 0, [1], [f"\nline {i}"], 0.01))
    text = screen(standard, speculative, 160, height=14).export_text()
    assert "line 59" in text and "line 5\n" not in text
    assert len(text.splitlines()) <= 14


def test_divergence_is_flagged_at_temperature_zero():
    standard, speculative = recorded_sides(diverge=True)
    assert sides.identical_so_far(standard, speculative) == 5
    assert "outputs differ at token 5 ✗" in screen(standard, speculative, 160).export_text()


def test_summary_says_speedup_and_slowdown_plainly():
    standard, speculative = recorded_sides()
    speculative.apply(Done("length", speculative.stats.frozen("length")))
    summary = view.summary(standard, speculative, temp=0).plain
    assert "2.40x faster" in summary
    # measured 2.40x where the theory says 1.72x: within 1.5x of it, no warning
    assert "theory predicted" not in summary and view.doubtful(2.4 / 1.72) is False
    standard.stats.decode_seconds *= 3  # now 7.2x measured: noise, and said so
    assert "The theory predicted" in view.summary(standard, speculative, temp=0).plain
    slow = racing.Side("speculative", "Big + Small", 3)
    slow.apply(round_event(0, [10, 11, 12], 0, [10], ["The"], 0.5, discarded=" x"))
    summary = view.summary(standard, slow, temp=0.7).plain
    assert "slower here" in summary and "draft costs" in summary


def test_scheduler_keeps_the_clocks_within_a_slice(load_pair):
    """A side keeps its turn until it is a slice of its own time ahead; then the one behind
    goes. So neither clock leads by more than a slice plus the round that crossed it."""
    pair = load_pair("llama")
    for standard, speculative in racing.race(
        pair, list(range(10, 22)), Options.build(gamma=3, max_tokens=120), slice_seconds=0.01
    ):
        if standard.done or speculative.done:
            break
        # the longest a single round took on either side so far
        longest = max(standard.stats.decode_seconds, speculative.stats.decode_seconds) / max(
            min(standard.stats.rounds, speculative.stats.rounds), 1
        )
        assert abs(standard.clock - speculative.clock) <= 0.01 + 4 * longest + 0.005
    *_, (standard, speculative) = racing.race(pair, list(range(10, 22)), Options.build(gamma=3, max_tokens=40))
    assert standard.done and speculative.done
    assert standard.tokens == speculative.tokens  # temperature 0


def test_turn_rule():
    a, b = racing.Side("standard", "T", 0), racing.Side("speculative", "T + D", 2)
    a.stats.decode_seconds, b.stats.decode_seconds = 0.30, 0.26
    assert racing._turn(a, a, b, 0.05) is a  # ahead, but by less than a slice: keeps going
    a.stats.decode_seconds = 0.32
    assert racing._turn(a, a, b, 0.05) is b  # a slice ahead: the other side's turn
    assert racing._turn(None, a, b, 0.05) is b  # the first turn: whoever is behind
    b.done = object()
    assert racing._turn(a, a, b, 0.05) is a  # alone once the other has finished


def test_race_command_plain_summary_and_svg(capsys, factory, tmp_path):
    target, draft = factory.pair("llama")
    svg, html = tmp_path / "race.svg", tmp_path / "race.html"
    code, out, err = run(
        capsys, "race", "hello", "-t", str(target), "-d", str(draft), "-m", "20", "--svg", str(svg), "--html", str(html)
    )
    assert code == 0, err
    assert out.startswith("prompt:\nhello\n\nstandard (") and "speculative (" in out and "Outputs identical." in out
    assert svg.read_text().startswith("<svg") and "Speculative" in svg.read_text()
    assert "<html" in html.read_text().lower()


def test_race_refuses_gamma_zero(capsys, factory):
    target, draft = factory.pair("llama")
    code, _, err = run(capsys, "race", "-t", str(target), "-d", str(draft), "-g", "0")
    assert code == 2 and "--gamma >= 1 or auto" in err


def test_panel_figures_are_never_cut():
    """Long figures (auto's plain steps, n-gram) at 160, 100 and 80 columns: every figure is on
    the screen whole, in the border where it fits, else below the text; no line overflows."""
    standard, speculative = recorded_sides()
    speculative.gamma = "auto"
    for i in range(3):
        plain = round_event(2 + i, (), 0, [16 + i], ["!"], 0.01)
        speculative.apply(
            Round(**{**plain.__dict__, "source": "target", "draft_seconds": None, "verify_seconds": None})
        )
    figures = view._figures(speculative)
    assert figures.endswith("γ auto→0 (plain)")
    for width in (160, 100, 80):
        text = screen(standard, speculative, width).export_text()
        assert all(len(line) <= width for line in text.splitlines())
        flat = " ".join(line.strip("│╭╮╰╯─ ") for line in text.splitlines())
        for part in figures.split(" · "):
            assert part in flat, (width, part)
    for height in (12, 20):  # live frames keep the figures too
        text = screen(standard, speculative, 100, height=height).export_text()
        assert "γ auto→0 (plain)" in text and len(text.splitlines()) <= height


def test_reasoning_is_dimmed_in_the_race():
    segments = [("<think>", "accepted"), ("\nweighing it", "bonus"), ("</think>", "recovered"), ("\n\nDone.", "bonus")]
    text = view.fate_text(segments)
    dim = "".join(text.plain[s.start : s.end] for s in text.spans if "dim" in str(s.style))
    assert dim == "<think>\nweighing it</think>" and text.plain.endswith("Done.")


def test_a_prompt_lookup_slowdown_names_no_draft_cost():
    standard, _ = recorded_sides()
    lookup = racing.Side("speculative", "Big + n-gram", 3)
    event = round_event(0, [10, 11, 12], 0, [10], ["The"], 0.5, discarded=" x")
    lookup.apply(Round(**{**event.__dict__, "source": "ngram", "draft_seconds": None, "verify_seconds": None}))
    summary = view.summary(standard, lookup, temp=0).plain
    assert "slower here" in summary and "draft costs" not in summary


def test_race_json_no_draft_and_cache_options(capsys, factory, monkeypatch):
    """race takes generate's options: --json, --stop, --min-p; --no-draft is refused in one
    line; --max-kv-size reaches both sides' caches, and the outputs stay identical."""
    import json

    from mlxspec.decoding.caches import CacheOptions

    target, draft = factory.pair("llama")
    made = []
    original = racing.Session

    def session(pair, *, cache_options=CacheOptions()):
        made.append(cache_options)
        return original(pair, cache_options=cache_options)

    monkeypatch.setattr(racing, "Session", session)
    code, out, err = run(
        capsys, "race", "hello", "-t", str(target), "-d", str(draft), "-m", "40", "--json", "--max-kv-size", "16"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["identical"] is True and result["standard"]["tokens"] == result["speculative"]["tokens"]
    # each side warmed up on a throwaway session first, then raced on its own
    assert made == [CacheOptions(max_kv_size=16)] * 4
    drafting = result["speculative"]["stats"]  # the pair's recommended length (4), not auto: no plain steps
    assert drafting["plain_rounds"] == 0 and drafting["mean_gamma"] > 3
    code, out, err = run(capsys, "race", "-t", str(target), "-d", str(draft), "--no-draft")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--draft ngram" in err
    code, out, _ = run(
        capsys, "race", "a", "-t", str(target), "-d", str(draft), "-m", "8", "--min-p", "0.05", "--stop", "zz", "--json"
    )
    assert code == 0 and json.loads(out)["identical"] is True


def plain_round(i, seconds):
    event = round_event(i, (), 0, [i + 10], ["x"], seconds)
    return Round(**{**event.__dict__, "source": "target", "draft_seconds": None, "verify_seconds": None})


def test_a_race_decoded_plainly_is_never_a_speedup():
    """No draft accepted: every token was a target step, so any gap to standard is noise,
    and the view says so instead of a speedup; with auto, one line says why."""
    standard, _ = recorded_sides()
    plain = racing.Side("speculative", "Big + Small", "auto")
    plain.apply(round_event(0, [10, 11], 0, [10], ["The"], 0.05, discarded=" x"))
    for i in range(1, 6):
        plain.apply(plain_round(i, 0.03))
    plain.apply(Done("length", plain.stats.frozen("length")))
    assert sides.speedup(standard, plain) > 1 and sides.verdict(standard, plain) == "plain"
    text = screen(standard, plain, 160, done=True).export_text()
    assert view.PLAIN in text and "speedup" not in text and "faster" not in text
    summary = view.summary(standard, plain, temp=0).plain
    assert view.PLAIN in summary and "γ auto decoded plainly for 5 of 6 rounds" in summary
    assert "draft step costs" in summary and "0 of 1 tested draft accepted" in summary


def test_a_speedup_inside_the_runs_noise_is_said_to_be():
    standard = racing.Side("standard", "Big", 0)
    for i, seconds in enumerate(([0.05] * 4 + [0.15] * 4) * 2):  # slow spells: a third of the speed
        standard.apply(round_event(i, (), 0, [i], ["x"], seconds))
    speculative = racing.Side("speculative", "Big + Small", 3)
    for i in range(5):
        speculative.apply(round_event(i, [1, 2, 3], 2, [1, 2, 3], ["a", "b", "c"], 0.27))
    now, noise = sides.speedup(standard, speculative), sides.speedup_noise(standard, speculative)
    assert abs(now - 1) < noise and sides.verdict(standard, speculative) == "noise"
    text = screen(standard, speculative, 160).export_text()
    assert f"speedup {now:.2f}x ±{noise:.2f}: within noise" in text
    summary = view.summary(standard, speculative, temp=0).plain
    assert "within noise" in summary and f"noise ±{noise:.2f}: two standard errors" in summary
    # a steady machine: the same speedup is measured, and said
    steady = racing.Side("standard", "Big", 0)
    for i in range(16):
        steady.apply(round_event(i, (), 0, [i], ["x"], 0.1 + 0.001 * (i % 2)))
    assert sides.verdict(steady, speculative) == "faster"
    assert sides.speedup_noise(steady, speculative) < 0.05


def test_the_final_frame_gives_a_verdict_not_so_far():
    standard, speculative = recorded_sides()
    assert "identical so far ✓" in screen(standard, speculative, 160).export_text()
    final = screen(standard, speculative, 160, done=True).export_text()
    assert "so far" not in final and "outputs identical ✓" in final


def test_the_title_keeps_the_drafters_name_whole():
    standard, speculative = recorded_sides()
    long = "/home/someone/.cache/mlxspec/imports/a-rather-long-folder-name/HuggingFaceTB--SmolLM2-135M-Instruct"
    speculative.models = f"{long} + bundled:smollm2-draft + n-gram"
    for width in (80, 120, 160):
        text = screen(standard, speculative, width).export_text()
        title = next(line for line in text.splitlines() if "Speculative" in line)
        assert "bundled:smollm2-draft + n-gram" in title, (width, title)
    assert view.short_models(f"{long} + d", 44) == "…/HuggingFaceTB--SmolLM2-135M-Instruct + d"
    # a last part too long for the room keeps its head, cut after a separator, not mid-word
    drafters = " + smollm2-draft + n-gram"
    assert view.short_models(f"SmolLM2-135M-Instruct.Q4_1-float32{drafters}", 40) == f"SmolLM2-135M-…{drafters}"
    assert view.short_models(f"{long}{drafters}", 50) == f"HuggingFaceTB--SmolLM2-…{drafters}"
    assert view.short_models(f"Averyveryverylongname{drafters}", 30) == f"…{drafters}"


def test_the_live_view_takes_only_the_lines_it_needs():
    standard, speculative = recorded_sides()
    for width in (80, 160):
        lines = screen(standard, speculative, width, height=60).export_text().splitlines()
        assert len(lines) < 20, (width, len(lines))


def test_the_legend_says_recovered():
    standard, speculative = recorded_sides()
    text = screen(standard, speculative, 160).export_text()
    assert "recovered after a rejection" in text and "resampled" not in text


def test_a_tiny_temperature_races_greedily(capsys, factory):
    """--temp 1e-45 is greedy decoding: both sides write the greedy text, said identical."""
    import json

    target, draft = factory.pair("llama")
    code, out, err = run(
        capsys, "race", "hello", "-t", str(target), "-d", str(draft), "-m", "12", "--json", "--temp", "1e-45"
    )
    assert code == 0, err
    result = json.loads(out)
    code, greedy, _ = run(capsys, "generate", "hello", "-t", str(target), "--no-draft", "-m", "12", "--json")
    assert result["identical"] is True and result["speculative"]["tokens"] == json.loads(greedy)["tokens"] != []


def looping_sides(answer_loops: bool, lookup: bool = True):
    """A race over 64 tokens: standard steady at 0.1 s a token; speculative in rounds of four
    (three accepted drafts and a bonus), proposed by prompt lookup or by the draft model, on an
    answer that repeats one line or one that never repeats."""
    words = [" A", " lone", " steed", ","] if answer_loops else [f" w{i}" for i in range(64)]
    ids = [words.index(w) for w in words] * (64 // len(words)) if answer_loops else list(range(64))
    pieces = (words * (64 // len(words)))[:64]
    standard = racing.Side("standard", "Big", 0)
    for i in range(64):
        standard.apply(round_event(i, (), 0, [ids[i]], [pieces[i]], 0.1 + 0.001 * (i % 2)))
    speculative = racing.Side("speculative", "Big + head + n-gram", 3)
    for r in range(16):
        chunk = slice(4 * r, 4 * r + 4)
        event = round_event(r, ids[chunk][:3], 3, ids[chunk], pieces[chunk], 0.17)
        speculative.apply(Round(**{**event.__dict__, "source": "ngram" if lookup else "model"}))
    return standard, speculative


def test_a_speedup_from_lookup_on_a_looping_answer_says_so():
    """Most accepted drafts from prompt lookup on an answer that repeats itself: the headline
    and the summary say that the speed came from the loop, not from drafting a reader would see
    on text that moves on; lookup on text that does not repeat, or a model's drafts on a loop,
    are a plain speedup."""
    standard, looping = looping_sides(answer_loops=True)
    assert sides.verdict(standard, looping) == "faster" and looping.stats.repeated_share == 56 / 64
    assert looping.stats.lookup_on_repetition
    headline = view.speedup_text(standard, looping).plain
    assert headline.startswith(f"speedup {sides.speedup(standard, looping):.2f}x") and "repeating answer" in headline
    summary = view.summary(standard, looping, temp=0).plain
    assert "48 of 48 accepted drafts came from prompt lookup" in summary and "repeats itself" in summary
    assert view.as_dict(standard, looping, temp=0)["lookup_on_repetition"] is True
    for moving_on in (looping_sides(answer_loops=False), looping_sides(answer_loops=True, lookup=False)):
        assert not moving_on[1].stats.lookup_on_repetition
        assert "repeat" not in view.speedup_text(*moving_on).plain + view.summary(*moving_on, temp=0).plain
