"""A spinner for a wait that is usually short: reading the prompt before the first token.
Shown on a terminal only once the wait has lasted a second, so that a quick prompt shows
nothing; it goes away, leaving no line, when the wait ends. (MLX releases the GIL while it
computes, so rich's refresh thread turns the spinner while the models read.)"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

SHOW_AFTER = 1.0  # seconds of waiting before the spinner appears


@contextmanager
def spinner_after(console: Console, message: Callable[[], str], *, delay: float = SHOW_AFTER) -> Iterator[None]:
    """Around a block that may wait: after `delay` seconds, a spinner with `message()` (asked
    then, so that what it counts is counted only for a long wait) and the seconds elapsed
    since the block began."""
    if not console.is_terminal:
        yield
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", style="dim"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("", total=None)  # its clock starts now
    lock, ended = threading.Lock(), False

    def show() -> None:
        try:
            text = message()
        except Exception:  # a label is never worth an error: the block reports its own
            text = "Reading the prompt"
        with lock:
            if not ended:
                progress.update(task, description=f"{text}…")
                progress.start()

    timer = threading.Timer(delay, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            ended = True
            progress.stop()  # nothing to stop when it was never shown


def reading(tokens: int | None, *, warming_up: bool = False) -> str:
    """The spinner's words: what is being read, and how many tokens."""
    what = f"Reading the prompt ({tokens} token{'' if tokens == 1 else 's'})" if tokens else "Reading the prompt"
    return f"Warming up both sides and {what[0].lower()}{what[1:]}" if warming_up else what
