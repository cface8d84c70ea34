"""An independent review of constrained speculative decoding (grammar.py): greedy identity
over many random regexes and every proposer, the matcher's state after each round checked
against a fresh matcher fed the ids kept, and the sampled law with end of sequence and
drafting past it in reach, under top-k and top-p too."""

from __future__ import annotations

import itertools
import random
import re

import mlx.core as mx
import pytest

import mlxspec
from mlxspec.decoding.events import Round
from mlxspec.decoding.sampling import SamplingParams, constrain, warp
from mlxspec.errors import InvalidOption
from mlxspec.grammar import GrammarSpec, Matcher, compile_spec, matcher_for
from tests.exactness.test_grammar import EOS, LAW_PROMPT, VOCAB, Letters, fits, sample_constrained, small_pair  # noqa: F401

PROMPT = list(range(10, 22))
PIECES = ["def", "x", "self", "[a-z]{1,4}", "[0-9]+", "\\(", "\\)", ", ", ":", " ", "_", "(ab|cd)", "[A-Z]"]


def random_regex(rng: random.Random, depth: int = 0) -> str:
    """A small random regex over code-like pieces: sequences, alternations, options, repeats."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.2 and depth < 2:
            parts.append("(" + "|".join(random_regex(rng, depth + 1) for _ in range(rng.randint(2, 3))) + ")")
        elif roll < 0.35 and depth < 2:
            parts.append("(" + random_regex(rng, depth + 1) + ")" + rng.choice(["?", "{0,3}", "{1,2}"]))
        else:
            parts.append(rng.choice(PIECES))
    return "".join(parts)


@pytest.fixture
def matcher_audit(monkeypatch):
    """After every round's settle, the matcher's mask and flags equal those of a fresh matcher
    fed the same ids (what a standard decoder under the grammar would hold)."""
    checked = []
    original = Matcher.settle

    def settle(self, mark, emitted):
        original(self, mark, emitted)
        fresh = Matcher(self._audit_tokenizer, self._audit_grammar, width=self.width)
        fresh.consume_all(self._ids)
        assert (fresh.allowed() == self.allowed()).all(), (mark, emitted)
        assert (fresh.accepting, fresh.stopped) == (self.accepting, self.stopped)
        checked.append(len(emitted))

    original_init = Matcher.__init__

    def init(self, tokenizer, grammar, *, width):
        original_init(self, tokenizer, grammar, width=width)
        self._audit_tokenizer, self._audit_grammar = tokenizer, grammar

    monkeypatch.setattr(Matcher, "settle", settle)
    monkeypatch.setattr(Matcher, "__init__", init)
    return checked


def test_greedy_identity_over_random_regexes(load_pair, factory, matcher_audit):
    """Standard == speculative for gamma 1, 2, 3, 6, auto and lookup beside the draft, and
    prompt lookup alone, over random regexes; the matcher is audited after every round."""
    pair = load_pair("llama")
    target, _ = factory.pair("llama")
    lookup = mlxspec.load_pair(str(target), "ngram")
    rng = random.Random(21)
    tried = 0
    while tried < 10:
        regex = random_regex(rng)
        spec = GrammarSpec("regex", regex)
        standard = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=0, grammar=spec)
        text = pair.tokenizer.decode([t for t in standard.tokens if t not in pair.eos_ids])
        if standard.finish_reason == "eos":
            assert re.fullmatch(regex, text), (regex, text)
        for options in ({"gamma": 1}, {"gamma": 2}, {"gamma": 3}, {"gamma": 6}, {"gamma": "auto"}):
            got = mlxspec.generate(pair, PROMPT, max_tokens=24, grammar=spec, **options)
            assert got.tokens == standard.tokens, (regex, options)
        got = mlxspec.generate(pair, PROMPT, max_tokens=24, grammar=spec, gamma=3, ngram=True)
        assert got.tokens == standard.tokens, (regex, "ngram")
        alone = mlxspec.generate(lookup, PROMPT + standard.tokens[:6], max_tokens=24, gamma=0, grammar=spec)
        for gamma in (2, "auto"):
            got = mlxspec.generate(lookup, PROMPT + standard.tokens[:6], max_tokens=24, gamma=gamma, grammar=spec)
            assert got.tokens == alone.tokens, (regex, "lookup", gamma)
        tried += 1
    assert sum(matcher_audit) > 100


def test_a_grammar_that_forces_the_end_at_once(load_pair, matcher_audit):
    """The empty regex: the only reply is end of sequence, in every mode."""
    pair = load_pair("llama")
    spec = GrammarSpec("regex", "")
    for gamma in (0, 1, 3, "auto"):
        for temp in (0.0, 1.0):
            result = mlxspec.generate(pair, PROMPT, max_tokens=8, gamma=gamma, temp=temp, seed=3, grammar=spec)
            assert result.finish_reason == "eos" and result.text == "" and len(result.tokens) <= 1, (gamma, temp)


def test_stop_strings_and_max_tokens_under_a_grammar(load_pair):
    """A stop text inside the grammar's language and a max_tokens cut agree between modes."""
    pair = load_pair("llama")
    spec = GrammarSpec("regex", "(def|class) [a-z]{1,20}( [a-z]{1,20}){0,6}")
    standard = mlxspec.generate(pair, PROMPT, max_tokens=30, gamma=0, grammar=spec)
    assert len(standard.text) > 6
    stop = standard.text[4:6]
    cut = mlxspec.generate(pair, PROMPT, max_tokens=30, gamma=0, grammar=spec, stop=[stop])
    for gamma in (1, 3, "auto"):
        got = mlxspec.generate(pair, PROMPT, max_tokens=30, gamma=gamma, grammar=spec, stop=[stop])
        assert got.text == cut.text and got.finish_reason == cut.finish_reason, gamma
        for limit in (1, 2, 5):
            short = mlxspec.generate(pair, PROMPT, max_tokens=limit, gamma=gamma, grammar=spec)
            assert short.tokens == standard.tokens[:limit], (gamma, limit)


