"""Several clients at once: aggregate tokens/s and each request's latency through `mlxspec serve`
one at a time (--max-batch 1), batched without drafts (γ 0 per request), batched with
speculation (the preset's own drafting), and mlx-lm's own server (which batches, with no
draft) on the same target folder, as the peer.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/serve_concurrency.py --pair smollm2 --clients 1,2,4,8 \
        [--prompts chat|edit|edit-below|edit-raw] [--api chat|completions] [--draft DRAFT] [--json]

Each run sends `clients` chat requests at once (streamed, temperature 0, --max-tokens each,
a different prompt each: the bench suite's prompts as chat messages, or "rewrite this code
with one name changed" requests where prompt lookup drafts well), and measures from the
first send to the last token: aggregate tokens/s = completion tokens / that time; per
request the first and last token's time. Each run's prompts start with a tag of the run, so
that no server answers from a cache of an earlier run's (mlx-lm's prompt cache, mlxspec's
history). Every greedy answer is checked against the same prompt's answer one at a time
(mlxspec's, with --max-batch 1). Configurations take turns within a repeat;
the table gives medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import openai  # noqa: E402

from mlxspec.measure import prompts as suites  # noqa: E402

CODE = [  # small functions, each with one name to change
    "def total(prices):\n    result = 0\n    for price in prices:\n        result += price\n    return result\n",
    "def longest(words):\n    best = ''\n    for word in words:\n        if len(word) > len(best):\n"
    "            best = word\n    return best\n",
    "def count_lines(path):\n    count = 0\n    with open(path) as handle:\n        for line in handle:\n"
    "            count += 1\n    return count\n",
    "def mean(values):\n    total = 0.0\n    for value in values:\n        total += value\n"
    "    return total / len(values)\n",
    "def flatten(rows):\n    out = []\n    for row in rows:\n        for item in row:\n            out.append(item)\n"
    "    return out\n",
    "def squares(limit):\n    found = []\n    for n in range(limit):\n        found.append(n * n)\n    return found\n",
    "def invert(mapping):\n    inverse = {}\n    for key, value in mapping.items():\n        inverse[value] = key\n"
    "    return inverse\n",
    "def first_even(numbers):\n    for number in numbers:\n        if number % 2 == 0:\n            return number\n"
    "    return None\n",
]
RENAMES = [("result", "acc"), ("best", "winner"), ("count", "n"), ("total", "running"), ("out", "flat"),
           ("found", "squares_found"), ("inverse", "flipped"), ("number", "x")]  # fmt: skip


EDIT_FORMS = {  # the request, and the code: SmolLM2-135M answers the first two with a rewrite of its own
    "edit": "Rewrite this code with `{old}` renamed to `{new}`. Reply with the code only.\n\n```python\n{code}```",
    # the code first: Gemma 3 270M then copies it, renaming, as an editor's request reads
    "edit-below": "```python\n{code}```\n\nRewrite the code above line by line with `{old}` renamed to `{new}`. "
    "Keep every other line the same.",
    # as raw text with one edit done before it (`--api completions`): SmolLM2-135M-Instruct, which
    # answers the forms above with a one-line rewrite of its own, then copies the code
    "edit-raw": "# Before:\n{example}\n# After renaming `top` to `peak`:\n{example_renamed}\n"
    "# Before:\n{code}\n# After renaming `{old}` to `{new}`:\n",
}
EXAMPLE = (
    "def biggest(items):\n    top = items[0]\n    for item in items:\n        if item > top:\n"
    "            top = item\n    return top\n"
)


def prompts(kind: str, count: int) -> list[str]:
    if kind in EDIT_FORMS:
        return [
            EDIT_FORMS[kind].format(
                old=old,
                new=new,
                code=CODE[i % len(CODE)],
                example=EXAMPLE,
                example_renamed=EXAMPLE.replace("top", "peak"),
            )
            for i, (old, new) in ((i, RENAMES[i % len(RENAMES)]) for i in range(count))
        ]
    chat = [p.prompt for p in suites.suite()]  # chat, code and writing requests
    return [chat[i % len(chat)] for i in range(count)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command: list[str], port: int, log) -> subprocess.Popen:
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited: {' '.join(command)}")
        for path in ("/health", "/v1/models"):
            try:
                if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200:
                    return process
            except httpx.TransportError:
                pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"no answer from {' '.join(command)}")


def one(url: str, prompt: str, *, max_tokens: int, extra: dict, started: float, api: str = "chat") -> dict:
    """One streamed request: a chat message, or (`api` "completions") the prompt as raw text, which
    a model without a chat template reads alike on every server."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=1800, max_retries=0)
    pieces, first, tokens = [], None, 0
    common = dict(temperature=0, max_tokens=max_tokens, stream=True, extra_body=extra)
    common["stream_options"] = {"include_usage": True}
    if api == "chat":
        stream = client.chat.completions.create(
            model="default_model", messages=[{"role": "user", "content": prompt}], **common
        )
    else:
        stream = client.completions.create(model="default_model", prompt=prompt, **common)
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        piece = (chunk.choices[0].delta.content if api == "chat" else chunk.choices[0].text) if chunk.choices else None
        if piece:
            first = first or time.perf_counter()
            pieces.append(piece)
    end = time.perf_counter()
    return {"text": "".join(pieces), "tokens": tokens, "first": (first or end) - started, "last": end - started}


