"""Several generations at once, each exactly what it would be alone (decoding/batch.py).

`generate_many` is the Python API; `Lanes` is what the server's worker uses: the pair's
packed caches, which a session's cursors join for one generation and leave after it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from .decoding import capture, packed
from .decoding.batch import Batch, Finished
from .decoding.caches import CacheOptions
from .drafters.feature_rows import FeatureRows
from .drafters.model import ModelDrafter
from .drafting import Controller, ControllerConfig
from .generation import GenerationResult, Session, generate, options_of
from .models.pairs import Pair
from .options import AUTO, Options


def why_not(pair: Pair) -> str | None:
    """None when the pair's target can share its forwards across generations (with any cache
    options: quantized keys and values, a --max-kv-size window); else why not (its
    generations then run one after another)."""
    if pair.target.shard is not None:
        return "a target split across ranks is not batched"
    reason = packed.why_not(pair.target.model)
    return None if reason is None else f"the target: {reason}"


MOST_BATCH = 8  # rows past which a decode step here stops costing about one (docs/server.md)
CONTEXT_SIZED = 8192  # the context each generation of a default batch is given room for


def default_max_batch(pair: Pair) -> int:
    """Generations at once by default: as many as a quarter of the machine's memory holds the
    KV caches of (the target's and the draft's, each at CONTEXT_SIZED ids), 1 to MOST_BATCH."""
    per_token = sum(
        kv_bytes_per_token(model) for model in (pair.target.model, pair.draft and pair.draft.model) if model
    )
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(MOST_BATCH, memory // 4 // max(per_token * CONTEXT_SIZED, 1)))


def kv_bytes_per_token(model) -> int:
    """Bytes a token's keys and values take over all of a model's layers (its own config;
    an unknown shape counts as a large model's, 256 KiB)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    args = _shape_of(model)
    try:
        heads = args.num_attention_heads
        kv_heads = getattr(args, "num_key_value_heads", None) or heads
        head_dim = getattr(args, "head_dim", None) or args.hidden_size // heads
        layers = args.num_hidden_layers
    except (AttributeError, TypeError, ZeroDivisionError):
        return 256 << 10
    # keys and values are kept in the activations' type: the first floating weight's
    floats = (v.dtype.size for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating))
    return 2 * layers * kv_heads * head_dim * next(floats, 2)


def _shape_of(model):
    """The config that says a model's attention shape: an mlx-lm model's `args`, a drafter's
    `config` (an EAGLE-3 head, a DFlash drafter), or the wrapped model's (a draft model over
    a subset of the target's ids); None where none does."""
    for each in (model, getattr(model, "model", None)):
        for name in ("args", "config"):
            found = getattr(each, name, None)
            if found is not None and hasattr(found, "num_attention_heads"):
                return found
    return None


class Lanes:
    """The pair's packed caches for one batch: the target's, and the drafter's where it has a
    model that packs (a draft model, an EAGLE-3 or MTP head, a DFlash drafter)."""

    def __init__(self, pair: Pair, batch: Batch, *, cache_options: CacheOptions = CacheOptions()):
        self.pair = pair
        self.batch = batch
        target = pair.target.model
        options = dict(
            kv_bits=cache_options.kv_bits,
            kv_group_size=cache_options.kv_group_size,
            max_kv_size=cache_options.max_kv_size,
        )
        self.target = packed.PackedCache(
            target, name=pair.target.name, batch=batch, taps=capture.taps_of(target), order=1, **options
        )
        draft = pair.draft.model if pair.draft is not None else None
        if draft is not None and pair.kind is not None and pair.kind.packed is not None:
            draft = pair.kind.packed(draft)  # a head, a block drafter: each reads the batch's layout itself
        self.draft = None
        if draft is not None and pair.kind is not None and packed.why_not(draft) is None:
            # a head's own cache is never quantized nor windowed (a draft model's is, as its lane alone)
            draft_options = {} if pair.kind.reads_features else options
            self.draft = packed.PackedCache(draft, name=pair.draft.name, batch=batch, order=0, **draft_options)

    @contextmanager
    def joined(self, session: Session, *, auto: bool = True):
        """While inside, the session's cursors are lanes of the batch; `auto`: its generation
        chooses its draft lengths (--gamma auto), which the batch's gate decides for."""
        cursors = [(session.target, self.target)]
        if self.draft is not None and isinstance(session.draft, (ModelDrafter, FeatureRows)):  # heads, DFlash
            cursors.append((session.draft, self.draft))
        joined = []
        try:
            for cursor, cache in cursors:
                cursor.join(cache)
                joined.append(cursor)
            controller = session.controller
            controller.batch.join(auto=auto)
            controller.fit_batch()
            try:
                yield
            finally:
                controller.batch.leave(auto=auto)
                controller.fit_batch()
        finally:
            errors = []
            for cursor in joined:  # each leaves, whatever another's leaving raised
                try:
                    cursor.leave()
                except BaseException as e:  # noqa: BLE001 - raised below, once all have left
                    errors.append(e)
            if errors:
                raise errors[0]


def generate_many(
    pair: Pair,
    prompts: Sequence[str | Sequence[int]],
    options: Options | Sequence[Options] | None = None,
    *,
    max_batch: int | None = None,
    batch: Batch | None = None,
    cache_options: CacheOptions = CacheOptions(),
    **overrides,
) -> list[GenerationResult]:
    """Generate for every prompt, `max_batch` at a time (default: all), the target's (and the
    drafter's) forwards shared: each result is what `generate` gives that prompt alone
    (greedy ids identical; sampled ones from their own seed's keys). `options`: one for all,
    or one per prompt; keywords as for `generate`; `batch`: one to run them in (its counts
    of forwards and rows read stay on it); `cache_options`: as a `Session`'s (quantized KV).
    Where the pair cannot batch (`why_not`), the prompts run one after another."""
    each = list(options) if isinstance(options, Sequence) else [options] * len(prompts)
    if len(each) != len(prompts):
        raise ValueError(f"{len(each)} options for {len(prompts)} prompts")
    results: list[GenerationResult | None] = [None] * len(prompts)
    batch = batch or Batch()
    lanes = Lanes(pair, batch, cache_options=cache_options) if why_not(pair) is None else None
    # one controller for all, as a server has: what it learns of the pair, and the batch's gate
    controller = Controller(ControllerConfig(start_gamma=pair.gamma_hint, draft_weight=pair.draft_weight))

    def task(i: int) -> Callable[[], GenerationResult]:
        def run() -> GenerationResult:
            session = Session(pair, controller=controller, cache_options=cache_options)
            options = options_of(each[i], overrides)
            if lanes is None:
                return generate(pair, prompts[i], options, session=session)
            with lanes.joined(session, auto=options.gamma is AUTO):
                return generate(pair, prompts[i], options, session=session)

        run.index = i
        return run

    queue = [task(i) for i in range(len(prompts))]
    limit = max_batch or len(prompts)
    running = [0]

    def admit(idle: bool) -> list:
        room = limit - running[0]
        taken, queue[:] = queue[:room], queue[room:]
        running[0] += len(taken)
        return taken

    def done(run, finished: Finished) -> None:
        running[0] -= 1
        if finished.error is not None:
            raise finished.error
        results[run.index] = finished.value

    batch.run(admit, done=done)
    return results
