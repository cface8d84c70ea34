"""What one client may cost `mlxspec serve`: the real server in a subprocess on 127.0.0.1,
driven by real clients (httpx, the `openai` package, raw sockets for what clients never
send). Each test holds /health to 100 ms while the hostile request is read, tokenized or
generated, and checks a greedy answer against the library's standard decoding."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

import mlxspec
from mlxspec.errors import InvalidOption
from tests.server.test_server import CODE, ROOT, STARTUP_SECONDS, TIMEOUT, free_port, running_server, standard

HEADER_TIMEOUT = 1.0  # seconds; short, so that the slow sockets end within the test
MAX_CONNECTIONS = 500
SLOW_SOCKETS = 2000
PROMPT_EVERY = 50  # one whole /health request sent among each 50 slow sockets
HEALTH_SECONDS = 0.1
# This 2-core machine is shared with other jobs: the scheduler alone gives an idle server's
# /health 50 ms outliers, and a thread beside a busy MLX thread 200 ms ones. So one probe in
# ten may be slow, none by a second (the stalls fixed here lasted seconds to minutes).
SLOW_PROBES = 0.1
# During the 2000-socket flood the listen queue (128, so that one burst of accepts stays
# within the open-file limit) fills and the kernel drops a probe's SYN: it connects on the
# retry, one second later. So a stall is over 1.5 s.
STALL_SECONDS = 1.5
LIMITS = ("--header-timeout", str(HEADER_TIMEOUT), "--idle-timeout", "2", "--max-connections", str(MAX_CONNECTIONS))
MB = 1 << 20
# A round at γ 64 with a tree of 256 (the most a request may ask) took at most 1.6 s on the
# bundled pair, on this shared machine: a client that left is seen within a few of them, not
# the minutes a 1500-token run at the bounds takes (γ 1500 with a tree of 50,000 held the
# worker for 106 s after its client left, issue 39).
ROUND_SECONDS = 15
# /health is timed: the other test process waits meanwhile (conftest.py)
pytestmark = pytest.mark.alone


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(*LIMITS, log=tmp_path_factory.mktemp("limits") / "serve.log") as (url, _):
        yield url


@pytest.fixture(scope="module")
def pair():
    return mlxspec.load_pair()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


# run in a process of its own: this one's threads share a GIL with the hostile client's work
PROBE = """
import http.client, json, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
stop, times, failures = threading.Event(), [], []
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
while not stop.wait(0.02):
    start = time.perf_counter()
    try:
        connection = http.client.HTTPConnection(host, port, timeout=5)
        connection.request("GET", "/health")
        response = connection.getresponse()
        ok = response.status == 200 and json.loads(response.read())["status"] == "ok"
        connection.close()
    except Exception as e:
        failures.append(repr(e))
        continue
    times.append(time.perf_counter() - start)
    if not ok:
        failures.append("status not ok")
print(json.dumps({"times": times, "failures": failures}), flush=True)
"""


class HealthProbe:
    """/health asked every 20 ms, each on a fresh connection, from another process; `check`
    holds the answers to HEALTH_SECONDS (but SLOW_PROBES of them, and those to STALL_SECONDS)."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.process = subprocess.Popen(
            [sys.executable, "-c", PROBE, host, port], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.times, self.failures = [], []

    def __enter__(self):
        assert self.process.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc):
        out, _ = self.process.communicate(timeout=30)
        result = json.loads(out.strip().splitlines()[-1])
        self.times, self.failures = result["times"], result["failures"]

    def check(self, at_least: int = 3):
        assert not self.failures, self.failures[:3]
        assert len(self.times) >= at_least, f"only {len(self.times)} answers"
        times = sorted(self.times)
        shown = f"/health in ms, slowest of {len(times)}: {[round(t * 1000) for t in times[-5:]]}"
        assert sum(t >= HEALTH_SECONDS for t in times) <= SLOW_PROBES * len(times), shown
        assert times[-1] < STALL_SECONDS, shown


def greedy(client, prompt: str = CODE) -> str:
    return client.completions.create(model="m", prompt=prompt, temperature=0, max_tokens=24).choices[0].text


# --- the body's size ------------------------------------------------------------------------
def test_a_50_mb_body_gets_a_413_and_the_server_serves_on(server, client, pair):
    huge = json.dumps({"prompt": "a" * (50 * MB)}).encode()

    def chunked():  # no Content-Length: the limit is found while reading
        for start in range(0, len(huge), MB):
            yield huge[start : start + MB]

    expected = standard(pair, CODE, 24, raw=True).text
    # Answered while the client still sends: closed at once, the socket's unread bytes made
    # the kernel reset the connection, and one answer in four was lost before it was read.
    with HealthProbe(server) as probe:
        for content in [body for _ in range(5) for body in (huge, chunked())]:
            start = time.perf_counter()
            response = httpx.post(f"{server}/v1/completions", content=content, timeout=TIMEOUT)
            assert response.status_code == 413, response.text
            error = response.json()["error"]
            assert "over this server's limit of 8388608 bytes" in error["message"]
            assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
            assert time.perf_counter() - start < 5
        assert greedy(client) == expected
    probe.check()


