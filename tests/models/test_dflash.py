"""DFlash block drafters: written to disk in the published layout, loaded back through
`--draft DIR` as their own kind, refused in one line where they do not fit the target, and
exact. Drafters fitted for a few seconds to their tiny target's continuations of the test
prompt accept some drafts and miss others, so the rollback paths run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter

import mlx.core as mx
import pytest

import mlxspec
from mlxspec.decoding.sampling import SamplingParams
from mlxspec.errors import IncompatibleHead, ModelLoadError
from mlxspec.generation import Session
from tests.models.test_eagle3 import Heads
from tests.support.dflash import make_dflash
from tests.support.heads import check_ctrl_c_mid_round

PROMPT = list(range(10, 22))
MAX_TOKENS = 64  # past the 40 ids it was fitted on: it misses more there
FAMILIES = ["llama", "qwen3", "gemma3_text"]  # gemma3_text: a window of 8 that wraps


class Drafters(Heads):
    """The EAGLE-3 tests' tiny targets (and their heads), with DFlash drafters beside them."""

    def drafter(self, arch: str, *, fit: int = 200, **kwargs):
        key = ("dflash", arch, fit, tuple(sorted(kwargs.items())))
        if key not in self.built:
            out = self.factory.root / f"{arch}-dflash-{fit}-{len(self.built)}"
            self.built[key] = make_dflash(self.target(arch), out, fit_steps=fit, fit_prompts=[PROMPT], **kwargs)
        return self.built[key]

    def pair(self, arch: str, **kwargs):
        return mlxspec.load_pair(str(self.target(arch)), str(self.drafter(arch, **kwargs)))


@pytest.fixture(scope="module")
def drafters(factory) -> Drafters:
    return Drafters(factory)


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_with_a_dflash_drafter_equals_standard(drafters, arch):
    pair = drafters.pair(arch)
    assert pair.draft.kind == "dflash"
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    assert len(standard) == MAX_TOKENS
    for gamma in (1, 3, 7, "auto"):
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma, tree=0)
        assert result.tokens == standard, f"gamma={gamma}"
        stats = result.stats
        if gamma in (3, 7):  # right often and wrong sometimes: both rollback paths run
            assert 0 < stats.accepted < stats.drafted, (gamma, stats.accepted, stats.drafted)


def test_the_published_layout_loads_without_running_its_code(drafters, tmp_path):
    """The published folders carry an `auto_map` (transformers' remote code) beside their
    config: mlxspec reads the config and weights itself and never imports the folder's code;
    a `model.` prefix on the weights and copies of the target's embedding are read too."""
    out = tmp_path / "published"
    shutil.copytree(drafters.drafter("llama"), out)
    config = json.loads((out / "config.json").read_text())
    block = config.pop("block_size")
    config["dflash_config"]["block_size"] = block  # where z-lab's newer configs keep it
    config["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    (out / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    (out / "dflash.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    weights = mx.load(str(out / "model.safetensors"))
    mx.save_safetensors(str(out / "model.safetensors"), {"model." + k: v for k, v in weights.items()})
    pair = mlxspec.load_pair(str(drafters.target("llama")), str(out))
    assert pair.draft.kind == "dflash" and pair.draft.config["block_size"] == block
    ours = drafters.pair("llama")
    # a fixed tree: auto's sizes follow this machine's timings, which differ between two runs
    a = mlxspec.generate(ours, PROMPT, max_tokens=24, gamma=5, tree=8)
    b = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=5, tree=8)
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted > 0
    assert not marker.exists()


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "in-a-batch"])
def test_the_drafters_rows_after_rejections_equal_rows_read_afresh(drafters, batched):
    """After rounds with rejections and a session moved to another prompt, the drafter's
    cached context rows are exactly those a fresh drafter reads from the target's features
    of the same ids: no row of a rejected draft, nothing of an older prompt. In a batch (the
    rounds beside another request's, every block one packed forward), the rows it takes
    back out of its lane are those too: no column of a block."""
    pair = drafters.pair("qwen3")
    session = Session(pair)
    first = mlxspec.generate(pair, PROMPT, max_tokens=30, gamma=7, tree=0, session=session)
    assert 0 < first.stats.accepted < first.stats.drafted
    history = PROMPT + first.tokens
    prompt = history[: len(PROMPT) + 9] + [50, 51]  # back into a drafted block, then elsewhere
    options = dict(max_tokens=20, gamma=7, tree=8, session=session)
    trees = _beside_another(pair, prompt, options) if batched else mlxspec.generate(pair, prompt, **options)
    assert trees.stats.tree_rounds > 0
    drafter = session.draft
    rows = drafter.rows
    assert rows > len(prompt) and drafter.ids == session.target.history[:rows]
    pair.target.model(mx.array([drafter.ids]))
    from mlxspec.decoding import capture

    features = capture.taps_of(pair.target.model).take()
    fresh = pair.draft.model.make_cache()
    pair.draft.model.read_context(features, fresh)
    for held, read in zip(drafter.cache, fresh):
        for a, b in zip(held.keys_and_values(), read.keys_and_values()):
            assert a.shape == b.shape and mx.allclose(a, b, atol=1e-4).item()


