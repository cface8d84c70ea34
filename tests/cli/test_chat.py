"""`mlxspec chat`: the real loop and engine on tiny models, driven by scripted input."""

from __future__ import annotations

import io
import json
import os
import platform
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

import mlxspec
from mlxspec.chat import Conversation
from mlxspec.decoding.events import ContextTrimmed, Done, Round
from mlxspec.options import Options
from mlxspec.views.chat import ChatApp
from tests.conftest import ctrl_c_at, fresh_standard, interrupt_after

GREEDY = dict(temp=0.0, top_p=1.0, max_tokens=12)


def script(lines):
    """read() for ChatApp: the scripted lines, then Ctrl-D."""
    queue = list(lines)

    def read(prompt: str) -> str:
        if not queue:
            raise EOFError
        return queue.pop(0)

    return read


def drive(pair, lines, **settings):
    out = io.StringIO()
    conversation = Conversation(pair, settings=Options.build(**{**GREEDY, **settings}))
    app = ChatApp(conversation, read=script(lines), console=Console(file=out, width=120, color_system=None))
    code = app.run()
    return code, out.getvalue(), conversation


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next"])
def test_second_turn_equals_a_fresh_generation_over_the_same_history(load_pair, arch):
    pair = load_pair(arch)
    code, out, conversation = drive(pair, ["hello there", "and again"], gamma=3)
    assert code == 0 and len(conversation.turns) == 2
    # what the second turn saw: the template over the first exchange plus the new message
    conversation.turns.pop()
    ids = conversation.encode("and again")
    fresh = mlxspec.generate(pair, ids, max_tokens=12, gamma=3)
    assert conversation.turns[-1].assistant is not None
    _, _, replay = drive(pair, ["hello there", "and again"], gamma=3)
    assert replay.turns[1].assistant == fresh.text
    # and the caches were reused: the second turn read only part of its prompt (windows that
    # wrapped and recurrent states come back to where the first prompt ended)
    assert replay.turns[1].reused_tokens >= replay.turns[0].prompt_tokens - 1


def test_cache_reuse_is_reported_per_turn(load_pair):
    _, out, conversation = drive(load_pair("llama"), ["one", "two", "three"], gamma=2)
    reused = [t.reused_tokens for t in conversation.turns]
    assert reused[0] == 0 and reused[1] > 0 and reused[2] > reused[1]
    assert out.count("prefill") == 3 and "new of" in out


def test_interrupted_reply_leaves_consistent_caches(load_pair):
    """Ctrl-C (a real SIGINT) during a long reply; the next turn gives what a fresh
    generation over the same history gives."""
    pair = load_pair("llama")
    conversation = Conversation(pair, settings=Options.build(temp=0.0, top_p=1.0, max_tokens=100000, gamma=3))
    events = interrupt_after(0.2, lambda: list(conversation.reply("talk for a long time")))
    assert events[-1].finish_reason == "interrupted"
    assert conversation.turns[-1].finish_reason == "interrupted" and conversation.turns[-1].assistant
    conversation.settings = conversation.settings.replace(max_tokens=10)
    ids = conversation.encode("shorter now")
    emitted = [t for e in conversation.reply("shorter now") if isinstance(e, Round) for t in e.emitted]
    assert [t for t in emitted if t not in pair.eos_ids] == mlxspec.generate(pair, ids, max_tokens=10, gamma=3).tokens


