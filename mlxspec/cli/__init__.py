"""The `mlxspec` command: one module per command, options declared once (options.py).

Every failure the user can fix arrives as an MlxspecError and leaves as one line on stderr
with a non-zero exit code (2 for bad options, 1 for models and machine, 130 for Ctrl-C); MLX
and mlx-lm are imported inside commands so `--help` is fast.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..distributed import ranks
from ..errors import MlxspecError
from ..models import backend
from . import blas
from .bench import bench
from .cache_prompt import cache_prompt
from .chat import chat
from .common import error
from .generate import generate
from .models import models_app
from .race import race
from .serve import serve
from .train_draft import train_draft
from .verbose import VerboseOption, asked, say_setup, with_verbose

FOLLOWER_EXIT_DELAY = 2.0  # seconds a rank other than 0 waits before exiting on what every rank finds


def _plain_arguments() -> None:
    """Typer 0.2x writes a required argument as {PROMPT} in the usage line and puts its type
    beside its name (PROMPT <str>); the metavars already say what to type. Usage: PROMPT,
    [PROMPT] when optional. (Guarded: a typer without these methods keeps its own.)"""
    from typer import core

    argument = getattr(core, "TyperArgument", None)
    if argument is None or not hasattr(argument, "_usage_display_name"):
        return

    def usage(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    argument._usage_display_name = usage
    argument.display_type_rich = lambda self, ctx: None


_plain_arguments()

app = typer.Typer(
    help="Speculative decoding on MLX: a small draft model proposes, the big target verifies. "
    "Faster generation with exactly the target's output.",
    add_completion=False,
    no_args_is_help=True,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _app(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Show the version and exit.")] = False,
    verbose: VerboseOption = False,
):
    """Speculative decoding on MLX: a small draft model proposes, the big target verifies.
    Faster generation with exactly the target's output."""
    if asked(verbose):
        say_setup(ctx)
    if version:
        from .. import __version__

        print(f"mlxspec {__version__}")
        raise typer.Exit()


# --verbose before the command (the callback above) or after it (each command's own)
app.command()(with_verbose(generate))
app.command()(with_verbose(chat))
app.command()(with_verbose(race))
app.command()(with_verbose(bench))
app.command()(with_verbose(serve))
app.command("cache-prompt")(with_verbose(cache_prompt))
app.command("train-draft")(with_verbose(train_draft))
app.add_typer(models_app, name="models")


def _is_usage_error(e: Exception) -> bool:
    """Typer's parse errors (click's ClickException, vendored in recent typer): they carry a
    message and an exit code."""
    return hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int)


def _is_bare_group(e: Exception) -> bool:
    """A group named with nothing after it (a bare `mlxspec`): click answers with its help as a
    usage error and exit 2 since 8.2; asked for nothing wrong, the help goes to stdout, exit 0.
    Recognised by name, as typer's rich_utils does (the class lives in click or typer._click)."""
    return type(e).__name__ == "NoArgsIsHelpError"


def _report(message: str, label: str = "error", *, every_rank: bool = True) -> None:
    """One line on stderr. Under mlx.launch it names its rank, and what every rank finds
    alike (a bad option) is said by rank 0 alone."""
    if not ranks.launched():
        error(message, label)
    elif every_rank or ranks.is_main():
        error(f"rank {ranks.rank()}: {message}", label)


def _started_as_command() -> bool:
    """This process is `mlxspec ...` or `python -m mlxspec ...` (not a test or a program
    calling main())."""
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    return started.name == "mlxspec" or started.resolve() == (Path(__file__).parent.parent / "__main__.py").resolve()


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every expected failure into one line. As the
    command, first re-execute once with OpenBLAS preloaded where that helps (blas.py)."""
    if argv is None and _started_as_command():
        blas.reexec_with_openblas()
    try:
        code = app(args=argv, prog_name="mlxspec", standalone_mode=False)
    except MlxspecError as e:
        _report(str(e), every_rank=not e.alike_on_every_rank)
        if e.alike_on_every_rank and ranks.launched() and not ranks.is_main():
            # rank 0 says it: mlx.launch ends every rank once one exits, so a follower that
            # found it first ended rank 0 before its line was out (a busy machine's CI)
            time.sleep(FOLLOWER_EXIT_DELAY)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt) as e:
        if isinstance(e.__cause__, EOFError):  # click turns any EOFError into its abort: a bug, not a Ctrl-C
            _report(f"EOFError: {e.__cause__} (MLXSPEC_DEBUG=1 shows the traceback)", "internal error")
            sys.exit(1)
        sys.exit(130)
    except Exception as e:
        if _is_bare_group(e):
            print(e.format_message())
            sys.exit(0)
        if _is_usage_error(e):
            _report(e.format_message(), every_rank=False)
            sys.exit(e.exit_code)
        if backend.missing_backend(e):
            _report(backend.NO_BACKEND)
            sys.exit(1)
        if ranks.is_lost_connection(e):
            _report(ranks.lost_connection_message(e))
            sys.exit(1)
        # a bug: say so in one line, the traceback on request
        if os.environ.get("MLXSPEC_DEBUG"):
            raise
        _report(f"{type(e).__name__}: {e} (MLXSPEC_DEBUG=1 shows the traceback)", "internal error")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