def run(url: str, texts: list[str], *, max_tokens: int, extra: dict, api: str = "chat") -> dict:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(texts)) as pool:
        answers = list(
            pool.map(lambda t: one(url, t, max_tokens=max_tokens, extra=extra, started=started, api=api), texts)
        )
    wall = max(a["last"] for a in answers)
    return {
        "tok_s": sum(a["tokens"] for a in answers) / wall,
        "first": statistics.mean(a["first"] for a in answers),
        "last": statistics.mean(a["last"] for a in answers),
        "texts": [a["text"] for a in answers],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--draft", help="mlxspec's draft in place of the preset's (e.g. dflash: its DFlash drafter)")
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--prompts", choices=["chat", *EDIT_FORMS], default="chat")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--api", choices=["chat", "completions"], default="chat",
                        help="completions: the prompt as raw text (a model without a chat template)")  # fmt: skip
    parser.add_argument("--configs", default="one-at-a-time,batched-plain,batched-spec,mlx-lm")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    configs = args.configs.split(",")
    from mlxspec.models.pairs import load_pair

    target_path = str(load_pair(pair=args.pair, no_draft=True).target.path)
    most = max(clients)
    ports = {name: free_port() for name in ("one", "batched", "mlx-lm")}
    mlxspec = [sys.executable, "-m", "mlxspec", "serve", "--pair", args.pair, "--cache-sessions", "0"]
    mlxspec += ["--draft", args.draft] if args.draft else []
    commands = {
        "one": [*mlxspec, "--port", str(ports["one"]), "--max-batch", "1"],
        "batched": [*mlxspec, "--port", str(ports["batched"]), "--max-batch", str(most)],
        "mlx-lm": [sys.executable, "-m", "mlx_lm.server", "--model", target_path, "--port", str(ports["mlx-lm"])],
    }
    server_of = {"one-at-a-time": "one", "batched-plain": "batched", "batched-spec": "batched", "mlx-lm": "mlx-lm"}
    # the server's history would draft a prompt asked before from its earlier answer: off, so
    # that every configuration answers as if for the first time
    extra_of = {"one-at-a-time": {"history": False}, "batched-plain": {"gamma": 0, "history": False}}
    extra_of["batched-spec"] = {"history": False}
    needed = sorted({server_of[c] for c in configs})
    logs = tempfile.mkdtemp(prefix="serve-concurrency-")
    processes = {}
    results: dict[tuple[str, int], list[dict]] = {}
    try:
        for name in needed:
            with open(Path(logs) / f"{name}.log", "w") as log:
                processes[name] = start(commands[name], ports[name], log)
        for repeat in range(args.repeats):
            for n in clients:
                # a tag of this run in front: no server answers from a cache of an earlier run
                # (mlx-lm's prompt cache, the history), and all configurations get the same text
                texts = [f"(#{repeat + 1}.{n}) {text}" for text in prompts(args.prompts, n)]
                for config in configs:
                    url = f"http://127.0.0.1:{ports[server_of[config]]}"
                    extra = extra_of.get(config, {})
                    if repeat == 0 and n == clients[0]:
                        run(url, ["(warm-up) Hello"], max_tokens=8, extra=extra, api=args.api)
                    answer = run(url, texts, max_tokens=args.max_tokens, extra=extra, api=args.api)
                    results.setdefault((config, n), []).append(answer)
                    print(f"repeat {repeat + 1} · {n} clients · {config}: {results[config, n][-1]['tok_s']:.1f} tok/s",
                          file=sys.stderr)  # fmt: skip
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGINT)
        for process in processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()

    # every greedy answer against the same prompt's one at a time: the same repeat's (each
    # repeat's prompts carry their own tag, so their answers may differ from another's)
    mismatches = []
    for (config, n), runs in results.items():
        if ("one-at-a-time", n) in results:
            for repeat, (r, reference) in enumerate(zip(runs, results["one-at-a-time", n])):
                mismatches += [
                    f"{config}@{n}#{i}" + (f" (repeat {repeat + 1})" if repeat else "")
                    for i, (a, b) in enumerate(zip(r["texts"], reference["texts"]))
                    if a != b
                ]
    table = {
        f"{config}@{n}": {
            "clients": n,
            "config": config,
            "tok_s": statistics.median(r["tok_s"] for r in runs),
            "first_token_s": statistics.median(r["first"] for r in runs),
            "last_token_s": statistics.median(r["last"] for r in runs),
        }
        for (config, n), runs in results.items()
    }
    if args.json:
        print(json.dumps({"rows": table, "mismatches": mismatches, "logs": logs}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    view = Table(title=f"{args.pair} · {args.prompts} prompts · {args.max_tokens} tokens · temperature 0")
    view.add_column("clients", justify="right")
    for config in configs:
        view.add_column(f"{config}\ntok/s (first / last s)", justify="right")
    for n in clients:
        cells = []
        for config in configs:
            row = table.get(f"{config}@{n}")
            cells.append(
                "" if row is None else f"{row['tok_s']:.1f} ({row['first_token_s']:.1f} / {row['last_token_s']:.1f})"
            )
        view.add_row(str(n), *cells)
    console = Console()
    console.print(view)
    console.print(f"answers unlike the same prompt's one at a time: {', '.join(mismatches) or 'none'} (logs: {logs})")


if __name__ == "__main__":
    main()
