"""A model's own MTP head as the drafter (`--draft mtp`): tiny Qwen3.5 (dense, MoE) and
Qwen3-Next models saved in the hub's layout with their heads (norms zero-centred, conv1d in
the hub's shape, experts unstacked or fused as the hub stores them, the head in its own
shard), loaded through mlx-lm as a user's folder is. Heads fitted for a few seconds to their
target's continuations accept some proposals and miss others, so both rollback paths run
(the gated-delta state and the attention KV rolled back together)."""

from __future__ import annotations

import json
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

import mlxspec
from mlxspec.batching import generate_many
from mlxspec.decoding import capture
from mlxspec.decoding.batch import Batch
from mlxspec.drafters import mtp_head
from mlxspec.errors import IncompatibleHead, UnsupportedModel
from tests.support import mtp_models

PROMPT = list(range(10, 22))
MAX_TOKENS = 40
FAMILIES = ["qwen3_5", "qwen3_5_moe", "qwen3_next", "glm4_moe_lite"]  # the last: a nextn layer
FIT_STEPS = 100
EMBEDDING = {
    "qwen3_5": "model.language_model.embed_tokens.weight",
    "qwen3_5_moe": "model.language_model.embed_tokens.weight",
    "qwen3_next": "model.embed_tokens.weight",
}


def reference(family: str, tensors: dict, config: dict, ids: list[int], hidden: np.ndarray) -> np.ndarray:
    if family in mtp_models.NEXTN:
        return mtp_models.reference_nextn_logits(tensors, config, ids, hidden)[0]
    return mtp_models.reference_logits(tensors, config, ids, hidden, EMBEDDING[family], "lm_head.weight")[0]


def is_head_norm(name: str, family: str, config: dict) -> bool:
    head = f"model.layers.{config.get('num_hidden_layers')}." if family in mtp_models.NEXTN else "mtp."
    return name.startswith(head) and name.endswith("norm.weight")


class Models:
    def __init__(self, factory):
        self.factory = factory
        self.built = {}
        self.pairs = {}

    def folder(self, family: str, *, fit: int = FIT_STEPS, with_head: bool = True):
        key = (family, fit, with_head)
        if key not in self.built:
            out = self.factory.root / f"{family}-hub-mtp-{fit}-{with_head}"
            self.built[key] = mtp_models.write_hub_model(
                family,
                out,
                tokenizer_dir=self.factory.tokenizer_dir,
                eos_token_ids=self.factory.eos,
                fit_steps=fit,
                fit_prompts=[PROMPT],
                with_head=with_head,
            )
        return self.built[key]

    def pair(self, family: str):
        if family not in self.pairs:
            self.pairs[family] = mlxspec.load_pair(str(self.folder(family)), "mtp")
        return self.pairs[family]


@pytest.fixture(scope="module")
def models(factory) -> Models:
    return Models(factory)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_the_mtp_head_equals_standard(models, family):
    pair = models.pair(family)
    assert pair.draft.kind == "mtp"
    standard = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=0).tokens
    assert len(standard) == MAX_TOKENS
    rates = {}
    for gamma in (1, 2, 4, "auto"):
        result = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=gamma)
        assert result.tokens == standard, f"gamma={gamma}"
        rates[gamma] = result.stats.acceptance_rate
    # right often and wrong sometimes, or both rollback paths would not run
    assert all(r is not None and 0.05 < r < 1.0 for r in (rates[2], rates[4])), rates


def test_a_nextn_head_drafts_for_every_lane_of_a_batch_in_one_forward(models):
    """glm4_moe_lite's target shares its forwards across a batch, and so does its nextn head:
    each lane's first row (whose embedding the layer zeroes) is found by the row's position in
    the batch's layout, not by the shared cache's offset. Every lane drafts what it drafts
    alone, so it accepts the same drafts at the same rounds."""
    pair = models.pair("glm4_moe_lite")
    prompts = [PROMPT, PROMPT[4:] + [40, 41, 42], list(range(30, 37))]
    options = dict(max_tokens=MAX_TOKENS, gamma=2, tree=0, ngram=False, history=False)
    batch = Batch()
    together = generate_many(pair, prompts, batch=batch, **options)
    alone = [mlxspec.generate(pair, p, **options) for p in prompts]
    standard = [mlxspec.generate(pair, p, max_tokens=MAX_TOKENS, gamma=0).tokens for p in prompts]
    assert [r.tokens for r in together] == [r.tokens for r in alone] == standard
    assert [(r.stats.drafted, r.stats.accepted) for r in together] == [
        (r.stats.drafted, r.stats.accepted) for r in alone
    ]
    head = pair.draft.name
    assert batch.rows_of[head] > 1.5 * batch.forwards_of[head] > 0, (batch.rows_of, batch.forwards_of)