def test_commands(load_pair, tmp_path):
    saved = tmp_path / "chat.json"
    code, out, conversation = drive(
        load_pair("llama"),
        [
            "/gamma 2",
            "/temp 0",
            "first message",
            "/stats",
            "/gamma -1",
            "/gamma 1500",
            "/temp hot",
            "/top-p 2",
            "/frobnicate",
            "/system Be brief.",
            f"/save {saved}",
            "second message",
            f"/save {saved}",
            "/quit",
        ],
    )
    assert code == 0
    assert "(gamma = 2)" in out and "(temp = 0.0)" in out
    assert "acceptance α" in out and "tokens per round τ" in out and "by position" in out
    assert "error: /gamma takes 0 to 64 or auto, not '-1'" in out
    assert "error: /gamma takes 0 to 64 or auto, not '1500'" in out  # issue 39: past what a round pays for
    assert "error: /temp takes a number, not 'hot'" in out
    assert "error: top-p must be in (0, 1]" in out
    assert "unknown command /frobnicate; /help lists them" in out
    assert "(system prompt set; new conversation)" in out
    data = json.loads(saved.read_text())
    assert data["system"] == "Be brief." and len(data["turns"]) == 1
    assert data["turns"][0]["user"] == "second message" and data["turns"][0]["stats"]["tokens"] > 0
    assert data["settings"]["gamma"] == 2


def test_reset_clears_history_and_caches(load_pair):
    _, out, conversation = drive(load_pair("llama"), ["hello", "/reset", "hello"], gamma=2)
    assert "(conversation and caches cleared)" in out
    assert len(conversation.turns) == 1
    assert conversation.turns[0].reused_tokens == 0


def test_multiline_input(load_pair):
    _, _, conversation = drive(load_pair("llama"), ["first line \\", "second line", '"""', "a", "b", '"""'], gamma=2)
    assert [t.user for t in conversation.turns] == ["first line \nsecond line", "a\nb"]


def test_gamma_zero_and_show_drafts(load_pair):
    out = io.StringIO()
    conversation = Conversation(load_pair("llama"), settings=Options.build(**GREEDY, gamma=0))
    ChatApp(conversation, read=script(["hi"]), console=Console(file=out, width=120), show_drafts=True).run()
    assert "no draft" in out.getvalue() and "draft token accepted" in out.getvalue()


def test_oldest_turns_are_dropped_near_the_context(factory):
    short = factory.model("short-chat", arch="llama", seed=1, overrides={"max_position_embeddings": 80})
    pair = mlxspec.load_pair(str(short))
    _, out, conversation = drive(
        pair, ["one two three four", "five six seven", "eight nine ten", "eleven"], gamma=0, max_tokens=16
    )
    assert "dropped the oldest" in out
    assert len(conversation.turns) == 4 and all(t.finish_reason in ("length", "eos") for t in conversation.turns)


def test_message_too_long_for_the_context(factory):
    short = factory.model("short-chat", arch="llama", seed=1, overrides={"max_position_embeddings": 80})
    pair = mlxspec.load_pair(str(short))
    _, out, conversation = drive(pair, ["word " * 100, "ok"], gamma=0, max_tokens=8)
    assert "error: this message alone has" in out and len(conversation.turns) == 1


EXACT = dict(temp=0.0, top_p=1.0, max_tokens=12)
MESSAGES = ["hello there", "and again", "tell me more", "why", "ok then", "last one"]


def exact_reply(conversation, user, **interrupt):
    """Reply to `user`; check the reply's ids against a fresh standard decode of the ids it
    was given (its turn's rendering). Returns the reply's events."""
    events, emitted = [], []
    with ctrl_c_at(interrupt.get("ctrl_c")):
        try:
            for event in conversation.reply(user):
                events.append(event)
                if isinstance(event, Round):
                    emitted += event.emitted
        except KeyboardInterrupt:  # before the reply's stream began: no turn was added
            return events
    turn = conversation.turns.pop()  # render the history as this turn saw it
    ids = conversation.encode(user)
    conversation.turns.append(turn)
    expected = fresh_standard(conversation.pair, ids, conversation.settings.max_tokens)
    interrupted = turn.finish_reason == "interrupted"
    assert emitted == (expected[: len(emitted)] if interrupted else expected), (user, turn.finish_reason)
    return events


