"""EAGLE-3 heads as the drafter: written to disk in the published layout, loaded back through
`--draft DIR`, and exact. Heads fitted for a few seconds to their tiny target's continuations
of the test prompt accept some proposals and miss others, so both rollback paths run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

import mlxspec
from mlxspec.decoding import capture
from mlxspec.decoding.sampling import SamplingParams
from mlxspec.drafting import Controller, ControllerConfig
from mlxspec.errors import IncompatibleHead, UnsupportedModel
from mlxspec.generation import Session
from tests.conftest import ARCH_SETTINGS, ModelFactory
from tests.support.heads import check_ctrl_c_mid_round, fresh_head_drafts, make_head

PROMPT = list(range(10, 22))
MAX_TOKENS = 40
FAMILIES = ["llama", "qwen2", "qwen3", "gemma3_text"]  # gemma3_text: a window of 8 that wraps


class Heads:
    def __init__(self, factory: ModelFactory):
        self.factory = factory
        self.built = {}

    def target(self, arch: str):
        return self.factory.model(f"{arch}-target", arch=arch, seed=1, head_scale=ARCH_SETTINGS[arch][0])

    def head(self, arch: str, *, vocab: float = 1.0, fit: int = 150, **kwargs):
        key = (arch, vocab, fit, tuple(sorted(kwargs.items())))
        if key not in self.built:
            out = self.factory.root / f"{arch}-eagle3-{vocab}-{fit}-{len(self.built)}"
            self.built[key] = make_head(
                self.target(arch), out, draft_vocab=vocab, fit_steps=fit, fit_prompts=[PROMPT], **kwargs
            )
        return self.built[key]

    def pair(self, arch: str, **kwargs):
        return mlxspec.load_pair(str(self.target(arch)), str(self.head(arch, **kwargs)))


@pytest.fixture(scope="module")
def heads(factory) -> Heads:
    return Heads(factory)


@pytest.mark.parametrize("vocab", [1.0, 0.1], ids=["full-vocab", "10%-vocab"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_with_a_head_equals_standard(heads, arch, vocab):
    pair = heads.pair(arch, vocab=vocab)
    assert pair.draft.kind == "eagle3"
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    assert len(standard) == MAX_TOKENS
    rates = []
    for gamma in (1, 3, 6, "auto"):
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma)
        assert result.tokens == standard, f"gamma={gamma}"
        rates.append(result.stats.acceptance_rate)
    # a head right often and wrong sometimes, or both rollback paths would not be exercised
    assert all(r is not None and 0.05 < r < 1.0 for r in rates[1:3]), rates  # gamma 3 and 6


def test_an_untrained_head_is_exact_and_rarely_right(heads):
    pair = heads.pair("llama", fit=0)
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=3)
    assert result.tokens == standard
    assert result.stats.acceptance_rate < 0.2


@pytest.mark.parametrize("gamma, ngram", [(4, False), (3, True), ("auto", True)])
def test_the_heads_proposals_are_what_a_fresh_head_proposes(heads, gamma, ngram):
    """The head's rows follow the target's history through rejections, prompt lookup's
    rounds and auto's plain steps: each round's greedy proposals equal a fresh head's over
    the same ids (a stale row costs only acceptance, so the output alone cannot see it).
    Under auto this head (rarely right) soon loses to plain decoding, and drafts again only
    when a probe is due (every 32 plain ids, then 64, 128): a longer reply, and a probe budget
    that never holds one back, so that probes come after plain stretches whatever the
    timings."""
    pair = heads.pair("gemma3_text")
    auto = gamma == "auto"
    controller = Controller(ControllerConfig(start_gamma=pair.gamma_hint, probe_budget=1.0)) if auto else None
    session = Session(pair, controller=controller)
    prompt = PROMPT + PROMPT[:6] if ngram else PROMPT
    max_tokens = MAX_TOKENS * 8 if auto else MAX_TOKENS
    rounds = [
        e
        # chains: a round's drafted ids are then one chain a fresh head would propose
        for e in mlxspec.stream(pair, prompt, session=session, max_tokens=max_tokens, gamma=gamma, ngram=ngram, tree=0)
        if hasattr(e, "drafted")
    ]
    history = list(prompt)
    assert not ngram or any(r.source == "ngram" for r in rounds)
    checked = after_plain = 0
    previous = None
    for r in rounds:
        if r.source == "model" and r.drafted:
            assert list(r.drafted) == fresh_head_drafts(pair, history, len(r.drafted)), f"round {r.index}"
            checked += 1
            after_plain += previous == "target"
        previous = r.source
        history += list(r.emitted)
    assert checked > 3
    assert not auto or after_plain >= 1, [r.source for r in rounds]


def test_taps_leave_the_targets_forward_as_it_was(heads):
    """Tapping records a layer's input and runs it unchanged."""
    import mlx_lm

    target = heads.target("qwen3")
    plain, _ = mlx_lm.load(str(target))
    tapped, _ = mlx_lm.load(str(target))
    taps = capture.install(tapped, (0, 1, 1))
    ids = mx.array([PROMPT])
    assert mx.array_equal(plain(ids), tapped(ids))
    features = taps.take()
    assert features.shape == (1, len(PROMPT), 3 * plain.args.hidden_size)