def test_a_session_walk_under_a_grammar(load_pair):
    """One session: constrained speculative, an unconstrained standard call, constrained
    standard sampled (reproducible from its seed; speculative sampling is not across sessions,
    as the adaptive stop reads the session's history), constrained greedy again; each reply
    equals a fresh session's."""
    pair = load_pair("llama")
    session = mlxspec.Session(pair)
    spec = GrammarSpec("regex", "[a-z]{1,6}( [a-z]{1,6}){0,5}")
    calls = [
        {"gamma": 3, "grammar": spec},
        {"gamma": 0},
        {"gamma": "auto", "grammar": spec},
        {"gamma": 0, "grammar": spec, "temp": 1.0, "seed": 5},
        {"gamma": 2, "grammar": spec},
        {"gamma": 0, "grammar": spec, "temp": 0.7, "top_p": 0.9, "seed": 8},
    ]
    prompt = list(PROMPT)
    for options in calls:
        got = mlxspec.generate(pair, prompt, session=session, max_tokens=20, **options)
        fresh = mlxspec.generate(pair, prompt, max_tokens=20, **options)
        assert got.tokens == fresh.tokens, options
        prompt = prompt + got.tokens + [30, 31]


# -- the sampled law with end of sequence in reach ------------------------------------------

# lengths 1 to 4, so the end is drawn mid-reply and a draft of 3 runs past it
END_REGEX = "(a|b[cd]?|c[a-e]{1,2}|d(a|b)c)"
REPLY = 4


def end_matcher() -> Matcher:
    from llguidance import LLTokenizer, TokenizerWrapper

    tokenizer = LLTokenizer(TokenizerWrapper(Letters()))
    return Matcher(tokenizer, compile_spec(GrammarSpec("regex", END_REGEX), tokenizer), width=VOCAB)


