"""Text: incremental detokenization, stop strings, end-of-sequence, chat template."""

from __future__ import annotations

import mlxspec
from mlxspec import Done, Round
from mlxspec.text import StopFilter, TextStream, earliest_stop, find_stop


def test_incremental_text_equals_whole_decoding(load_pair):
    tokenizer = load_pair("llama").tokenizer
    ids = tokenizer.encode("def f(x):\n    return 'héllo wörld ✓' + x  # done\n")
    stream = TextStream(tokenizer)
    pieces = [stream.add(t) for t in ids]
    assert "".join(pieces) == tokenizer.decode(ids)


def test_find_stop():
    assert find_stop("abc STOP def", ("STOP",)) == 4
    assert find_stop("abc STO", ("STOP",)) is None
    assert find_stop("x END y STOP", ("STOP", "END")) == 2


def test_the_stop_string_that_ended_the_text_is_named():
    assert earliest_stop("x END y STOP", ("STOP", "END")) == (2, "END")
    assert earliest_stop("x ENDING", ("END", "ENDING")) == (2, "END")  # same start: the first given
    stops = StopFilter(("STOP", "END"))
    assert stops.matched is None and stops.feed("a ST") == ("a ", False) and stops.matched is None
    assert stops.feed("OP END") == ("", True) and stops.matched == "STOP"


def test_stop_filter_holds_back_possible_starts():
    stops = StopFilter(("</end>",))
    assert stops.feed("hello </") == ("hello ", False)
    assert stops.feed("e") == ("", False)
    assert stops.feed("x") == ("</ex", False)  # not a stop after all: released
    assert stops.feed(" a</en") == (" a", False)
    assert stops.feed("d> tail") == ("", True) and stops.matched == "</end>"
    assert StopFilter(("AB",)).flush() == ""
    pending = StopFilter(("AB",))
    assert pending.feed("xA") == ("x", False) and pending.flush() == "A"


def test_stop_string_cuts_the_round(load_pair):
    pair = load_pair("llama")
    full = mlxspec.generate(pair, list(range(10, 22)), max_tokens=40, gamma=4)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop and stop in full.text
    cut = mlxspec.generate(pair, list(range(10, 22)), max_tokens=40, gamma=4, stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.tokens == full.tokens[: len(cut.tokens)] and len(cut.tokens) < len(full.tokens)
    assert cut.stats.tokens == len(cut.tokens)


def test_end_of_sequence_ends_generation_mid_round(load_pair, factory):
    pair = load_pair("llama")
    full = mlxspec.generate(pair, list(range(10, 22)), max_tokens=40, gamma=0)
    # declare an id that greedy decoding reaches as end-of-sequence
    eos = full.tokens[17]
    first = full.tokens.index(eos)
    pair.target.tokenizer.eos_token_ids = set(pair.target.tokenizer.eos_token_ids) | {eos}
    try:
        for gamma in (0, 3, 5):
            events = list(mlxspec.stream(pair, list(range(10, 22)), max_tokens=40, gamma=gamma))
            done = events[-1]
            assert isinstance(done, Done) and done.finish_reason == "eos"
            emitted = [t for e in events if isinstance(e, Round) for t in e.emitted]
            assert emitted == full.tokens[: first + 1]
            assert done.stats.tokens == first
    finally:
        pair.target.tokenizer.eos_token_ids = set(factory.eos)


def test_chat_template_is_applied_unless_raw(load_pair):
    pair = load_pair("llama")
    templated = mlxspec.generate(pair, "hello", max_tokens=4, gamma=2)
    raw = mlxspec.generate(pair, "hello", max_tokens=4, gamma=2, raw=True)
    assert templated.prompt_tokens > raw.prompt_tokens
    assert raw.prompt_tokens == len(pair.tokenizer.encode("hello"))
