"""Token fates as colours: shared by the race view and `chat --show-drafts`."""

from __future__ import annotations

from rich.text import Text

STYLES = {
    "accepted": "#5fd75f",
    "recovered": "#ffaf00",
    "bonus": "bold #5fafff",
    "rejected": "strike #d75f5f",
    "target": "",
}
DESCRIPTIONS = {
    "accepted": "draft token accepted",
    "recovered": "resampled after a rejection",
    "bonus": "bonus from the last verify",
    "rejected": "draft thrown away",
}


def fate_text(segments: list[tuple[str, str]], *, show_rejected: bool = False) -> Text:
    """Concatenate (text, fate) segments with each fate's style."""
    text = Text()
    for piece, fate in segments:
        if fate == "rejected" and not show_rejected:
            continue
        text.append(piece, style=STYLES.get(fate, ""))
    return text


def legend(show_rejected: bool = False) -> Text:
    fates = ["accepted", "recovered", "bonus"] + (["rejected"] if show_rejected else [])
    parts = []
    for fate in fates:
        parts += [("■ ", STYLES[fate].replace("strike ", "")), (DESCRIPTIONS[fate], "dim"), ("   ", "")]
    return Text.assemble(*parts[:-1])