def end_law(model, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(reply) for standard decoding under END_REGEX, walked out exactly (each reply ends with
    end of sequence, as the regex's longest match is 3 letters)."""
    law = {}

    def walk(prefix: tuple[int, ...], p: float):
        if prefix and prefix[-1] == EOS or len(prefix) == REPLY:
            law[prefix] = law.get(prefix, 0.0) + p
            return
        matcher = end_matcher()
        matcher.consume_all(prefix)
        allowed = mx.array(matcher.allowed())
        logits = model(mx.array([LAW_PROMPT + list(prefix)]))[0, -1]
        probs = warp(constrain(logits, allowed), params)
        for token in range(VOCAB):
            q = probs[token].item()
            if q > 0:
                walk(prefix + (token,), p * q)

    walk((), 1.0)
    return law


def sample_end(pair, params, monkeypatch, *, gamma: int, lookup: bool, runs: int, seed: int):
    """The author's sampling harness (tests/exactness/test_grammar.py) with END_REGEX and REPLY ids."""
    import tests.exactness.test_grammar as author

    monkeypatch.setattr(author, "letters_matcher", end_matcher)
    monkeypatch.setattr(author, "LENGTH", REPLY)
    return sample_constrained(pair, params, gamma=gamma, lookup=lookup, runs=runs, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize(
    "params, gamma, lookup",
    [
        (SamplingParams(temp=1.0), 3, False),
        (SamplingParams(temp=1.0), 3, True),
    ],
    ids=["temp1-g3", "lookup-g3"],  # top-k: test_grammar's law test
)
def test_sampled_law_with_the_end_in_reach(small_pair, monkeypatch, params, gamma, lookup):  # noqa: F811
    law = end_law(small_pair.target.model, params)
    assert any(len(k) < REPLY for k in law) and abs(sum(law.values()) - 1) < 1e-4
    counts = sample_end(small_pair, params, monkeypatch, gamma=gamma, lookup=lookup, runs=2000, seed=7000 + gamma)
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


def test_end_law_masks_are_the_regexes():
    """The walk's masks: every reply the law gives matches END_REGEX."""
    matcher = end_matcher()
    for length in range(1, REPLY):
        for prefix in itertools.product(range(5), repeat=length):
            text = "".join("abcde"[t] for t in prefix)
            if re.fullmatch(END_REGEX, text):
                matcher.consume_all(prefix)
                assert matcher.accepting and matcher.allowed()[EOS], text
                matcher.rollback_to(0)


def test_matcher_for_caches_the_bridge(load_pair):
    pair = load_pair("llama")
    spec = GrammarSpec("regex", "[a-z]+")
    a = matcher_for(spec, pair.tokenizer, width=pair.target.width, eos_ids=pair.eos_ids)
    b = matcher_for(spec, pair.tokenizer, width=pair.target.width, eos_ids=pair.eos_ids)
    assert a is not b and (a.allowed() == b.allowed()).all()


@pytest.mark.parametrize("vocab", [1.0, 0.1], ids=["full-vocab", "10%-vocab"])
def test_greedy_identity_with_a_head_over_random_regexes(factory, matcher_audit, vocab):
    """EAGLE-3 heads (a 10% head often can say nothing the grammar allows) over random regexes."""
    from tests.models.test_eagle3 import Heads

    pair = Heads(factory).pair("llama", vocab=vocab, fit=40)
    rng = random.Random(99)
    for _ in range(6):
        spec = GrammarSpec("regex", random_regex(rng))
        standard = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=0, grammar=spec)
        for gamma in (1, 3, 6, "auto"):
            got = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=gamma, grammar=spec)
            assert got.tokens == standard.tokens, (spec.source, gamma)


def test_sampled_replies_match_random_regexes(load_pair, matcher_audit):
    """Sampled at T 1 (top-k, top-p too), speculative and standard: every reply that ends is in
    the regex's language, and the matcher follows the ids kept after every round."""
    pair = load_pair("llama")
    rng = random.Random(5)
    ended = 0
    for i in range(8):
        regex = random_regex(rng)
        spec = GrammarSpec("regex", regex)
        for gamma, extra in ((0, {}), (3, {}), ("auto", {"top_k": 20}), (2, {"top_p": 0.8})):
            result = mlxspec.generate(pair, PROMPT, max_tokens=30, gamma=gamma, temp=1.0, seed=i, grammar=spec, **extra)
            if result.finish_reason == "eos":
                ended += 1
                assert re.fullmatch(regex, result.text), (regex, gamma, result.text)
    assert ended >= 8


def test_ctrl_c_anywhere_in_a_constrained_reply_leaves_the_session_exact(load_pair):
    """A Ctrl-C landing at call k (every k, sparsely) of a constrained speculative reply: the
    next constrained reply on the same session is a fresh session's, token for token."""
    from tests.conftest import ctrl_c_at

    pair = load_pair("llama")
    spec = GrammarSpec("regex", "(def|class) [a-z_]{1,8}(\\((x|y)(, (x|y)){0,3}\\))?:")
    fresh = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=0, grammar=spec).tokens
    landings = 0
    for at in range(20, 4000, 29):
        session = mlxspec.Session(pair)
        with ctrl_c_at(at) as landed:
            try:
                mlxspec.generate(pair, PROMPT, session=session, max_tokens=24, gamma=3, grammar=spec)
            except KeyboardInterrupt:
                pass
        if not landed:
            break
        landings += 1
        again = mlxspec.generate(pair, PROMPT, session=session, max_tokens=24, gamma=3, grammar=spec)
        assert again.tokens == fresh, (at, landed)
    assert landings > 10


