"""Tables for `mlxspec bench`: one row per setting, speedups by category, the cost model."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..drafting.verdict import PLAUSIBLE_VS_PREDICTED, TAU_SLACK
from .summary import position_part


def _num(value, fmt: str, missing: str = "–") -> str:
    return missing if value is None else format(value, fmt)


NOISE_MARK = "≈"  # a speedup whose distance from 1 is below the repeats' spread
PLAIN = "plain"  # no draft accepted: standard decoding under another name, never a speedup


def _speedup(value: float | None, verdict: str | None = None) -> Text:
    if value is None:
        return Text("–")
    if verdict == "plain":
        return Text(PLAIN, style="yellow")
    if verdict == "noise":
        return Text(f"{value:.2f}x{NOISE_MARK}", style="yellow")
    style = "green" if value >= 1.05 else "red" if value < 0.95 else "yellow"
    return Text(f"{value:.2f}x", style=style)


def _alpha(stats) -> str:
    return _num(stats.shown_acceptance_rate, ".2f")


def noise_note(report) -> Text:
    """Under the table, when a setting decoded plainly or its speedup is inside the noise."""
    overall = [s for s in report.settings if s.category == "all"]
    verdicts = {s.verdict for s in overall}
    notes = []
    if "noise" in verdicts:
        one_run = any(s.spread is None for s in overall if s.verdict == "noise")
        notes.append(
            f"{NOISE_MARK} within noise: the speedup differs from 1 by less than the spread of its repeats' speedups "
            "(± half their range)"
            + (
                "; with one repeat no spread is measured, so no speedup is told from noise (--repeats 3)"
                if one_run
                else ""
            )
        )
    if "plain" in verdicts:
        notes.append(f"{PLAIN}: decoded plainly, no draft paid here; same speed as standard")
    return Text("\n".join(notes), style="yellow")


DOUBTFUL_MARK = "†"


def _vs_predicted(s) -> Text:
    if s.vs_predicted is None:
        return Text(f"–{DOUBTFUL_MARK}", style="yellow") if s.unexplained else Text("–")
    return (
        Text(f"{s.vs_predicted:.2f}{DOUBTFUL_MARK}", style="yellow") if s.unexplained else Text(f"{s.vs_predicted:.2f}")
    )


def doubt_note(report) -> Text:
    """Under the table, when a speedup is more (or less) than the run's own figures explain,
    or the verify curve was timed below 1."""
    notes = []
    if any(s.unexplained for s in report.settings if s.category == "all"):
        low, high = PLAUSIBLE_VS_PREDICTED
        notes.append(
            f"{DOUBTFUL_MARK} a speedup the run's own α, τ, c and v do not explain: measured/predicted outside "
            f"{low:g}–{high:g}, or above τ by more than {TAU_SLACK:.0%} (each pass of the target gave τ tokens and "
            "costs at least a target step); the machine was probably busy or idle unevenly: run the bench again "
            "before trusting the figure"
        )
    if noisy := report.costs.noisy_verify:
        which = ", ".join(f"v({k})" for k in noisy)
        notes.append(
            f"{DOUBTFUL_MARK} {which} below 1: a longer pass of the target timed faster than a 1-token one, which it "
            "cannot be; timing noise, so the predictions take 1 there"
        )
    return Text("\n".join(notes), style="yellow")


def costs_line(report) -> Text:
    costs = report.costs
    curve = " ".join(f"{v:.2f}" + (DOUBTFUL_MARK if v < 1 else "") for v in costs.verify_curve)
    return Text.assemble(
        ("cost model  ", "bold"),
        f"c = {costs.c:.3f} (draft {costs.draft_step * 1e3:.2f} ms / target {costs.target_step * 1e3:.2f} ms "
        f"per token)   ",
        f"v(k), k=1..{len(costs.verify_curve)}: {curve}",
    )


def settings_table(report, *, wide: bool = True, drafting: bool = True) -> Table:
    """One row per temperature and γ. Narrow (`wide=False`): mlxspec's own figures only,
    the peer and drafting columns go to `peer_table`; `drafting` False: the drafting column
    goes there alone (its free text too wide for the line beside the figures)."""
    peers = wide and any(s.peer_speculative_tps for s in report.settings)
    extras = (
        wide
        and drafting
        and any(s.stats.lookup_rounds or s.stats.early_stops or s.gamma == "auto" or s.tree for s in report.settings)
    )
    # no padding at the edges: the narrow table's figures fit 80 columns whole, marks and all
    table = Table(title="All prompts", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    names = ("T", "γ", "std tok/s", "spec tok/s", "speedup", "±", "α", "τ", "predicted", "meas/pred")
    if not wide:
        names = ("T", "γ", "std/s", "spec/s", "speedup", "±", "α", "τ", "pred.", "m/p")
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    if extras:
        table.add_column("drafting", no_wrap=True)
    if peers:
        for name in ("mlx-lm spec tok/s", "mlx-lm α", "vs mlx-lm"):
            table.add_column(name, justify="right", no_wrap=True)
    for s in (s for s in report.settings if s.category == "all"):
        row = [
            f"{s.temp:g}",
            s.label,
            _num(s.standard_tps, ".1f"),
            _num(s.speculative_tps, ".1f"),
            _speedup(s.speedup, s.verdict),
            _num(s.spread, ".2f"),
            _alpha(s.stats),
            _num(s.stats.tokens_per_round, ".2f"),
            _num(s.predicted_speedup, ".2f", "–") + ("x" if s.predicted_speedup else ""),
            _vs_predicted(s),
        ]
        if extras:
            row.append(_drafting(s, by_position=bool(report.pair.get("drafting"))))
        if peers:
            row += _peer_cells(s)
        table.add_row(*row)
    return table


def peer_table(report, *, peers: bool = True) -> Table:
    """The second table: how each setting drafted, and mlx-lm beside it (`peers`, where it was
    measured). Only the drafting text wraps: every figure stays whole."""
    peers = peers and _peers_measured(report)  # else no mlx-lm columns: a note under the table says why
    table = Table(
        title="Drafting, and mlx-lm on the same settings" if peers else "Drafting",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
    )
    names = ("T", "γ", "drafting") + (("mlx-lm spec tok/s", "mlx-lm α", "vs mlx-lm") if peers else ())
    for name in names:
        if name == "drafting":
            table.add_column(name, ratio=1)  # takes what the figures leave, wrapping between words
        else:
            table.add_column(name, justify="right", no_wrap=True)
    for s in (s for s in report.settings if s.category == "all"):
        cells = [f"{s.temp:g}", s.label, _drafting(s, by_position=bool(report.pair.get("drafting")))]
        table.add_row(*cells, *(_peer_cells(s) if peers else []))
    return table


def _peer_cells(s) -> list[str]:
    return [
        _num(s.peer_speculative_tps, ".1f"),
        _num(s.peer_acceptance_rate, ".2f"),
        _num(s.vs_peer, ".2f") + ("x" if s.vs_peer else ""),
    ]


def _drafting(s, *, by_position: bool = False) -> str:
    parts = []
    # α per depth: whether chaining pays for a head; for a tree, what each level adds
    if (by_position or s.stats.tree_rounds) and (positions := position_part(s.stats)):
        parts.append(positions)
    if s.stats.mean_gamma is not None and s.gamma == "auto":  # over the rounds that drafted, plain steps apart
        parts.append(f"mean γ {s.stats.mean_gamma:.1f} when drafting")
    if s.stats.plain_rounds:
        parts.append(f"{s.stats.plain_rounds} plain")
    if s.stats.tree_rounds:
        parts.append(f"{s.stats.nodes_per_tree:.1f} nodes/tree round")
    if s.stats.ngram_rounds:
        parts.append(f"{s.stats.ngram_rounds} n-gram")
    if s.stats.history_rounds:
        parts.append(f"{s.stats.history_rounds} history")
    if s.stats.early_stops:
        parts.append(f"{s.stats.early_stops} early stops")
    return ", ".join(parts)


def category_table(report) -> Table:
    keys = [(s.temp, s.gamma, s.tree) for s in report.settings if s.category == "all"]
    table = Table(title="Speedup (α) by category", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("category")
    for temp, gamma, tree in keys:
        table.add_column(f"T{temp:g} γ{gamma}" + (f" t{tree}" if tree != "auto" else ""), justify="right")
    for category in sorted({s.category for s in report.settings} - {"all"}):
        by_key = {(s.temp, s.gamma, s.tree): s for s in report.settings if s.category == category}
        cells = []
        for key in keys:
            s = by_key.get(key)
            cell = _speedup(s.speedup if s else None, s.verdict if s else None)
            if s and s.speedup is not None and s.stats.tested:  # nothing decoded: no α either
                cell.append(f" ({_alpha(s.stats)})", style="dim")
            cells.append(cell)
        table.add_row(category, *cells)
    return table


def standard_line(report) -> Text:
    """Standard decoding against mlx-lm's own: the baseline must be honest."""
    parts = {}  # one per temperature (its settings share the standard runs)
    for s in report.settings:
        if s.category == "all" and s.peer_standard_tps is not None:
            parts.setdefault(
                s.temp,
                f"T{s.temp:g}: mlxspec {_num(s.standard_tps, '.1f')} tok/s, mlx-lm {s.peer_standard_tps:.1f} tok/s",
            )
    parts = list(parts.values())
    return Text("standard decoding  " + "; ".join(parts), style="dim") if parts else Text("")


