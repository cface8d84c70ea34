"""`mlxspec bench`: measured speedups on this machine, against the theory and mlx-lm."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..errors import InvalidOption
from .common import err, load, wide_console, writable, write_text
from .options import Models, model_options


def _number_list(text: str, kind, name: str) -> list:
    """Comma-separated values, each read by `kind` (an InvalidOption or a ValueError refuses
    it); an empty item is a slip ("0,,8"), not a value to skip."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise InvalidOption(f"{name} is empty: give a comma-separated list, e.g. 2,4,6")
    if not all(parts):
        raise InvalidOption(f"{name} has an empty item in {text!r}: give a comma-separated list, e.g. 2,4,6")
    try:
        return [kind(part) for part in parts]
    except ValueError:
        raise InvalidOption(f"{name} takes a comma-separated list, e.g. 2,4,6; got {text!r}") from None


DEFAULT_GAMMAS = "auto,2,4,6"


@model_options(exclude=("no_draft", "max_kv_size", "kv_bits"))
def bench(
    *,
    models: Models,
    gamma: Annotated[
        Optional[str],
        typer.Option(
            "--gamma",
            "-g",
            metavar="LIST",
            help=f"Draft lengths to sweep (1 to 64), e.g. 1,2,3,4,6,8 or auto,2,4. Default: {DEFAULT_GAMMAS} (--quick: "
            "auto and the pair's recommended length, a preset's γ or 4).",
            show_default=False,
        ),
    ] = None,
    tree: Annotated[
        Optional[str],
        typer.Option(
            "--tree",
            metavar="LIST",
            help="Tree sizes to sweep beside each γ (0 to 256), e.g. 0,8,16,auto (0: chains). "
            "Default: auto, as generate drafts.",
            show_default=False,
        ),
    ] = None,
    temp: Annotated[
        Optional[str],
        typer.Option(
            "--temp",
            metavar="LIST",
            help="Temperatures to sweep, e.g. 0,0.7,1.0. Default: 0,1 (--quick: 0).",
            show_default=False,
        ),
    ] = None,
    prompts: Annotated[
        Optional[str],
        typer.Option(
            "--prompts",
            metavar="FILE",
            help='Your own prompts: a JSON-lines file of {"prompt": ..., "category": ...}.',
            show_default=False,
        ),
    ] = None,
    max_tokens: Annotated[
        Optional[int],
        typer.Option(
            "--max-tokens",
            "-m",
            metavar="N",
            help="Tokens per generation. Default: 128 (--quick: 64).",
            show_default=False,
        ),
    ] = None,
    repeats: Annotated[
        Optional[int],
        typer.Option(
            "--repeats",
            metavar="N",
            help="Runs per setting; the median speed is reported. Default: 3 (--quick: 1).",
            show_default=False,
        ),
    ] = None,
    no_peers: Annotated[bool, typer.Option("--no-peers", help="Skip mlx-lm's own generation.")] = False,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="A short run (a minute or two for smollm2 on a 2-core CPU): one prompt per category, γ auto and the "
            "pair's recommended length, T 0, 64 tokens, one repeat.",
        ),
    ] = False,
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Seed of the first repeat (the next ones add 1).")
    ] = 0,
    raw: Annotated[bool, typer.Option("--raw", help="Use the prompts as they are, without the chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print every measurement as one JSON object.")] = False,
    csv_file: Annotated[
        Optional[str],
        typer.Option("--csv", metavar="FILE", help="Also write one row per run to this CSV file.", show_default=False),
    ] = None,
    plot_file: Annotated[
        Optional[str],
        typer.Option(
            "--plot",
            metavar="FILE.png",
            help="Also plot speedup against γ (measured and predicted) to this PNG (needs matplotlib).",
            show_default=False,
        ),
    ] = None,
):
    """Measure speedup, acceptance and costs on this machine, against the theory and mlx-lm.

    Example: mlxspec bench --pair smollm2 --temp 0,0.7 --plot speedup.png
    """
    from ..decoding.sampling import SamplingParams
    from ..measure import prompts as suites
    from ..measure.bench import BenchConfig, plan_size, run_bench
    from ..views import bench as view

    config = BenchConfig(
        prompts=suites.load_jsonl(prompts) if prompts else suites.suite(quick),
        gammas=_number_list(_given(gamma, "auto" if quick else DEFAULT_GAMMAS), str, "--gamma"),
        temps=_number_list(_given(temp, "0" if quick else "0,1"), float, "--temp"),
        trees=_number_list(_given(tree, "auto"), str, "--tree"),
        max_tokens=max_tokens if max_tokens is not None else (64 if quick else 128),
        repeats=repeats if repeats is not None else (1 if quick else 3),
        peers=not no_peers,
        seed=seed,
        raw=raw,
    )
    if any(g != "auto" and g < 1 for g in config.gammas):
        raise InvalidOption("--gamma values must be >= 1 or auto (standard decoding is always measured)")
    if config.repeats < 1 or config.max_tokens < 1:
        raise InvalidOption("--repeats and --max-tokens must be >= 1")
    for t in config.temps:
        SamplingParams(temp=t)
    csv_path, plot_path = writable(csv_file, "CSV"), writable(plot_file, "plot")
    if plot_path:
        _require_matplotlib()
    pair = load(models)
    if pair.draft is None and not pair.ngram:
        raise InvalidOption("bench needs a draft model (or --draft ngram)")
    if quick and gamma is None:  # auto, and the fixed length the pair recommends (a preset's γ, else 4)
        config.gammas = ["auto", pair.gamma_hint]
    report = _with_progress(
        lambda step: run_bench(pair, config, step, on_note=_note), lambda: plan_size(config), "Benchmarking"
    )
    if csv_path:
        write_text(csv_path, _csv(view.csv_rows(report)), "CSV")
    if plot_path:
        from ..views.plot import plot_speedup

        plot_speedup(report, str(plot_path))
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        console = wide_console()
        console.print(view.render(report, console.width))


def _given(text: str | None, default: str) -> str:
    """An option's text, or its default where it was left out (not where it is empty)."""
    return default if text is None else text


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidOption("--plot needs matplotlib: pip install 'mlxspec[plot]'") from None


def _csv(rows: list[dict]) -> str:
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["prompt"])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _note(line: str) -> None:
    err.print(Text(line, style="dim"), soft_wrap=not err.is_terminal)


def _with_progress(work, total, label: str):
    """Run work(step) with a progress bar on stderr; `step(description)` begins a counted step
    (the last one done), `step(description, counted=False)` one the bar does not count (a
    warm-up). `total()`: the counted steps to make, asked at each step (the plan shrinks where
    a peer is off), so that the bar's count is the plan's."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task(label, total=total())
        counting = False  # the step under way is one the bar counts

        def step(description: str, counted: bool = True) -> None:
            nonlocal counting
            if counting:
                progress.advance(task)
            counting = counted
            progress.update(task, description=description, total=total())

        return work(step)
