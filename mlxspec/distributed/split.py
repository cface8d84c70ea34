"""Speculative decoding with the target split across machines by MLX's distributed layer.

`mlx.launch` starts one process per rank and each loads its share of the target, split by
mlx-lm: `pipeline(group)` gives each rank a block of layers, `shard(group)` splits every
layer's matrices (tensor parallel). **Rank 0 leads**: it alone loads the draft, tokenizes,
plans each round (`--gamma auto` from its own timings), drafts, samples, decides and
prints. The other ranks *follow*: they run their share of each target forward, in the order
rank 0 runs them, and nothing else.

Why rank 0 decides alone, rather than every rank drafting with the same keys: decisions
then agree by construction. For every rank to reach the same accept/reject by itself, every
rank would need the same draft logits, the same target logits and the same plan, bit for
bit, on every machine: `--gamma auto`'s plans follow timings, which differ per rank, and
logits need not agree across Macs of different generations (MLX picks kernels per chip). A
rank that strays would feed its cache other ids, or a forward of another length, and hang
or corrupt the others. With one leader there is nothing to agree on: the followers need no
draft, no tokenizer, no seed and no clock.

The price is one small transfer per target forward. Before each forward rank 0 broadcasts
a header: which cache, how many tokens it holds, and the ids to read (up to HEADER_IDS; a
longer input, a prefill chunk, follows in a second transfer). A follower trims its own copy
of that cache to that length and reads the ids, so every rollback rank 0 makes (a rejected
draft, a session brought back to a shared prefix, mlx-lm's own trims) reaches it without a
message of its own; this needs caches that roll back by trimming (KV and quantized KV:
`check_mirrorable`). Per target forward, on every rank:

    1 header (+1 for more than HEADER_IDS ids)  +  the sharded model's own collectives
        pipeline: the hidden state's hop from stage to stage (rank 0, the last stage,
                  receives once: 2 in all); mlx-lm's final all_gather, which hands every
                  rank the output, is left out (`without_final_gather`): only rank 0 reads it
        tensor:   two all_sums per layer (1 + 2 x layers in all)

A speculative round is one target forward, so it pays this once for all its tokens;
standard decoding pays it once per token.

Every rank must make the same transfers in the same order. Rank 0 queues the header
before building the forward (a pipeline stage's receive depends on no input, and could
otherwise run first), and queues the whole forward whatever its caller evaluates (a
prefill that reads only the cache still runs the forward's last transfers); forwards are
serialised by a lock and built on one stream.

A rank that dies closes its sockets: the ring backend then raises "[ring] connection to a
peer was lost" on every other rank at its next transfer, and the command line turns that
into one line (and mlx.launch stops the ranks left when one exits with an error).
"""

from __future__ import annotations

import atexit
import signal
import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generation_stream
from mlx_lm.models import cache as mlx_cache

from ..decoding.caches import ModelCache, layer_length, make_cache
from ..decoding.capture import model_family
from ..errors import InvalidOption, MlxspecError, ModelLoadError, UnsupportedCache, UnsupportedShard
from . import ranks

FORWARD, STOP = 1, 2  # what a header asks of the followers
HEADER_IDS = 32  # ids a header carries itself: a round's verify fits (pending ids + drafts)
FREED_SLOTS = 4  # caches rank 0 has dropped, announced with the next header
META = 6 + FREED_SLOTS  # op, cache key, cache length, id count, kv bits, kv group size, freed keys
HEADER = META + HEADER_IDS
COLLECTIVES = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter", "send", "recv", "recv_like")

ALONE = (
    "--shard splits the target across the ranks that mlx.launch starts, and this process is alone: run "
    "`mlx.launch --backend ring -n 2 --python $(which python) $(which mlxspec) generate ... --shard pipeline` "
    "(--hosts or --hostfile across Macs)"
)


class DistributedError(MlxspecError):
    """Ranks that cannot work together: no connection, a lost one, a rank out of step."""


@dataclass(frozen=True)
class ShardInfo:
    """How the target is split, seen from one rank."""

    mode: str  # "pipeline" or "tensor"
    rank: int
    size: int
    model_collectives: int  # the sharded forward's own transfers on this rank, per forward
    body_only: bool = False  # the model's body holds all of them: a follower may skip the output head
    skip_gather: bool = False  # forwards are built without the pipeline's final all_gather

    @property
    def transfers_per_forward(self) -> int:
        """Cross-rank transfers one target forward costs this rank: the header and the model's."""
        return 1 + self.model_collectives

    @property
    def label(self) -> str:
        return f"{self.mode} over {self.size} ranks"