@pytest.mark.parametrize("gamma", [0, 3, "auto"])
def test_every_turn_on_a_sliding_window_is_exact(load_pair, gamma):
    """gemma3_text (window 8): each turn's reply is a fresh standard decode of its ids, while
    the window wraps and each turn reads only its new ids, from a trim or a checkpoint."""
    conversation = Conversation(load_pair("gemma3_text"), settings=Options.build(**EXACT, gamma=gamma))
    for user in MESSAGES[:4]:
        exact_reply(conversation, user)
    assert all(t.reused_tokens >= 8 for t in conversation.turns[1:])


def test_dropped_turns_reset_and_interrupts_stay_exact(factory):
    """A short context drops the oldest turns (the prompt's start changes: read again); /reset;
    replies cut short by Ctrl-C at chosen points, mid-forward included: every reply after them
    is exact."""
    short = dict(arch="gemma3_text", overrides={"max_position_embeddings": 96})
    target = factory.model("short-gemma", seed=1, head_scale=4.0, **short)
    draft = factory.model("short-gemma-draft", seed=2, like=target, noise=0.04, **short)
    pair = mlxspec.load_pair(str(target), str(draft))
    conversation = Conversation(pair, settings=Options.build(**EXACT, gamma=3))
    trimmed = 0
    for i, user in enumerate(MESSAGES * 2):
        events = exact_reply(conversation, user, ctrl_c=(None, 40, 400, 1500)[i % 4])
        trimmed += any(isinstance(e, ContextTrimmed) for e in events)
        if i == 5:
            conversation.reset()
    assert trimmed >= 2
    assert any(t.finish_reason == "interrupted" for t in conversation.turns)


def test_undo_comes_back_to_the_turn_before(load_pair):
    """Undo the last turn: the next reply is exact and starts from the checkpoint the undone
    turn's prompt left (the window has wrapped: no trim), not from an empty cache."""
    conversation = Conversation(load_pair("gemma3_text"), settings=Options.build(**EXACT, gamma=0))
    for user in MESSAGES[:3]:
        exact_reply(conversation, user)
    before = conversation.turns[-1].prompt_tokens
    undone = conversation.undo()
    assert undone.user == MESSAGES[2] and len(conversation.turns) == 2
    exact_reply(conversation, "something else")
    assert conversation.turns[-1].reused_tokens >= conversation.turns[-2].prompt_tokens - 1
    assert conversation.turns[-1].reused_tokens < before
    while conversation.undo():
        pass
    events = exact_reply(conversation, "from the top")
    assert isinstance(events[-1], Done) and len(conversation.turns) == 1


# A ChatML template that reads enable_thinking as Qwen3's does: told not to think, the
# generation prompt holds an empty thinking block, which the history's turns then lack.
THINK_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


@pytest.fixture(scope="module")
def thinking_pair(factory, tmp_path_factory):
    from mlxspec.models import synthetic
    from tests.conftest import stdlib_texts

    root = tmp_path_factory.mktemp("thinking")
    synthetic.train_tokenizer(stdlib_texts(), 512, root / "tokenizer", chat_template=THINK_TEMPLATE)
    build = dict(arch="llama", tokenizer_dir=root / "tokenizer", eos_token_ids=factory.eos)
    synthetic.build_model(out_dir=root / "target", seed=1, head_scale=4.0, **build)
    synthetic.build_model(out_dir=root / "draft", seed=2, like=root / "target", noise=0.1, **build)
    return mlxspec.load_pair(str(root / "target"), str(root / "draft"))


def tail_ids(conversation, user: str) -> int:
    """How many ids the template adds after the last reply for `user`: what a turn must read."""
    turn = conversation.turns[-1]
    held_text, held_ids = turn.held
    full = conversation.render(conversation.messages(user))
    return len(conversation._tokens(full[len(held_text) :]))


