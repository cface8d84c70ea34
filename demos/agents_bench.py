"""An agentic replay through the real server (issue 32): what agents send, timed under each
configuration of `mlxspec serve`, through the real `openai` client on 127.0.0.1.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/agents_bench.py --pair smollm2 --quick
    python demos/agents_bench.py --pair smollm2 --only standard,lookup,history -- --cache-sessions 8

Three workloads, greedy (temperature 0), every answer bounded by max_tokens:
- tools: a SQL and file-search agent's loop. Each request carries the earlier turns and the
  last tool's result (synthetic, realistic and deterministic), and the model emits the next
  call: through `tools` (tool_choice "required" where the model's call format allows it,
  else "auto") when the model has a tool-call format, else as a JSON call under a
  `response_format` json_schema, as agent frameworks drive models without one;
- extract: invoices of one kind (generated from a fixed seed) to JSON under a json_schema;
- edit: a 60-line Python file and a small change to make; the model returns the whole file.

Each configuration is one server (standard decoding `--no-draft`; prompt lookup alone,
`--draft ngram --history off`; lookup with the server's history, `--draft ngram`; the
preset's drafter without (`preset-`) and with the history; `--config NAME=FLAGS` adds
more), started side by
side; every request goes to each server in turn (the order rotated per request), so a busy
machine slows all of them alike. Each server answers a warm-up first. Tokens/s: completion
tokens over the client's wall time (prompt reading included), and the engine's decoding
rate (usage.speculative.decode_seconds); α = accepted / tested, τ = ids per round, both
from usage.speculative. Speedups and "same" (answers identical to its answers) are against
the first configuration: standard decoding unless --only or --config say otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 300  # importing MLX and loading a pair on a busy 2-core machine
REQUEST_SECONDS = 900
DEFAULT_CONFIGS = {
    "standard": "--no-draft",
    "lookup": "--draft ngram --history off",  # this prompt and answer alone, as before issue 32
    "history": "--draft ngram",  # and the server's earlier requests
    "preset-": "--history off",  # the preset's drafter beside lookup alone
    "preset": "",  # beside the history
}


@dataclass(frozen=True)
class Sizes:
    turns: int  # tool calls in the agent's loop
    records: int  # invoices extracted
    edits: int  # code edits
    call_tokens: int
    record_tokens: int
    edit_tokens: int


FULL = Sizes(turns=8, records=50, edits=6, call_tokens=64, record_tokens=200, edit_tokens=700)
QUICK = Sizes(turns=3, records=5, edits=1, call_tokens=48, record_tokens=160, edit_tokens=256)


# --- the tool loop ----------------------------------------------------------------------
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }
    for name, arg, description in [
        ("list_tables", "schema", "List the tables of a database schema."),
        ("describe_table", "table", "The columns of a table, with their types."),
        ("run_sql", "query", "Run a read-only SQL query and return the rows."),
        ("search_files", "pattern", "Search the repository for files whose text matches a pattern."),
        ("read_file", "path", "Read a file of the repository."),
    ]
]
TOOL_NAMES = [t["function"]["name"] for t in TOOLS]
CALL_SCHEMA = {  # a call, for models without a tool-call format
    "type": "object",
    "properties": {
        "tool": {"enum": TOOL_NAMES},
        "arguments": {
            "type": "object",
            "properties": {arg: {"type": "string"} for arg in ("schema", "table", "query", "pattern", "path")},
            "additionalProperties": False,
        },
    },
    "required": ["tool", "arguments"],
    "additionalProperties": False,
}
AGENT_SYSTEM = (
    "You are a data analyst agent for Northwind Billing. You answer questions about customers, invoices and "
    "payments by calling tools, one call per turn, then reading the result. Tools: list_tables(schema), "
    "describe_table(table), run_sql(query) (PostgreSQL, read-only), search_files(pattern), read_file(path). "
    "Always call a tool; never invent rows."
)
AGENT_TASK = (
    "Which customers in Germany have unpaid invoices that are more than 30 days overdue, and how much does "
    "each of them owe in total? Also check how the overdue report in reports/overdue.py computes its cutoff."
)
TABLES = {
    "customers": [("id", "integer"), ("name", "text"), ("country", "text"), ("segment", "text"), ("created", "date")],
    "invoices": [
        ("id", "integer"),
        ("customer_id", "integer"),
        ("issued", "date"),
        ("due", "date"),
        ("amount_eur", "numeric(12,2)"),
        ("status", "text"),
    ],
    "payments": [("id", "integer"), ("invoice_id", "integer"), ("paid_on", "date"), ("amount_eur", "numeric(12,2)")],
}
COMPANIES = [
    "Kessler Maschinenbau GmbH",
    "Brandt & Söhne KG",
    "Alpenblick Hotels AG",
    "Nordlicht Logistik GmbH",
    "Weber Feinkost",
    "Rheinland Solar GmbH",
    "Hafenstadt Druckerei",
    "Lindner Medizintechnik",
]


def tool_result(tool: str, arguments: dict, turn: int) -> str:
    """What the tool would have returned: plausible, and a function of the call alone."""
    rng = random.Random(f"{tool}:{json.dumps(arguments, sort_keys=True)}:{turn}")
    if tool == "list_tables":
        return "\n".join(f"{name}({', '.join(c for c, _ in cols)})" for name, cols in TABLES.items())
    if tool == "describe_table":
        table = arguments.get("table") if arguments.get("table") in TABLES else "invoices"
        return f"Table {table}:\n" + "\n".join(f"  {c} {t} NOT NULL" for c, t in TABLES[table])
    if tool == "run_sql":
        rows = ["customer_id | name | overdue_invoices | owed_eur", "------------+------+------------------+---------"]
        for _ in range(rng.randint(3, 6)):
            owed = rng.randint(800, 48000)
            rows.append(f"{rng.randint(100, 999)} | {rng.choice(COMPANIES)} | {rng.randint(1, 5)} | {owed}.00")
        return "\n".join(rows) + f"\n({len(rows) - 2} rows)"
    if tool == "search_files":
        files = ["reports/overdue.py", "reports/aging.py", "sql/views/overdue_invoices.sql", "tests/test_overdue.py"]
        return "\n".join(f"{f}:{rng.randint(3, 120)}: cutoff = today - timedelta(days=30)" for f in files[:3])
    return (
        "from datetime import date, timedelta\n\n"
        "OVERDUE_DAYS = 30\n\n\n"
        "def cutoff(today: date) -> date:\n"
        "    return today - timedelta(days=OVERDUE_DAYS)\n\n\n"
        "def overdue(invoices, today):\n"
        "    return [i for i in invoices if i.status == 'unpaid' and i.due < cutoff(today)]\n"
    )


@dataclass
class Reply:
    text: str  # what is compared across configurations
    tool: str | None = None
    arguments: dict = field(default_factory=dict)
    message: dict | None = None  # the assistant's turn as the next request carries it


def tool_loop(sizes: Sizes, mode: str) -> Generator[dict, Reply, None]:
    messages = [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": AGENT_TASK}]
    for turn in range(sizes.turns):
        if mode == "json":
            request = {
                "response_format": {"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}}
            }
        else:
            request = {"tools": TOOLS, "tool_choice": mode}
        reply = yield {"messages": list(messages), "max_tokens": sizes.call_tokens, **request}
        tool = reply.tool if reply.tool in TOOL_NAMES else TOOL_NAMES[turn % len(TOOL_NAMES)]
        result = tool_result(tool, reply.arguments, turn)
        if reply.message and reply.message.get("tool_calls"):
            call = reply.message["tool_calls"][0]
            messages += [reply.message, {"role": "tool", "tool_call_id": call["id"], "content": result}]
        else:
            messages += [
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": f"Result of {tool}:\n{result}\nCall the next tool."},
            ]


# --- structured extraction --------------------------------------------------------------
INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string"},
        "issue_date": {"type": "string"},
        "due_date": {"type": "string"},
        "vendor": {"type": "string"},
        "customer": {"type": "string"},
        "currency": {"type": "string"},
        "line_items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "description": {"type": "string"},
                    "quantity": {"type": "integer"},
                    "unit_price": {"type": "number"},
                },
                "required": ["description", "quantity", "unit_price"],
                "additionalProperties": False,
            },
        },
        "total": {"type": "number"},
    },
    "required": ["invoice_number", "issue_date", "due_date", "vendor", "customer", "currency", "line_items", "total"],
    "additionalProperties": False,
}
EXTRACT_SYSTEM = "Extract the invoice's fields as JSON. Copy names and numbers exactly as written; dates as YYYY-MM-DD."
VENDORS = ["Harbor Lane Supplies", "Brightline Office Co.", "Kestrel IT Services", "Mapleworks Print", "Oakridge Foods"]
CUSTOMERS = ["Riverside Dental", "Bluebird Cafe", "Summit Legal LLP", "Greenway Gym", "Pioneer Books", "Atlas Motors"]
ITEMS = [
    ("A4 paper, 500 sheets", 4.99),
    ("Toner cartridge, black", 62.50),
    ("Laptop stand", 34.00),
    ("On-site support, hour", 85.00),
    ("Coffee beans, 1 kg", 18.75),
    ("Printed flyers, 250", 120.00),
    ("USB-C cable, 2 m", 9.90),
]


def invoice(number: int) -> str:
    rng = random.Random(number)
    issued = date(2024, 1, 1) + timedelta(days=rng.randint(0, 330))
    due = issued + timedelta(days=rng.choice([14, 30, 45]))
    currency = rng.choice(["EUR", "GBP", "USD"])
    lines, total = [], 0.0
    for description, price in rng.sample(ITEMS, rng.randint(1, 3)):
        quantity = rng.randint(1, 12)
        total += quantity * price
        lines.append(f"  {quantity} x {description} @ {price:.2f} {currency}")
    return (
        f"INVOICE No. INV-2024-{1000 + number}\n"
        f"From: {rng.choice(VENDORS)}\nBill to: {rng.choice(CUSTOMERS)}\n"
        f"Issued: {issued}    Payment due: {due}\nItems:\n"
        + "\n".join(lines)
        + f"\nTotal due: {total:.2f} {currency}\n"
    )


def extractions(sizes: Sizes, mode: str) -> Generator[dict, Reply, None]:
    response_format = {"type": "json_schema", "json_schema": {"name": "invoice", "schema": INVOICE_SCHEMA}}
    for number in range(sizes.records):
        messages = [{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": invoice(number)}]
        yield {"messages": messages, "max_tokens": sizes.record_tokens, "response_format": response_format}


# --- code edits -------------------------------------------------------------------------
SOURCE = '''"""Stock levels and orders for a small shop."""

from dataclasses import dataclass

TAX_RATE = 0.2
LOW_STOCK = 5


@dataclass
class Item:
    sku: str
    name: str
    price: float
    stock: int


def parse_line(line):
    sku, name, price, stock = line.strip().split(",")
    return Item(sku, name, float(price), int(stock))


def load_items(path):
    with open(path) as f:
        return [parse_line(line) for line in f if line.strip()]


def calc_total(items, quantities):
    total = 0.0
    for item in items:
        total += item.price * quantities.get(item.sku, 0)
    return round(total * (1 + TAX_RATE), 2)


def apply_discount(total, percent):
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return round(total * (1 - percent / 100), 2)


def low_stock(items):
    return [item for item in items if item.stock < LOW_STOCK]


def restock(items, amounts):
    for item in items:
        item.stock += amounts.get(item.sku, 0)
    return items


def report(items):
    lines = []
    for item in sorted(items, key=lambda i: i.sku):
        flag = " (low)" if item.stock < LOW_STOCK else ""
        lines.append(f"{item.sku} {item.name}: {item.stock}{flag}")
    return "\\n".join(lines)
'''
EDITS = [
    "Rename the function calc_total to compute_total.",
    "Add a one-line docstring to apply_discount.",
    "Change TAX_RATE from 0.2 to 0.21.",
    "Make low_stock take the threshold as a keyword argument, defaulting to LOW_STOCK.",
    "Add type hints to parse_line.",
    "In report, sort the items by name instead of by sku.",
]
EDIT_SYSTEM = "You edit Python files. Return the whole file with the change made, and nothing else."


def edits(sizes: Sizes, mode: str) -> Generator[dict, Reply, None]:
    for instruction in EDITS[: sizes.edits]:
        content = f"{instruction}\n\n```python\n{SOURCE}```"
        messages = [{"role": "system", "content": EDIT_SYSTEM}, {"role": "user", "content": content}]
        yield {"messages": messages, "max_tokens": sizes.edit_tokens}


WORKLOADS = {"tools": tool_loop, "extract": extractions, "edit": edits}


# --- the servers ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    name: str
    flags: list[str]
    port: int = 0
    process: subprocess.Popen | None = None
    log: Path | None = None
    client: object = None

    def start(self, common: list[str], folder: Path) -> None:
        import openai

        self.port, self.log = free_port(), folder / f"{self.name}.log"
        command = [sys.executable, "-m", "mlxspec", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [*command, *common, *self.flags], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        self.client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", timeout=REQUEST_SECONDS, max_retries=0
        )

    def wait(self) -> None:
        import httpx

        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the {self.name} server exited: {self.last_lines()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"the {self.name} server did not answer within {STARTUP_SECONDS} s: {self.last_lines()}")

    def last_lines(self) -> str:
        return " | ".join(self.log.read_text().strip().splitlines()[-3:]) if self.log and self.log.exists() else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def call(server: Server, request: dict) -> tuple[Reply, dict, float]:
    """One chat request: the reply, usage.speculative and the completion tokens, wall seconds."""
    start = time.perf_counter()
    response = server.client.chat.completions.create(model="m", temperature=0, **request)
    seconds = time.perf_counter() - start
    message = response.choices[0].message
    figures = {**response.usage.model_extra.get("speculative", {}), "tokens": response.usage.completion_tokens}
    if message.tool_calls:
        first = message.tool_calls[0]
        try:
            arguments = json.loads(first.function.arguments or "{}")
        except json.JSONDecodeError:
            arguments = {}
        calls = [{"id": c.id, "type": "function", "function": c.function.model_dump()} for c in message.tool_calls]
        text = json.dumps([c["function"] for c in calls])
        turn = {"role": "assistant", "content": message.content or "", "tool_calls": calls}
        return (
            Reply(text, first.function.name, arguments if isinstance(arguments, dict) else {}, turn),
            figures,
            seconds,
        )
    return reply_of(message.content or ""), figures, seconds


def reply_of(text: str) -> Reply:
    """A text answer, with the call in it when it is one (JSON calls)."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and "tool" in parsed:
        arguments = parsed.get("arguments") if isinstance(parsed.get("arguments"), dict) else {}
        return Reply(text, parsed.get("tool"), arguments)
    return Reply(text)