def lost_connection(error: BaseException) -> DistributedError:
    return DistributedError(ranks.lost_connection_message(error))


def init_group():
    """The group of every rank mlx.launch started (2 or more, or InvalidOption)."""
    try:
        group = mx.distributed.init()
    except RuntimeError as e:
        raise DistributedError(f"cannot connect the ranks: {str(e).strip().splitlines()[0]}") from None
    if group.size() < 2:
        raise InvalidOption(ALONE)
    return group


def group_size() -> int:
    """How many ranks this process runs with (1 when not launched, or launched alone)."""
    if not ranks.launched():
        return 1
    try:
        return mx.distributed.init().size()
    except RuntimeError as e:
        raise DistributedError(f"cannot connect the ranks: {str(e).strip().splitlines()[0]}") from None


# --- splitting the target ----------------------------------------------------------------
def supported_modes(model) -> list[str]:
    """The ways mlx-lm can split this model."""
    modes = []
    if hasattr(model, "model") and hasattr(model.model, "pipeline"):
        modes.append("pipeline")
    if hasattr(model, "shard"):
        modes.append("tensor")
    return modes


def split(model, mode: str, group, name: str) -> None:
    """Split a (lazily loaded) model across the group in place, as mlx-lm's sharded_load does,
    or refuse an architecture mlx-lm cannot split that way."""
    if mode not in ranks.SHARD_MODES:
        raise InvalidOption(f"--shard takes {' or '.join(ranks.SHARD_MODES)}, got {mode!r}")
    supported = supported_modes(model)
    if mode not in supported:
        kind = model_family(model)
        how = "by layers (pipeline)" if mode == "pipeline" else "tensor-parallel (shard)"
        instead = f"; use --shard {supported[0]}" if supported else ""
        raise UnsupportedShard(f"{name} ({kind}) cannot be split {how} by mlx-lm{instead}")
    if mode == "tensor":
        _check_heads_divide(model, group.size(), name)
    try:
        if mode == "pipeline":
            model.model.pipeline(group)
        else:
            model.shard(group)
    except (ValueError, AssertionError) as e:
        raise ModelLoadError(f"cannot split {name} over {group.size()} ranks: {str(e).splitlines()[0]}") from None


def _check_heads_divide(model, size: int, name: str) -> None:
    """A tensor split gives each rank whole attention heads; mlx-lm splits whatever it is
    given and fails later, mid-forward, on the shapes that leaves."""
    args = getattr(model, "args", None) or getattr(getattr(model, "model", None), "args", None)
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    for count, what in ((heads, "attention heads"), (kv_heads, "key-value heads")):
        if isinstance(count, int) and count % size:
            raise UnsupportedShard(
                f"{name} has {count} {what}, which do not divide among {size} ranks: a tensor split gives every "
                f"rank whole heads (use a rank count that divides {count}, or --shard pipeline)"
            )


def check_mirrorable(model, name: str) -> None:
    """Followers mirror rank 0's rollbacks by trimming their caches, so every layer's cache
    must roll back by trimming (KV, quantized KV, lists of them); windows and recurrent
    states are refused."""
    cache = make_cache(model, name)
    if set(cache.kinds) != {"trim"}:
        kinds = sorted({type(layer).__name__ for layer, kind in zip(cache.layers, cache.kinds) if kind != "trim"})
        raise UnsupportedCache(
            f"{name}: a target split across ranks needs caches that roll back by trimming (KVCache), and it "
            f"uses {', '.join(kinds)}"
        )


