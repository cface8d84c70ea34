"""Constrained decoding (grammar.py): output matches its grammar, greedy ids are identical
between speculative and standard decoding under one, and sampled output has exactly the law
of standard decoding under the same grammar (the chi-square harness of test_distribution)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections import Counter

import jsonschema
import mlx.core as mx
import pytest

import mlxspec
from mlxspec.decoding import engine
from mlxspec.decoding.events import Round
from mlxspec.decoding.sampling import SamplingParams, constrain, warp
from mlxspec.drafters.lookup import PromptLookup
from mlxspec.drafting import Policy
from mlxspec.errors import InvalidOption
from mlxspec.generation import Session
from mlxspec.grammar import GrammarSpec, Matcher, compile_spec
from mlxspec.models.synthetic import ARCHITECTURES
from tests.exactness.test_distribution import fits
from tests.server.test_server import ROOT
from tests.support import fuzz_targets as fuzz

PROMPT = list(range(10, 22))
MAX_TOKENS = 40
WORDS = GrammarSpec("regex", r"(def|class|import) [a-z_]{1,12}(\((self|x|y)(, (x|y|z)){0,3}\))?:?")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "size": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "owner": {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]},
    },
    "required": ["name", "kind", "size", "tags", "owner"],
    "additionalProperties": False,
}


def text_of(pair, result) -> str:
    return pair.tokenizer.decode(result.tokens)


@pytest.mark.parametrize("spec", [WORDS, GrammarSpec.json_schema(SCHEMA)], ids=["regex", "json-schema"])
def test_greedy_ids_under_a_grammar_are_standard_decodings(load_pair, spec):
    """Speculative (gamma 1, 3, auto, prompt lookup, lookup beside the draft) == standard,
    token for token, and the text matches the grammar."""
    pair = load_pair("llama")
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0, grammar=spec)
    for options in ({"gamma": 1}, {"gamma": 3}, {"gamma": "auto"}, {"gamma": 3, "ngram": True}):
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, grammar=spec, **options)
        assert result.tokens == standard.tokens, options
        assert result.stats.rounds < len(result.tokens) + 1 or options["gamma"] == "auto"
    text = text_of(pair, standard)
    if spec is WORDS:
        assert standard.finish_reason == "eos" and re.fullmatch(spec.source, text), text
    else:  # a random model may not close its JSON within max tokens: what it wrote is a prefix
        assert text.startswith('{"name"') or text.startswith('{ "name"') or text.startswith("{"), text


def test_unconstrained_output_is_not_the_grammars(load_pair):
    """The control: without the grammar this model writes no such text, so the test above
    shows the mask at work."""
    pair = load_pair("llama")
    text = text_of(pair, mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0))
    assert not re.fullmatch(WORDS.source, text)


def test_prompt_lookup_alone_under_a_grammar(factory):
    """Lookup proposals copy the prompt, which the grammar mostly forbids: each is cut before
    its first forbidden id, and the ids stay standard decoding's."""
    target, _ = factory.pair("llama")
    pair = mlxspec.load_pair(str(target), "ngram")
    prompt = pair.tokenizer.encode("def foo(self, x): return x\ndef foo(self, x): return x\ndef foo(")
    standard = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=0, grammar=WORDS)
    for gamma in (1, 3, "auto"):
        result = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=gamma, grammar=WORDS)
        assert result.tokens == standard.tokens, gamma


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text", "mamba"])
def test_greedy_under_a_grammar_on_other_caches(load_pair, arch):
    """Rotating and recurrent caches roll back with the matcher too."""
    pair = load_pair(arch)
    standard = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=0, grammar=WORDS)
    assert mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=3, grammar=WORDS).tokens == standard.tokens


def test_sampled_output_matches_its_grammar(load_pair):
    pair = load_pair("llama")
    for seed in range(4):
        for gamma in (0, 3):
            result = mlxspec.generate(pair, PROMPT, max_tokens=60, gamma=gamma, temp=1.0, seed=seed, grammar=WORDS)
            if result.finish_reason == "eos":
                assert re.fullmatch(WORDS.source, text_of(pair, result))