def _head_rows(pair, ids):
    """The target's final normed hidden states along `ids` and the head's logits for rows
    0 .. n-2 (token j+1 beside hidden j), read at once and then one more row by a chained call."""
    model, head = pair.target.model, pair.draft.model
    model(mx.array([ids]))
    hidden = capture.taps_of(model).take()[0]
    cache = KVCache()
    logits, _ = head(mx.array([ids[1:-1]]), hidden[None, :-2], cache)
    last, _ = head(mx.array([ids[-1:]]), hidden[None, -2:-1], cache)  # one row more, through the cache
    rows = mx.concatenate([logits[0], last[0]], axis=0)
    return np.array(hidden[:-1].astype(mx.float32), dtype=np.float64), np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_heads_forward_is_the_published_architecture(models, family):
    """Against a float64 NumPy forward of vLLM's Qwen3-Next/3.5 MTP (or DeepSeek nextn layer)
    on the hub's raw tensors (zero-centred norms, unstacked experts, MLA's kv_b_proj): a
    wiring error keeps exactness but ruins acceptance, so it is checked here."""
    folder = models.folder(family)
    pair = models.pair(family)
    ids = PROMPT + list(range(40, 52))
    hidden, logits = _head_rows(pair, ids)
    config = json.loads((folder / "config.json").read_text())
    tensors = mtp_models.hub_tensors(folder)
    expected = reference(family, tensors, config, ids[1:], hidden)
    scale = np.abs(expected).max()
    assert np.abs(logits - expected).max() < 1e-4 * scale
    # the check can fail: the same forward with 1 added to the head's norms (a +1 taken twice)
    shifted = {k: v + 1.0 if is_head_norm(k, family, config) else v for k, v in tensors.items()}
    wrong = reference(family, shifted, config, ids[1:], hidden)
    assert np.abs(logits - wrong).max() > 1e-2 * scale


def test_the_head_is_read_from_its_own_shard_only(models, tmp_path):
    """With the body's shard gone (only the index names it), the head still reads: nothing
    but the shard the index names for `mtp.*` is opened."""
    import shutil

    folder = tmp_path / "head-only"
    shutil.copytree(models.folder("qwen3_5"), folder)
    (folder / mtp_models.HUB_BODY_SHARD).unlink()
    tensors, quantized = mtp_head.read_head_tensors(folder)
    assert quantized is None  # the hub's layout
    assert "fc.weight" in tensors and "layers.0.self_attn.q_proj.weight" in tensors
    assert all(not name.startswith(("model.", "lm_head")) for name in tensors)
    assert mtp_head.body_in_hub_layout(folder, "qwen3_5")  # an original fetched for its head alone


def test_a_target_without_mtp_weights_is_refused_naming_what_is_missing(models):
    folder = models.folder("qwen3_5", fit=0, with_head=False)
    with pytest.raises(IncompatibleHead, match=r"no MTP head \(no mtp\.\* tensors.*add-mtp"):
        mlxspec.load_pair(str(folder), "mtp")


@pytest.mark.parametrize(
    "arch, message",
    [
        ("deepseek_v32", "is deepseek_v32: its nextn MTP layers are not supported yet"),
        ("llama", "is llama: no MTP head"),
    ],
)
def test_other_families_are_refused_naming_the_family(factory, arch, message):
    target = factory.model(f"{arch}-target", arch=arch, seed=1)
    with pytest.raises(UnsupportedModel, match=message):
        mlxspec.load_pair(str(target), "mtp")