# --- a text longer than the context, refused by its length ---------------------------------
def test_a_1_mb_prompt_is_refused_by_its_length_before_tokenizing(server):
    text = "a" * MB
    cases = (
        ("completions", {"prompt": text}, "prompt"),
        ("chat/completions", {"messages": [{"role": "user", "content": text}]}, "messages"),
    )
    with HealthProbe(server) as probe:
        for route, body, param in cases:
            start = time.perf_counter()
            response = httpx.post(f"{server}/v1/{route}", json=body, timeout=TIMEOUT)
            seconds = time.perf_counter() - start
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "context_length_exceeded" and error["param"] == param
            assert f"{param} has {len(text)} bytes of text, so at least" in error["message"]
            assert seconds < 0.5, f"{seconds:.2f} s"  # tokenizing it takes seconds
        time.sleep(0.1)
    probe.check()


def test_the_length_bound_never_exceeds_the_token_count(pair):
    """The bound the refusal rests on, against the bundled tokenizer on texts that pack many
    bytes into few tokens (runs of spaces, special tokens) and few into many."""
    from mlxspec.server.length import bytes_per_token, fewest_tokens

    per_token = bytes_per_token(pair.tokenizer)
    assert per_token is not None
    special = pair.tokenizer.eos_token
    texts = [
        "\n" + " " * 4000,
        (special or "") * 50,
        "def f(x):\n    return x\n" * 200,
        "é漢字🙂" * 300,
        "a" * 5000,
        Path(mlxspec.__file__).read_text(),
    ]
    for text in texts:
        tokens = len(pair.tokenizer.encode(text))
        assert fewest_tokens(len(text.encode()), per_token) <= tokens, text[:40]


