"""`mlxspec models list`: what is on disk, by kind, with sizes, and where the caches are."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text


def size(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def disk_view(listing: dict) -> Group:
    """`listing` is `mlxspec models list --json`'s object: cache, cache_bytes, hub_cache, entries."""
    entries = listing["entries"]
    parts = []
    if entries:
        table = Table(header_style="bold", box=None, pad_edge=False)
        table.add_column("kind", no_wrap=True, style="dim")
        table.add_column("name (mlxspec models rm NAME)", overflow="fold")
        table.add_column("size", justify="right", no_wrap=True)
        for entry in entries:
            table.add_row(entry["kind"], entry["name"], size(entry["bytes"]))
        parts.append(table)
    else:
        parts.append(Text("Nothing on disk yet: models are fetched on first use (or `mlxspec models download NAME`)."))
    count, total = len(entries), sum(e["bytes"] for e in entries)
    parts.append(Text(f"{count} item{'' if count == 1 else 's'}, {size(total)}", style="bold"))
    parts.append(Text(f"mlxspec's cache: {listing['cache']} ({size(listing['cache_bytes'])} in all)", style="dim"))
    parts.append(Text(f"Hugging Face cache: {listing['hub_cache']} (only the presets' repos are listed)", style="dim"))
    return Group(*parts)