def local_bytes(model) -> int:
    """Bytes of the weights this rank holds (known before they are read)."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


@contextmanager
def counting() -> Iterator[Counter]:
    """Count the collectives built while inside, by name (each is one cross-rank transfer
    when evaluated); `.total()` is the sum."""
    count: Counter = Counter()
    originals = {name: getattr(mx.distributed, name) for name in COLLECTIVES}

    def counted(name, function):
        def call(*args, **kwargs):
            count[name] += 1
            return function(*args, **kwargs)

        return call

    for name, function in originals.items():
        setattr(mx.distributed, name, counted(name, function))
    try:
        yield count
    finally:
        for name, function in originals.items():
            setattr(mx.distributed, name, function)


@contextmanager
def without_final_gather(active: bool) -> Iterator[None]:
    """mlx-lm's pipeline forward ends by all_gathering rank 0's last hidden state, so that
    every rank holds the output. Here only rank 0 reads it (it holds the last layers), so
    while a forward is built the gather is the identity, on every rank alike: rank 0 keeps
    its own rows, the others' are never read, and each forward crosses once less."""
    if not active:
        yield
        return
    gather = mx.distributed.all_gather
    mx.distributed.all_gather = lambda x, **kwargs: x
    try:
        yield
    finally:
        mx.distributed.all_gather = gather


def probe(model, mode: str) -> tuple[int, ShardInfo]:
    """One forward on every rank at once (it must run everywhere): the logit width and how
    this rank's forwards cross: the sharded forward's collectives (without the final gather
    of a pipeline, when that is its only gather) and whether the model's body alone holds
    all of them (then a follower can skip the output head it does not need)."""
    group = mx.distributed.init()
    with counting() as built:
        model(mx.array([[0]]), cache=mlx_cache.make_prompt_cache(model))  # built, never evaluated
    skip = mode == "pipeline" and built["all_gather"] == 1
    with counting() as whole, without_final_gather(skip):
        logits = model(mx.array([[0]]), cache=mlx_cache.make_prompt_cache(model))
    mx.eval(logits)
    body_only = False
    body = getattr(model, "model", None)
    if isinstance(body, nn.Module):
        try:
            with counting() as inside, without_final_gather(skip):
                body(mx.array([[0]]), cache=mlx_cache.make_prompt_cache(model))  # built, never evaluated
            body_only = inside.total() == whole.total()
        except Exception:
            body_only = False
    info = ShardInfo(mode, group.rank(), group.size(), whole.total(), body_only, skip)
    return logits.shape[-1], info


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block ends: once a header is queued, the forward it announces
    must be queued too, or the other ranks would run a forward rank 0 never joins."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def barrier() -> None:
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))


# --- rank 0 --------------------------------------------------------------------------------
_leaders: list = []  # kept to the end: at exit they release their followers