def test_prompt_lookup_beside_a_head(heads):
    pair = heads.pair("llama")
    prompt = PROMPT + PROMPT[:6]
    standard = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=0).tokens
    for gamma in (3, "auto"):
        result = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=gamma, ngram=True)
        assert result.tokens == standard, f"gamma={gamma}"
        if gamma == 3:  # both proposed: lookup where the text repeats, the head elsewhere
            assert result.stats.ngram_rounds > 0 and result.stats.model_rounds > 0, result.stats


def test_a_session_with_a_head_stays_exact(heads):
    """Chat-like calls on one session: extend, diverge, retry, on a window that wraps."""
    pair = heads.pair("gemma3_text")
    session = Session(pair)
    history = []
    for prompt_of in (
        lambda h: PROMPT,
        lambda h: h + [40, 41],
        lambda h: h[:5] + [50, 51, 52],
        lambda h: h[:-3],
        lambda h: h + PROMPT[:4],
    ):
        prompt = prompt_of(history)
        for gamma in (0, 3, "auto"):  # standard decoding keeps no features: the next call reads them again
            got = mlxspec.generate(pair, prompt, max_tokens=12, gamma=gamma, session=session).tokens
            fresh = mlxspec.generate(pair, prompt, max_tokens=12, gamma=0, session=Session(pair)).tokens
            assert got == fresh, (prompt, gamma)
        history = prompt + got


def test_drafting_after_a_shorter_standard_retry_reads_the_rows_it_needs(heads):
    """A drafting call, the same prompt again by standard decoding but shorter (the target
    trims back, and forgets the features its forwards overwrite), then drafting on that
    call's history: the head holds every row but the target's store lacks the last one,
    which propose reads (this raised LookupError), and its proposals are a fresh head's."""
    pair = heads.pair("llama")
    session = Session(pair)
    mlxspec.generate(pair, PROMPT, session=session, max_tokens=12, gamma=3)
    retried = mlxspec.generate(pair, PROMPT, session=session, max_tokens=3, gamma=0).tokens
    history = PROMPT + retried
    rounds = [  # chains: each round's drafts are then one chain a fresh head would propose
        e
        for e in mlxspec.stream(pair, history, session=session, max_tokens=6, gamma=3, tree=0)
        if hasattr(e, "drafted")
    ]
    emitted = [i for r in rounds for i in r.emitted]
    assert emitted == mlxspec.generate(pair, history, max_tokens=6, gamma=0).tokens
    seen = list(history)
    for r in rounds:
        if r.source == "model" and r.drafted:
            assert list(r.drafted) == fresh_head_drafts(pair, seen, len(r.drafted)), f"round {r.index}"
        seen += list(r.emitted)


