"""Fixtures: real mlx-lm models, tiny and random, written to disk and loaded back with
`mlx_lm.load`, sharing a byte-level BPE tokenizer trained here on the standard library's
source. Built once per test session (a few seconds).

The suite runs on two processes (`-n 2`, pytest-xdist, a file at a time to each): one MLX
thread each, so a 2-core machine's second core is not left idle. Tests that time a server
(`alone`) hold the machine to themselves while they run."""

from __future__ import annotations

import fcntl
import inspect
import os
import sysconfig
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never touch the network

from mlxspec.models import synthetic  # noqa: E402
from tests.support.real_models import use_tests_cache  # noqa: E402

use_tests_cache()  # downloads, imports and locks in the tests' own cache, not the user's

# Per architecture: how sharp the target's logits are and how far its draft is perturbed
# from it, chosen so that greedy acceptance sits between ~0.3 and ~0.9: every round length
# and both rewind paths (partial rejection, full acceptance) occur within 40 tokens.
# Caches covered: KVCache (llama, qwen2, qwen3, gemma2, phi3), RotatingKVCache that wraps
# (gemma3_text, llama_sliding), ArraysCache (mamba; qwen3_next beside KVCache) and
# CacheList (deepseek_v32: two KV caches; baichuan_m1: a state with a window; falcon_h1: a
# Mamba-2 state with a KV cache).
ARCH_SETTINGS = {
    "llama": (4.0, 0.1),
    "qwen2": (4.0, 0.1),
    "qwen3": (4.0, 0.1),
    "gemma2": (1.0, 0.15),
    "phi3": (4.0, 0.1),
    "gemma3_text": (4.0, 0.04),
    "llama_sliding": (4.0, 0.1),
    "qwen3_next": (4.0, 0.05),
    "mamba": (4.0, 0.15),
    "deepseek_v32": (2.0, 0.15),
    "baichuan_m1": (4.0, 0.1),
    "falcon_h1": (4.0, 0.1),
}
ARCHS = list(ARCH_SETTINGS)
# Beyond ARCHS (whose caches these share): a llama with 32-wide heads, for quantized KV caches.
ARCH_SETTINGS["llama_kv32"] = (4.0, 0.1)