class Leader:
    """Rank 0's handle on the sharded target: calling it runs one forward on every rank.

    It stands in for the model (other attributes are the model's), so caches, the engine,
    the cost model and mlx-lm's own generation use it unchanged. A call broadcasts a header,
    then builds rank 0's share on the broadcast ids and queues it (async_eval): whatever
    the caller evaluates, the whole forward runs, so every rank makes the same transfers in
    the same order. Calls are serialised and placed on one stream."""

    def __init__(self, model, info: ShardInfo):
        self._sharded = model
        self.info = info
        self.forwards = 0
        self.transfers = 0  # this rank's cross-rank transfers: headers and the model's
        self._keys: dict[int, int] = {}  # id of a cache's first layer -> its key
        self._next_key = 1
        self._freed: list[int] = []
        self._lock = threading.Lock()
        self._stopped = False
        if not _leaders:
            atexit.register(finish)
        _leaders.append(self)

    def __getattr__(self, name):
        if name.startswith("_sharded"):
            raise AttributeError(name)
        return getattr(self._sharded, name)

    def __call__(self, inputs: mx.array, cache=None, **extra):
        if any(value is not None for value in extra.values()):
            raise NotImplementedError("a target split across ranks reads token ids only")
        if inputs.ndim != 2 or inputs.shape[0] != 1:
            raise NotImplementedError("a target split across ranks reads one sequence at a time")
        if self._stopped:
            raise DistributedError("the other ranks were already released (finish() was called)")
        with self._lock, interrupts_deferred(), mx.stream(generation_stream):
            ids = self._announce(inputs, cache)
            # queued apart, before the forward: a pipeline stage's receive depends on no
            # input, and would otherwise be free to run ahead of the header
            mx.async_eval(ids)
            with without_final_gather(self.info.skip_gather):
                out = self._sharded(ids, cache=cache)
            mx.async_eval(out)
            self.forwards += 1
            self.transfers += self.info.model_collectives
        return out

    def _announce(self, inputs: mx.array, cache) -> mx.array:
        """Broadcast the header; returns the ids as every rank received them (1, n)."""
        count = inputs.shape[1]
        key, length, bits, group_size = self._describe(cache)
        meta = mx.array([FORWARD, key, length, count, bits, group_size, *self._take_freed()], dtype=mx.int32)
        flat = inputs.reshape(-1).astype(mx.int32)
        carried = flat if count <= HEADER_IDS else flat[:0]
        padding = mx.zeros((HEADER_IDS - carried.shape[0],), dtype=mx.int32)
        received = mx.distributed.all_sum(mx.concatenate([meta, carried, padding]))
        self.transfers += 1
        if count <= HEADER_IDS:
            ids = received[META : META + count]
        else:
            ids = mx.distributed.all_sum(mx.depends(flat, received))  # after the header, on every rank
            self.transfers += 1
        return ids.astype(inputs.dtype)[None]

    def _describe(self, cache) -> tuple[int, int, int, int]:
        """(key, tokens held, kv bits, kv group size) of a cache; key 0: no cache."""
        if cache is None:
            return 0, 0, 0, 0
        first = cache[0]
        key = self._keys.get(id(first))
        if key is None:
            key, self._next_key = self._next_key, self._next_key + 1
            self._keys[id(first)] = key
            weakref.finalize(first, self._forget, id(first), key)
        quantized = isinstance(first, mlx_cache.QuantizedKVCache)
        return key, layer_length(first), first.bits if quantized else 0, first.group_size if quantized else 0

    def _forget(self, ident: int, key: int) -> None:
        # called by the garbage collector, at any point: no MLX and no lock here
        self._keys.pop(ident, None)
        self._freed.append(key)

    def _take_freed(self) -> list[int]:
        taken = [self._freed.pop() for _ in range(min(FREED_SLOTS, len(self._freed)))]
        return taken + [0] * (FREED_SLOTS - len(taken))

    def stop(self) -> None:
        """Release the followers (they exit); later calls raise."""
        if self._stopped:
            return
        self._stopped = True
        with self._lock:
            header = mx.array([STOP] + [0] * (HEADER - 1), dtype=mx.int32)
            try:
                mx.eval(mx.distributed.all_sum(header, stream=generation_stream))
            except RuntimeError:
                pass  # they are gone already


def finish() -> None:
    """Release every follower: called at exit, and by whoever is done with the target."""
    for leader in list(_leaders):
        leader.stop()


# --- the other ranks -----------------------------------------------------------------------
def follow(model, info: ShardInfo) -> None:
    """Run this rank's share of each target forward rank 0 announces, until it says stop.
    Ctrl-C is left to rank 0 (it reaches every local rank: rank 0 ends the generation, then
    releases the others)."""
    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with mx.stream(generation_stream):
            _follow(model.model if info.body_only else model, model, info.skip_gather)
    except RuntimeError as e:
        if ranks.is_lost_connection(e):
            raise lost_connection(e) from None
        raise
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


def _follow(forward, model, skip_gather: bool) -> None:
    caches: dict[int, ModelCache] = {}
    empty = mx.zeros((HEADER,), dtype=mx.int32)
    while True:
        header = mx.distributed.all_sum(empty).tolist()  # waits for the last forward, then the next header
        op, key, length, count, bits, group_size = header[:6]
        for freed in header[6:META]:
            caches.pop(freed, None)
        if op == STOP:
            return
        if op != FORWARD:
            raise DistributedError(f"rank {ranks.rank()} is out of step with rank 0 (header {header[:META]})")
        if count <= HEADER_IDS:
            ids = mx.array(header[META : META + count], dtype=mx.int32)
        else:
            ids = mx.distributed.all_sum(mx.zeros((count,), dtype=mx.int32))
        cache = None
        if key:
            cache = caches.get(key)
            if cache is None:
                cache = caches[key] = make_cache(model, kv_bits=bits or None, kv_group_size=group_size or 64)
            if cache.length < length:
                raise DistributedError(
                    f"rank {ranks.rank()} is out of step with rank 0: its cache holds {cache.length} tokens, rank 0's "
                    f"{length}"
                )
            cache.trim_to(length)
        with without_final_gather(skip_gather):
            out = forward(ids[None], cache=cache.layers if cache else None)
        if cache:
            cache.length += count
        mx.async_eval(out)
