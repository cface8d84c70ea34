"""Temperature 0: speculative decoding must reproduce standard decoding token for token, on
every architecture (plain, sliding-window and recurrent caches), float and 4-bit."""

from __future__ import annotations

import mlx.core as mx
import pytest

import mlxspec
from mlxspec import Round
from mlxspec.decoding.caches import CacheOptions
from mlxspec.drafting import Controller
from mlxspec.generation import Session
from tests.conftest import ARCHS, primed_for_early_stop

PROMPT = list(range(10, 22))  # 12 ids; with 48 new ones every window-8 cache wraps many times
MAX_TOKENS = 48
GAMMAS = (1, 2, 4, 7)


def rounds(pair, prompt, **options) -> list[Round]:
    return [e for e in mlxspec.stream(pair, prompt, **options) if isinstance(e, Round)]


@pytest.mark.parametrize("bits", [None, 4], ids=["float", "4bit"])
@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_equals_standard(load_pair, arch, bits):
    pair = load_pair(arch, bits)
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0)
    assert len(standard.tokens) == MAX_TOKENS
    for gamma in GAMMAS:
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma)
        assert result.tokens == standard.tokens, f"gamma={gamma}"
        stats = result.stats
        assert stats.tokens == MAX_TOKENS and stats.rounds < MAX_TOKENS
        # the draft is a noisy copy of the target: it must be right often, wrong sometimes,
        # or this test would not exercise both rewind paths
        assert 0.05 < stats.acceptance_rate < 1.0, f"gamma={gamma}: acceptance {stats.acceptance_rate}"


@pytest.mark.parametrize(
    "arch, options",
    [("qwen3", CacheOptions(max_kv_size=12)), ("llama_kv32", CacheOptions(kv_bits=4, kv_group_size=32))],
    ids=["kept-tokens", "quantized-kv"],
)
def test_cache_options_keep_speculative_exact(load_pair, arch, options):
    """A rotating cache with kept tokens (max_kv_size: before this, speculative output left
    standard's at token 6 for gamma 3 and 8) and a quantized KV cache."""
    pair = load_pair(arch)

    def emitted(gamma):
        session = Session(pair, cache_options=options)
        return mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma, session=session).tokens

    standard = emitted(0)
    assert len(standard) > 8  # past the window of 12, however early the model ends
    for gamma in (1, 3, 8, "auto"):
        assert emitted(gamma) == standard, f"gamma={gamma}"


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next"])
def test_rounds_cover_rejection_and_full_acceptance(load_pair, arch):
    events = rounds(load_pair(arch), PROMPT, max_tokens=MAX_TOKENS, gamma=2)
    kinds = {e.fates[-1] for e in events}
    assert {"recovered", "bonus"} <= kinds, kinds


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "llama_sliding", "qwen3_next", "mamba"])
def test_target_drafting_for_itself_accepts_everything(load_pair, arch):
    pair = load_pair(arch)
    self_pair = mlxspec.Pair(pair.target, pair.target)
    for gamma in (3, 5):
        events = rounds(self_pair, PROMPT, max_tokens=40, gamma=gamma)
        for event in events:
            assert event.accepted == len(event.drafted), event


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "llama_sliding", "qwen3_next", "mamba"])
def test_each_round_drafts_what_a_fresh_draft_would(load_pair, arch):
    """A draft cache rolled back wrongly still gives exact output (the target decides), only
    lower acceptance; so compare every round's proposals with a fresh draft run over the same
    history."""
    pair = load_pair(arch)
    history = list(PROMPT)
    for event in rounds(pair, PROMPT, max_tokens=40, gamma=4):
        if event.drafted:
            assert list(event.drafted) == fresh_greedy(pair.draft.model, history, len(event.drafted))
        history += event.emitted


def fresh_greedy(model, ids, n):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(ids)[None], cache=cache)
    out = []
    for _ in range(n):
        token = mx.argmax(logits[0, -1]).item()
        out.append(token)
        logits = model(mx.array([[token]]), cache=cache)
    return out


def test_session_reuses_caches_exactly(load_pair):
    """Generating twice through one session (the second prompt extending the first output)
    gives the same ids as a fresh run, and reads only the new ids."""
    pair = load_pair("llama")
    session = Session(pair)
    first = mlxspec.generate(pair, PROMPT, max_tokens=10, gamma=3, session=session)
    follow = PROMPT + first.tokens + [30, 31]
    events = list(mlxspec.stream(pair, follow, max_tokens=20, gamma=3, session=session))
    fresh = mlxspec.generate(pair, follow, max_tokens=20, gamma=3)
    reused = [t for e in events if isinstance(e, Round) for t in e.emitted]
    assert reused == fresh.tokens
    assert events[0].processed_tokens < len(follow) - 10


