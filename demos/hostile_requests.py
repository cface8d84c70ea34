"""Issue 39's hostile run against a real `mlxspec serve` on 127.0.0.1: requests that asked for
more than pays (gamma and tree in the thousands), numbers written in other scripts' digits,
float ids, random mixes of every request field, a client that leaves mid-generation, a FIFO
where a key's kept history should be, SIGTERM with a history to keep, and one key asking
/health about another's; then the command line's option checks.

    python demos/hostile_requests.py [--requests 600] [--seed N] [--clients 4]

Each answer must be a 4xx with its error in one line, or a 200 whose body parses, within a
bound; no answer may say "internal error"; after a client leaves, the worker must be free
again within seconds; /health must answer while a generation runs and while a key's history
file blocks; what a key's requests taught must be on disk after SIGTERM and counted by
/health after a restart, before any request; one key's /health tells nothing of another's
requests. With --clients N the random mixes come from N clients at once, so they share the
server's batch (mixes of gamma, tree, sampling and stops side by side). Loopback only, a
bounded count of requests, max_tokens small. Prints how each
group ended and exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests.server.test_server import KEY, running_server  # noqa: E402

KEY_A, KEY_B = KEY, "hostile-key-b"  # the first is the one running_server asks /health with
ANSWER_SECONDS = 30  # any one answer, a refusal or a short generation on the bundled pair
FREED_SECONDS = 10  # a worker busy with a request whose client left
PROMPT = "def fibonacci(n):"
STRANGE_NUMBERS = [
    "²",
    "١٢",
    "１２",
    "3.0",
    "1e3",
    "-1",
    " 3",
    "3 ",
    "0x10",
    "",
    "auto ",
    "AUTO",
    "∞",
    "NaN",
    True,
    3.5,
]
FIELDS = {  # a request field and values worth throwing at it, bad and good
    "gamma": [0, 1, 3, 64, 65, 1500, 2**31, -1, "auto", None, *STRANGE_NUMBERS],
    "tree": [0, 8, 64, 512, 513, 50000, 2**40, -3, "auto", None, *STRANGE_NUMBERS],
    "max_tokens": [1, 4, 8, 0, -1, 2**63, "8", 8.0, None],
    "temperature": [0, 0.7, 1, 2, -1, 1e-30, 1e30, "0", None],
    "top_p": [0.9, 1, 0, 1.5, -0.1, None],
    "top_k": [0, 1, 40, -5, 2**40, 1.5, None],
    "min_p": [0, 0.05, 1, 2, None],
    "seed": [0, 7, -1, 2**70, "7", None],
    "stop": ["\n", ["a", "b"], "", [""], [1], None],
    "history": [True, False, "yes", None],
}


class Tally:
    def __init__(self):
        self.ended: Counter = Counter()
        self.failures: list[str] = []
        self._lock = threading.Lock()  # clients at once count into it

    def fail(self, what: str) -> None:
        with self._lock:
            self.failures.append(what)
        print(f"FAIL {what}", flush=True)

    def answer(self, group: str, response: httpx.Response, *, elapsed: float, what: str) -> None:
        """A 4xx with one line, or a 200 that parses; never a 5xx, never "internal error"."""
        text = response.text
        if elapsed > ANSWER_SECONDS:
            self.fail(f"{group}: {what}: answered after {elapsed:.0f} s")
        if "internal error" in text or response.status_code >= 500:
            self.fail(f"{group}: {what}: {response.status_code} {text[:300]}")
            return
        if 400 <= response.status_code < 500:
            message = response.json()["error"]["message"]
            if "\n" in message:
                self.fail(f"{group}: {what}: a refusal over several lines: {message[:300]}")
            with self._lock:
                self.ended[(group, "refused")] += 1
            return
        response.json()
        with self._lock:
            self.ended[(group, "answered")] += 1


def post(url: str, route: str, body: dict, *, key: str = KEY_A, timeout: float = ANSWER_SECONDS + 30):
    start = time.monotonic()
    response = httpx.post(f"{url}{route}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    return response, time.monotonic() - start


def health(url: str, key: str = KEY_A, timeout: float = 5) -> dict:
    return httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {key}"}, timeout=timeout).json()


def bodies(route: str, fields: dict) -> dict:
    if route == "/v1/completions":
        return {"model": "m", "prompt": PROMPT, **fields}
    return {"model": "m", "messages": [{"role": "user", "content": PROMPT}], **fields}


def throw_fields(url: str, tally: Tally, *, count: int, rng: random.Random, clients: int = 1) -> None:
    """The filer's cases by name, then random mixes of every field on every route, from
    `clients` clients at once."""
    named = [
        ("/v1/completions", {"gamma": 1500, "tree": 50000, "max_tokens": 1500}),
        ("/v1/completions", {"gamma": 2000, "tree": 20000, "max_tokens": 64}),
        ("/v1/completions", {"gamma": 600, "tree": 30000, "max_tokens": 64}),
        ("/v1/completions", {"prompt": [1.5, 2], "max_tokens": 4}),
        ("/v1/completions", {"prompt": [1, 2.0], "max_tokens": 4}),
        ("/v1/chat/completions", {"tree": "²", "max_tokens": 4}),
        ("/v1/chat/completions", {"gamma": "١٢", "max_tokens": 4}),
        ("/v1/messages", {"gamma": "²", "max_tokens": 4}),
    ]
    for route, fields in named:
        response, elapsed = post(url, route, bodies(route, {"max_tokens": 8, **fields}))
        tally.answer("named", response, elapsed=elapsed, what=f"{route} {fields}")
    routes = ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"]
    requests = []
    for _ in range(count):
        route = rng.choice(routes)
        fields = {name: rng.choice(values) for name, values in FIELDS.items() if rng.random() < 0.5}
        fields = {name: value for name, value in fields.items() if value is not None}
        if isinstance(fields.get("max_tokens"), int) and fields["max_tokens"] > 8:
            fields["max_tokens"] = 8  # the budget stays small: what is hostile here is the rest
        fields.setdefault("max_tokens", 8)
        if route == "/v1/responses":
            fields["max_output_tokens"] = fields.pop("max_tokens")
            body = {"model": "m", "input": PROMPT, **fields}
        else:
            body = bodies(route, fields)
        requests.append((route, body, fields))

    def send(request) -> None:
        route, body, fields = request
        response, elapsed = post(url, route, body)
        tally.answer("random" if clients == 1 else f"random, {clients} at once", response, elapsed=elapsed,
                     what=f"{route} {fields}")  # fmt: skip

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, requests))


def client_leaves(url: str, tally: Tally) -> None:
    """A long generation at the largest gamma and tree allowed, its client gone after 2 s: the
    worker is free within FREED_SECONDS, and /health answered all along."""
    body = bodies("/v1/completions", {"max_tokens": 4000, "gamma": 64, "tree": 256, "temperature": 1})
    body["max_tokens"] = 1500

    def go():
        try:
            httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=2)
        except httpx.TimeoutException:
            pass

    thread = threading.Thread(target=go)
    thread.start()
    time.sleep(1)
    start = time.monotonic()
    try:
        busy = health(url)["busy"]
    except httpx.TimeoutException:
        tally.fail("client leaves: /health did not answer during a generation")
        busy = None
    if time.monotonic() - start > 2:
        tally.fail(f"client leaves: /health took {time.monotonic() - start:.1f} s during a generation")
    thread.join()
    left = time.monotonic()
    while health(url)["busy"]:
        if time.monotonic() - left > FREED_SECONDS:
            tally.fail(f"client leaves: the worker still busy {FREED_SECONDS} s after the client left")
            break
        time.sleep(0.2)
    else:
        tally.ended[("client leaves", f"freed in {time.monotonic() - left:.1f} s (busy seen: {busy})")] += 1


def keys_apart(url: str, tally: Tally) -> None:
    before = health(url, KEY_B)
    for _ in range(2):
        post(url, "/v1/completions", bodies("/v1/completions", {"max_tokens": 4}))
    after = health(url, KEY_B)
    counters = ("served", "busy", "queued", "cached_sessions")
    moved = {name: (before.get(name), after.get(name)) for name in counters if before.get(name) != after.get(name)}
    if moved:
        tally.fail(f"keys: key B's /health moved with key A's requests: {moved}")
    else:
        tally.ended[("keys", "B sees nothing of A")] += 1


def history_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "history").rglob("*.npz"))


def history_runs(tally: Tally, work: Path) -> None:
    """SIGTERM keeps what was taught; a restart counts it before any request; a FIFO in its
    place neither hangs a request nor /health; the files are private."""
    env = {"MLXSPEC_CACHE": str(work / "cache")}
    # prompt lookup drafts (and so keeps a history); the bundled pair's draft model does not
    args = (
        "--target",
        "bundled:tiny-target",
        "--draft",
        "ngram",
        "--history-keep",
        "--api-key",
        KEY_A,
        "--api-key",
        KEY_B,
    )
    with running_server(*args, log=work / "first.log", env=env, stop=signal.SIGTERM) as (url, _):
        client_leaves(url, tally)
        keys_apart(url, tally)
        taught = health(url)["history"]
    files = history_files(work / "cache")
    if not files:
        tally.fail("SIGTERM: no history file written")
        return
    for path in files:
        mode = stat.S_IMODE(path.stat().st_mode)
        folder = stat.S_IMODE(path.parent.stat().st_mode)
        if mode & 0o077 or folder & 0o077:
            tally.fail(f"files: {path.name} is {oct(mode)} in a folder {oct(folder)}")
        if KEY_A in path.name:
            tally.fail(f"files: {path.name} names the key")
    with running_server(*args, log=work / "second.log", env=env, stop=signal.SIGTERM) as (url, _):
        again = health(url)["history"]
        if not again or again.get("documents", 0) == 0 or again != taught:
            tally.fail(f"restart: /health before any request says {again}, before the stop {taught}")
        else:
            tally.ended[("SIGTERM and restart", "history kept and counted")] += 1
    for path in files:
        path.unlink()
        os.mkfifo(path)
    with running_server(*args, log=work / "third.log", env=env, stop=signal.SIGINT) as (url, _):
        start = time.monotonic()
        response, elapsed = post(url, "/v1/completions", bodies("/v1/completions", {"max_tokens": 4}))
        tally.answer("fifo", response, elapsed=elapsed, what="a request whose history file is a FIFO")
        other, _ = post(url, "/v1/completions", bodies("/v1/completions", {"max_tokens": 4}), key=KEY_B)
        tally.answer("fifo", other, elapsed=time.monotonic() - start, what="another key's request beside it")
        health(url, KEY_B)
    print((work / "third.log").read_text().strip().splitlines()[-3:], flush=True)


def command_line(tally: Tally) -> None:
    """Option values the command line took quietly or answered with an internal error."""
    cases = [
        ("generate", "x", "--tree", "²", "-m", "4"),
        ("generate", "x", "--gamma", "²", "-m", "4"),
        ("generate", "x", "--gamma", "١٢", "-m", "4"),
        ("generate", "x", "--gamma", "1500", "-m", "4"),
        ("generate", "x", "--tree", "50000", "-m", "4"),
        ("bench", "--tree", "0,,8", "--quick"),
        ("bench", "--tree", "", "--quick"),
        ("serve", "--history-tokens", "1"),
        ("serve", "--history-tokens", "2147483649"),
        ("serve", "--history-tokens", "99999999999999999999"),
    ]
    for args in cases:
        done = subprocess.run(
            [sys.executable, "-m", "mlxspec", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        lines = done.stderr.strip().splitlines()
        if done.returncode == 0 or len(lines) != 1 or "internal error" in done.stderr or "Traceback" in done.stderr:
            tally.fail(f"command line: mlxspec {' '.join(args)}: exit {done.returncode}, {done.stderr.strip()[:300]}")
        else:
            tally.ended[("command line", "refused in one line")] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="random request mixes (default 600)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--clients", type=int, default=1, help="random mixes sent by this many clients at once")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed {seed}", flush=True)
    tally = Tally()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        env = {"MLXSPEC_CACHE": str(work / "fields-cache")}
        with running_server("--api-key", KEY_A, log=work / "fields.log", env=env) as (url, _):
            throw_fields(url, tally, count=args.requests, rng=random.Random(seed), clients=args.clients)
        history_runs(tally, work)
    command_line(tally)
    for (group, how), count in sorted(tally.ended.items()):
        print(f"{group:>20}: {count:4d} {how}")
    print(f"{len(tally.failures)} failed")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