def tool_mode(server: Server) -> str:
    """How this model is made to call: 'required', 'auto' (tools) or 'json' (no tool-call format)."""
    import openai

    for choice in ("required", "auto"):
        try:
            server.client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "List the tables."}],
                tools=TOOLS,
                tool_choice=choice,
                max_tokens=1,
                temperature=0,
            )
            return choice
        except openai.BadRequestError as e:
            param = (e.body or {}).get("param") if isinstance(e.body, dict) else None
            if param == "tools":
                return "json"
    return "json"


# --- measuring --------------------------------------------------------------------------
@dataclass
class Tally:
    requests: int = 0
    tokens: int = 0
    wall: float = 0.0
    decode: float = 0.0
    accepted: int = 0
    tested: int = 0
    emitted: float = 0.0
    rounds: int = 0
    texts: list[str] = field(default_factory=list)

    def add(self, reply: Reply, figures: dict, seconds: float) -> None:
        self.requests += 1
        self.tokens += figures["tokens"]
        self.wall += seconds
        self.decode += figures.get("decode_seconds") or 0.0
        self.accepted += figures.get("accepted") or 0
        self.tested += figures.get("tested") or 0
        self.rounds += figures.get("rounds") or 0
        self.emitted += (figures.get("tokens_per_round") or 0) * (figures.get("rounds") or 0)
        self.texts.append(reply.text)

    @property
    def rate(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0

    @property
    def decode_rate(self) -> float:
        return self.tokens / self.decode if self.decode else 0.0


def replay(servers: list[Server], sizes: Sizes, mode: str, workloads: list[str]) -> dict:
    tallies = {(w, s.name): Tally() for w in workloads for s in servers}
    for workload in workloads:
        scripts = {s.name: WORKLOADS[workload](sizes, mode) for s in servers}
        pending = {name: next(script) for name, script in scripts.items()}
        step = 0
        while pending:
            order = servers[step % len(servers) :] + servers[: step % len(servers)]  # rotated per request
            for server in order:
                if server.name not in pending:
                    continue
                reply, figures, seconds = call(server, pending[server.name])
                tallies[workload, server.name].add(reply, figures, seconds)
                print(
                    f"  {workload} #{step + 1} {server.name}: {figures['tokens']} tokens in {seconds:.1f} s",
                    flush=True,
                )
                try:
                    pending[server.name] = scripts[server.name].send(reply)
                except StopIteration:
                    del pending[server.name]
            step += 1
    return tallies


def table(tallies: dict, servers: list[Server], workloads: list[str]) -> str:
    head = f"{'workload':<8} {'config':<8} {'req':>4} {'tokens':>6} {'tok/s':>6} {'decode':>7} {'speedup':>7}"
    head += f" {'α':>5} {'τ':>5} {'same':>6}"
    lines = [head, "-" * len(head)]
    for workload in workloads:
        standard = tallies.get((workload, servers[0].name))
        for server in servers:
            t = tallies[workload, server.name]
            speedup = t.rate / standard.rate if standard and standard.rate else 0.0
            alpha = f"{t.accepted / t.tested:.2f}" if t.tested else "-"
            tau = f"{t.emitted / t.rounds:.2f}" if t.rounds else "-"
            same = sum(a == b for a, b in zip(t.texts, standard.texts)) if standard else 0
            lines.append(
                f"{workload:<8} {server.name:<8} {t.requests:>4} {t.tokens:>6} {t.rate:>6.1f} {t.decode_rate:>7.1f} "
                f"{speedup:>6.2f}x {alpha:>5} {tau:>5} {same:>3}/{t.requests:<2}"
            )
    return "\n".join(lines)


def parse_configs(extra: list[str]) -> dict[str, str]:
    configs = dict(DEFAULT_CONFIGS)
    for item in extra:
        name, _, flags = item.partition("=")
        if not name or not _:
            raise SystemExit(f"--config takes NAME=FLAGS, got {item!r}")
        configs[name] = flags
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2", help="the preset every server runs (default smollm2)")
    parser.add_argument("--quick", action="store_true", help="3 tool calls, 5 invoices, 1 edit, shorter answers")
    parser.add_argument("--workloads", default="tools,extract,edit")
    for name in ("turns", "records", "edits"):
        parser.add_argument(f"--{name}", type=int, help=f"override the {name} of --quick or the full run")
    parser.add_argument("--only", help="configurations to run, by name (default: all)")
    parser.add_argument("--config", action="append", default=[], metavar="NAME=FLAGS", help="another server")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args, serve_flags = parser.parse_known_args()
    serve_flags = [f for f in serve_flags if f != "--"]
    configs = parse_configs(args.config)
    if args.only:
        configs = {name: configs[name] for name in args.only.split(",")}
    workloads = args.workloads.split(",")
    sizes = QUICK if args.quick else FULL
    overrides = {name: getattr(args, name) for name in ("turns", "records", "edits") if getattr(args, name)}
    sizes = dataclasses.replace(sizes, **overrides)
    common = ["--pair", args.pair, *serve_flags]
    servers = [Server(name, shlex.split(flags)) for name, flags in configs.items()]
    folder = Path(tempfile.mkdtemp(prefix="mlxspec-agents-"))
    env_note = f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
    described = ", ".join(f"{s.name} ({' '.join(s.flags) or 'as the preset'})" for s in servers)
    print(f"servers: {described}; logs in {folder}; {env_note}")
    started = time.perf_counter()
    try:
        for server in servers:
            server.start(common, folder)
        for server in servers:
            server.wait()
        mode = tool_mode(servers[0])
        print(
            f"tool calls: {mode}" + (" (no tool-call format: calls as JSON under a schema)" if mode == "json" else "")
        )
        for server in servers:  # warm-up, not counted
            call(server, {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})
        tallies = replay(servers, sizes, mode, workloads)
    finally:
        for server in servers:
            server.stop()
    print(
        f"\n--pair {args.pair} {' '.join(serve_flags)} ({'quick' if args.quick else 'full'}, {mode} calls), "
        f"{time.perf_counter() - started:.0f} s in all\n"
    )
    print(table(tallies, servers, workloads))
    if args.json:
        figures = {f"{w}/{n}": vars(t) for (w, n), t in tallies.items()}  # the answers too
        run = {"pair": args.pair, "mode": mode, "sizes": vars(sizes), "serve": serve_flags}
        args.json.write_text(json.dumps({"run": run, "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
