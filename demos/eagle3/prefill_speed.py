"""Where train-draft's teacher-forced prefill spends its time on a target: the whole
prefill (data.prefill: the forward with the feature taps, the top-K ids and probabilities,
the copies to numpy), the layers alone, and the layers with the output layer.

    python demos/eagle3/prefill_speed.py --target MODEL [--corpus sharegpt] [--chunks 8]

It reads the first chunks of 384 ids of the corpus's conversations in the target's chat
template, as the data stage does, one chunk a forward.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from mlxspec.decoding.capture import install, num_layers
from mlxspec.training.conversations import load_corpus
from mlxspec.training.data import Pace, prefill
from mlxspec.training.sequences import TEXT_CHUNK, conversation_sequences
from mlxspec.training.settings import load_target
from mlxspec.training.shape import TargetShape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--corpus", default="sharegpt")
    parser.add_argument("--chunks", type=int, default=8)
    args = parser.parse_args()
    target = load_target(args.target)
    model = target.model
    shape = TargetShape.of(target.config, num_layers(model))
    taps = install(model, shape.aux)
    conversations = load_corpus(args.corpus).conversations
    chunks, _ = conversation_sequences(target.tokenizer, conversations, tokens=4 * args.chunks * TEXT_CHUNK, raw=False)
    chunks = [c for c in chunks if len(c) == TEXT_CHUNK][: args.chunks]
    tokens = sum(map(len, chunks))
    prefill(model, taps, chunks[:1], vocab_size=shape.vocab_size)  # warm up

    def layers_only():
        for c in chunks:
            mx.eval(model.model(mx.array([c])))
            taps.take()

    def with_output_layer():
        for c in chunks:
            mx.eval(model(mx.array([c])))
            taps.take()

    for name, work in (
        ("the whole prefill", lambda: prefill(model, taps, chunks, vocab_size=shape.vocab_size, pace=Pace(TEXT_CHUNK))),
        ("the layers alone", layers_only),
        ("the layers and the output layer", with_output_layer),
    ):
        began = time.perf_counter()
        work()
        seconds = time.perf_counter() - began
        print(f"{name}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.0f} tokens/s")


if __name__ == "__main__":
    main()