def test_a_grammar_the_engine_rejects_is_named(load_pair):
    pair = load_pair("llama")
    bad = GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "strng"}}}, label="schema 'pet'")
    with pytest.raises(InvalidOption, match="schema 'pet' is not one the grammar engine accepts"):
        mlxspec.generate(pair, PROMPT, max_tokens=4, grammar=bad)
    with pytest.raises(InvalidOption, match="regex"):
        mlxspec.generate(pair, PROMPT, max_tokens=4, grammar=GrammarSpec("regex", "a(b"))


def test_a_session_stays_exact_after_a_constrained_reply_is_cut(load_pair):
    """A constrained stream closed mid-way (a disconnect) leaves the session's caches exact:
    the next reply on it is a fresh session's."""
    pair = load_pair("llama")
    session = Session(pair)
    events = mlxspec.stream(pair, PROMPT, session=session, max_tokens=MAX_TOKENS, gamma=3, grammar=WORDS)
    for event in events:
        if isinstance(event, Round) and event.index >= 2:
            break
    events.close()
    again = mlxspec.generate(pair, PROMPT, session=session, max_tokens=MAX_TOKENS, gamma=3, grammar=WORDS)
    fresh = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0, grammar=WORDS)
    assert again.tokens == fresh.tokens


# -- the law under a grammar, on a 6-id vocabulary ----------------------------------------

VOCAB = 6
LETTERS = "abcde"  # ids 0-4; id 5 is end of sequence
EOS = 5
LAW_PROMPT = [1, 4, 2]
LENGTH = 3
# seeded runs per law test: outcomes expected under 5 times are pooled; w = 0.2 at power
# about 0.99 (tests/exactness/test_distribution.py's ADAPTIVE_RUNS)
RUNS = 2000
# the first letter from {a, b, c}; the second depends on it; the third is a or b
LAW_REGEX = "(a[bd]|b[ace]|c[a-e])[ab]"


def allowed_after(prefix: tuple[int, ...]) -> list[int]:
    """The grammar's masks written out by hand, to check llguidance's against."""
    if len(prefix) == 0:
        return [0, 1, 2]
    if len(prefix) == 1:
        return {0: [1, 3], 1: [0, 2, 4], 2: [0, 1, 2, 3, 4]}[prefix[0]]
    if len(prefix) == 2:
        return [0, 1]
    return [EOS]


class Letters:
    """Six tokens, five letters and an end: the llguidance tokenizer for the tiny models."""

    eos_token_id = EOS
    bos_token_id = None
    tokens = [c.encode() for c in LETTERS] + [b"<end>"]
    special_token_ids = [EOS]

    def __call__(self, text):
        text = text.decode() if isinstance(text, bytes) else text
        return [LETTERS.index(c) for c in text]


def letters_matcher() -> Matcher:
    from llguidance import LLTokenizer, TokenizerWrapper

    tokenizer = LLTokenizer(TokenizerWrapper(Letters()))
    return Matcher(tokenizer, compile_spec(GrammarSpec("regex", LAW_REGEX), tokenizer), width=VOCAB)