@pytest.fixture(scope="module")
def subset_pair(factory, load_pair):
    """The llama target with a subset-vocabulary draft (mlxspec/subset_draft.py) that covers
    only ids whose text holds no digit: under a digits grammar it often can say nothing."""
    from mlxspec.models.subset_draft import write_subset

    pair = load_pair("llama")
    target, _ = factory.pair("llama")
    width = pair.target.width
    ids = [i for i in range(width) if not any(c.isdigit() for c in pair.tokenizer.decode([i]))]
    out = factory.model("llama-subset-draft", arch="llama", vocab_size=len(ids) + 1, seed=4, head_scale=4.0)
    write_subset(out, ids, width)
    return mlxspec.load_pair(str(target), str(out))


def test_a_subset_draft_that_cannot_say_what_the_grammar_allows(subset_pair):
    """Digits only where the draft has none, a space where it has one: greedy ids are standard
    decoding's, and sampled replies (the 0/0 rows cut, never verified) match the grammar."""
    regex = "[0-9]{1,4}( [0-9]{1,4}){0,5}"
    spec = GrammarSpec("regex", regex)
    standard = mlxspec.generate(subset_pair, PROMPT, max_tokens=30, gamma=0, grammar=spec)
    assert len(standard.tokens) > 3
    rounds = [
        e for e in mlxspec.stream(subset_pair, PROMPT, max_tokens=30, gamma=3, grammar=spec) if isinstance(e, Round)
    ]
    drafted = [len(r.drafted) for r in rounds]
    assert 0 in drafted and max(drafted) > 0, drafted  # cut at a digit; a space drafted
    for gamma in (1, 3, 6, "auto"):
        got = mlxspec.generate(subset_pair, PROMPT, max_tokens=30, gamma=gamma, grammar=spec)
        assert got.tokens == standard.tokens, gamma
        for seed in range(3):
            sampled = mlxspec.generate(
                subset_pair, PROMPT, max_tokens=30, gamma=gamma, temp=1.0, seed=seed, grammar=spec
            )
            if sampled.finish_reason == "eos":
                assert re.fullmatch(regex, sampled.text), (gamma, sampled.text)


