"""The one thread that runs MLX, and the prompt cache.

The worker thread loads the pair, then runs up to `max_batch` generations at once, in
arrival order. Interleaving generations' rounds on one device would only share its time;
batching them shares its forwards. A decode step reads every weight once whatever its rows
(here, SmolLM2-135M on two CPU cores: 4 rows cost 1.03 steps, 8 cost 1.30), so four clients
decoded together get about three times the tokens per second of four one after another, and
each still gets exactly its own answer: each generation runs the engine's own code in a
greenlet with its own keys, policy and grammar, and only the forwards are shared
(decoding/batch.py, decoding/packed.py; measured in docs/server.md). A job joins the batch
between forwards (its prompt read in chunks, aside while others decode, so they are not
padded to its length) and leaves when it ends; a session generating in the batch is never handed to
another job. `max_batch` 1 is one at a time (FIFO), as are families whose caches cannot be
batched (recurrent state, a target across ranks: `batching.why_not`, said once at start).

Each generation's events go to the asyncio side as they come (`Job`); between rounds the
worker looks at the job's stop flag (a client that went away, the server shutting down) and
closes the generator, which leaves the session's caches consistent, as Ctrl-C does in chat.

The prompt cache keeps up to `size` Sessions, one per conversation, least recently used
first. A request continues a conversation when it starts with that conversation's last
prompt (but for a short tail a chat template may render differently once the reply is in,
such as an empty thinking block): that session's caches then read only the new tokens, for
the target and the draft. Any other request takes a fresh session while there is room, or
the least recently used one (whose caches still serve whatever prefix it shares, such as a
system prompt). Memory: each session holds both models' KV caches for its conversation.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Collection
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

from ..decoding.caches import CacheOptions
from ..decoding.events import Done
from ..errors import MlxspecError
from ..options import AUTO, Options

# A template may render the end of the previous prompt differently once the reply follows it
# (Qwen3's empty thinking block, a generation prompt): this many ids of it may differ.
REWRITTEN_TAIL = 32
END = object()  # the last item of every job


@dataclass(eq=False)  # a job is itself: hashed by identity (the worker's set of running ones)
class Job:
    """One generation, seen from both sides: the worker posts events, the event loop reads
    them; either side may set `stop`."""

    ids: list[int]
    options: Options
    loop: asyncio.AbstractEventLoop
    note: str | None = None  # for the console line: what else was in force (tools)
    namespace: str = "default"  # whose history prompt lookup drafts from (a digest of the API key)
    items: asyncio.Queue = field(default_factory=asyncio.Queue)
    stop: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.stop.set()

    def post(self, item) -> None:
        """From the worker thread: hand an item to the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.stop.set()

    async def next(self):
        return await self.items.get()


@dataclass(frozen=True)
class HistorySettings:
    """The server's history of prompts and answers (drafters/history/): one index per API
    key, each at most `tokens` ids, kept on disk under mlxspec's cache when `keep`."""

    tokens: int = 1 << 20
    keep: bool = False
    save_every: int = 64  # requests between saves, when kept

    def store(self, pair, *, warn):
        """The store for `pair`: kept under a folder of its tokenizer's, and no file's ids
        past its target's width read."""
        from ..drafters.history import HistoryStore
        from ..models.paths import history_folder

        folder = history_folder(pair.tokenizer) if self.keep else None
        return HistoryStore(limit_tokens=self.tokens, folder=folder, warn=warn, vocab_size=pair.target.width)


@dataclass
class _Entry:
    session: object  # generation.Session
    namespace: str  # whose conversation its caches hold (an API key's digest)
    prompt: tuple[int, ...] = ()  # the last prompt it read


class PromptCache:
    """Up to `size` sessions, least recently used first (size 0: a fresh session each time)."""

    def __init__(self, make_session: Callable[[], object], size: int):
        self.make_session = make_session
        self.size = size
        self.entries: list[_Entry] = []

    def __len__(self) -> int:
        return len(self.entries)

    def held_for(self, namespace: str) -> int:
        """Conversations cached under one namespace (from any thread: a copy is read)."""
        return sum(entry.namespace == namespace for entry in list(self.entries))

    def session_for(self, ids: list[int], namespace: str, *, busy: Collection = ()):
        """The session of the conversation `ids` continues under `namespace`, else a free or
        the oldest one; never one of `busy` (generating now, in a batch), so with every
        session busy a fresh one that is not kept. A session's caches never pass from one
        namespace (API key) to another: a prompt sharing their prefix would read faster, and
        its usage would count the cached tokens, telling one key what another sent."""
        idle = [e for e in self.entries if e.session not in busy]
        continuing = [
            (shared, e)
            for e in idle
            if e.namespace == namespace and continues(shared := _common(e.prompt, ids), e.prompt)
        ]
        if continuing:
            return max(continuing, key=lambda pair: pair[0])[1].session
        if len(self.entries) < self.size:
            self.entries.append(_Entry(self.make_session(), namespace))
            return self.entries[-1].session
        if not idle:
            return self.make_session()
        oldest = idle[0]
        if oldest.namespace != namespace:  # another key's: its caches go with it
            oldest.session, oldest.namespace, oldest.prompt = self.make_session(), namespace, ()
        return oldest.session

    def used(self, session, prompt: list[int]) -> None:
        """`session` has just read `prompt`: it becomes the most recently used."""
        entry = next((e for e in self.entries if e.session is session), None)
        if entry is None:
            return
        self.entries.remove(entry)
        entry.prompt = tuple(prompt)
        self.entries.append(entry)