@pytest.mark.parametrize("command", ["generate", "race"])
def test_the_cli_drafts_with_the_mtp_head(models, command):
    folder = models.folder("qwen3_5")
    run = subprocess.run(
        [sys.executable, "-m", "mlxspec", command, "def main():", "--target", str(folder), "--draft", "mtp"]
        + ["-m", "12", "--gamma", "2", "--raw"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    if command == "race":
        assert "drafting: the model's MTP head" in run.stdout


def test_the_views_name_the_head_and_its_acceptance_by_position(models):
    from mlxspec.views.summary import stats_line

    pair = models.pair("qwen3_5")
    assert pair.description.endswith("· drafting: the model's MTP head")
    stats = mlxspec.generate(pair, PROMPT, max_tokens=MAX_TOKENS, gamma=4).stats
    line = str(stats_line(stats, by_position=pair.own_head))
    rates = stats.per_position_acceptance
    assert "by position " + " ".join(f"{r:.2f}" for r in rates) in line, line
    assert "by position" not in str(stats_line(stats))


def test_the_cli_refuses_a_model_without_its_head_in_one_line(models):
    folder = models.folder("qwen3_5", fit=0, with_head=False)
    run = subprocess.run(
        [sys.executable, "-m", "mlxspec", "generate", "hi", "--target", str(folder), "--draft", "mtp", "-m", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no MTP head" in lines[0], run.stderr


@pytest.mark.slow
def test_sampling_with_the_mtp_head_has_the_targets_joint_law(factory):
    """The whole engine (the head's cache, the target's gated-delta state and KV restored and
    trimmed) at temperature 1 on a six-word Qwen3.5: the joint law of the first three ids
    against the target's exact law, chi-square."""
    from collections import Counter

    from mlxspec.decoding.sampling import SamplingParams
    from tests.exactness.test_distribution import LENGTH, fits, sample_joint
    from tests.models.test_eagle3 import exact_law_of

    vocab, prompt, runs = 6, [1, 4, 2], 2000  # w = 0.2 at power 0.99 (test_distribution.py's ADAPTIVE_RUNS)
    folder = mtp_models.write_hub_model(
        "qwen3_5",
        factory.root / "dist-qwen3_5-mtp",
        tokenizer_dir=factory.tokenizer_dir,
        eos_token_ids=factory.eos,
        seed=11,
        head_scale=5.0,
        vocab_size=vocab,
        overrides={"hidden_size": 32, "intermediate_size": 64},
        fit_steps=60,  # right often enough that whole rounds are accepted too
        fit_prompts=[prompt],
    )
    pair = mlxspec.load_pair(str(folder), "mtp")
    params = SamplingParams(temp=1.0)
    law = exact_law_of(pair.target.model, params, prompt, vocab, LENGTH)
    fates = Counter()
    counts = sample_joint(pair, params, 2, runs, 9000, prompt=prompt, fates=fates)
    assert all(fates[n] > 50 for n in range(3)), fates  # rejections, partial and full acceptance
    ok, statistic, threshold = fits(counts, law)
    assert ok, f"chi2 {statistic:.1f} > {threshold:.1f}"


# -- a conversion that lost its head, given it back


@pytest.fixture(scope="module")
def conversion(models):
    """What mlx-lm's convert makes of the Qwen3.5 original at 4 bits: no head."""
    original = models.folder("qwen3_5")
    return original, models.factory.quantized(original, 4)


def add_mtp_cli(model, original, *extra):
    return subprocess.run(
        [sys.executable, "-m", "mlxspec", "models", "add-mtp", str(model), "--from", str(original), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_conversion_without_its_head_is_refused_with_the_fix(conversion):
    _, converted = conversion
    with pytest.raises(IncompatibleHead, match=r"no MTP head .*mlxspec models add-mtp .* --from ORIGINAL_REPO"):
        mlxspec.load_pair(str(converted), "mtp")


@pytest.mark.parametrize("precision", ["bf16", "body"])
def test_add_mtp_gives_a_4bit_body_its_head(conversion, models, tmp_path, precision):
    """A 4-bit body with the head in bf16 or at the body's 4 bits: read from the original's
    head shard alone, stored beside the model, found by `--draft mtp`, exact."""
    import shutil

    original, converted = conversion
    model = tmp_path / "conversion"
    shutil.copytree(converted, model)
    run = add_mtp_cli(model, original, "--precision", precision)
    assert run.returncode == 0, run.stderr
    stored = mx.load(str(model / mtp_head.CONVERTED_FILE))
    assert stored["fc.weight"].dtype == (mx.bfloat16 if precision == "bf16" else mx.uint32)
    pair = mlxspec.load_pair(str(model), "mtp")
    standard = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=0).tokens
    for gamma in (2, "auto"):
        result = mlxspec.generate(pair, PROMPT, max_tokens=24, gamma=gamma)
        assert result.tokens == standard, f"gamma={gamma}"
    # the stored head is the original's: over the original's float body, on the same hidden
    # states, it gives the hub head's logits (to bf16's or 4 bits' precision)
    hub_pair = models.pair("qwen3_5")
    tensors, quantized = mtp_head.read_head_tensors(model)
    stored_head = mtp_head.head_from(
        tensors,
        model=hub_pair.target.model,
        config=hub_pair.target.config,
        hub_folder=model,
        quantized=quantized,
        name="x",
    )
    stored_head.set_dtype(mx.float32)
    ids = PROMPT + list(range(40, 52))
    hidden, expected = _head_rows(hub_pair, ids)
    states = mx.array(hidden, dtype=mx.float32)[None]
    logits, _ = stored_head(mx.array([ids[1:]]), states, KVCache())
    logits, expected = np.array(logits[0], dtype=np.float64), expected
    agree = (logits.argmax(-1) == expected.argmax(-1)).mean()
    assert agree > (0.95 if precision == "bf16" else 0.7), agree
    assert np.abs(logits - expected).max() < (0.05 if precision == "bf16" else 0.5) * np.abs(expected).max()


def test_add_mtp_refuses_an_original_without_a_head_in_one_line(conversion, models, tmp_path):
    _, converted = conversion
    run = add_mtp_cli(converted, models.folder("qwen3_5", fit=0, with_head=False))
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no MTP head either" in lines[0], run.stderr


def test_models_says_which_presets_draft_with_their_own_head(models, tmp_path, monkeypatch, capsys):
    from tests.cli.test_cli import run

    folder = models.folder("qwen3_5")
    mine = tmp_path / "models.toml"
    mine.write_text(f'[tiny-mtp]\ntarget = "{folder}"\ndraft = "mtp"\ngamma = 2\n')
    monkeypatch.setenv("MLXSPEC_MODELS", str(mine))
    code, out, _ = run(capsys, "models", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and rows["qwen3.5-4b-mtp"]["mtp_head"] and not rows["qwen3-14b"]["mtp_head"]
    assert rows["tiny-mtp"]["mtp_head"] and rows["tiny-mtp"]["draft_downloaded"]  # in the target's own folder
    code, out, _ = run(capsys, "models")
    assert code == 0 and "the model's own MTP head" in out
    pair = mlxspec.load_pair(pair="tiny-mtp")
    assert pair.own_head and pair.gamma_hint == 2


def test_another_tools_mtp_file_is_refused_in_one_line(conversion, tmp_path):
    import shutil

    _, converted = conversion
    model = tmp_path / "foreign"
    shutil.copytree(converted, model)
    mx.save_safetensors(str(model / mtp_head.CONVERTED_FILE), {"mtp.fc.weight": mx.zeros((4, 8))})
    with pytest.raises(IncompatibleHead, match="not written by `mlxspec models add-mtp`"):
        mlxspec.load_pair(str(model), "mtp")


def test_serve_drafts_with_the_mtp_head_and_says_so(models, tmp_path):
    """The real server on loopback with `--draft mtp`, asked with the real openai client:
    the greedy completion is standard decoding's, and the log names the drafter."""
    import openai

    from tests.server.test_server import running_server

    folder = models.folder("qwen3_5")
    pair = models.pair("qwen3_5")
    log = tmp_path / "serve.log"
    with running_server("--target", str(folder), "--draft", "mtp", "--gamma", "2", log=log) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
        reply = client.completions.create(model="x", prompt="def main():", temperature=0, max_tokens=16)
    expected = mlxspec.generate(pair, "def main():", raw=True, gamma=0, max_tokens=16)
    assert reply.choices[0].text == expected.text
    assert "drafting: the model's MTP head" in log.read_text()