# --- slow sockets ---------------------------------------------------------------------------
@contextlib.contextmanager
def open_files(n: int):
    """At least n more open files for this process (the soft limit raised if need be)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = n + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"needs {wanted} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_2000_slow_sockets_are_closed_while_health_and_a_greedy_request_are_served(server, client, pair):
    expected = standard(pair, CODE, 24, raw=True).text
    port = int(server.rsplit(":", 1)[1])
    sockets: list[socket.socket] = []
    prompt: list[socket.socket] = []  # whole requests sent in the middle of the flood
    with open_files(SLOW_SOCKETS + SLOW_SOCKETS // PROMPT_EVERY), HealthProbe(server) as probe:
        with ThreadPoolExecutor(1) as pool:
            try:
                answer = pool.submit(greedy, client)
                opened = time.monotonic()
                for number in range(SLOW_SOCKETS):  # part of a request line and headers, never the end
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                    sockets.append(sock)
                    with contextlib.suppress(OSError):  # closed already: turned away for the limit
                        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                    if number % PROMPT_EVERY == PROMPT_EVERY // 2:
                        prompt.append(socket.create_connection(("127.0.0.1", port), timeout=10))
                        prompt[-1].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert answer.result(timeout=TIMEOUT) == expected
                answers = [_status_line(sock) for sock in prompt]
                closed = _wait_until_closed(sockets, deadline=opened + SLOW_SOCKETS * 0.01 + HEADER_TIMEOUT + 10)
                held = time.monotonic() - opened
            finally:
                for sock in sockets + prompt:
                    sock.close()
    assert closed == SLOW_SOCKETS, f"{SLOW_SOCKETS - closed} slow sockets still open after {held:.1f} s"
    # a burst of accepts runs ahead of the reads: a request already whole is never the one closed
    assert answers == [b"HTTP/1.1 200 OK"] * len(prompt), answers
    probe.check()
    assert greedy(client) == expected


def _status_line(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    received = b""
    with contextlib.suppress(OSError):
        while b"\r\n" not in received and (chunk := sock.recv(4096)):
            received += chunk
    return received.split(b"\r\n", 1)[0]


def _wait_until_closed(sockets: list[socket.socket], *, deadline: float) -> int:
    """How many of `sockets` the server closed (end of file or reset) before the deadline."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed = 0
    while closed < len(sockets) and (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(timeout=min(left, 0.5)):
            try:
                data = key.fileobj.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(key.fileobj)
                closed += 1
    selector.close()
    return closed


def test_a_body_that_stalls_gets_a_408(server, client, pair):
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        start = time.monotonic()
        reply = slow.recv(4096)
        waited = time.monotonic() - start
        while chunk := slow.recv(4096):  # the body may come in a later packet; the server closes after it
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 408") and "the request body stalled for 2 s" in reply
    assert 1.5 < waited < 5, waited  # --idle-timeout 2
    assert greedy(client) == standard(pair, CODE, 24, raw=True).text


def test_a_request_answered_before_its_body_ends_is_not_kept_reading_it(server):
    """A 404 answered before its body is read: kept alive, the connection would read the rest
    for as long as the client sent it. It is closed (write side first: end of file right
    after the answer) while the client is still sending."""
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n")
        reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 404"), reply
        sock.settimeout(0.2)
        ended, start = False, time.monotonic()
        while not ended and time.monotonic() - start < 3:
            sock.sendall(b"a" * 4096)  # still sending
            try:
                while chunk := sock.recv(4096):
                    reply += chunk
                ended = True
            except TimeoutError:
                pass
        assert ended, "the connection was kept alive, reading the body"
    assert b"no such route: POST /v1/nowhere" in reply


def test_connections_lingering_over_refused_bodies_give_way_to_new_ones(tmp_path):
    """A connection answered 413 mid-body lingers, reading and dropping the rest, for up to
    30 s: at --max-connections, such connections must give way (oldest first) to new clients,
    not lock /health out for as long as their bodies keep coming."""
    most = 8
    args = ("--header-timeout", "1", "--idle-timeout", "2", "--max-connections", str(most))
    with started_server(*args, log=tmp_path / "serve.log") as (url, port, _):
        refused = []
        for _ in range(most):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n")
            refused.append(sock)
        try:
            for sock in refused:
                assert b" 413 " in sock.recv(4096)
                sock.sendall(b"a" * 1000)  # still sending: lingering
            # each new one closes the oldest lingering one (else it would be turned away)
            answers = [httpx.get(f"{url}/health", timeout=2).status_code for _ in range(3)]
            assert answers == [200] * 3
        finally:
            for sock in refused:
                sock.close()


# --- SIGTERM mid-request ------------------------------------------------------------------
@contextlib.contextmanager
def started_server(*args: str, log: Path):
    """`mlxspec serve` on a free port, for a test that ends it itself; killed if it did not."""
    port = free_port()
    command = [sys.executable, "-m", "mlxspec", "serve", "--port", str(port), *args]
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert process.poll() is None, f"the server exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"no /health after {STARTUP_SECONDS} s: {log.read_text()}"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url, port, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_sigterm_mid_request_ends_the_process_within_2_s(tmp_path):
    with started_server(*LIMITS, log=tmp_path / "serve.log") as (url, port, process), ThreadPoolExecutor(1) as pool:
        body = {"prompt": CODE, "temperature": 0, "max_tokens": 100000, "stream": True}
        with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", f"{url}/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # generating
            # a body still arriving, and a text to tokenize far longer than the context
            with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
                slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
                big = json.dumps({"messages": [{"role": "user", "content": "a b " * MB}]})
                pool.submit(httpx.post, f"{url}/v1/chat/completions", content=big, timeout=TIMEOUT)
                time.sleep(0.5)
                signalled = time.monotonic()
                process.send_signal(signal.SIGTERM)
                try:
                    code = process.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    raise AssertionError(
                        f"still running 2 s after SIGTERM: {(tmp_path / 'serve.log').read_text()}"
                    ) from None
                took = time.monotonic() - signalled
                tail = [line for line in lines if line.startswith("data:")]
    assert code in (-signal.SIGTERM, 128 + signal.SIGTERM), code
    assert tail[-1] == "data: [DONE]" and "shutting down" in tail[-2]
    assert took < 2


# --- an error names its field ---------------------------------------------------------------
def test_a_token_id_error_names_its_param(server, client):
    response = httpx.post(f"{server}/v1/completions", json={"prompt": [1, 99999]}, timeout=TIMEOUT)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt" and "token id 99999 is outside the target's vocabulary" in error["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="m", prompt=[5, -1], max_tokens=4, stream=True)
    assert raised.value.body["param"] == "prompt"


def test_bad_limits_are_one_line_before_anything_loads(capsys):
    from mlxspec.cli import main

    for args, message in (
        (["--max-body-mb", "0"], "--max-body-mb must be > 0"),
        (["--header-timeout", "nan"], "--header-timeout must be > 0"),
        (["--max-body-mb", "inf"], "--max-body-mb must be > 0 and finite"),  # an internal error once (issue 28)
        (["--idle-timeout", "inf"], "--idle-timeout must be > 0 and finite"),  # no limit at all, silently
        (["--max-connections", "0"], "--max-connections must be from 1 to"),
        (["--max-connections", str(10**9)], "--max-connections must be from 1 to"),
        # issue 39: these started a server whose every lookup request was a 500
        (["--history-tokens", "1"], "--history-tokens must be from 2 to 2147483648, got 1"),
        (["--history-tokens", "2147483649"], "--history-tokens must be from 2 to 2147483648, got 2147483649"),
        (["--history-tokens", "99999999999999999999"], "--history-tokens must be from 2 to 2147483648"),
        (["--tree", "²"], "tree (nodes per round) must be a whole number from 0 to 256 or 'auto', got '²'"),
        (["--gamma", "1500"], "gamma (draft length) must be at most 64, got 1500"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", *args])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


# --- what one request may ask of a round (issue 39) ----------------------------------------
ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    "completions": ("/v1/completions", {"prompt": CODE, "max_tokens": 4}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
}
HUGE_ROUNDS = {  # each kept a worker busy for minutes after its client left, or was a 500
    "a chain of 1500": ({"gamma": 1500, "tree": 0}, "gamma", "gamma (draft length) must be at most 64, got 1500"),
    "a tree of 50000": ({"gamma": 4, "tree": 50000}, "tree", "tree (nodes per round) must be at most 256, got 50000"),
    "both": ({"gamma": 1500, "tree": 50000, "max_tokens": 1500}, "gamma", "must be at most 64"),
    "a superscript two": ({"tree": "²"}, "tree", "must be a whole number from 0 to 256 or 'auto', got '²'"),
    "Arabic-Indic twelve": ({"gamma": "١٢"}, "gamma", "must be a whole number from 0 to 64 or 'auto', got '١٢'"),
}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case", list(HUGE_ROUNDS))
def test_gamma_and_tree_past_what_pays_get_a_400_naming_the_field(server, route, case):
    path, body = ROUTES[route]
    fields, param, message = HUGE_ROUNDS[case]
    response = httpx.post(f"{server}{path}", json={**body, **fields}, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"]
    assert error.get("param", param) == param  # Anthropic's error shape has no param


@pytest.mark.parametrize("route", [*ROUTES, "responses"])
def test_nan_and_infinity_in_a_body_are_not_json(server, client, route):
    """pydantic's reader took them: an echoed field (a response's metadata) then failed the
    answer's writing after the generation ran, a 500. A 400 before anything runs; the word
    inside a text is text."""
    path, body = ROUTES[route] if route != "responses" else ("/v1/responses", {"input": "hi", "max_output_tokens": 4})
    text = json.dumps(body)[:-1]
    for bad in (', "temperature": NaN}', ', "metadata": {"a": Infinity}}', ', "top_p": -Infinity}'):
        response = httpx.post(f"{server}{path}", content=text + bad, timeout=TIMEOUT)
        assert response.status_code == 400, response.text
        assert "not a JSON number" in response.json()["error"]["message"]
    fine = httpx.post(f"{server}{path}", content=text + ', "metadata": {"a": "NaN Infinity"}}', timeout=TIMEOUT)
    assert fine.status_code == 200, fine.text
    assert greedy(client)


def test_a_float_token_id_is_refused_not_truncated(server, client, pair):
    response = httpx.post(f"{server}/v1/completions", json={"prompt": [1.5, 2], "max_tokens": 4}, timeout=TIMEOUT)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt" and error["message"] == "token ids are whole numbers: prompt[0] is 1.5"
    with pytest.raises(InvalidOption, match=r"token ids are whole numbers: prompt\[1\] is 2.0"):
        mlxspec.generate(pair, [5, 2.0], max_tokens=4)  # the API truncated it to 2 (issue 39)
    assert greedy(client)


def test_a_client_that_leaves_a_request_at_the_bounds_frees_the_worker(server, client, pair):
    """γ and a tree at their most, for minutes' worth of tokens: the worker sees the client
    gone at the end of the round it is in (a round at the bounds takes about a second here)."""
    before = httpx.get(f"{server}/health", timeout=TIMEOUT).json()
    body = {"prompt": CODE, "max_tokens": 1500, "temperature": 0, "gamma": 64, "tree": 256}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/completions", json=body, timeout=httpx.Timeout(TIMEOUT, read=3))
    left = time.monotonic()
    while (state := httpx.get(f"{server}/health", timeout=TIMEOUT).json())["busy"] or state["stopped"] == before[
        "stopped"
    ]:
        assert time.monotonic() - left < ROUND_SECONDS, f"still generating after the client left: {state}"
        time.sleep(0.05)
    assert state["served"] == before["served"]  # cut short, not finished
    assert greedy(client) == standard(pair, CODE, 24, raw=True).text