def continues(shared: int, prompt: tuple[int, ...]) -> bool:
    """Whether a request sharing `shared` leading ids with a conversation's last prompt
    continues it (all of it but a short tail, and more than half)."""
    return bool(prompt) and shared >= len(prompt) - min(REWRITTEN_TAIL, len(prompt) // 2)


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Worker:
    """Loads the pair with `load()` and runs every generation on one thread."""

    def __init__(
        self,
        load: Callable[[], object],
        *,
        cache_sessions: int = 4,
        cache_options=None,
        history: HistorySettings = HistorySettings(),
        max_batch: int | None = None,
        log: Callable[[str], None] | None = None,
    ):
        """`max_batch`: generations that share their forwards at most (1: one at a time;
        None: sized from the machine's memory and the models, once loaded)."""
        self._load = load
        self.max_batch = max_batch
        self.batched_because: str | None = None  # why generations run one at a time, if they do
        self._history = history
        self.history = None  # the HistoryStore every session shares, once loaded
        self._cache_sessions = cache_sessions
        self._cache_options = cache_options
        self._log = log or (lambda line: None)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mlxspec-worker", daemon=True)
        self.pair = None
        self.cache: PromptCache | None = None
        self.current: dict[Job, object] = {}  # the jobs generating now, and their sessions
        self.served = 0
        # per namespace: what /health tells a key is its own, never another key's
        self.served_by: Counter[str] = Counter()
        self.stopped_by: Counter[str] = Counter()  # cut short by a client that left (or a shutdown)

    def start(self):
        """Load the pair on the worker thread; returns it, or raises what loading raised."""
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        return self.pair

    def submit(
        self,
        ids: list[int],
        options: Options,
        loop: asyncio.AbstractEventLoop,
        *,
        note: str | None = None,
        namespace: str = "default",
    ) -> Job:
        job = Job(ids, options, loop, note=note, namespace=namespace)
        self._jobs.put(job)
        return job

    def state_of(self, namespace: str) -> dict:
        """What /health tells one namespace (an API key) of the worker: its own requests'
        counts only, so that no key can count or time another's. Reads plain values and the
        queue's own mutex (held for a put or a get, never for a generation)."""
        with self._jobs.mutex:
            queued = sum(1 for job in self._jobs.queue if job is not None and job.namespace == namespace)
        current, cache = list(self.current), self.cache
        return {
            "busy": any(job.namespace == namespace for job in current),
            "generating": sum(job.namespace == namespace for job in current),
            "max_batch": self.max_batch,
            "queued": queued,
            "cached_sessions": cache.held_for(namespace) if cache is not None else 0,
            "served": self.served_by[namespace],
            "stopped": self.stopped_by[namespace],
        }

    def cancel_all(self) -> None:
        """Stop the running generation at its next round and every queued one (shutdown)."""
        with self._jobs.mutex:
            waiting = [job for job in self._jobs.queue if job is not None]
        for job in waiting + list(self.current):
            job.cancel()

    def close(self, timeout: float = 10.0) -> None:
        self.cancel_all()
        self._jobs.put(None)
        self._thread.join(timeout)

    # --- on the worker thread ---------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._load_pair():
                if self.max_batch > 1:
                    self._run_batched()
                else:
                    while (job := self._jobs.get()) is not None:
                        self._serve(job)
        finally:
            self.cache = None  # the sessions' caches go with the thread that made them
            self._save_history()
            _release_thread()

    def _load_pair(self) -> bool:
        try:
            from ..drafting import Controller, ControllerConfig
            from ..generation import Session

            self.pair = pair = self._load()
            # one pair, one generation at a time: what is learnt of its costs and acceptance
            # serves every conversation
            controller = Controller(ControllerConfig(start_gamma=pair.gamma_hint, draft_weight=pair.draft_weight))
            options = {"cache_options": self._cache_options} if self._cache_options is not None else {}
            # one history for every conversation, a namespace per API key
            self.history = history = self._history.store(self.pair, warn=self._log)
            self.cache = PromptCache(
                lambda: Session(pair, controller=controller, history=history, **options), self._cache_sessions
            )
            self._size_batch()
            return True
        except BaseException as e:  # reported by start(), on the main thread
            self._failure = e
            return False
        finally:
            self._ready.set()

    def _size_batch(self) -> None:
        from ..batching import default_max_batch, why_not

        self.batched_because = why_not(self.pair)
        if self.batched_because is not None:
            if self.max_batch not in (None, 1):
                self._log(f"generations run one at a time: {self.batched_because}")
            self.max_batch = 1
        elif self.max_batch is None:
            self.max_batch = default_max_batch(self.pair)

    def _run_batched(self) -> None:
        """Up to max_batch generations at once, their forwards shared (decoding/batch.py): a
        job joins between forwards and leaves when it ends."""
        from ..batching import Lanes
        from ..decoding.batch import Batch

        batch = Batch()
        lanes = Lanes(self.pair, batch, cache_options=self._cache_options or CacheOptions())
        closing = False

        def admit(idle: bool) -> list:
            nonlocal closing
            jobs = []
            while not closing and len(self.current) + len(jobs) < self.max_batch:
                try:
                    job = self._jobs.get(block=idle and not jobs)
                except queue.Empty:
                    break
                if job is None:
                    closing = True
                else:
                    jobs.append(job)
            return [partial(self._serve, job, lanes=lanes) for job in jobs]

        batch.run(admit)

    def _serve(self, job: Job, *, lanes=None) -> None:
        """One job to its end; `lanes`: in a batch, whose lanes its session's cursors join."""
        from ..generation import stream

        if job.stop.is_set():  # its client left while it waited
            self._stopped(job)
            job.post(END)
            return
        session, events = None, None
        try:
            session = self.cache.session_for(job.ids, job.namespace, busy=set(self.current.values()))
            self.current[job] = session
            auto = job.options.gamma is AUTO
            with lanes.joined(session, auto=auto) if lanes is not None else nullcontext():
                try:
                    events = stream(self.pair, job.ids, job.options, session=session, namespace=job.namespace)
                    self._post_events(job, events)
                finally:
                    if events is not None:  # in its lane: the clean-up may touch the caches
                        events.close()
        except MlxspecError as e:
            job.post(e)
        except Exception as e:  # a bug: say so to the client and the console, keep serving
            self._log(traceback.format_exc())
            job.post(e)
        finally:
            if session is not None:
                self.cache.used(session, job.ids)
            self.current.pop(job, None)
            if self._history.keep and self.served % self._history.save_every == 0:
                self._save_history()
            job.post(END)

    def _post_events(self, job: Job, events) -> None:
        shared = 1  # the most generations this one ran beside, itself included
        for event in events:
            job.post(event)
            shared = max(shared, len(self.current))
            if isinstance(event, Done):
                self.served += 1
                self.served_by[job.namespace] += 1
                batch = f"batch of {shared}" if shared > 1 else None
                note = " · ".join(part for part in (job.note, batch) if part) or None
                self._log(_summary(event, note=note, by_position=self.pair.own_head))
            elif job.stop.is_set():  # between rounds: closing the stream keeps the caches exact
                self._stopped(job)
                break

    def _stopped(self, job: Job) -> None:
        self.stopped_by[job.namespace] += 1

    def _save_history(self) -> None:
        """Write the history to disk (when kept), so that a restarted server starts warm (a
        namespace that cannot be saved is said so in a line, and the others are saved)."""
        if self.history is not None and self._history.keep:
            try:
                self.history.save()
            except Exception as e:  # the store says each namespace's failure; this is past them
                self._log(f"warning: the history was not saved ({type(e).__name__}: {e})")


def _release_thread() -> None:
    """Before the worker thread ends: finish its device work and destroy the streams it
    made (mlx-lm's generation stream is one per thread). Left to the thread's own exit,
    their teardown can abort the process as it exits (MLX 0.32, Linux)."""
    import mlx.core as mx

    mx.synchronize()
    clear = getattr(mx, "clear_streams", None)  # recent MLX only
    if clear is not None:
        clear()


def job_note(*, tools: str | None = None, grammar: str | None = None) -> str | None:
    """What else was in force, for the console line: tools (e.g. "tools 2 (auto)") and a
    grammar. `grammar` is the hook for constrained decoding (response_format, tool_choice
    required or named): a route that holds the output to a grammar names it here, e.g.
    "grammar json_schema", and the line shows it beside the tools."""
    parts = [part for part in (tools, grammar) if part]
    return " · ".join(parts) if parts else None


def _summary(done: Done, *, note: str | None = None, by_position: bool = False) -> str:
    from ..views.summary import stats_line

    stats = done.stats
    line = stats_line(stats, reused=stats.prompt_tokens - stats.prefill_tokens, by_position=by_position)
    return f"{line} · {note}" if note else str(line)