@pytest.mark.parametrize("model", ["no template (bundled)", "ChatML"])
def test_each_turn_reads_only_what_follows_the_last_reply(load_pair, model):
    """The token history is append-only: a turn reads the template's few ids after the last
    reply and the new message (plus the reply's last id, which no cache has read yet), never
    the reply again; and every reply is exact."""
    pair = mlxspec.load_pair() if model.startswith("no template") else load_pair("llama")
    conversation = Conversation(pair, settings=Options.build(**EXACT, gamma=3))
    exact_reply(conversation, MESSAGES[0])
    for user in MESSAGES[1:4]:
        expected = tail_ids(conversation, user)
        exact_reply(conversation, user)
        turn = conversation.turns[-1]
        assert turn.appended and turn.prompt_tokens - turn.reused_tokens <= expected + 1, user


def test_a_template_that_rewrites_history_falls_back_and_says_so(thinking_pair):
    """Told not to think, this template opens each reply with an empty thinking block that the
    history then lacks: the turn is rendered whole (exact still), and the chat says so once."""
    out = io.StringIO()
    conversation = Conversation(thinking_pair, settings=Options.build(**EXACT, gamma=2, think=False))
    app = ChatApp(conversation, read=script(MESSAGES[:3]), console=Console(file=out, width=120, color_system=None))
    app.run()
    assert [t.appended for t in conversation.turns] == [False, False, False]
    assert out.getvalue().count("renders earlier turns differently") == 1
    assert "<think>\n\n</think>" in conversation.render(conversation.messages("next"))
    # thinking on: no empty block, and the history is append-only again
    conversation.update(think=True)
    exact_reply(conversation, "and now")
    exact_reply(conversation, "once more")
    assert conversation.turns[-1].appended


def test_think_switch_in_chat(thinking_pair):
    code, out, conversation = drive(thinking_pair, ["/think off", "hello", "/think maybe", "/think on", "again"])
    assert "(thinking off)" in out and "(thinking on)" in out and "error: /think takes on or off" in out
    assert conversation.settings.think is True
    assert "<think>" not in conversation.render(conversation.messages("x"))
    conversation.update(think=False)
    assert conversation.render(conversation.messages("x")).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_no_think_reaches_the_template_from_the_command_line(capsys, thinking_pair):
    from tests.cli.test_cli import run

    folders = [str(thinking_pair.target.path), str(thinking_pair.draft.path)]
    lengths = {}
    for flag in ("--think", "--no-think"):
        code, out, _ = run(capsys, "generate", "hi", "-t", folders[0], "-d", folders[1], "-m", "2", "--json", flag)
        lengths[flag] = json.loads(out)["prompt_tokens"]
    assert code == 0 and lengths["--no-think"] > lengths["--think"]


def test_reasoning_is_dimmed_in_chat():
    from types import SimpleNamespace

    out = io.StringIO()
    app = ChatApp(
        SimpleNamespace(prompt_opens_thinking=False), read=script([]), console=Console(file=out), show_drafts=False
    )
    text = app._styled([("<think>", "target"), ("\nhmm, ", "target"), ("ok</think>", "target"), ("\n\nYes.", "target")])
    dim = "".join(text.plain[span.start : span.end] for span in text.spans if "dim" in str(span.style))
    assert dim == "<think>\nhmm, ok</think>" and text.plain.endswith("\n\nYes.")
    app.show_drafts = True
    text = app._styled([("<think>a", "accepted"), ("</think>b", "bonus")])
    styles = {text.plain[span.start : span.end]: str(span.style) for span in text.spans}
    assert styles["<think>a"].endswith("dim") and "dim" not in styles["b"]


def test_retry_and_undo(load_pair, tmp_path):
    code, out, conversation = drive(
        load_pair("llama"), ["/retry", "hello there", "/retry", "/undo", "/undo", f"/save {tmp_path}/no/such/x.json"]
    )
    assert code == 0 and "error: nothing to retry" in out
    assert out.count("prefill") == 2  # the message, and its retry
    assert "(forgot the last exchange: 'hello there')" in out and "error: nothing to undo" in out
    assert f"error: cannot write {tmp_path}/no/such/x.json: no folder" in out
    assert conversation.turns == []


