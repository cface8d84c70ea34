"""What constraining costs per token, standard and speculative, with and without a draft.

The SmolLM2 pair (float32 target, the bundled distilled draft) and the target alone with
prompt lookup answer JSON questions, each with and without a JSON schema; every mode runs
in one process on the same prompts, interleaved, a warm-up excluded. Besides
tokens/s it reports the host time spent in the grammar engine per token (mask + advance),
most of which overlaps the device's forward (engine.py, rounds.py).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m demos.grammar_cost --repeats 3
"""

from __future__ import annotations

import argparse
import time

import mlxspec
from mlxspec import grammar as grammar_module
from mlxspec.generation import encode_messages
from mlxspec.grammar import GrammarSpec
from mlxspec.models.presets import resolve_name

SCHEMA = {
    "type": "object",
    "properties": {
        "country": {"type": "string"},
        "capital": {"type": "string"},
        "population_millions": {"type": "number"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "continent": {"enum": ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]},
    },
    "required": ["country", "capital", "population_millions", "languages", "continent"],
    "additionalProperties": False,
}
QUESTIONS = [
    "Describe France as JSON with the keys country, capital, population_millions, languages and continent.",
    "Describe Japan as JSON with the keys country, capital, population_millions, languages and continent.",
    "Describe Brazil as JSON with the keys country, capital, population_millions, languages and continent.",
]
MODES = {  # name: (draft?, generate options)
    "standard": (True, {"gamma": 0}),
    "draft, gamma auto": (True, {"gamma": "auto"}),
    "draft, gamma 4": (True, {"gamma": 4}),
    "prompt lookup alone": (False, {"gamma": "auto"}),
}


class EngineClock:
    """Seconds inside the grammar engine (mask and advance), summed: wall time, and this
    thread's CPU time (llguidance computes on the calling thread; on a loaded machine the
    wall time also counts the waits for a core while MLX's threads run beside it)."""

    def __init__(self):
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        for name in ("allowed", "consume"):
            original = getattr(grammar_module.Matcher, name)
            setattr(grammar_module.Matcher, name, self._timed(original))

    def _timed(self, method):
        clock = self

        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - start
                clock.cpu_seconds += time.thread_time() - cpu

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    from tests.support import real_models

    target = str(real_models.folder(real_models.SMOLLM2))
    pairs = {
        True: mlxspec.load_pair(target, str(resolve_name("bundled:smollm2-draft"))),
        False: mlxspec.load_pair(target, "ngram"),
    }
    clock = EngineClock()
    spec = GrammarSpec.json_schema(SCHEMA)
    configs = [(mode, constrained) for mode in MODES for constrained in (False, True)]
    prompts = {
        with_draft: [encode_messages(pair.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
        for with_draft, pair in pairs.items()
    }
    for mode, constrained in configs:  # warm-up
        with_draft, options = MODES[mode]
        extra = {"grammar": spec} if constrained else {}
        mlxspec.generate(pairs[with_draft], prompts[with_draft][0], max_tokens=16, seed=0, **options, **extra)
    # interleaved: every configuration runs on each prompt back to back, so the machine's
    # load, which drifts over minutes here, weighs on all of them alike
    tokens = dict.fromkeys(configs, 0)
    seconds = dict.fromkeys(configs, 0.0)
    engine = {config: [0.0, 0.0] for config in configs}
    for _ in range(args.repeats):
        for index in range(len(QUESTIONS)):
            for mode, constrained in configs:
                with_draft, options = MODES[mode]
                extra = {"grammar": spec} if constrained else {}
                clock.seconds = clock.cpu_seconds = 0.0
                result = mlxspec.generate(
                    pairs[with_draft],
                    prompts[with_draft][index],
                    max_tokens=args.max_tokens,
                    seed=0,
                    **options,
                    **extra,
                )
                tokens[mode, constrained] += result.stats.tokens
                seconds[mode, constrained] += result.stats.decode_seconds
                engine[mode, constrained][0] += clock.seconds
                engine[mode, constrained][1] += clock.cpu_seconds
    print(
        f"{'mode':<22} {'grammar':<8} {'tok/s':>7} {'ms/token':>9} {'engine us/token':>16} {'(cpu)':>7} {'tokens':>7}"
    )
    for mode, constrained in configs:
        count = tokens[mode, constrained]
        rate = count / seconds[mode, constrained]
        wall, cpu = (1e6 * value / count for value in engine[mode, constrained])
        base = tokens["standard", constrained] / seconds["standard", constrained]
        print(
            f"{mode:<22} {'json' if constrained else '-':<8} {rate:7.1f} {1000 / rate:9.2f} {wall:16.0f} {cpu:7.0f} "
            f"{count:7d}" + ("" if mode == "standard" else f"   speedup {rate / base:.2f}x")
        )


if __name__ == "__main__":
    main()
