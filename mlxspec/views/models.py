"""`mlxspec models`: the presets, whether each model is in the local Hugging Face cache, its
size on disk, and whether the pair fits this machine."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

WIDE = 120  # columns from which the presets are a table; below, a list


def inventory() -> list[dict]:
    """One dict per preset (also the --json output)."""
    from ..loading import folder_bytes, local_copy
    from ..pairs import MTP_DRAFT, machine_memory
    from ..presets import load_presets, resolve_name

    memory = machine_memory()
    rows = []
    for preset in load_presets().values():
        row = {
            "name": preset.name,
            "target": preset.target,
            "target_fallback": preset.target_fallback,
            "draft": preset.draft,
            "gamma": preset.gamma,
            "memory_gb": preset.memory_gb,
            "fits": None if preset.memory_gb is None else preset.memory_gb * 1e9 <= memory,
            "suits": list(preset.suits),
            "description": preset.description,
        }
        row["mtp_head"] = preset.draft == MTP_DRAFT  # the target's own head: nothing else to fetch
        for role, names in (("target", [preset.target, preset.target_fallback]), ("draft", [preset.draft])):
            if role == "draft" and row["mtp_head"]:
                row["draft_downloaded"], row["draft_bytes"] = row["target_downloaded"], None
                continue
            local = next((path for n in names if n and (path := local_copy(resolve_name(n)))), None)
            row[f"{role}_downloaded"] = local is not None
            row[f"{role}_bytes"] = folder_bytes(local) if local else None
        rows.append(row)
    return rows


def _draft(row: dict) -> str:
    return "the model's own MTP head" if row.get("mtp_head") else row["draft"]


def _size(n: int | None) -> str:
    if n is None:
        return "–"
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def _have(flag: bool) -> Text:
    return Text("✓", style="green") if flag else Text("·", style="dim")


def models_table(rows: list[dict]) -> Table:
    table = Table(title="Model-pair presets (--pair NAME)", title_justify="left", header_style="bold")
    table.add_column("name", no_wrap=True)
    for name in ("target", "draft"):  # long repo ids fold on narrow terminals
        table.add_column(name, overflow="fold")
    for name, justify in (("γ", "right"), ("on disk", "right"), ("memory", "right"), ("fits", "center")):
        table.add_column(name, justify=justify, no_wrap=True)
    for row in rows:
        on_disk = None
        if row["target_bytes"] is not None or row["draft_bytes"] is not None:
            on_disk = (row["target_bytes"] or 0) + (row["draft_bytes"] or 0)
        fits = {True: Text("yes", style="green"), False: Text("no", style="red"), None: Text("?")}[row["fits"]]
        table.add_row(
            Text(row["name"], style="bold"),
            Text.assemble(
                _have(row["target_downloaded"]),
                " ",
                row["target"],
                (f" (or {row['target_fallback']})" if row["target_fallback"] else "", "dim"),
            ),
            Text.assemble(_have(row["draft_downloaded"]), " ", _draft(row)),
            str(row["gamma"]),
            _size(on_disk),
            f"{row['memory_gb']:.1f} GB" if row["memory_gb"] else "?",
            fits,
        )
    table.caption = "✓ downloaded  · not yet (mlxspec models download NAME)"
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
        figures = [f"γ {row['gamma']}", memory, _fits(row)] + ([f"{_size(on_disk)} on disk"] if on_disk else [])
        lines.append(
            Text.assemble(
                (row["name"], "bold"),
                "  ",
                Text(" · ").join(Text(str(f)) if isinstance(f, str) else f for f in figures),
            )
        )
        for role in ("target", "draft"):
            shown = _draft(row) if role == "draft" else row[role]
            lines.append(Text.assemble("  ", _have(row[f"{role}_downloaded"]), f" {role:<6} ", shown))
    lines.append(Text("✓ downloaded  · not yet (mlxspec models download NAME)", style="dim"))
    return Group(*lines)
