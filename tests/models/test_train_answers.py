"""The target's answers written with its taps on (training/answers.py): what the writing
forwards keep is what a teacher-forced read of prompt + answer gives, on a plain KV cache
and on a sliding window the prompts pass; greedy answers are the target's argmax chain;
an answer is the same written alone or in a batch whose rows leave at other times."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

MAX_TOKENS = 10
LENGTHS = (3, 29, 12, 1, 41)  # the tiny Gemma's window is 8: most prompts pass it


def _target(factory, arch: str):
    import mlx_lm

    from mlxspec.decoding import capture

    model, _ = mlx_lm.load(str(factory.pair(arch)[0]))
    layers = len(capture.decoder_layers(model))
    return model, capture.install_stream(model, (1, layers // 2, layers))


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[int(i) for i in rng.integers(3, vocab, n)] for n in LENGTHS]


def _write(model, taps, prompts, *, batch: int, eos=(), positions: int = 16):
    from mlxspec.training.answers import write_answers
    from mlxspec.training.data import Pace

    return write_answers(
        model,
        taps,
        prompts,
        max_tokens=MAX_TOKENS,
        eos=list(eos),
        seed=5,
        batch=batch,
        pace=Pace(positions, measured=False),
        vocab_size=model.args.vocab_size,  # prompts read in chunks: the window's rotation too
    )


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_what_writing_keeps_is_a_teacher_forced_read(arch, factory):
    from mlxspec.training.answers import kept_from
    from mlxspec.training.data import Pace, prefill

    model, taps = _target(factory, arch)
    prompts = _prompts(model.args.vocab_size)
    made = _write(model, taps, prompts, batch=3)
    assert {m.greedy for m in made} == {True, False}  # greedy and sampled answers both written
    assert all(m.ended for m in made)
    for prompt, (greedy, answer, features, top_ids, top_probs, _) in zip(prompts, made):
        assert len(answer) == MAX_TOKENS
        cut = kept_from(prompt)
        assert len(features) == len(top_ids) == len(top_probs) == len(prompt) - cut + len(answer)
        read = prefill(model, taps, [prompt + answer], vocab_size=model.args.vocab_size, pace=Pace(4096))[0]
        ref_features, ref_ids, ref_probs = (a[cut:] for a in read)
        scale = np.abs(ref_features.astype(np.float32)).max()
        np.testing.assert_allclose(features.astype(np.float32), ref_features.astype(np.float32), atol=1e-3 * scale)
        np.testing.assert_allclose(top_probs.astype(np.float32), ref_probs.astype(np.float32), atol=2e-3)
        assert (top_ids[:, 0] == ref_ids[:, 0]).all()
        assert (np.diff(top_probs.astype(np.float32), axis=-1) <= 0).all()  # sorted: column 0 the argmax
        first = len(prompt) - 1 - cut  # the row whose distribution is the answer's first id's
        if greedy:
            assert answer == [int(i) for i in ref_ids[first : first + len(answer), 0]]


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_an_answer_does_not_depend_on_its_batch(arch, factory):
    """Alone (a batch of one) or beside others, each answer, greedy or sampled, is the same;
    and with an end id that some rows write early, the rows that leave the batch, and those
    that join it in their place, do not change the answers of the others."""
    model, taps = _target(factory, arch)
    prompts = _prompts(model.args.vocab_size)
    alone = _write(model, taps, prompts, batch=1)
    together = _write(model, taps, prompts, batch=len(prompts))
    assert [m.ids for m in alone] == [m.ids for m in together]
    end = alone[1].ids[3]  # the fourth id of one answer: it and any other that writes it end there
    ended = _write(model, taps, prompts, batch=len(prompts), eos=[end])
    for (_, full, *_), (_, cut, features, *_), prompt in zip(alone, ended, prompts):
        stop = full.index(end) + 1 if end in full else len(full)
        assert cut == full[:stop]
        assert len(features) == len(prompt) - max(0, len(prompt) - 65) + len(cut)
    assert any(len(m.ids) < MAX_TOKENS for m in ended) and any(len(m.ids) == MAX_TOKENS for m in ended)
    # two at a time: as a row ends, the next prompt joins the batch while the other is mid-answer
    refilled = _write(model, taps, prompts, batch=2, eos=[end])
    assert [m.ids for m in refilled] == [m.ids for m in ended]
    for a, b in zip(refilled, ended):
        np.testing.assert_allclose(a.features.astype(np.float32), b.features.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_the_clock_leaves_prompts_unread(factory):
    from mlxspec.training.answers import answered, write_answers
    from mlxspec.training.data import Pace

    model, taps = _target(factory, "llama")
    made = write_answers(
        model,
        taps,
        _prompts(model.args.vocab_size),
        max_tokens=4,
        eos=[],
        seed=0,
        batch=2,
        pace=Pace(),
        vocab_size=model.args.vocab_size,
        until=0.0,
    )
    assert made == [None] * len(LENGTHS) and answered(made) == 0
    mx.clear_cache()


def test_a_prompt_the_clock_cuts_short_is_answered_again(factory, monkeypatch):
    """The clock (a second a prompt read, this test's own) passes as the third and fourth
    prompts join the batch: they read one id each, too little to learn from, and are not
    counted answered, so a resumed run answers them; the first two were written whole."""
    from types import SimpleNamespace

    from mlxspec.training import answers
    from mlxspec.training.data import Pace

    clock = [0.0]
    read = answers._read_prompt

    def reading(*args, **kwargs):
        clock[0] += 1.0
        return read(*args, **kwargs)

    monkeypatch.setattr(answers, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(answers, "_read_prompt", reading)
    model, taps = _target(factory, "llama")
    made = answers.write_answers(
        model,
        taps,
        _prompts(model.args.vocab_size),
        max_tokens=MAX_TOKENS,
        eos=[],
        seed=0,
        batch=2,
        pace=Pace(16, measured=False),
        vocab_size=model.args.vocab_size,
        until=3.5,
    )
    assert [None if m is None else (len(m.ids), m.ended) for m in made] == [
        (MAX_TOKENS, True),
        (MAX_TOKENS, True),
        (1, False),
        (1, False),
        None,
    ]
    assert answers.answered(made) == 2