def recommendation(report) -> Text:
    """The setting to use at each temperature, where the repeats measured a spread: from one
    run, none (the best said, with what measures it); a figure the run cannot explain marked."""
    temps = sorted({s.temp for s in report.settings})
    parts = []
    for temp in temps:
        best = report.best(temp)
        if best is None:
            continue
        if not best.replicated:
            parts.append(
                f"T{temp:g}: none from one repeat (best γ {best.label} gave {best.speedup:.2f}x with no spread "
                "measured; --repeats 3 measures it)"
            )
        elif best.unexplained:
            parts.append(
                f"T{temp:g}: none yet (best γ {best.label} gave {best.speedup:.2f}x{DOUBTFUL_MARK}, more than the "
                "run's own figures explain: run the bench again)"
            )
        elif best.verdict == "noise":
            parts.append(
                f"T{temp:g}: no measurable difference (best γ {best.label} gives {best.speedup:.2f}x, within its "
                f"repeats' spread ±{best.spread:.2f})"
            )
        elif best.speedup < 1.0:
            parts.append(f"T{temp:g}: standard decoding (best γ {best.label} gives {best.speedup:.2f}x)")
        else:
            parts.append(f"T{temp:g}: γ {best.label} ({best.speedup:.2f}x)")
    return Text.assemble(("recommended  ", "bold"), "; ".join(parts))


