"""The prompt-reading spinner: shown on a terminal only when the wait is long, with what it
counts, and gone when the wait ends."""

from __future__ import annotations

import io
import time

from rich.console import Console

from mlxspec.views.progress import reading, spinner_after


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=80), out


def shown(out: io.StringIO, text: str, *, patience: float = 60.0) -> bool:
    """Whether `text` reaches the console within `patience` seconds: waited for, not slept for,
    so that a loaded machine only makes it later (the block lasts until it is shown)."""
    deadline = time.monotonic() + patience
    while text not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    return text in out.getvalue()


def test_a_long_wait_shows_the_spinner_with_its_words():
    console, out = terminal()
    asked = []

    def words() -> str:
        asked.append(True)
        return reading(412)

    with spinner_after(console, words, delay=0.05):
        assert shown(out, "Reading the prompt (412 tokens)…")
    assert asked == [True]


def test_a_short_wait_shows_nothing_and_counts_nothing():
    console, out = terminal()
    asked = []
    with spinner_after(console, lambda: asked.append(True) or "never", delay=0.5):
        pass
    time.sleep(0.6)  # past the delay: the timer was cancelled, nothing appears late
    assert out.getvalue() == "" and not asked


def test_not_a_terminal_shows_nothing():
    out = io.StringIO()
    with spinner_after(Console(file=out, force_terminal=False), lambda: "x", delay=0.01):
        time.sleep(0.1)
    assert out.getvalue() == ""


def test_words_that_fail_fall_back_and_the_block_error_passes_through():
    console, out = terminal()

    def broken() -> str:
        raise TypeError("the tokenizer could not read it")

    try:
        with spinner_after(console, broken, delay=0.01):
            assert shown(out, "Reading the prompt…")
            raise ValueError("the block's own error")
    except ValueError as e:
        assert "own error" in str(e)


def test_the_words():
    assert reading(1) == "Reading the prompt (1 token)"
    assert reading(None) == "Reading the prompt"
    assert reading(30, warming_up=True) == "Warming up both sides and reading the prompt (30 tokens)"