def test_retry_is_exact_and_reuses_the_prompt(load_pair):
    conversation = Conversation(load_pair("gemma3_text"), settings=Options.build(**EXACT, gamma=2))
    for user in MESSAGES[:2]:
        exact_reply(conversation, user)
    first = conversation.turns[-1]
    events = list(conversation.retry())
    again = conversation.turns[-1]
    assert isinstance(events[-1], Done) and len(conversation.turns) == 2
    assert again.assistant == first.assistant  # temperature 0
    assert again.reused_tokens >= again.prompt_tokens - 1  # the checkpoint of its own prompt


def test_chat_stat_line_is_one_line_when_not_a_terminal(load_pair):
    _, out, conversation = drive(load_pair("llama"), ["hello"], gamma=2)
    line = next(line for line in out.splitlines() if "prefill" in line)
    assert line.startswith(f"{conversation.turns[0].stats.tokens} tokens · ")
    assert " τ " not in line or float(line.split(" τ ")[1].split()[0]) >= 1


def test_stats_count_the_conversation_as_it_stands(load_pair):
    """A retried reply no longer counts, an undone one neither; one turn is '1 turn'."""
    code, out, conversation = drive(load_pair("llama"), ["hello there", "/retry", "/stats"])
    assert code == 0 and re.search(r"Conversation: 1 turn\b(?!s)", out)
    (turn,) = conversation.turns
    assert conversation.totals.tokens == turn.stats.tokens > 0
    assert re.search(rf"│ tokens +│ {turn.stats.tokens} ", out)  # not the retried reply's added
    conversation.undo()
    assert conversation.totals.tokens == 0


def test_help_wraps_inside_its_entries(load_pair):
    """/help on a narrow terminal: each description wraps in its own column, so every line
    either starts a command or continues a description under the descriptions."""
    out = io.StringIO()
    conversation = Conversation(load_pair("llama"), settings=Options.build(**GREEDY))
    ChatApp(conversation, read=script(["/help"]), console=Console(file=out, width=60, color_system=None)).run()
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("/help"))
    entries = lines[start : next(i for i, line in enumerate(lines) if line.startswith("End a line"))]
    indent = entries[0].index("this list")
    for line in entries:
        assert line.startswith("/") or line[:indent].strip() == "", line
        assert line == line.rstrip() or len(line) <= 60
    assert any(line.startswith("/stats") for line in entries) and any(line.startswith("/quit") for line in entries)


def test_stats_show_no_alpha_from_a_few_tested_drafts(load_pair):
    code, out, conversation = drive(load_pair("llama"), ["hi", "/stats"], gamma=1, max_tokens=4)
    totals = conversation.totals
    assert code == 0 and totals.tested < 8
    assert re.search(rf"acceptance α +│ – \({totals.accepted} of {totals.tested} tested\)", out), out
    assert "α –" in out and "est." not in out  # the stat line: no α, no estimate resting on it


def chat_command(capsys, monkeypatch, lines: bytes, *args, errors: str = "surrogateescape"):
    """`mlxspec chat` through its entry point, these bytes on standard input (decoded as Python
    decodes a pipe under a C locale, or under a UTF-8 one with errors="strict"), then its end;
    (exit code, stdout, stderr)."""
    from tests.cli.test_cli import run

    stdin = io.TextIOWrapper(io.BytesIO(lines), encoding="utf-8", errors=errors)
    monkeypatch.setattr("sys.stdin", stdin)
    return run(capsys, "chat", *args)


def replies(out: str) -> list[str]:
    """What a piped chat printed after its prompts, stat lines left out (their timings vary)."""
    return [line for line in out.split(">>> ")[1:] if "tok/s" not in line]


