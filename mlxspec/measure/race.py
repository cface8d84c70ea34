"""Standard and speculative decoding side by side, each on its own clock.

Both sides share one device, so running them at once would slow each by the other. Instead
the two generators take turns, and the one whose own compute time is behind goes next. A
side's clock is the seconds its rounds report, plus, when it is paused, the time to finish
the device work it left queued (standard decoding queues its next step before yielding, as
it does alone). Turns last a short slice of a side's own time rather than one round, so
that pipelining survives as it would running alone. Each clock then reads as if that side
ran alone, and the panels show what each method had produced after the same own time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx

from ..decoding.caches import CacheOptions
from ..decoding.events import Done
from ..generation import Session, generate, stream
from ..models.pairs import Pair
from ..options import Options
from .sides import Side

SLICE = 0.05  # seconds of its own time a side runs before the other may take a turn
# tokens each side generates, untimed, before the race: a first call compiles kernels and
# grows buffers, and whichever side ran first would pay for both
WARM_UP_TOKENS = 8


def race(
    pair: Pair,
    prompt,
    options: Options,
    *,
    slice_seconds: float = SLICE,
    cache_options: CacheOptions = CacheOptions(),
    warm_up: bool = True,
) -> Iterator[tuple[Side, Side]]:
    """Yields (standard, speculative) after every event of either side. Ctrl-C in either
    side stops both (KeyboardInterrupt, after the state is updated). Each side has its own
    caches, built with `cache_options`. `warm_up`: both sides first run a few untimed tokens
    on throwaway sessions (what they learn is not kept)."""
    if warm_up:
        for side_options in (options.replace(gamma=0), options):
            generate(
                pair,
                prompt,
                side_options.replace(max_tokens=WARM_UP_TOKENS),
                session=Session(pair, cache_options=cache_options),
            )
    target_label = pair.target.label
    standard = Side("standard", target_label, 0)
    speculative = Side(
        "speculative",
        pair.description,
        options.gamma if isinstance(options.gamma, int) else "auto",
        by_position=pair.own_head,
    )
    generators = {
        id(standard): stream(
            pair, prompt, options.replace(gamma=0), session=Session(pair, cache_options=cache_options)
        ),
        id(speculative): stream(pair, prompt, options, session=Session(pair, cache_options=cache_options)),
    }
    current = None
    try:
        while not (standard.done and speculative.done):
            side = _turn(current, standard, speculative, slice_seconds)
            if side is not current and current is not None and not current.done:
                start = time.perf_counter()
                mx.synchronize()  # what the paused side left queued is its own work
                current.settle(time.perf_counter() - start)
            current = side
            event = next(generators[id(side)])
            side.apply(event)
            yield standard, speculative
            if isinstance(event, Done) and event.finish_reason == "interrupted":
                raise KeyboardInterrupt
    finally:
        for generator in generators.values():
            generator.close()


def _turn(current: Side | None, standard: Side, speculative: Side, slice_seconds: float) -> Side:
    """Keep the side that is running until it is a slice ahead; else the one behind."""
    active = [s for s in (standard, speculative) if not s.done]
    if len(active) == 1:
        return active[0]
    other = speculative if current is standard else standard
    if current is not None and not current.done and current.clock <= other.clock + slice_seconds:
        return current
    return min(active, key=lambda s: s.clock)