def _beside_another(pair, prompt: list[int], options: dict):
    """The generation for `prompt` in a batch beside another request's (both drafting)."""
    from mlxspec.batching import Lanes
    from mlxspec.decoding.batch import Batch

    batch, results = Batch(), {}
    lanes = Lanes(pair, batch)

    def mine():
        with lanes.joined(options["session"]):
            results["mine"] = mlxspec.generate(pair, prompt, **options)

    def other():
        fresh = Session(pair)
        with lanes.joined(fresh):
            mlxspec.generate(pair, PROMPT[:7], **(options | dict(session=fresh)))

    def done(task, finished):
        if finished.error is not None:
            raise finished.error

    tasks = [mine, other]
    batch.run(lambda idle: [tasks.pop() for _ in range(len(tasks))], done=done)
    assert batch.rows_of[pair.draft.name] > batch.forwards_of[pair.draft.name] > 0
    return results["mine"]


def test_a_session_with_a_dflash_drafter_stays_exact(drafters):
    """Chat-like calls on one session: extend, trim back into the last drafted block,
    diverge, retry, on a window that wraps."""
    pair = drafters.pair("gemma3_text")
    session = Session(pair)
    history = []
    for prompt_of in (
        lambda h: PROMPT,
        lambda h: h + [40, 41],
        lambda h: h[: len(h) - 5] + [60],  # back into the block the last round drafted
        lambda h: h[:5] + [50, 51, 52],
        lambda h: h[:-3],
        lambda h: h + PROMPT[:4],
    ):
        prompt = prompt_of(history)
        # standard decoding keeps no features: the next call reads them again
        for gamma, tree in ((0, 0), (5, 0), (5, 8), ("auto", "auto")):
            got = mlxspec.generate(pair, prompt, max_tokens=12, gamma=gamma, tree=tree, session=session).tokens
            fresh = mlxspec.generate(pair, prompt, max_tokens=12, gamma=0, session=Session(pair)).tokens
            assert got == fresh, (prompt, gamma, tree)
        history = prompt + got


def test_a_ctrl_c_mid_round_leaves_a_dflash_session_exact(drafters):
    check_ctrl_c_mid_round(drafters.pair("llama"), PROMPT, gamma=5)


def test_prompt_lookup_beside_a_dflash_drafter(drafters):
    pair = drafters.pair("llama")
    prompt = PROMPT + PROMPT[:6]
    standard = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=0).tokens
    result = mlxspec.generate(pair, prompt, max_tokens=MAX_TOKENS, gamma=3, ngram=True)
    assert result.tokens == standard
    assert result.stats.ngram_rounds > 0 and result.stats.model_rounds > 0, result.stats


