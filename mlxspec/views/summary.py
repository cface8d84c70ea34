"""One-line summaries of a generation's statistics."""

from __future__ import annotations

from rich.text import Text

from ..events import Stats


def stats_line(stats: Stats, *, estimate: float | None = None, reused: int | None = None) -> Text:
    """e.g. `64 tokens · 41.3 tok/s · α 0.72 · τ 3.10 · γ 4 · prefill 0.05 s (12 tokens)`.
    `estimate`: a speedup estimate to show; `reused`: prompt tokens the caches already held."""
    parts = [f"{stats.tokens} tokens"]
    if stats.tokens_per_second:
        parts.append(f"{stats.tokens_per_second:.1f} tok/s")
    if stats.acceptance_rate is not None:
        parts.append(f"α {stats.acceptance_rate:.2f}")
    if stats.gamma and stats.tokens_per_round:
        parts.append(f"τ {stats.tokens_per_round:.2f}")
    if estimate:
        parts.append(f"≈{estimate:.2f}x est.")
    if stats.gamma == "auto":
        detail = (
            f"mean {stats.mean_gamma:.1f}, {stats.plain_rounds} plain steps" if stats.mean_gamma is not None else ""
        )
        parts.append(f"γ auto ({detail})" if detail else "γ auto")
    else:
        parts.append(f"γ {stats.gamma}" if stats.gamma else "no draft")
    if stats.ngram_rounds:
        parts.append(f"{stats.ngram_rounds} n-gram rounds")
    if stats.early_stops:
        parts.append(f"{stats.early_stops} early stops")
    if stats.transfers_per_token:
        parts.append(f"{stats.transfers_per_token:.2f} transfers/token")
    read = (
        f"{stats.prompt_tokens - reused} new of {stats.prompt_tokens}"
        if reused is not None
        else f"{stats.prompt_tokens}"
    )
    parts.append(f"prefill {stats.prefill_seconds:.2f} s ({read} tokens)")
    if stats.finish_reason not in (None, "eos", "length", "stop"):
        parts.append(stats.finish_reason)
    return Text(" · ".join(parts), style="dim")
