"""One-line summaries of a generation's statistics."""

from __future__ import annotations

from rich.text import Text

from ..events import Stats


def stats_line(stats: Stats, *, speedup: float | None = None) -> Text:
    """e.g. `64 tokens · 41.3 tok/s · α 0.72 · τ 3.10 · γ 4 · prefill 0.05 s (12 tokens)`."""
    parts = [f"{stats.tokens} tokens"]
    if stats.tokens_per_second:
        parts.append(f"{stats.tokens_per_second:.1f} tok/s")
    if stats.acceptance_rate is not None:
        parts.append(f"α {stats.acceptance_rate:.2f}")
    if stats.gamma and stats.tokens_per_round:
        parts.append(f"τ {stats.tokens_per_round:.2f}")
    parts.append(f"γ {stats.gamma}" if stats.gamma else "no draft")
    if speedup is not None:
        parts.append(f"{speedup:.2f}x")
    parts.append(f"prefill {stats.prefill_seconds:.2f} s ({stats.prompt_tokens} tokens)")
    if stats.finish_reason not in (None, "eos", "length", "stop"):
        parts.append(stats.finish_reason)
    return Text(" · ".join(parts), style="dim")