def test_a_target_with_ids_to_refeed_still_drafts_aligned(heads, monkeypatch):
    """A rewind that cannot trim refeeds ids (array caches do): the target reads them before
    the head drafts, so its first proposal is still for the position the verify puts it at
    (helper-4's review found it predicted one id too early)."""
    from mlxspec.decoding import caches

    pair = heads.pair("llama")
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    original = caches.ModelCache.rewind

    def refeeding(self, length, mark):
        self.restore(mark)
        return length - mark.length

    monkeypatch.setattr(caches.ModelCache, "rewind", refeeding)
    trees = mlxspec.generate(pair, PROMPT, session=Session(pair), max_tokens=MAX_TOKENS, gamma=3, tree=8)
    assert trees.tokens == standard and trees.stats.tree_rounds > 0
    session = Session(pair)
    rounds = [  # chains: each round's drafts are then one chain a fresh head would propose
        e
        for e in mlxspec.stream(pair, PROMPT, session=session, max_tokens=MAX_TOKENS, gamma=3, tree=0)
        if hasattr(e, "drafted")
    ]
    assert [t for r in rounds for t in r.emitted] == standard
    monkeypatch.setattr(caches.ModelCache, "rewind", original)
    history, stale = list(PROMPT), 0
    for r in rounds:
        if r.source == "model" and r.drafted:
            stale += list(r.drafted) != fresh_head_drafts(pair, history, len(r.drafted))
        history += list(r.emitted)
    assert stale == 0


def test_a_ctrl_c_mid_round_leaves_a_head_session_exact(heads):
    check_ctrl_c_mid_round(heads.pair("llama"), PROMPT, gamma=3)


# -- the sampled law: a head over 6 ids, chi-square of the first three emitted ids