def test_a_tiny_temperature_chats_greedily(capsys, monkeypatch, factory):
    folders = [str(p) for p in factory.pair("llama")]
    args = ("-t", folders[0], "-d", folders[1], "-m", "8")
    code, greedy, _ = chat_command(capsys, monkeypatch, b"def f():\nagain\n", *args, "--temp", "0")
    assert code == 0 and "8 tokens" in greedy
    code, tiny, err = chat_command(capsys, monkeypatch, b"def f():\nagain\n", *args, "--temp", "1e-45")
    assert code == 0 and "0 tokens" not in tiny and replies(tiny) == replies(greedy), err


@pytest.mark.parametrize("errors", ["surrogateescape", "strict"])
def test_a_message_that_is_not_utf8_is_refused_and_the_chat_goes_on(capsys, monkeypatch, factory, errors):
    """Bytes that are not UTF-8 (a Latin-1 é) are refused in one line, as generate refuses such
    a prompt, and the conversation goes on, whatever the locale's decoding of standard input."""
    folders = [str(p) for p in factory.pair("llama")]
    lines = b"def f():\ncaf\xe9\n/system caf\xe9\nagain\n"
    args = ("-t", folders[0], "-d", folders[1], "-m", "8")
    code, out, err = chat_command(capsys, monkeypatch, lines, *args, errors=errors)
    assert code == 0 and "internal error" not in out + err, err
    assert out.count("error: the message is not valid UTF-8 text (at character 3)") == 1
    assert out.count("error: the system prompt is not valid UTF-8 text (at character 3)") == 1
    assert out.count("8 tokens") == 2  # the first message and the last were answered