def test_greedy_under_a_grammar_with_a_dflash_drafter_equals_standard(drafters):
    """Under a grammar each block position is masked by the matcher after the drafts before
    it (a chain, trees or not), and the ids are standard decoding's under the grammar."""
    from tests.exactness.test_grammar import WORDS

    pair = drafters.pair("llama")
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0, grammar=WORDS).tokens
    for gamma, tree in ((3, 0), (7, 8), ("auto", "auto")):
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma, tree=tree, grammar=WORDS)
        assert result.tokens == standard, (gamma, tree)


def test_a_batch_of_prompts_with_a_dflash_drafter_is_each_prompts_own_output(drafters):
    """Batched generations share the target's forwards and the drafter's (every lane's block
    in one forward), and every result is what the prompt gives alone."""
    from mlxspec.batching import generate_many
    from mlxspec.decoding.batch import Batch

    pair = drafters.pair("llama")
    first = mlxspec.generate(pair, PROMPT, max_tokens=20, gamma=0).tokens
    prompts = [PROMPT, PROMPT + first[:3]]  # both on the path the drafter was fitted to
    alone = [mlxspec.generate(pair, p, max_tokens=20, gamma=0).tokens for p in prompts]
    batch = Batch()
    results = generate_many(pair, prompts, max_tokens=20, gamma=5, batch=batch)
    assert [r.tokens for r in results] == alone
    assert all(r.stats.accepted > 0 for r in results), [r.stats for r in results]
    assert batch.rows_of[pair.draft.name] > batch.forwards_of[pair.draft.name] > 0


def test_the_cost_model_times_one_block_forward_as_the_drafters_step(drafters):
    """bench's cost model: a DFlash drafter's step is its block forward (its whole chain)."""
    from mlxspec.measure import costs

    measured = costs.measure(drafters.pair("llama"), PROMPT, max_tokens=2, repeats=1)
    assert measured.draft_step > 0 and measured.target_step > 0


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_with_ddtrees_equals_standard(drafters, arch):
    """DDTree: the block's per-position distributions as a best-first tree, fixed sizes and
    auto (sized by the verify curve), depths fixed and auto."""
    pair = drafters.pair(arch)
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    for gamma, tree in ((3, 4), (7, 8), (7, 24), ("auto", 16), ("auto", "auto")):
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma, tree=tree)
        assert result.tokens == standard, f"gamma={gamma} tree={tree}"
        if tree != "auto":  # trees verified, some paths taken, some not
            stats = result.stats
            assert stats.tree_rounds > 0 and 0 < stats.accepted, (gamma, tree, stats)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_a_dflash_drafter_over_part_of_the_ids_stays_exact(drafters, arch):
    """A draft vocabulary (its own LM head over part of the target's ids, d2t mapping them):
    the target's greedy text holds ids outside it, which are never drafted and still
    emitted; chains and DDTrees give standard decoding's ids."""
    pair = drafters.pair(arch, draft_vocab=0.5)
    kept = set(mx.array(pair.draft.model.draft_to_target).tolist())
    assert pair.draft.model.config.draft_vocab_size == len(kept) < pair.target.model.args.vocab_size
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    assert set(standard) - kept and set(standard) & kept  # both kinds of id in the text
    for gamma, tree in ((3, 0), (7, 0), (7, 8), ("auto", "auto")):
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma, tree=tree)
        assert result.tokens == standard, (gamma, tree)
        if tree != "auto":
            assert 0 < result.stats.accepted < result.stats.drafted, (gamma, tree, result.stats)


