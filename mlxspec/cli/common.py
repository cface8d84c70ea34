"""What the commands share besides their options: the consoles, loading with progress,
checking output paths before any work, and writing files."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..distributed import ranks
from ..errors import InvalidOption
from ..models.loading import Reporter
from ..text import ascii_digits
from .options import Models


def _drop_unreadable_terminal_size() -> None:
    """rich reads COLUMNS and LINES with `isdigit()` then `int()`: `COLUMNS=²` passes the first
    and fails the second in every Console, so every command died. A size that is not ASCII
    digits is no size: dropped, and the terminal's own is used. Before the first Console."""
    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name)
        if value is not None and not ascii_digits(value):
            del os.environ[name]


_drop_unreadable_terminal_size()
err = Console(stderr=True, highlight=False)


def error(message: str, label: str = "error") -> None:
    err.print(Text.assemble((f"{label}: ", "bold red"), message), soft_wrap=True)


class ConsoleReporter(Reporter):
    """Loading's progress on stderr: steps, spinners and bars for people on a terminal
    (scripts reading stderr get only errors and notes), notes always. Quick steps (finding a
    pair's models) are shown in full the first time this cache sees them, their last line
    ("Loading ...") alone after; anything slow or worth a note among them shows them all."""

    def __init__(self):
        self._bar = None
        self._held: list[str] | None = None  # a group of quick steps' lines, not shown yet

    def status(self, message: str) -> None:
        if not err.is_terminal:
            return
        line = f"{bundled_by_name(message)}…"
        if self._held is not None:
            self._held.append(line)
        else:
            err.print(Text(line, style="dim"))

    @contextmanager
    def quick_steps(self, what: str) -> Iterator[None]:
        from ..models.paths import mark_shown, shown_before

        if not err.is_terminal:
            yield
            return
        self._held = [] if shown_before(what) else None
        try:
            yield
        except BaseException:
            self._show_held()  # what led to the error
            raise
        held, self._held = self._held, None
        for line in (held or [])[-1:]:
            err.print(Text(line, style="dim"))
        mark_shown(what)

    def _show_held(self) -> None:
        """The quick steps so far, as they came: one of them is slow or has something to say."""
        held, self._held = self._held, None
        for line in held or []:
            err.print(Text(line, style="dim"))

    def note(self, message: str) -> None:
        self._show_held()
        err.print(Text(message, style="dim"), soft_wrap=not err.is_terminal)

    def busy(self, message: str) -> AbstractContextManager:
        self._show_held()
        return err.status(Text(f"{bundled_by_name(message)}…", style="dim")) if err.is_terminal else nullcontext()

    def progress(self, what: str, done: int, total: int) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        if not err.is_terminal:
            return
        self._show_held()
        if self._bar is None:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(what, total=total)
        self._bar.update(self._task, completed=done, description=what)
        if done >= total:
            self._bar.stop()
            self._bar = None


def lenient_stdin() -> None:
    """Bytes on standard input that are not UTF-8 arrive as lone surrogates, whatever the
    locale (a UTF-8 one decodes strictly and would raise mid-read), so that the text check
    refuses them in one line (text.check_text)."""
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdin, "errors", None) == "strict":
        try:
            reconfigure(errors="surrogateescape")
        except (ValueError, OSError):  # a stream that has been read from cannot change its decoding
            pass


def bundled_by_name(message: str) -> str:
    """A step's words with a bundled model named as the presets name it (bundled:tiny-target),
    not by its folder deep inside the installed package."""
    from ..models.presets import ASSETS

    return message.replace(f"{ASSETS}/", "bundled:")


BUNDLED_NOTE = (
    "The bundled pair is a 4M-parameter toy trained on Python's standard library: it completes code for a line or "
    "two, then repeats itself. It shows the method, not a useful model. Real ones: --pair smollm2, "
    "--target/--draft (a repo id or folder), or the presets of `mlxspec models`."
)