def stdlib_texts(limit: int = 30) -> list[str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(lib.glob("*.py"))[:limit]
    return [f.read_text(errors="ignore") for f in files]


def pytest_runtest_logreport(report):
    """A failure named as it happens, in the process that prints (under xdist, the one the
    workers report to): `-ra`'s summary comes only at the end, and a run stopped before it
    would have shown only its F's."""
    if not report.failed or _is_xdist_worker(_config):
        return
    terminal = _config.pluginmanager.get_plugin("terminalreporter") if _config else None
    if terminal is not None:
        terminal.write("\n")  # after the line of progress letters
        terminal.write_line(f"FAILED {report.nodeid}" + (f" (in its {report.when})" if report.when != "call" else ""))


_config = None


def _is_xdist_worker(config) -> bool:
    """This process is a worker of an xdist run: by its config, not by PYTEST_XDIST_WORKER,
    which a pytest a test starts (the session walk's negative control) inherits. Read from
    the environment, such an inner run took the outer run's locks while its parent test held
    one, and deadlocked the suite with a waiting `alone` test (the whole run stood idle)."""
    return config is not None and hasattr(config, "workerinput")


def pytest_configure(config):
    global _config
    _config = config


_lock_files = None  # this process's machine and turnstile lock files, open for the run
_holding_alone = False  # the machine held exclusively from one `alone` test into the next


def _alone(item) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, each test holds a shared lock on the machine and an `alone` test an
    exclusive one, from its setup (a module's server starting, a model loading) to its
    teardown; a turnstile taken first keeps a waiting `alone` test from being starved by the
    other process's stream of shared ones. Consecutive `alone` tests keep the exclusive lock
    from one to the next: taken anew for each, every one waited for the other process's
    current test to end while this one stood idle, and the two processes took turns, one test
    each, through a file of them (test_server_limits.py's 31). Outside xdist, nothing."""
    global _lock_files, _holding_alone
    if not _is_xdist_worker(item.config):
        return (yield)
    if _lock_files is None:
        shared = Path(tempfile.gettempdir()) / f"mlxspec-tests-{item.config.workerinput['testrunuid']}"
        shared.mkdir(exist_ok=True)  # one folder for the run's processes
        _lock_files = open(shared / "machine.lock", "a"), open(shared / "turnstile.lock", "a")  # noqa: SIM115
    machine, turnstile = _lock_files
    alone = _alone(item)
    if not _holding_alone:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        return (yield)
    finally:
        _holding_alone = alone and _alone(nextitem)
        if not _holding_alone:
            fcntl.flock(machine, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory, request) -> Path:
    """A folder every test process of this run shares (pytest-xdist's workers' temporary
    folders are siblings in one folder per run, cleaned as pytest cleans its own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if _is_xdist_worker(request.config) else base


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tokenizer_dir(models_dir) -> Path:
    path = models_dir / "tokenizer"
    synthetic.train_tokenizer(stdlib_texts(), 512, path)
    return path


def _eos_ids(tokenizer_dir: Path) -> list[int]:
    import json

    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in data["added_tokens"]}
    return [ids[synthetic.ENDOFTEXT], ids[synthetic.IM_END]]


class ModelFactory:
    """Builds (and remembers) model folders on demand."""

    def __init__(self, root: Path, tokenizer_dir: Path):
        self.root = root
        self.tokenizer_dir = tokenizer_dir
        self.eos = _eos_ids(tokenizer_dir)
        self._built: dict[str, Path] = {}

    def _build(self, name: str, **kwargs) -> Path:
        if name not in self._built:
            path = self.root / name
            kwargs.setdefault("eos_token_ids", self.eos)
            synthetic.build_model(out_dir=path, tokenizer_dir=self.tokenizer_dir, **kwargs)
            self._built[name] = path
        return self._built[name]

    def pair(self, arch: str, bits: int | None = None) -> tuple[Path, Path]:
        """A target and a noisy copy of it as the draft; `bits` quantizes both."""
        head_scale, noise = ARCH_SETTINGS[arch]
        target = self._build(f"{arch}-target", arch=arch, seed=1, head_scale=head_scale)
        draft = self._build(f"{arch}-draft", arch=arch, seed=2, like=target, noise=noise)
        if bits:
            return self.quantized(target, bits), self.quantized(draft, bits)
        return target, draft

    def quantized(self, source: Path, bits: int) -> Path:
        name = f"{source.name}-q{bits}"
        if name not in self._built:
            import mlx_lm
            from mlx_lm.utils import load_config, quantize_model, save_config, save_model

            model, _ = mlx_lm.load(str(source))
            model, config = quantize_model(model, load_config(source), group_size=32, bits=bits)
            save_model(self.root / name, model)
            save_config(config, self.root / name / "config.json")
            synthetic.copy_tokenizer(source, self.root / name)
            self._built[name] = self.root / name
        return self._built[name]

    def model(self, name: str, **kwargs) -> Path:
        return self._build(name, **kwargs)


@pytest.fixture(scope="session")
def factory(models_dir, tokenizer_dir) -> ModelFactory:
    return ModelFactory(models_dir, tokenizer_dir)


@pytest.fixture(scope="session")
def load_pair(factory):
    """load_pair(arch, bits=None) -> a loaded Pair, cached per session."""
    import mlxspec

    cache = {}

    def load(arch: str, bits: int | None = None):
        if (arch, bits) not in cache:
            target, draft = factory.pair(arch, bits)
            cache[arch, bits] = mlxspec.load_pair(str(target), str(draft))
        return cache[arch, bits]

    return load


def interrupt_after(delay: float, work):
    """Run work() while a real SIGINT (Ctrl-C) arrives after `delay` seconds. Returns what
    work returned, or None if the KeyboardInterrupt escaped it; a signal landing after work
    finished is absorbed here, so it never leaks into the next test."""
    import os
    import signal
    import threading
    import time

    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()  # on a busy machine the signal may come before start() returns
        result = work()
    except KeyboardInterrupt:
        result = None
    while True:
        try:
            timer.join()
            time.sleep(0.02)  # a pending signal is handled at the next bytecode
            return result
        except KeyboardInterrupt:
            continue


@contextmanager
def ctrl_c_at(call: int | None):
    """A KeyboardInterrupt raised at the start of the `call`-th Python function called inside
    mlxspec or mlx-lm (None: never): a Ctrl-C at a chosen, repeatable point, mid-forward or
    mid-rollback included. Generator frames resuming are not counted: a real signal is not
    raised where one resumes either. Yields a list that gets the module it landed in."""
    import sys

    import mlx_lm

    import mlxspec

    roots = tuple(str(Path(package.__file__).parent) for package in (mlxspec, mlx_lm))
    count, landed = 0, []

    def trace(frame, event, arg):
        nonlocal count
        code = frame.f_code
        if event == "call" and not code.co_flags & inspect.CO_GENERATOR and code.co_filename.startswith(roots):
            count += 1
            if count == call:
                sys.settrace(None)
                landed.append(frame.f_globals.get("__name__"))
                raise KeyboardInterrupt

    before = sys.gettrace()
    if call is not None:
        sys.settrace(trace)
    try:
        yield landed
    finally:
        sys.settrace(before)


def emitted_ids(pair, prompt, session, **options) -> tuple[list, list]:
    """The ids a call emits (end-of-sequence included) and its rounds."""
    import mlxspec

    rounds = [e for e in mlxspec.stream(pair, prompt, session=session, **options) if isinstance(e, mlxspec.Round)]
    return [t for r in rounds for t in r.emitted], rounds


def fresh_standard(pair, prompt, max_tokens: int, options=None) -> list[int]:
    """What standard decoding emits for `prompt` from empty caches (built with `options`)."""
    import mlxspec

    session = mlxspec.Session(pair, cache_options=options or mlxspec.CacheOptions())
    return emitted_ids(pair, prompt, session, gamma=0, max_tokens=max_tokens)[0]


def primed_for_early_stop(doubt: float = 0.75, threshold: float = 0.8):
    """A controller whose evidence says: the draft's second proposal, at confidence `doubt`,
    is always rejected, so stop below `threshold` (the smallest candidate above `doubt`). Its
    learned threshold is then on from the first round."""
    from mlxspec.drafting import Controller
    from tests.support.controllers import drafted

    controller = Controller()
    pattern = [0.95, doubt, 0.95, 0.95, 0.95, 0.95]
    for r in range(32):
        size = len(pattern) - r % 2
        drafted(controller, drafted=size, accepted=1, draft=size * 0.004, verify=0.01)
        controller.stop.observe(
            threshold=0.0, confidences=tuple(pattern[:size]), accepted=1, forwards=size, draft_seconds=size * 0.004
        )
    assert controller.stop.threshold == threshold
    return controller