def test_a_draft_vocabulary_is_written_and_read_back_in_the_heads_layout(drafters, tmp_path):
    """`draft_vocab_size`, `lm_head.weight` and d2t/t2d (EAGLE-3's layout for the same
    thing) round-trip; a d2t past the target's ids, or one without the size, or the size
    without d2t, is refused in one line."""
    folder = drafters.drafter("llama", fit=0, draft_vocab=0.5)
    config = json.loads((folder / "config.json").read_text())
    weights = mx.load(str(folder / "model.safetensors"))
    size = config["draft_vocab_size"]
    assert weights["lm_head.weight"].shape[0] == size and weights["d2t"].shape == (size,)
    loaded = mlxspec.load_pair(str(drafters.target("llama")), str(folder)).draft.model
    assert mx.array_equal(loaded.draft_to_target, mx.arange(size) + weights["d2t"]).item()

    def rewritten(name, change_config=None, **tensors):
        out = tmp_path / name
        shutil.copytree(folder, out)
        if change_config:
            (out / "config.json").write_text(json.dumps(change_config(dict(config))))
        kept = {k: v for k, v in weights.items() if k not in tensors} | {
            k: v for k, v in tensors.items() if v is not None
        }
        mx.save_safetensors(str(out / "model.safetensors"), kept)
        return out

    past = weights["d2t"] + 10**6
    twice = mx.array([-1] * size) * mx.arange(size)  # every draft id to target id 0
    wrong_mask = mx.logical_not(weights["t2d"])
    for out, says in (
        (rewritten("past", d2t=past), "d2t points past the target's"),
        (rewritten("fractional", d2t=weights["d2t"].astype(mx.float32) + 0.6), "not whole numbers"),
        (rewritten("twice", d2t=twice), "two draft ids to one target id"),
        (rewritten("mask", t2d=wrong_mask), "t2d does not mark"),
        (rewritten("no-d2t", d2t=None, t2d=None), "needs d2t"),
        (rewritten("no-size", lambda c: {k: v for k, v in c.items() if k != "draft_vocab_size"}), "d2t without"),
    ):
        with pytest.raises(ModelLoadError, match=says) as refused:
            mlxspec.load_pair(str(drafters.target("llama")), str(out))
        assert "\n" not in str(refused.value)


def test_a_draft_vocabulary_in_any_order_drafts_the_same(drafters, tmp_path):
    """d2t need not be sorted: the same drafter with its ids (d2t and lm_head rows) reversed
    drafts the same target ids and accepts the same, in chains, trees and under a grammar."""
    from tests.exactness.test_grammar import WORDS

    folder = drafters.drafter("llama", draft_vocab=0.5)
    weights = dict(mx.load(str(folder / "model.safetensors")))
    size = weights["d2t"].shape[0]
    targets = mx.arange(size) + weights["d2t"]
    reversed_ids = targets[::-1]
    out = tmp_path / "reversed"
    shutil.copytree(folder, out)
    weights |= {"d2t": reversed_ids - mx.arange(size), "lm_head.weight": weights["lm_head.weight"][::-1]}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    sorted_pair = drafters.pair("llama", draft_vocab=0.5)
    reversed_pair = mlxspec.load_pair(str(drafters.target("llama")), str(out))
    for options in ({"gamma": 5, "tree": 0}, {"gamma": 5, "tree": 8}, {"gamma": 3, "tree": 0, "grammar": WORDS}):
        a = mlxspec.generate(sorted_pair, PROMPT, max_tokens=MAX_TOKENS, **options)
        b = mlxspec.generate(reversed_pair, PROMPT, max_tokens=MAX_TOKENS, **options)
        assert a.tokens == b.tokens and (a.stats.drafted, a.stats.accepted) == (b.stats.drafted, b.stats.accepted)
        assert 0 < a.stats.accepted < a.stats.drafted, (options, a.stats)
        standard = mlxspec.generate(sorted_pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0, grammar=options.get("grammar"))
        assert a.tokens == standard.tokens, options


# -- the sampled law: a drafter over 6 ids, chi-square of the first three emitted ids