MODES = {
    "auto": dict(gamma="auto"),
    "early-stop": dict(gamma=5, draft_min_p=0.6),
    "ngram+model": dict(gamma=4, ngram=True),
    "auto+ngram": dict(gamma="auto", ngram=True),
    "learned-stop": dict(gamma="auto", draft_min_p="auto"),
    "auto+early-stop": dict(gamma="auto", draft_min_p=0.3),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next", "baichuan_m1"])
def test_adaptive_drafting_stays_exact(load_pair, arch, mode):
    """--gamma auto, the draft's early stop and prompt-lookup proposals change only how much
    is proposed, never what is emitted."""
    pair = load_pair(arch)
    prompt = PROMPT * 3  # repeats for prompt lookup to find
    standard = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=0)
    result = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, **MODES[mode])
    assert result.tokens == standard.tokens
    stats = result.stats
    if mode == "early-stop":
        assert stats.early_stops > 0
    if "ngram" in mode:
        assert stats.ngram_rounds > 0


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next"])
def test_prompt_lookup_alone_stays_exact(load_pair, arch):
    pair = load_pair(arch)
    lookup = mlxspec.Pair(pair.target, None, ngram=True)
    prompt = PROMPT * 3
    standard = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=0)
    for gamma in (2, 5, "auto"):
        result = mlxspec.generate(lookup, prompt, max_tokens=MAX_TOKENS, gamma=gamma)
        assert result.tokens == standard.tokens, gamma
        assert result.stats.ngram_rounds > 0 and result.stats.model_rounds == 0
    # a prompt with no repeats: rounds that propose nothing at first
    fresh_prompt = list(range(40, 52))
    assert (
        mlxspec.generate(lookup, fresh_prompt, max_tokens=MAX_TOKENS, gamma="auto").tokens
        == mlxspec.generate(pair, fresh_prompt, max_tokens=MAX_TOKENS, gamma=0).tokens
    )


class Alternating(Controller):
    """A fixed policy in the controller's place: plain stretches of 9 ids between drafting
    rounds, so that every round starts with the draft catching up on what it did not draft."""

    def choose(self) -> int:
        self._turn = getattr(self, "_turn", 0) + 1
        return 0 if self._turn % 2 else 3

    def plain_stretch(self) -> int:
        return 9


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next", "baichuan_m1"])
def test_drafting_after_plain_stretches_stays_exact(load_pair, arch):
    """After a plain stretch the draft reads the stretch's ids apart (catch-up) before it
    proposes: the output stays the target's, and each proposal is what a fresh draft over the
    same history would propose."""
    pair = load_pair(arch)
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0)
    session = Session(pair)
    session.controller = Alternating()
    events = rounds(pair, PROMPT, max_tokens=MAX_TOKENS, gamma="auto", session=session)
    assert [t for e in events for t in e.emitted] == standard.tokens
    history, drafting = list(PROMPT), 0
    for event in events:
        if event.drafted:
            drafting += 1
            assert list(event.drafted) == fresh_greedy(pair.draft.model, history, len(event.drafted))
        history += event.emitted
    assert drafting >= 3 and any(e.source == "target" for e in events)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_next", "mamba"])
def test_a_learned_early_stop_stays_exact(load_pair, arch):
    """With the learned threshold on (0.1: these random drafts are rarely sure), rounds stop
    early, before and after some proposals, the draft waiting for each confidence; the output
    is still the target's and each round's proposals are what a fresh draft would make."""
    pair = load_pair(arch)
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0)
    session = Session(pair)
    session.controller = primed_for_early_stop(doubt=0.07, threshold=0.1)
    events = rounds(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=4, draft_min_p="auto", session=session)
    assert [t for e in events for t in e.emitted] == standard.tokens
    history = list(PROMPT)
    for event in events:
        if event.drafted:
            assert list(event.drafted) == fresh_greedy(pair.draft.model, history, len(event.drafted))
        history += event.emitted
    assert any(e.early_stop and e.drafted for e in events) and any(e.early_stop and not e.drafted for e in events)