@pytest.mark.slow
@pytest.mark.parametrize("draft_vocab", [1.0, 0.5])
def test_sampling_with_a_head_has_the_targets_joint_law(factory, draft_vocab):
    """Over the whole vocabulary and over part of it (q zero on the ids the head cannot
    propose, which the target still emits: the residual must supply them)."""
    from mlxspec.models.synthetic import ARCHITECTURES
    from tests.exactness.test_distribution import LENGTH, fits, sample_joint

    vocab, prompt, runs = 6, [1, 4, 2], 2000  # w = 0.2 at power 0.99 (test_distribution.py's ADAPTIVE_RUNS)
    config = dict(ARCHITECTURES["llama"], hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    target = factory.model("dist-target", arch=config, vocab_size=vocab, seed=11, head_scale=5.0)
    head = make_head(target, factory.root / f"dist-eagle3-{draft_vocab}", draft_vocab=draft_vocab, seed=3)
    pair = mlxspec.load_pair(str(target), str(head))
    proposable = set(np.array(pair.draft.model.draft_to_target).tolist())
    assert (len(proposable) < vocab) == (draft_vocab < 1), proposable  # the half head: 2 of the 6 ids
    params = SamplingParams(temp=1.0)
    law = exact_law_of(pair.target.model, params, prompt, vocab, LENGTH)
    fates = Counter()
    counts = sample_joint(pair, params, 2, runs, 7000, prompt=prompt, fates=fates)
    # rejections, partial and full acceptance (both drafts in 2 of 6 ids: seldom)
    needed = {0: 50, 1: 50, 2: 50 if draft_vocab == 1 else 5}
    assert all(fates[n] > needed[n] for n in range(3)), fates
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


@pytest.mark.slow
def test_a_head_s_auto_trees_under_sampling_have_the_targets_joint_law(factory, monkeypatch):
    """`--tree auto` under sampling as generate builds it for a head: trees no deeper than the
    controller's chain, cut each round by their costs (a primed controller), the drawn spine
    kept whole; the walk takes point masses as well as drawn children."""
    import copy

    from mlxspec.decoding import engine
    from mlxspec.decoding.events import Round
    from mlxspec.drafting import Policy, TreeShape
    from mlxspec.models.synthetic import ARCHITECTURES
    from mlxspec.options import AUTO
    from tests.exactness.test_distribution import LENGTH, fits, primed_for_trees
    from tests.support.tree_walks import count_point_mass_paths

    vocab, prompt, runs = 6, [1, 4, 2], 2000
    config = dict(ARCHITECTURES["llama"], hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    target = factory.model("dist-target", arch=config, vocab_size=vocab, seed=11, head_scale=5.0)
    pair = mlxspec.load_pair(str(target), str(make_head(target, factory.root / "dist-eagle3-1.0", seed=3)))
    params = SamplingParams(temp=1.0)
    law = exact_law_of(pair.target.model, params, prompt, vocab, LENGTH)
    taken = count_point_mass_paths(monkeypatch)
    primed, counts = primed_for_trees(), Counter()
    for i in range(runs):
        session = Session(pair)
        policy = Policy(gamma=AUTO, stop=0.0, controller=copy.deepcopy(primed), shape=TreeShape(tree=AUTO))
        events = engine.decode(
            session.target,
            session.draft,
            prompt,
            policy=policy,
            params=params,
            max_tokens=LENGTH,
            eos_ids=frozenset(),
            key=mx.random.key(7000 + i),
        )
        counts[tuple(t for e in events if isinstance(e, Round) for t in e.emitted)] += 1
    assert taken[True] > runs / 10 and taken[False] > runs / 10, taken
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


def exact_law_of(model, params, prompt, vocab, length) -> dict:
    import itertools

    from mlxspec.decoding.sampling import warp

    rows = {}
    for n in range(length):
        for prefix in itertools.product(range(vocab), repeat=n):
            rows[prefix] = warp(model(mx.array([prompt + list(prefix)]))[0, -1], params).tolist()
    law = {}
    for outcome in itertools.product(range(vocab), repeat=length):
        p = 1.0
        for i in range(length):
            p *= rows[outcome[:i]][outcome[i]]
        if p > 0:
            law[outcome] = p
    return law


# -- refusals


def _edit_config(head_dir, tmp_path, **changes):
    import shutil

    out = tmp_path / "edited"
    shutil.copytree(head_dir, out)
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        if key == "aux":
            config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = value
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


MISFITS = [
    (dict(aux=[0, 1, 9]), "eagle_aux_hidden_state_layer_ids"),
    (dict(target_hidden_size=128), "target_hidden_size"),
    (dict(vocab_size=1000), "vocab_size"),
    (dict(aux=[0, 1]), "fc"),
]


@pytest.mark.parametrize("changes, field", MISFITS)
def test_a_head_that_does_not_fit_is_refused_naming_the_field(heads, tmp_path, changes, field):
    edited = _edit_config(heads.head("llama", fit=0), tmp_path, **changes)
    with pytest.raises((IncompatibleHead, mlxspec.errors.ModelLoadError), match=field):
        mlxspec.load_pair(str(heads.target("llama")), str(edited))


def test_a_head_for_a_wider_target_is_refused(heads, factory, tmp_path):
    wide = factory.model("llama-wide", arch="llama", seed=1, overrides={"hidden_size": 128})
    with pytest.raises(IncompatibleHead, match="target_hidden_size"):
        mlxspec.load_pair(str(wide), str(heads.head("llama", fit=0)))


def test_an_unsupported_target_family_is_refused(heads, factory):
    target = factory.model("mamba-target", arch="mamba", seed=1, head_scale=4.0)
    with pytest.raises(UnsupportedModel, match="mamba"):
        mlxspec.load_pair(str(target), str(heads.head("llama", fit=0)))


def _one_line_refusal(*args: str) -> str:
    """The command's stderr, checked to be one line and its exit non-zero."""
    run = subprocess.run([sys.executable, "-m", "mlxspec", *args], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    return lines[0]


@pytest.mark.parametrize("changes, field", MISFITS)
def test_the_cli_refuses_a_misfit_head_in_one_line(heads, tmp_path, changes, field):
    edited = _edit_config(heads.head("llama", fit=0), tmp_path, **changes)
    target = str(heads.target("llama"))
    assert field in _one_line_refusal("generate", "hello", "--target", target, "--draft", str(edited), "-m", "4")


def test_the_cli_refuses_a_head_or_training_for_an_unsupported_family(heads, factory, tmp_path):
    target = str(factory.model("mamba-target", arch="mamba", seed=1, head_scale=4.0))
    head = str(heads.head("llama", fit=0))
    assert "mamba" in _one_line_refusal("generate", "hello", "--target", target, "--draft", head, "-m", "4")
    training = [sys.executable, "-m", "mlxspec", "train-draft", "--target", target, "--out", str(tmp_path / "run")]
    run = subprocess.run(training, capture_output=True, text=True, timeout=120)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    assert run.returncode != 0 and len(errors) == 1 and "mamba" in errors[0], run.stderr
    assert run.stderr.strip().endswith(errors[0]) and "Traceback" not in run.stderr
    assert not (tmp_path / "run").exists()  # nothing --resume would take for a run


def test_a_head_in_speculators_layout_loads_the_same(heads, tmp_path):
    """speculators writes `Eagle3Speculator` with the layer's config nested and the layer's
    weights under `layers.0.`, a `model.` prefix allowed: the same head, the same proposals."""
    source = heads.head("llama")
    out = tmp_path / "speculators"
    out.mkdir()
    flat = json.loads((source / "config.json").read_text())
    layer = {k: v for k, v in flat.items() if k not in ("architectures", "eagle_config", "draft_vocab_size")}
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Eagle3Speculator"],
                "speculators_model_type": "eagle3",
                "transformer_layer_config": layer,
                "draft_vocab_size": flat["draft_vocab_size"],
                "eagle_aux_hidden_state_layer_ids": flat["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            }
        )
    )
    weights = mx.load(str(source / "model.safetensors"))
    renamed = {"model." + k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), renamed)
    published = mlxspec.load_pair(str(heads.target("llama")), str(source))
    speculators = mlxspec.load_pair(str(heads.target("llama")), str(out))
    # a fixed tree: auto's sizes follow this machine's timings, which differ between two runs
    a = mlxspec.generate(published, PROMPT, max_tokens=24, gamma=3, tree=8)
    b = mlxspec.generate(speculators, PROMPT, max_tokens=24, gamma=3, tree=8)
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted > 0


def _rewrite_config(head_dir, tmp_path, change):
    """A copy of the head whose config.json is what `change(config)` returns."""
    import shutil

    out = tmp_path / "hostile"
    shutil.copytree(head_dir, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(change(config)))
    return out


def _set(**values):
    return lambda config: config | values


def _aux(ids):
    return lambda config: config | {"eagle_config": config["eagle_config"] | {"eagle_aux_hidden_state_layer_ids": ids}}


HOSTILE_CONFIGS = {
    # issue 28: internal errors, nonsense accepted silently, and a line that named the wrong thing
    "a JSON array": (lambda config: [config], "JSON list"),
    "no attention heads": (_set(num_attention_heads=0), "num_attention_heads"),
    "a trillion wide": (_set(hidden_size=1e12), "hidden_size"),
    "a negative width": (_set(hidden_size=-256), "hidden_size"),
    "a rope factor that is text": (_set(rope_scaling={"rope_type": "linear", "factor": "x"}), "rope_scaling"),
    "a dynamic rope factor that is text": (_set(rope_scaling={"type": "dynamic", "factor": "x"}), "rope_scaling"),
    "zero layers": (_set(num_hidden_layers=0), "num_hidden_layers"),
    "no aux layers": (_aux([]), "eagle_aux_hidden_state_layer_ids"),
    "fractional aux layers": (_aux([0.5, 1.0, 1.5]), "eagle_aux_hidden_state_layer_ids"),
    "code of its own": (_set(auto_map={"AutoModel": "modeling_head.Head"}), "auto_map"),
    "no architectures": (lambda config: {k: v for k, v in config.items() if k != "architectures"}, "architectures"),
    "another architecture": (_set(architectures=["LlamaForCausalLM"]), "architectures"),
}


@pytest.mark.parametrize("hostile", list(HOSTILE_CONFIGS))
def test_a_hostile_head_config_is_refused_in_one_line(heads, tmp_path, hostile):
    change, field = HOSTILE_CONFIGS[hostile]
    edited = _rewrite_config(heads.head("llama", fit=0), tmp_path, change)
    target = str(heads.target("llama"))
    line = _one_line_refusal("generate", "hello", "--target", target, "--draft", str(edited), "-m", "4")
    assert field in line and "internal error" not in line and "has no tokenizer" not in line, line