@pytest.fixture(scope="module")
def small_pair(factory):
    """test_distribution's pair: one-layer llamas over 6 ids, the draft unrelated to the target."""
    config = dict(ARCHITECTURES["llama"], hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    target = factory.model("dist-target", arch=config, vocab_size=VOCAB, seed=11, head_scale=5.0)
    draft = factory.model("dist-draft", arch=config, vocab_size=VOCAB, seed=12, like=target, noise=0.8)
    return mlxspec.load_pair(str(target), str(draft))


def test_llguidance_masks_are_the_grammars():
    matcher = letters_matcher()
    for length in range(LENGTH + 1):
        for prefix in itertools.product(range(5), repeat=length):
            if all(prefix[i] in allowed_after(prefix[:i]) for i in range(length)):
                matcher.consume_all(prefix)
                assert sorted(matcher.allowed().nonzero()[0].tolist()) == allowed_after(prefix), prefix
                matcher.rollback_to(0)


def constrained_law(model, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first LENGTH ids) under standard decoding with the hand-written masks."""
    law = {}
    for outcome in itertools.product(range(5), repeat=LENGTH):
        p = 1.0
        for i in range(LENGTH):
            allowed = mx.zeros((VOCAB,), dtype=mx.bool_).at[mx.array(allowed_after(outcome[:i]))].add(True)
            logits = model(mx.array([LAW_PROMPT + list(outcome[:i])]))[0, -1]
            p *= warp(constrain(logits, allowed), params)[outcome[i]].item()
            if p == 0:
                break
        if p > 0:
            law[outcome] = p
    return law


def sample_constrained(pair, params: SamplingParams, *, gamma: int, lookup: bool, runs: int, seed: int) -> Counter:
    counts = Counter()
    for i in range(runs):
        session = Session(pair)
        policy = None
        if gamma:
            # lookup proposes what followed an earlier match in the prompt: a point-mass draft
            found = PromptLookup(LAW_PROMPT + [0, 1, 4, 2, 0, 3], min_match=1) if lookup else None
            policy = Policy(gamma=gamma, stop=0.0, controller=session.controller, lookup=found, draft_model=True)
        emitted = []
        try:
            for event in engine.decode(
                session.target,
                session.draft,
                LAW_PROMPT,
                policy=policy,
                params=params,
                max_tokens=LENGTH,
                eos_ids=frozenset({EOS}),
                key=mx.random.key(seed + i),
                grammar=letters_matcher(),
            ):
                if isinstance(event, Round):
                    emitted += event.emitted
        except RuntimeError:  # the matcher refused an emitted id: an outcome the law rules out
            emitted = ["refused"]
        counts[tuple(emitted)] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize(
    "params", [SamplingParams(temp=1.0), SamplingParams(temp=0.8, top_k=2)], ids=["temp1", "temp0.8-top_k2"]
)
def test_speculative_sampling_under_a_grammar_has_the_constrained_law(small_pair, params):
    law = constrained_law(small_pair.target.model, params)
    counts = sample_constrained(small_pair, params, gamma=2, lookup=False, runs=RUNS, seed=1000)
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


@pytest.mark.slow
def test_lookup_beside_the_draft_under_a_grammar_has_the_constrained_law(small_pair):
    """Point-mass proposals from the prompt, cut where the grammar forbids them."""
    params = SamplingParams(temp=1.0)
    law = constrained_law(small_pair.target.model, params)
    counts = sample_constrained(small_pair, params, gamma=2, lookup=True, runs=RUNS, seed=3000)
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


@pytest.mark.slow
def test_standard_sampling_under_a_grammar_has_the_constrained_law(small_pair):
    """The harness itself, and the standard path's mask."""
    params = SamplingParams(temp=1.0)
    law = constrained_law(small_pair.target.model, params)
    ok, statistic, threshold = fits(
        sample_constrained(small_pair, params, gamma=0, lookup=False, runs=RUNS, seed=5000), law
    )
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


def test_a_stale_target_mask_fails_the_law(small_pair, monkeypatch):
    """Negative control: verifying every position with the round's first mask (not the
    drafted prefix's) lets the target emit what the grammar forbids, and the test sees it."""
    params = SamplingParams(temp=1.0)
    law = constrained_law(small_pair.target.model, params)

    def stale(self, mark):
        first = self._masks.get(mark) if mark in self._masks else self.allowed()
        return first[None].repeat(self.depth - mark + 1, axis=0)

    monkeypatch.setattr(Matcher, "trail", stale)
    counts = sample_constrained(small_pair, params, gamma=2, lookup=False, runs=400, seed=9000)
    ok, statistic, threshold = fits(counts, law)
    assert not ok, f"a stale mask passed: chi2 {statistic:.1f} <= {threshold:.1f}"


def test_json_schema_spec_reads_text_and_refuses_non_objects():
    assert json.loads(GrammarSpec.json_schema('{"type": "integer"}').source) == {"type": "integer"}
    with pytest.raises(InvalidOption, match="not JSON"):
        GrammarSpec.json_schema("{nope")
    with pytest.raises(InvalidOption, match="JSON object"):
        GrammarSpec.json_schema("[1]")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_rollback_over_ids_read_after_the_grammar_stopped():
    """llguidance does not record an id read once the grammar has stopped (a draft past the
    end): rolling back over it must not undo an earlier id (greedy on gemma3_text drifted
    from standard decoding before the matcher knew)."""
    matcher = letters_matcher()
    matcher.consume_all([0, 1, 0])  # "aba": complete, stopped
    assert matcher.stopped
    matcher.consume_all([EOS, EOS])
    matcher.rollback_to(3)
    assert matcher.allowed().nonzero()[0].tolist() == [EOS]
    matcher.rollback_to(2)
    assert matcher.allowed().nonzero()[0].tolist() == [0, 1]


# -- the command line ----------------------------------------------------------------------


def run_cli(capsys, *args) -> tuple[int, str, str]:
    from mlxspec.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def test_generate_json_schema_regex_and_grammar(capsys, factory, tmp_path):
    target, draft = (str(p) for p in factory.pair("llama"))
    schema = tmp_path / "pet.json"
    schema.write_text(json.dumps(SCHEMA))
    lark = tmp_path / "answer.lark"
    lark.write_text('start: "yes" | "no" | "maybe"\n')
    common = ("-t", target, "-d", draft, "-m", "80", "--json")
    code, out, _ = run_cli(capsys, "generate", "def main(", "--grammar", str(lark), *common)
    assert code == 0 and json.loads(out)["text"] in ("yes", "no", "maybe")
    assert json.loads(out)["finish_reason"] == "stop" or json.loads(out)["finish_reason"] == "eos"
    code, out, _ = run_cli(capsys, "generate", "def main(", "--regex", "[0-9]{2}-[a-z]{2}", *common)
    assert code == 0 and re.fullmatch("[0-9]{2}-[a-z]{2}", json.loads(out)["text"])
    code, out, _ = run_cli(capsys, "generate", "def main(", "--json-schema", str(schema), *common, "--temp", "1")
    assert code == 0 and json.loads(out)["text"].lstrip().startswith("{")


@pytest.mark.parametrize(
    "args, message",
    [
        (("--json-schema", "/no/such.json"), "--json-schema /no/such.json: no such file"),
        (("--regex", "a("), "--regex is not one the grammar engine accepts"),
        (("--regex", "a", "--grammar", "x.lark"), "give one of --json-schema, --regex and --grammar"),
    ],
)
def test_bad_grammars_are_one_line_and_exit_2(capsys, factory, args, message):
    target, draft = (str(p) for p in factory.pair("llama"))
    code, _, err = run_cli(capsys, "generate", "def main(", "-t", target, "-d", draft, "-m", "4", *args)
    assert code == 2 and message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real command in a process of its own: a crash there is an exit code, not this run's end."""
    command = [sys.executable, "-m", "mlxspec", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def one_error_line(done: subprocess.CompletedProcess, words: str) -> None:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and words in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_grammars_that_overflowed_the_engines_stack(factory, tmp_path):
    """`--json-schema` with a chain of 1,000 $defs and `--grammar` with a chain of 3,000 Lark
    rules died with exit 139 (the engine's recursion overflowed the stack). The schema is
    refused in one line (exit 2), before the models load; the Lark chain compiles on the
    engine's own big stack and its reply is what it allows; a grammar past the size bound
    is one line."""
    target, draft = (str(p) for p in factory.pair("llama"))
    models = ("-t", target, "-d", draft, "-m", "8")
    deep = tmp_path / "deep.json"
    deep.write_text(json.dumps(fuzz.ref_chain(1000)))
    done = cli("generate", "def main(", "--json-schema", str(deep), *models)
    assert done.returncode == 2, (done.returncode, done.stderr)
    one_error_line(done, f"the JSON schema in {deep} nests deeper than 512 levels")
    nested = tmp_path / "nested.json"  # deeper than Python's JSON reader recurses
    nested.write_text('{"type": "array", "items": ' * 5000 + "{}" + "}" * 5000)
    done = cli("generate", "def main(", "--json-schema", str(nested), *models)
    assert done.returncode == 2, (done.returncode, done.stderr)
    one_error_line(done, "nests deeper than 512 levels")
    chain = tmp_path / "chain.lark"
    chain.write_text(fuzz.lark_chain(3000))
    done = cli("generate", "def main(", "--grammar", str(chain), *models, "--json")
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert json.loads(done.stdout)["text"] == "x"
    chain.write_text(fuzz.lark_chain(30000))
    done = cli("generate", "def main(", "--grammar", str(chain), *models)
    assert done.returncode == 2, (done.returncode, done.stderr)
    one_error_line(done, "the grammar engine takes at most 256 KiB")


def test_a_lark_lexeme_with_stop_is_one_line_when_speculating(factory, tmp_path):
    """`stop=` lexemes cannot be rolled back by the engine, and speculative decoding rolls back
    the drafts it rejects: that was "internal error: RuntimeError: ...". It is one line now;
    standard decoding (gamma 0), which rolls nothing back, answers under it."""
    target, draft = (str(p) for p in factory.pair("llama"))
    lark = tmp_path / "stop.lark"
    lark.write_text('start: word\nword[stop=""]: /[a-z]+/\n')
    models = ("-t", target, "-d", draft, "-m", "40")
    done = cli("generate", "def main(", "--grammar", str(lark), *models, "-g", "3")
    assert done.returncode == 2, (done.returncode, done.stderr)
    one_error_line(done, "the grammar engine cannot take back ids read under this grammar")
    done = cli("generate", "def main(", "--grammar", str(lark), *models, "-g", "0", "--json")
    assert done.returncode == 0 and re.fullmatch("[a-z]+", json.loads(done.stdout)["text"]), done.stderr


# -- the real SmolLM2 pair -------------------------------------------------------------------

COUNTRY = {
    "type": "object",
    "properties": {
        "country": {"type": "string"},
        "capital": {"type": "string"},
        "continent": {"enum": ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    },
    "required": ["country", "capital", "continent", "languages"],
    "additionalProperties": False,
}


@pytest.mark.slow
def test_smollm2_answers_a_real_question_in_valid_sensible_json():
    """The SmolLM2 pair (float32 target, the bundled distilled draft): the JSON validates,
    names Paris and Europe, and speculative decoding gives standard decoding's ids."""
    from mlxspec.models.presets import resolve_name
    from tests.support import real_models

    target = str(real_models.folder(real_models.SMOLLM2))
    pair = mlxspec.load_pair(target, str(resolve_name("bundled:smollm2-draft")))
    question = "Describe France as JSON with the keys country, capital, continent and languages."
    spec = GrammarSpec.json_schema(COUNTRY)
    standard = mlxspec.generate(pair, question, max_tokens=80, gamma=0, grammar=spec)
    answer = json.loads(standard.text)
    jsonschema.validate(answer, COUNTRY)
    assert answer["capital"] == "Paris" and answer["continent"] == "Europe", answer
    assert standard.finish_reason == "eos"
    for gamma in (3, "auto"):
        assert mlxspec.generate(pair, question, max_tokens=80, gamma=gamma, grammar=spec).tokens == standard.tokens
    lookup = mlxspec.load_pair(target, "ngram")
    assert mlxspec.generate(lookup, question, max_tokens=80, gamma="auto", grammar=spec).tokens == standard.tokens


@pytest.mark.parametrize("vocab", [1.0, 0.1], ids=["full-vocab", "10%-vocab"])
def test_greedy_under_a_grammar_with_an_eagle3_head(factory, vocab):
    """The head's rows masked at its own ids (a 10% head often allows nothing the grammar
    does, and stops drafting there): still standard decoding's ids."""
    from tests.models.test_eagle3 import Heads

    pair = Heads(factory).pair("llama", vocab=vocab, fit=40)
    assert pair.draft.kind == "eagle3"
    for spec in (WORDS, GrammarSpec.json_schema(SCHEMA)):
        standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0, grammar=spec)
        for gamma in (1, 3, "auto"):
            result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma, grammar=spec)
            assert result.tokens == standard.tokens, (spec.kind, gamma)
