"""What `mlxspec serve` costs: time to first token and tokens/s through the server against
the library in this process (what `mlxspec generate` runs), and speculative (γ auto)
against standard decoding (γ 0) through the server.

    LD_PRELOAD=$(dpkg -L libopenblas0-pthread | grep 'libblas.so.3$') OPENBLAS_NUM_THREADS=1 \
        python demos/server_overhead.py [--max-tokens 128] [--repeats 3]

The server runs in a subprocess on 127.0.0.1 with the same pair (the bundled one unless
--target/--draft) and --cache-sessions 0, so that every request reads its whole prompt, as
a fresh `generate` does; the openai client streams from /v1/completions (greedy, the bench
suite's prompts as raw text). Both sides keep one draft-length controller across their
generations, as the server does. Time to first token: from the call to the first text.
Client tokens/s: the tokens after the first over the time from the first text to the last;
engine tokens/s: the engine's own figure (decoding only, from inside the generation).
A warm-up of each method first; medians over prompts x repeats, methods taken in turn, and
medians of the paired ratios (each run against the other method's on the same prompt).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import openai  # noqa: E402

import mlxspec  # noqa: E402
from mlxspec.decoding.events import Done, Round  # noqa: E402
from mlxspec.drafting import Controller, ControllerConfig  # noqa: E402
from mlxspec.measure import prompts as suites  # noqa: E402


def start_server(args, port: int, log) -> subprocess.Popen:
    models = [*(["-t", args.target] if args.target else []), *(["-d", args.draft] if args.draft else [])]
    command = [sys.executable, "-m", "mlxspec", "serve", "--port", str(port), "--cache-sessions", "0", *models]
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not start")


def through_server(client, prompt: str, gamma, max_tokens: int) -> dict:
    start = time.perf_counter()
    first = last = None
    usage = None
    stream = client.completions.create(
        model="m",
        prompt=prompt,
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"gamma": gamma},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            first = first or last
        if chunk.usage:
            usage = chunk.usage
    spec = usage.model_extra["speculative"]
    return _timings(start, first, last, usage.completion_tokens, spec["tokens_per_second"], spec["acceptance_rate"])


def in_process(pair, controllers: dict, prompt: str, gamma, max_tokens: int) -> dict:
    session = mlxspec.Session(pair, controller=controllers[gamma])
    start = time.perf_counter()
    first = last = None
    for event in mlxspec.stream(pair, prompt, gamma=gamma, temp=0.0, max_tokens=max_tokens, raw=True, session=session):
        if isinstance(event, Round) and event.text:
            last = time.perf_counter()
            first = first or last
        elif isinstance(event, Done):
            stats = event.stats
    return _timings(start, first, last, stats.tokens, stats.tokens_per_second, stats.acceptance_rate)


def _timings(start, first, last, tokens, engine_rate, alpha) -> dict:
    rate = (tokens - 1) / (last - first) if last and first and last > first else None
    return {"ttft": first - start, "client": rate, "engine": engine_rate, "alpha": alpha}


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()

    if not args.port:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            args.port = sock.getsockname()[1]
    prompts = [p.prompt for p in suites.suite()]
    pair = mlxspec.load_pair(args.target, args.draft)
    start_gamma = pair.gamma_hint
    controllers = {g: Controller(ControllerConfig(start_gamma=start_gamma)) for g in ("auto", 0)}
    log = tempfile.NamedTemporaryFile("w", prefix="mlxspec-serve-", suffix=".log", delete=False)
    server = start_server(args, args.port, log)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="unused", timeout=120, max_retries=0)
    methods = {
        ("library", 0): lambda p: in_process(pair, controllers, p, 0, args.max_tokens),
        ("server", 0): lambda p: through_server(client, p, 0, args.max_tokens),
        ("library", "auto"): lambda p: in_process(pair, controllers, p, "auto", args.max_tokens),
        ("server", "auto"): lambda p: through_server(client, p, "auto", args.max_tokens),
    }
    runs = {method: [] for method in methods}
    try:
        for run in methods.values():  # warm-up
            run(prompts[0])
        for _ in range(args.repeats):
            for prompt in prompts:
                for method, run in methods.items():
                    runs[method].append(run(prompt))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
        os.unlink(log.name)

    print(
        f"{pair.description}, {len(prompts)} prompts x {args.repeats} repeats, {args.max_tokens} tokens, greedy, "
        "raw prompts (medians)\n"
    )
    print("| path | γ | time to first token | client tok/s | engine tok/s | α |")
    print("|---|---|---|---|---|---|")
    for (path, gamma), results in runs.items():
        row = {key: median(r[key] for r in results) for key in ("ttft", "client", "engine", "alpha")}
        alpha = f"{row['alpha']:.2f}" if row["alpha"] is not None else "–"
        print(
            f"| {path} | {gamma} | {row['ttft'] * 1000:.1f} ms | {row['client']:.1f} | {row['engine']:.1f} | {alpha} |"
        )
    # paired: each figure against the other method's on the same prompt, run just before or
    # after it, so that a slow spell of the machine falls on both
    print("\npaired medians (same prompt and repeat):")
    for gamma in (0, "auto"):
        lib, srv = runs["library", gamma], runs["server", gamma]
        extra = median((s["ttft"] - a["ttft"]) * 1000 for s, a in zip(srv, lib))
        rate = median(s["client"] / a["client"] for s, a in zip(srv, lib))
        print(f"- server vs library, γ {gamma}: first token {extra:+.1f} ms, client tok/s {rate:.3f}x")
    standard, speculative = runs["server", 0], runs["server", "auto"]
    client = median(s["client"] / b["client"] for s, b in zip(speculative, standard))
    engine = median(s["engine"] / b["engine"] for s, b in zip(speculative, standard))
    print(f"- through the server, γ auto vs γ 0: client tok/s {client:.3f}x, engine tok/s {engine:.3f}x")


if __name__ == "__main__":
    main()
