"""The interactive chat loop: read a line (or several), run a command or stream a reply,
print a one-line stat after it. Input and output are injected, so tests drive the real
loop with scripted lines."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..decoding.events import ContextTrimmed, Done, Prefill, Round
from ..drafting.verdict import judge
from ..errors import MlxspecError
from ..options import MOST_GAMMA, parse_gamma
from ..text import Reasoning
from .progress import reading, spinner_after
from .summary import VERDICT_WORDS, PartsLine, counted, repetition_words, speedup_part, stats_line

if TYPE_CHECKING:
    from ..chat import Conversation
from .tokens import STYLES, legend

HELP = """\
/help              this list
/stats             the conversation's totals: tokens, acceptance, τ, per-position acceptance, time, speedup
/gamma N|auto      draft tokens per round (0: standard decoding; auto: chosen each round)
/temp X            temperature (0: greedy); also /top-p X, /top-k N, /min-p X, /seed N, /max-tokens N
/think on|off      let a reasoning model think first (its template's enable_thinking); shown dimmed
/system TEXT       set the system prompt (starts a new conversation)
/retry             answer the last message again (a new sample when sampling)
/undo              forget the last exchange
/reset             forget the conversation (and both models' caches)
/save FILE         save the transcript, with per-turn statistics, as JSON
/quit              leave (or Ctrl-D; Ctrl-C stops a reply, or clears the line)
End a line with \\ to continue on the next; paste a block between lines of three quotes (\"\"\")."""


HELP_FOOTER = HELP.splitlines()[-1]
LEAVE_HINT = "(Ctrl-D or /quit to leave)"


def help_table() -> Group:
    """/help: each command beside its description, which wraps in its own column, so that a
    narrow terminal never breaks an entry mid-line under the next command."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column()
    for line in HELP.splitlines()[:-1]:
        command, _, description = line.partition("  ")
        table.add_row(Text(command), Text(description.strip()))
    return Group(table, Text(HELP_FOOTER))


_SETTINGS = {
    "/gamma": ("gamma", parse_gamma),
    "/temp": ("temp", float),
    "/top-p": ("top_p", float),
    "/top-k": ("top_k", int),
    "/min-p": ("min_p", float),
    "/seed": ("seed", int),
    "/max-tokens": ("max_tokens", int),
}


def stat_line(stats, reused: int, *, lookup: bool = False, by_position: bool = False) -> PartsLine:
    return stats_line(stats, judged=judge(stats), reused=reused, lookup=lookup, by_position=by_position)


def banner(pair, options) -> Text:
    """The first lines: the models and the draft length; for the bundled toy pair, what it is."""
    gamma = options.gamma
    label = "no draft" if gamma == 0 else f"γ {gamma}" if isinstance(gamma, int) else "γ auto"
    if pair.draft is None and pair.ngram and gamma != 0:
        label += ", drafting by prompt lookup"
    if options.think is not None:
        label += ", thinking " + ("on" if options.think else "off")
    text = Text(f"{pair.description} · {label}", style="bold")
    if pair.bundled:
        text.append(
            "\nThe bundled pair is a 4M-parameter toy trained on Python's standard library: it completes code and "
            "has no idea what a conversation is. For a real assistant: --pair smollm2 (fetched where the Hugging "
            "Face hub cannot be reached), or a Qwen3 pair on a Mac (mlxspec models).",
            style="yellow",
        )
    return text


class ChatApp:
    def __init__(
        self, conversation: Conversation, *, read: Callable[[str], str], console: Console, show_drafts: bool = False
    ):
        self.conversation = conversation
        self.read = read
        self.console = console
        self.show_drafts = show_drafts
        self._reasoning = Reasoning()
        self._reused, self._trimmed = 0, False
        self._told_rewrites = False  # said once that the template makes turns re-read the last reply

    def run(self) -> int:
        """The loop; returns the exit code (0: the user left)."""
        self.console.print(Text("Type a message, or /help. Ctrl-D or /quit to leave.", style="dim"))
        if self.show_drafts:
            self.console.print(legend())
        while True:
            try:
                line = self.read_message()
            except EOFError:
                self.console.print()
                return 0
            except KeyboardInterrupt:  # as Python's REPL and Ollama: the line (or block) dropped, a fresh prompt
                self.console.print()
                self.console.print(Text(LEAVE_HINT, style="dim"))
                continue
            if line is None or not line.strip():
                continue
            if line.startswith("/"):
                if self.command(line.strip()) == "quit":
                    return 0
                continue
            self.answer(line)

    def read_message(self) -> str | None:
        """One message: a line, lines joined by a trailing backslash, or a \"\"\" block."""
        line = self.read(">>> ")
        if line.strip() == '"""':
            block = []
            while (more := self.read("... ")).strip() != '"""':
                block.append(more)
            return "\n".join(block)
        lines = [line]
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            lines.append(self.read("... "))
        return "\n".join(lines)

    def answer(self, message: str | None, *, retry: bool = False) -> None:
        self._reused, self._trimmed = 0, False
        try:
            events = self.conversation.retry() if retry else self.conversation.reply(message)
            try:
                with spinner_after(self.console, lambda: reading(None)):  # until the prompt is read
                    for event in events:
                        self.show(event)
                        if not isinstance(event, ContextTrimmed):
                            break
                for event in events:
                    self.show(event)
            except KeyboardInterrupt:  # Ctrl-C while printing: let the reply end itself
                try:
                    self.show(events.throw(KeyboardInterrupt))
                except (StopIteration, KeyboardInterrupt):
                    pass
                events.close()
        except MlxspecError as e:
            self.console.print(Text.assemble(("error: ", "bold red"), str(e)))

    def show(self, event) -> None:
        if isinstance(event, ContextTrimmed):
            self._trimmed = True
            self.console.print(
                Text(
                    f"(the conversation nears the {event.context_length}-token context: dropped the oldest "
                    f"{event.dropped_turns} turn(s))",
                    style="yellow",
                )
            )
        elif isinstance(event, Prefill):
            self._reused = event.prompt_tokens - event.processed_tokens
            self._reasoning = Reasoning(thinking=self.conversation.prompt_opens_thinking)
        elif isinstance(event, Round):
            self.print_round(event)
        elif isinstance(event, Done):
            self.console.print(self._styled([(event.text, "target")]), end="", soft_wrap=True)
            self.console.print()
            if event.finish_reason == "interrupted":
                self.console.print(Text("[interrupted]", style="yellow"))
            for call in self.conversation.tool_calls():
                self.console.print(Text.assemble(("tool call: ", "bold cyan"), call.describe()), soft_wrap=True)
            pair = self.conversation.pair
            self.console.print(
                stat_line(
                    event.stats, self._reused, lookup=pair.draft is None and pair.ngram, by_position=pair.own_head
                ),
                soft_wrap=not self.console.is_terminal,
            )
            turns = self.conversation.turns
            rewritten = len(turns) > 1 and not turns[-1].appended and turns[-2].held and not self._trimmed
            if rewritten and not self._told_rewrites:
                self._told_rewrites = True
                self.console.print(
                    Text(
                        "(this chat template renders earlier turns differently from how they were generated, e.g. "
                        "without their thinking: each turn re-reads the conversation from the first change)",
                        style="dim",
                    )
                )

    def print_round(self, event: Round) -> None:
        self.console.print(self._styled(zip(event.pieces, event.fates)), end="", soft_wrap=True)

    def _styled(self, pieces) -> Text:
        """The pieces' text: reasoning dimmed, and with --show-drafts each token by its fate."""
        text = Text()
        for piece, fate in pieces:
            for part, thinking in self._reasoning.split(piece):
                style = STYLES.get(fate, "") if self.show_drafts else ""
                text.append(part, style=f"{style} dim".strip() if thinking else style)
        return text

    def command(self, line: str) -> str | None:
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        try:
            if name in ("/quit", "/exit", "/q"):
                return "quit"
            if name == "/help":
                self.console.print(help_table())
            elif name == "/stats":
                self.console.print(self.stats_table())
            elif name == "/reset":
                self.conversation.reset()
                self.console.print(Text("(conversation and caches cleared)", style="dim"))
            elif name == "/system":
                self.conversation.set_system(argument or None)
                self.console.print(
                    Text(
                        "(system prompt set; new conversation)"
                        if argument
                        else "(system prompt cleared; new conversation)",
                        style="dim",
                    )
                )
            elif name == "/think":
                value = {"on": True, "off": False}.get(argument.lower())
                if value is None:
                    now = {True: "on", False: "off", None: "the template's default"}[self.conversation.settings.think]
                    raise ValueError(f"/think takes on or off (now {now})")
                self.conversation.update(think=value)
                template = getattr(self.conversation.pair.tokenizer, "chat_template", None) or ""
                unread = "" if "enable_thinking" in template else "; this model's template has no such switch"
                self.console.print(Text(f"(thinking {argument.lower()}{unread})", style="dim"))
            elif name == "/retry":
                self.answer(None, retry=True)
            elif name == "/undo":
                turn = self.conversation.undo()
                if turn is None:
                    raise ValueError("nothing to undo")
                shown = turn.user if len(turn.user) <= 40 else turn.user[:39] + "…"
                self.console.print(Text(f"(forgot the last exchange: {shown!r})", style="dim"))
            elif name == "/save":
                if not argument:
                    raise ValueError("/save needs a file name")
                path = self.conversation.save(argument)
                saved = counted(len(self.conversation.turns), "turn")
                self.console.print(Text(f"(saved {saved} to {path})", style="dim"))
            elif name in _SETTINGS:
                field, kind = _SETTINGS[name]
                if not argument:
                    raise ValueError(f"{name} needs a value (now {getattr(self.conversation.settings, field)})")
                try:
                    value = kind(argument)
                except (ValueError, MlxspecError):
                    what = {int: "a whole number", float: "a number"}.get(kind, f"0 to {MOST_GAMMA} or auto")
                    raise ValueError(f"{name} takes {what}, not {argument!r}") from None
                self.conversation.update(**{field: value})
                self.console.print(Text(f"({field.replace('_', '-')} = {value})", style="dim"))
            else:
                self.console.print(Text(f"unknown command {name}; /help lists them", style="yellow"))
        except (ValueError, MlxspecError) as e:
            self.console.print(Text.assemble(("error: ", "bold red"), str(e)))
        return None

    def stats_table(self) -> Table:
        totals = self.conversation.totals
        turns = len(self.conversation.turns)
        title = f"Conversation: {counted(turns, 'turn')}"
        table = Table(title=title, title_justify="left", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        table.add_row("tokens", str(totals.tokens))
        table.add_row(
            "decode time",
            f"{totals.decode_seconds:.2f} s"
            + (f" ({totals.tokens_per_second:.1f} tok/s)" if totals.tokens_per_second else ""),
        )
        table.add_row("prefill time", f"{totals.prefill_seconds:.2f} s")
        table.add_row("rounds", str(totals.rounds))
        if totals.tested:  # the counts always; the rate once enough drafts were tested
            alpha = totals.shown_acceptance_rate
            table.add_row(
                "acceptance α",
                f"{'–' if alpha is None else f'{alpha:.3f}'} ({totals.accepted} of {totals.tested} tested)",
            )
            table.add_row("tokens per round τ", f"{totals.tokens_per_round:.2f}")
            rates = [f"{a / t:.2f}" if t else "–" for a, t in zip(totals.position_accepted, totals.position_tested)]
            table.add_row("by position", " ".join(rates))
        if judged := judge(totals):  # the turns' verdict, by the rule generate's runs are judged by
            table.add_row("speedup", f"{speedup_part(judged)}: {VERDICT_WORDS[judged.verdict]}")
            if totals.lookup_on_repetition:
                table.add_row("", repetition_words(totals))
        return table
