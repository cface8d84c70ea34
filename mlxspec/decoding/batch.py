"""Many generations on one thread, their forwards batched.

Each generation runs the engine's own code, as it would alone: its policy, drafter, keys,
grammar and stop strings are its own, in a greenlet of its own. Its cursors are lanes of
packed caches (packed.py); when a cursor reads ids, its greenlet hands the read to the hub
and waits. Once every generation waits, the hub runs the reads of one packed cache as one
forward (a drafter's before its target's, so the target reads every lane's drafts at once)
and hands each its rows. So a round is: every lane drafts (one batched forward per draft
step), then one target forward verifies every lane's chain or tree, then each lane applies
the rule and rolls back its own lane. What a generation emits cannot depend on the others:
the only thing shared is the forward, and each lane's rows in it see its own context only.

Greenlets (not threads) because MLX and the caches are used from one thread, and the
switches are explicit: nothing runs between a read and its forward but other generations'
host code.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
from greenlet import greenlet

from .packed import PackedCache, Read


@dataclass
class Finished:
    """A task's end: what it returned, or what it raised."""

    value: object = None
    error: BaseException | None = None


class Batch:
    """Runs tasks (callables) together; see the module's docstring."""

    def __init__(self):
        self._hub: greenlet | None = None
        self.forwards = 0  # batched forwards run, for the figures
        self.rows = 0  # reads they served
        self.forwards_of: Counter[str] = Counter()  # per packed cache (its name): forwards
        self.rows_of: Counter[str] = Counter()  # and reads served

    def read(self, read: Read) -> tuple[mx.array, mx.array | None]:
        """From a task: its read, once forwarded with the others' (alone outside a run)."""
        if self._hub is None or greenlet.getcurrent() is self._hub:
            return read.lane.packed.forward([read])[0]
        answer = self._hub.switch(read)
        if isinstance(answer, _Raise):
            raise answer.error
        return answer

    def run(self, admit: Callable[[bool], list[Callable[[], object]]], *, done: Callable | None = None) -> None:
        """Start what `admit(idle)` returns (idle: nothing runs, so it may wait for work; an
        empty list then ends the run) and run all to their ends; `done(task, Finished)` as each
        ends. A KeyboardInterrupt reaches every waiting task (each ends as Ctrl-C ends it
        alone) before it ends the run."""
        self._hub = greenlet.getcurrent()
        live: dict[greenlet, Callable] = {}
        ready: deque = deque()  # (runner, what its read returns; None to start it)
        waiting: dict[PackedCache, list[tuple[greenlet, Read]]] = {}
        try:
            while True:
                for task in admit(not live):
                    runner = greenlet(_finishing(task), parent=self._hub)
                    live[runner] = task
                    ready.append((runner, None))
                if not live:
                    return
                while ready:
                    runner, answer = ready.popleft()
                    self._step(runner, answer, live, waiting, done)
                if waiting:
                    packed = min(waiting, key=lambda p: p.order)
                    ready.extend(self._forward(packed, waiting.pop(packed)))
        except BaseException as e:
            # From here reads run alone. Every task that started unwinds through its own
            # handlers (an interrupt: each stream ends "interrupted", its caches exact).
            self._hub = None
            endings = []
            for runner in list(live):
                if runner:  # started and not finished
                    endings.append((live.pop(runner), runner.throw(e)))
            for task, out in endings:  # every task has ended before any `done` may raise
                if done is not None:
                    with contextlib.suppress(Exception):
                        done(task, out)
            raise
        finally:
            self._hub = None

    def _step(self, runner, answer, live, waiting, done) -> None:
        """Run one task until it reads again (then it waits) or ends."""
        out = runner.switch(answer) if runner else runner.switch()  # a runner not started takes no answer
        if runner.dead:
            task = live.pop(runner)
            if done is not None:
                done(task, out)
        else:
            waiting.setdefault(out.lane.packed, []).append((runner, out))

    def _forward(self, packed: PackedCache, entries: list[tuple[greenlet, Read]]) -> list:
        try:
            results = packed.forward([read for _, read in entries])
        except Exception as e:  # a failed forward fails its readers, not the run
            return [(runner, _Raise(e)) for runner, _ in entries]
        self.forwards += 1
        self.rows += len(entries)
        self.forwards_of[packed.name] += 1
        self.rows_of[packed.name] += len(entries)
        return [(runner, result) for (runner, _), result in zip(entries, results)]


@dataclass
class _Raise:
    error: BaseException


def _finishing(task: Callable[[], object]) -> Callable[[], Finished]:
    def body() -> Finished:
        try:
            return Finished(value=task())
        except BaseException as e:  # noqa: BLE001 - handed to `done`, never lost
            return Finished(error=e)

    return body