class Terminal:
    """`mlxspec chat` on a real pseudo-terminal: keys go in as a person types them (Ctrl-C is
    the terminal's SIGINT, as in a shell), the screen comes out."""

    # the child takes the pty as its controlling terminal (a new session), so that Ctrl-C on it
    # is a SIGINT, as in a shell; run in a fresh interpreter: forking this one (MLX's threads
    # running) could deadlock the child before its exec
    # Ctrl-C as a terminal's user has it: a runner that ignores SIGINT (a test worker) would
    # pass the ignoring on through exec, and the chat would never hear it
    ATTACH = (
        "import fcntl, os, signal, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
        "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )

    def __init__(self, *args: str):
        env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40", "HF_HUB_OFFLINE": "1"}
        self.fd, terminal = pty.openpty()
        command = [sys.executable, "-c", self.ATTACH, "-m", "mlxspec", "chat", *args]
        self.process = subprocess.Popen(command, stdin=terminal, stdout=terminal, stderr=terminal, env=env)
        os.close(terminal)
        self.screen = ""

    def _read(self, seconds: float) -> bool:
        """What the terminal shows within `seconds`, added to the screen; False once it closed."""
        if select.select([self.fd], [], [], seconds)[0]:
            try:
                self.screen += os.read(self.fd, 4096).decode(errors="replace")
            except OSError:  # the child closed its terminal
                return False
        return True

    def wait_for(self, text: str, timeout: float = 90.0) -> str:
        """Read until `text` shows after what was read before; the new output."""
        start, deadline = len(self.screen), time.monotonic() + timeout
        while text not in self.screen[start:]:
            assert time.monotonic() < deadline, f"no {text!r} on the screen: {self.screen[start:]!r}"
            assert self._read(0.2), f"the chat ended: {self.screen[start:]!r}"
        return self.screen[start:]

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    # the main thread blocked in select, pselect6, poll or ppoll (readline), or read (a Python
    # without readline), by their Linux numbers on this machine (none known: a pause instead)
    WAITING_FOR_KEYS = {
        "x86_64": {"23", "270", "7", "271", "0"},
        "aarch64": {"72", "73", "63"},
    }.get(platform.machine(), set())

    def interrupt(self) -> None:
        """Ctrl-C, once the chat waits for a key, as it always does when a person presses it.
        Python's readline checks for signals when its select() is interrupted: a SIGINT that
        lands in the microseconds between drawing the echo and the next select() is seen only
        at the next key (CPython's readline_until_enter_or_signal). A person never hits that
        gap; a test that types the moment the echo shows can, on a loaded machine."""
        self._wait_for_keys()
        self.type("\x03")

    def _wait_for_keys(self, timeout: float = 30.0) -> None:
        """Until the chat's main thread sits in select() or poll() twice in a row; a pause
        where /proc cannot tell (not Linux, or an architecture not listed)."""
        syscall = Path(f"/proc/{self.process.pid}/syscall")
        deadline, settled = time.monotonic() + timeout, 0
        while settled < 2:
            try:
                number = syscall.read_text().split()[0]
            except (OSError, IndexError):
                number = None
            if number is None or not self.WAITING_FOR_KEYS:
                time.sleep(0.5)
                return
            settled = settled + 1 if number in self.WAITING_FOR_KEYS else 0
            assert time.monotonic() < deadline, f"the chat never waited for a key: {self.screen!r}"
            time.sleep(0.05)

    def exit_code(self, timeout: float = 30.0) -> int | None:
        """The exit code once it ends (the terminal drained meanwhile), None if still running."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            if not self._read(0.1):
                time.sleep(0.1)
        return self.process.poll()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.fd)


def test_ctrl_c_at_the_prompt_clears_the_line_and_the_chat_goes_on(factory):
    """As in Python's REPL and Ollama: Ctrl-C over a half-typed line (or a half-typed block)
    drops it and gives a fresh prompt; /quit and Ctrl-D leave, with exit code 0."""
    folders = [str(p) for p in factory.pair("llama")]
    for leave in ("/quit\r", "\x04"):
        chat = Terminal("-t", folders[0], "-d", folders[1], "-m", "6", "--temp", "0")
        try:
            chat.wait_for(">>> ")
            chat.type("half a thought")
            chat.wait_for("half a thought")
            chat.interrupt()
            after = chat.wait_for(">>> ")
            assert "Ctrl-D or /quit to leave" in after and "tokens" not in after
            chat.type('"""\r')
            chat.wait_for("... ")
            chat.type("a block\r")
            chat.wait_for("... ")
            chat.interrupt()
            assert "tokens" not in chat.wait_for(">>> ")  # the block was dropped, not answered
            chat.type("def f():\r")
            assert "6 tokens" in chat.wait_for(">>> ")  # the chat still answers
            chat.type(leave)
            assert chat.exit_code() == 0, chat.screen
        finally:
            chat.close()


def test_the_stats_say_the_speedup_and_a_repeating_answer(capsys, monkeypatch):
    """Issue 39: /stats left out the speedup, and a reply that prompt lookup copied from its own
    loop headlined "≈3.76x est." unflagged. The stat line flags it (as race does) and /stats
    gives the conversation's speedup and verdict by the rule generate's runs are judged by."""
    args = ("-d", "ngram", "--temp", "0", "-m", "64")  # the bundled target loops on this message
    code, out, err = chat_command(capsys, monkeypatch, b"import os\n/stats\n", *args)
    assert code == 0, err
    line = next(line for line in out.splitlines() if "tok/s ·" in line)
    assert re.search(r"\d\.\d\dx (est\.|vs its plain steps) on a repeating answer", line), line
    table = " ".join(out.split("Conversation: 1 turn")[1].replace("│", " ").split())
    verdict = r"(helped|made little difference|did not pay)"
    speedup = re.search(rf"speedup ≈?(\d\.\d\d)x (est\.|vs its plain steps): {verdict}", table)
    assert speedup and f"{speedup[1]}x" in line, table
    assert "came from prompt lookup, copying an answer that repeats itself" in table