def legend(report, *, wide: bool) -> Text:
    """What the table's columns and the cost model's figures mean, in words (under the table)."""
    columns = [
        "T temperature (0: greedy)",
        "γ draft tokens per round (auto: chosen each round, 0 for a plain step; its mean γ under drafting counts "
        "the rounds that drafted, the plain steps apart)",
        f"{'std/s' if not wide else 'std tok/s'}, {'spec/s' if not wide else 'spec tok/s'}: tokens a second of "
        "standard and speculative decoding",
        f"speedup: speculative over standard ({NOISE_MARK}: within noise)",
        "±: half the range of the repeats' speedups",
        "α: the share of the drafts the target checked that it accepted",
        "τ: tokens per pass of the target",
        f"{'pred.' if not wide else 'predicted'}: the speedup the theory gives from α, c and v",
        f"{'m/p' if not wide else 'meas/pred'}: measured over predicted",
        "c: a draft step's time over a target step's",
        "v(k): a k-token pass of the target over a 1-token one",
    ]
    if _peers_measured(report):
        columns.append("mlx-lm: its own speculative decoding on the same pair and settings")
    return Text("; ".join(columns) + ".", style="dim")


def _peers_measured(report) -> bool:
    return any(s.peer_speculative_tps for s in report.settings)


def notes_text(report) -> Text:
    """What could not be measured, and why (a peer left out)."""
    return Text("\n".join(report.notes), style="yellow")


def _seconds(report) -> str:
    def said(seconds: float) -> str:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"

    estimate = getattr(report, "estimated_seconds", None)  # of the sweep, after the cost model
    return f"{said(report.seconds)} (sweep estimated {said(estimate)})" if estimate else said(report.seconds)


def render(report, width: int = 160) -> Group:
    """Everything; below 140 columns the wide table splits in two."""
    drafting = report.pair.get("drafting")
    models = (
        f"{report.pair['target']} · drafting: {drafting}"
        if drafting
        else f"{report.pair['target']} + {report.pair['draft'] or 'prompt lookup'}"
    )
    header = Text(
        f"{models}  ·  {report.machine.get('device')}  ·  "
        f"mlx {report.machine.get('mlx')}, mlx-lm {report.machine.get('mlx_lm')}  ·  {_seconds(report)}",
        style="bold",
    )
    wide, tables = _tables(report, width)
    notes = [note for note in (noise_note(report), doubt_note(report), notes_text(report)) if note.plain]
    return Group(
        header,
        costs_line(report),
        *tables,
        legend(report, wide=wide),
        *notes,
        category_table(report),
        standard_line(report),
        recommendation(report),
    )


WIDE = 140  # columns from which the figures, the drafting and mlx-lm's may share one table


def _tables(report, width: int) -> tuple[bool, list[Table]]:
    """The widest layout whose figures fit `width` whole: one table; the figures with mlx-lm's,
    then the drafting text under them, wrapped; mlxspec's figures, then the drafting and
    mlx-lm's. (Whether the layout is wide, the tables.)"""
    drafted = any(_drafting(s) for s in report.settings if s.category == "all")
    if width >= WIDE:
        whole = settings_table(report)
        if _width(whole) <= width:
            return True, [whole]
        figures = settings_table(report, drafting=False)
        if _width(figures) <= width:
            return True, [figures] + ([peer_table(report, peers=False)] if drafted else [])
    second = _peers_measured(report) or drafted
    return False, [settings_table(report, wide=False)] + ([peer_table(report)] if second else [])


def _width(table: Table) -> int:
    """Cells the table takes with nothing wrapped."""
    console = Console(width=10_000, file=io.StringIO())
    return console.measure(table).maximum


def csv_rows(report) -> list[dict]:
    def rounded(value, digits):
        return None if value is None else round(value, digits)

    rows = []
    for r in report.runs:
        stats = r.stats
        rows.append(
            {
                "prompt": r.prompt,
                "category": r.category,
                "method": r.method,
                "mode": r.mode,
                "gamma": r.gamma,
                "temp": r.temp,
                "tokens": r.tokens,
                "tokens_per_second": rounded(r.tokens_per_second, 3),
                "acceptance_rate": rounded(stats.acceptance_rate, 4),
                "drafts_tested": stats.tested,
                "tokens_per_round": rounded(stats.tokens_per_round, 3),
                "peak_memory_gb": rounded(r.peak_memory_gb, 3),
            }
        )
    return rows