def load(models: Models, *, speculative: bool = True, note_bundled: bool = True):
    """Load the pair the options name (only the target when not speculative). A --target with
    no draft and no preset drafts by prompt lookup, and says so; the bundled toy pair says
    what it is (`note_bundled`, unless the command shows it itself).

    Under mlx.launch with --shard, only rank 0 returns: the other ranks run their share of
    the target as rank 0 asks, and exit when it is done (pairs.load_pair)."""
    from ..drafters import PROMPT_LOOKUP
    from ..models.pairs import compatible_drafts, load_pair

    check_launch(models)
    reporter = ConsoleReporter() if ranks.is_main() else Reporter()
    lookup = speculative and models.target is not None and models.draft is None and not models.pair
    lookup = lookup and not models.no_draft
    if speculative and models.ngram is False and not models.no_draft and (lookup or models.draft == PROMPT_LOOKUP):
        raise InvalidOption(
            "--no-ngram leaves nothing to draft with (no draft model): name a --draft, or use --no-draft"
        )
    loaded = load_pair(
        models.target,
        PROMPT_LOOKUP if lookup else models.draft,
        pair=models.pair,
        no_draft=models.no_draft or not speculative,
        reporter=reporter,
        shard=models.shard,
        ngram=models.ngram,
    )
    if lookup:
        drafts = compatible_drafts(loaded.target)
        hint = (
            f"a draft model with the same tokenizer is on this machine: {drafts[0]}"
            if drafts
            else "a draft model of the same family (same tokenizer) is usually faster: --draft MODEL"
        )
        reporter.note(f"no --draft named: drafting by prompt lookup (no draft model); {hint}; --no-draft: target alone")
    if loaded.bundled and note_bundled:
        reporter.note(BUNDLED_NOTE)
    own = [m.name for m in filter(None, (loaded.target, loaded.draft)) if hasattr(m.model, "make_cache")]
    if models.max_kv_size is not None and own:
        # mlx-lm's make_prompt_cache gives max_kv_size only to models without caches of their own
        reporter.note(f"--max-kv-size does not apply to {' and '.join(own)}: it builds its own caches, kept as built")
    return loaded


def check_launch(models: Models) -> None:
    """--shard and mlx.launch go together; a window's rollback cannot be mirrored by trimming."""
    if models.shard is None:
        if ranks.launched():
            from ..distributed.split import group_size

            if group_size() > 1:
                raise InvalidOption(
                    "this is one of several ranks mlx.launch started: add --shard pipeline or --shard tensor to "
                    "split the target across them"
                )
        return
    if models.max_kv_size is not None:
        raise InvalidOption(
            "--max-kv-size cannot be used with --shard: the other ranks follow rank 0's rollbacks by trimming, "
            "which a rotating window cannot do"
        )


PIPE_WIDTH = 160  # tables written to a file or pipe, with no COLUMNS and no terminal: wide enough not to wrap


class _TrimmedLines(io.TextIOBase):
    """Writes whole lines, trailing spaces cut (a table's padding has no use in a file)."""

    def __init__(self, out):
        self.out, self.pending = out, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.out.write(line.rstrip() + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()


def wide_console() -> Console:
    """Tables for a terminal at its width; for a file or pipe, at the width COLUMNS names, else
    at the width of the terminal the command was typed in (a shell does not export COLUMNS:
    `mlxspec models | less` on an 80-column terminal is 80 wide), else wide enough not to
    wrap; with no trailing spaces."""
    console = Console()
    if console.is_terminal:
        return console
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if ascii_digits(columns) and int(columns) > 0 else terminal_columns() or PIPE_WIDTH
    return Console(width=width, file=_TrimmedLines(sys.stdout))


def terminal_columns() -> int | None:
    """The width of the terminal on stderr or stdin, when stdout is piped; None without one."""
    for stream in (sys.stderr, sys.stdin):
        try:
            if stream is not None and stream.isatty():
                return os.get_terminal_size(stream.fileno()).columns or None
        except (OSError, ValueError, AttributeError):  # closed, or a stand-in without a descriptor
            continue
    return None


def writable(path: str | None, what: str) -> Path | None:
    """Check an output path before the work that fills it: its folder exists and can be
    written (the file is written at the end)."""
    if path is None:
        return None
    out = Path(path).expanduser()
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise InvalidOption(f"{what} {path} is a folder: give a file name")
    if not folder.is_dir():
        raise InvalidOption(f"cannot write {what} {path}: no folder {folder}")
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InvalidOption(f"cannot write {what} {path}: permission denied")
    return out


def write_text(path: Path, text: str, what: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise InvalidOption(f"cannot write {what} {path}: {e.strerror}") from None