@pytest.mark.parametrize("name", ["auto", "none", "required"])
def test_a_function_named_like_a_tool_choice_keyword_is_still_forced(load_pair, name):
    """tool_choice naming a function called "auto" or "none" was read as that keyword (the
    call not forced at all), and one called "required" as any tool; the grammar must hold the
    reply to that function alone."""
    from mlxspec.server.schema import ChatBody
    from mlxspec.server.tools import tool_use
    from mlxspec.tool_calls import ToolFormat

    json_tools = ToolFormat(parser=None, start="<tool_call>", end="</tool_call>", name="json_tools")
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
    ]
    body = ChatBody(
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": name}},
    )
    use = tool_use(body, json_tools)
    assert use.forced and use.parses
    pair = load_pair("llama")
    grammar = use.forced_call(pair.tokenizer)
    for called, allowed in ((name, True), ("other", False)):
        matcher = matcher_for(grammar, pair.tokenizer, width=pair.target.width, eos_ids=pair.eos_ids)
        call = f'<tool_call>\n{{"name": "{called}", "arguments": {{}}}}\n</tool_call>'
        ids = pair.tokenizer.encode(call, add_special_tokens=False)
        assert (matcher.walk(ids) == len(ids) and matcher.accepting) is allowed, called


def test_boolean_json_schemas(load_pair):
    """JSON Schema's `true` (any value) constrains to JSON, and `false` (no value) is one
    clear line; `true` reached the engine as a bare boolean it refused, with a message about
    applying options."""
    pair = load_pair("llama")
    result = mlxspec.generate(pair, PROMPT, max_tokens=12, gamma=3, grammar=GrammarSpec.json_schema(True))
    assert (
        result.tokens
        == mlxspec.generate(pair, PROMPT, max_tokens=12, gamma=0, grammar=GrammarSpec.json_schema(True)).tokens
    )
    with pytest.raises(InvalidOption, match="false, which no value matches"):
        GrammarSpec.json_schema("false")


def test_an_engine_that_gives_up_mid_reply_is_one_clear_error(small_pair):  # noqa: F811
    """llguidance stops a grammar too ambiguous for its limits mid-reply: its mask is then end
    of sequence alone, which ended the reply as if the grammar were done (text outside it), or
    its refusal was a RuntimeError (the CLI's "a bug" line, the server's 500). Now it is one
    line naming the engine's reason, in standard and speculative decoding alike. The engine's
    limits are lowered so that it gives up within a few ids."""
    from llguidance import LLMatcher, LLParserLimits, LLTokenizer, TokenizerWrapper

    from mlxspec.decoding import engine
    from mlxspec.drafting import Policy

    tokenizer = LLTokenizer(TokenizerWrapper(Letters()))
    grammar = compile_spec(GrammarSpec("lark", 'start: s\ns: s s s | s s | "a" | "b" | "c" | "d" | "e"\n'), tokenizer)

    def touchy() -> Matcher:
        matcher = Matcher(tokenizer, grammar, width=VOCAB)
        matcher._matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=LLParserLimits(max_items_in_row=15))
        return matcher

    ids = [0, 1, 2, 3, 4] * 10
    matcher = touchy()
    with pytest.raises(InvalidOption, match="the grammar engine gave up after"):
        for token in ids:
            matcher.allowed()
            matcher.consume(token)
    params = SamplingParams(temp=1.0)
    for gamma in (0, 3):
        session = mlxspec.Session(small_pair)
        policy = Policy(gamma=gamma, stop=0.0, controller=session.controller, draft_model=True) if gamma else None
        events = engine.decode(
            session.target,
            session.draft,
            LAW_PROMPT,
            policy=policy,
            params=params,
            max_tokens=200,
            eos_ids=frozenset(),  # never stops on its own: runs until the engine gives up
            key=mx.random.key(1),
            grammar=touchy(),
        )
        with pytest.raises(InvalidOption, match="the grammar engine gave up after [1-9].*max is 15;") as raised:
            for _ in events:
                pass
        assert "<state>" not in str(raised.value)