@pytest.fixture(scope="module")
def small_target(factory):
    """A one-layer llama over 6 ids."""
    from mlxspec.models.synthetic import ARCHITECTURES

    config = dict(ARCHITECTURES["llama"], hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    return factory.model("dist-target", arch=config, vocab_size=6, seed=11, head_scale=5.0)


def _small_drafter(factory, target, name: str, **kwargs):
    """A drafter briefly fitted to the small target: it reads that layer's output (the final
    norm's input); some drafts are accepted, some not."""
    drafter = make_dflash(
        target, factory.root / name, seed=3, block_size=4, fit_steps=60, fit_prompts=[LAW_PROMPT], **kwargs
    )
    return mlxspec.load_pair(str(target), str(drafter))


@pytest.fixture(scope="module")
def small_pair(factory, small_target):
    return _small_drafter(factory, small_target, "dist-dflash")


@pytest.fixture(scope="module")
def small_part_pair(factory, small_target):
    """A drafter over 4 of the target's 6 ids."""
    pair = _small_drafter(factory, small_target, "dist-dflash-part", draft_vocab=0.7)
    assert pair.draft.model.config.draft_vocab_size == 4
    return pair


LAW_PROMPT = [1, 4, 2]
LAWS = {
    "chain, temperature 0.7": (SamplingParams(temp=0.7), 0, False),
    "ddtree, temperature 0.7": (SamplingParams(temp=0.7), 8, False),
    "ddtree, temperature 1, top-p 0.9": (SamplingParams(temp=1.0, top_p=0.9), 8, False),
    "chain over 4 of the 6 ids, temperature 0.7": (SamplingParams(temp=0.7), 0, True),
    "ddtree over 4 of the 6 ids, temperature 1": (SamplingParams(temp=1.0), 8, True),
}


@pytest.mark.parametrize(
    "law_name", [pytest.param(name, marks=pytest.mark.slow) if LAWS[name][1] else name for name in LAWS]
)
def test_sampling_with_a_dflash_drafter_has_the_targets_joint_law(request, monkeypatch, law_name):
    """Chains: each draft drawn from its own position's warped row, q that row. DDTrees: a
    drawn spine (q each depth's row) and point masses the heap chose; walks that took a point
    mass and walks along the spine alone both counted. Over part of the ids: q is zero at
    the others, which only the residual emits."""
    from tests.exactness.test_distribution import LENGTH, fits, sample_joint
    from tests.models.test_eagle3 import exact_law_of
    from tests.support.tree_walks import count_point_mass_paths

    params, tree, part = LAWS[law_name]
    pair = request.getfixturevalue("small_part_pair" if part else "small_pair")
    law = exact_law_of(pair.target.model, params, LAW_PROMPT, 6, LENGTH)
    taken, fates = count_point_mass_paths(monkeypatch), Counter()
    counts = sample_joint(pair, params, 2, 2000, 9000, prompt=LAW_PROMPT, fates=fates, tree=tree)
    assert all(fates[n] > 20 for n in range(3)), (fates, taken)  # rejections, partial and full acceptance
    assert not tree or (taken[True] > 100 and taken[False] > 100), (taken, fates)  # point masses and spine
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


# -- refusals


def _edit_config(drafter_dir, tmp_path, change):
    out = tmp_path / "edited"
    shutil.copytree(drafter_dir, out)
    config = json.loads((out / "config.json").read_text())
    change(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


MISFITS = {
    "a wrong hidden size": (lambda c: c.update(hidden_size=128), "hidden_size"),
    "a layer id past the target": (lambda c: c["dflash_config"].update(target_layer_ids=[0, 5]), "target_layer_ids"),
    "no mask id": (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id"),
    "another vocabulary": (lambda c: c.update(vocab_size=1000), "vocab_size"),
}


@pytest.mark.parametrize("misfit", list(MISFITS))
def test_a_dflash_drafter_that_does_not_fit_is_refused_naming_the_field(drafters, tmp_path, misfit):
    change, field = MISFITS[misfit]
    edited = _edit_config(drafters.drafter("llama", fit=0), tmp_path, change)
    with pytest.raises((IncompatibleHead, ModelLoadError), match=field) as refused:
        mlxspec.load_pair(str(drafters.target("llama")), str(edited))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("misfit", list(MISFITS))
def test_the_cli_refuses_a_misfit_dflash_drafter_in_one_line(drafters, tmp_path, misfit):
    change, field = MISFITS[misfit]
    edited = _edit_config(drafters.drafter("llama", fit=0), tmp_path, change)
    target = str(drafters.target("llama"))
    command = [sys.executable, "-m", "mlxspec", "generate", "hello", "--target", target, "--draft", str(edited)]
    run = subprocess.run([*command, "-m", "4"], capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    # exit 1, as for an EAGLE-3 head that does not fit (2 is the CLI's for a bad option)
    assert run.returncode == 1 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert field in lines[0]


HOSTILE = {
    "a JSON array": (lambda c: [c], "JSON"),
    "no dflash_config": (lambda c: {k: v for k, v in c.items() if k != "dflash_config"}, "dflash_config"),
    "zero layers": (lambda c: c | {"num_hidden_layers": 0}, "num_hidden_layers"),
    "a trillion wide": (lambda c: c | {"hidden_size": 1e12}, "hidden_size"),
    "a block of one": (lambda c: c | {"block_size": 1}, "block_size"),
    "a mask id past the vocabulary": (
        lambda c: c | {"dflash_config": {**c["dflash_config"], "mask_token_id": 10**6}},
        "mask_token_id",
    ),
    "fractional layer ids": (
        lambda c: c | {"dflash_config": {**c["dflash_config"], "target_layer_ids": [0.5]}},
        "target_layer_ids",
    ),
    "sliding drafter layers": (lambda c: c | {"layer_types": ["sliding_attention"]}, "layer_types"),
    "a rope factor that is text": (
        lambda c: c | {"rope_scaling": {"rope_type": "linear", "factor": "x"}},
        "rope_scaling",
    ),
}


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_dflash_config_is_refused_in_one_line(drafters, tmp_path, hostile):
    """Every field checked before a module is built from it: one line naming it."""
    change, field = HOSTILE[hostile]
    out = tmp_path / "hostile"
    shutil.copytree(drafters.drafter("llama", fit=0), out)
    (out / "config.json").write_text(json.dumps(change(json.loads((out / "config.json").read_text()))))
    with pytest.raises(ModelLoadError, match=field) as refused:
        mlxspec.load_pair(str(drafters.target("llama")), str(out))
    assert "\n" not in str(refused.value)


def _damaged(folder, tmp_path, damage):
    """A copy of a drafter or head folder whose weights `damage(tensors, out)` rewrote."""
    out = tmp_path / "damaged"
    shutil.copytree(folder, out)
    tensors = dict(mx.load(str(out / "model.safetensors")))
    damage(tensors, out)
    return out


def _first_float(tensors) -> str:
    return next(name for name, value in sorted(tensors.items()) if mx.issubdtype(value.dtype, mx.floating))


DAMAGE = {  # what shapes do not show, and names that say two things
    "NaN weights": (
        lambda t, out: mx.save_safetensors(
            str(out / "model.safetensors"), {**t, _first_float(t): t[_first_float(t)] * float("nan")}
        ),
        "not finite",
    ),
    "whole-number weights": (
        lambda t, out: mx.save_safetensors(
            str(out / "model.safetensors"), {**t, _first_float(t): t[_first_float(t)].astype(mx.int32)}
        ),
        "not floating-point",
    ),
    "a stale second file": (
        lambda t, out: mx.save_safetensors(str(out / "old.safetensors"), {_first_float(t): t[_first_float(t)] * 0}),
        "stale",
    ),
    "a tensor with and without its prefix": (
        lambda t, out: mx.save_safetensors(
            str(out / "model.safetensors"), {**t, "model." + _first_float(t): t[_first_float(t)]}
        ),
        "which one is meant",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_damaged_weights_are_refused_in_one_line(drafters, tmp_path, kind, damage):
    """Nothing damaged loads as if sound: a NaN or integer tensor (shapes alike), a second
    file holding a tensor again, two names for one tensor; for DFlash drafters and EAGLE-3
    heads, which share the loader (review finding: each loaded, drafting nothing or badly)."""
    folder = drafters.drafter("llama", fit=0) if kind == "dflash" else drafters.head("llama", fit=0)
    change, says = DAMAGE[damage]
    damaged = _damaged(folder, tmp_path, change)
    with pytest.raises(ModelLoadError, match=says) as refused:
        mlxspec.load_pair(str(drafters.target("llama")), str(damaged))
    assert "\n" not in str(refused.value)
