"""Token fates as colours: shared by the race view and `chat --show-drafts`."""

from __future__ import annotations

from rich.text import Text

from ..text import Reasoning

STYLES = {
    "accepted": "#5fd75f",
    "recovered": "#ffaf00",
    "bonus": "bold #5fafff",
    "rejected": "strike #d75f5f",
    "target": "",
}
DESCRIPTIONS = {
    "accepted": "draft token accepted",
    "recovered": "recovered after a rejection",
    "bonus": "bonus from the last verify",
    "rejected": "draft thrown away",
}


def fate_text(segments: list[tuple[str, str]], *, show_rejected: bool = False) -> Text:
    """Concatenate (text, fate) segments with each fate's style, reasoning (<think> to
    </think>) dimmed."""
    text, reasoning = Text(), Reasoning()
    for piece, fate in segments:
        if fate == "rejected":  # not part of the text: shown (or not), never a tag
            if show_rejected:
                text.append(piece, style=_dimmed(STYLES[fate], reasoning.thinking))
            continue
        for part, thinking in reasoning.split(piece):
            text.append(part, style=_dimmed(STYLES.get(fate, ""), thinking))
    return text


def _dimmed(style: str, thinking: bool) -> str:
    return f"{style} dim".strip() if thinking else style


def legend(show_rejected: bool = False):
    """One entry per fate; on a narrow screen an entry moves to the next line whole."""
    from .summary import PartsLine

    fates = ["accepted", "recovered", "bonus"] + (["rejected"] if show_rejected else [])
    entries = [
        Text.assemble(("■ ", STYLES[fate].replace("strike ", "")), (DESCRIPTIONS[fate], "dim")) for fate in fates
    ]
    return PartsLine(entries, style="", separator="   ")
