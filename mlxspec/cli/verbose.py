"""`--verbose`: say how this machine is set up for MLX (which BLAS, and why) before the command
runs. Accepted before the command (`mlxspec --verbose generate …`) and after it
(`mlxspec generate … --verbose`), and said once either way."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Annotated, get_type_hints

import typer
from rich.text import Text

from . import blas
from .common import err

VERBOSE_ENV = "MLXSPEC_VERBOSE"
HELP = (
    f"Say how this machine is set up for MLX (which BLAS, and why) before the command runs; {VERBOSE_ENV}=1 does "
    "the same."
)
VerboseOption = Annotated[bool, typer.Option("--verbose", help=HELP)]
_SAID = "mlxspec.setup_said"  # in the root context's meta: said once per command line


def asked(verbose: bool) -> bool:
    return verbose or os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


def say_setup(ctx: typer.Context) -> None:
    """The BLAS line on stderr, once per command line however often --verbose was given."""
    root = ctx.find_root()
    if root.meta.get(_SAID):
        return
    root.meta[_SAID] = True
    err.print(Text(blas.describe(), style="dim"), soft_wrap=True)


def with_verbose(fn: Callable) -> Callable:
    """The command `fn` with a --verbose option of its own (and the context, to say it once)."""
    hints = get_type_hints(fn, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()]
    # typer hands the context to one parameter only: the command's own, where it takes one
    named = next((p.name for p in own if p.annotation is typer.Context), None)
    added = [inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=VerboseOption)]
    if named is None:
        added.append(inspect.Parameter("verbose_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

    @functools.wraps(fn)
    def command(*args, verbose: bool = False, verbose_context: typer.Context | None = None, **kwargs):
        if asked(verbose):
            say_setup(verbose_context if named is None else kwargs[named])
        return fn(*args, **kwargs)

    params = own + added
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}  # resolved: typer reads them here
    return command
