"""EAGLE-3 heads for tiny targets, in the published layout on disk: random, or fitted for a
few seconds to the target's own greedy continuations of given prompts, so that some
proposals are accepted and some rejected (what exercises both rollback paths)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

CONTINUATION = 40


def make_head(
    target_dir: Path,
    out_dir: Path,
    *,
    draft_vocab: float = 1.0,
    fit_steps: int = 0,
    fit_prompts: list[list[int]] = (),
    seed: int = 0,
    aux_layer_ids=None,
) -> Path:
    """A head for the mlx-lm model at `target_dir`, written to `out_dir`. `draft_vocab` < 1:
    over that fraction of the target's ids (its end-of-sequence ids, half of the ids its
    fitted continuations use, random others), so some emitted ids lie outside it."""
    import mlx_lm

    from mlxspec.decoding import capture
    from mlxspec.drafters.eagle3_head import Eagle3Head, config_from_target, save_head, target_embedding

    model, tokenizer = mlx_lm.load(str(target_dir))
    config = json.loads((Path(target_dir) / "config.json").read_text())
    vocab = int((config.get("text_config") or config)["vocab_size"])
    ids = tuple(aux_layer_ids or capture.default_aux_layers(capture.num_layers(model)))
    taps = capture.install(model, ids)
    rng = np.random.default_rng(seed)
    sequences, features = _continuations(model, taps, [list(p) for p in fit_prompts], rng) if fit_steps else ([], [])
    kept = part_of_vocabulary(draft_vocab, vocab=vocab, eos=tokenizer.eos_token_ids, sequences=sequences, rng=rng)
    mx.random.seed(seed)
    head = Eagle3Head(config_from_target(config, draft_vocab_size=len(kept), aux_layer_ids=ids))
    object.__setattr__(head, "draft_to_target", mx.array(kept, dtype=mx.uint32))
    head.share_embedding(target_embedding(model))
    if fit_steps:
        _fit(head, sequences, features, kept, vocab, fit_steps)
    mx.eval(head.parameters())
    save_head(head, out_dir, dtype=mx.float32)
    return Path(out_dir)


def part_of_vocabulary(share: float, *, vocab: int, eos, sequences: list, rng) -> np.ndarray:
    """A drafter's ids, sorted: every id for `share` >= 1; else that share of the target's
    ids: its end-of-sequence ids, half of the ids the fitted continuations use (so some of
    the target's greedy ids lie outside), and random others."""
    if share >= 1.0:
        return np.arange(vocab)
    used = np.unique(np.concatenate([s for s in sequences])) if sequences else np.array([], dtype=int)
    chosen = list(eos) + list(rng.permutation(used)[: len(used) // 2])
    fill = [i for i in rng.permutation(vocab) if i not in set(used)]
    return np.unique(np.array(chosen + fill[: max(int(vocab * share) - len(chosen), 0)], dtype=np.int64))


def _continuations(model, taps, prompts: list[list[int]], rng) -> tuple[list, list]:
    """The target's greedy continuations of `prompts` (and random prompts, to 8), with its
    features along each by one teacher-forced pass."""
    from mlx_lm.models.cache import make_prompt_cache

    vocab = model(mx.array([[0]])).shape[-1]
    length = len(prompts[0]) if prompts else 4
    randoms = [[int(i) for i in rng.integers(3, vocab, length)] for _ in range(8)]
    sequences, features = [], []
    for prompt in (prompts + randoms)[:8]:
        ids = list(prompt[:length])
        cache = make_prompt_cache(model)
        logits = model(mx.array([ids]), cache=cache)
        for _ in range(CONTINUATION):
            ids.append(int(mx.argmax(logits[0, -1]).item()))
            logits = model(mx.array([[ids[-1]]]), cache=cache)
        model(mx.array([ids]))
        sequences.append(np.array(ids))
        features.append(taps.take()[0])
    return sequences, features


def _fit(head, sequences, features, kept: np.ndarray, vocab: int, steps: int) -> None:
    """Cross-entropy on x_{j+2} from row j (features at j, token j+1). A random target's
    continuations are memorised, not learnt: the head is right where it was fitted."""
    from mlx_lm.models.cache import KVCache

    from mlxspec.training.trainer import draft_index

    to_row = draft_index(kept, vocab)
    tokens = mx.array(np.stack([s[1:-1] for s in sequences]))
    labels = mx.array(to_row[np.stack([s[2:] for s in sequences])])
    hidden = mx.stack([f[:-2] for f in features])
    optimizer = optim.Adam(learning_rate=3e-3)

    def loss_fn(head):
        logits, _ = head(tokens, hidden, KVCache())
        mask = labels >= 0
        losses = nn.losses.cross_entropy(logits, mx.maximum(labels, 0), reduction="none")
        return (losses * mask).sum() / mx.maximum(mask.sum(), 1)

    step = nn.value_and_grad(head, loss_fn)
    for _ in range(steps):
        _, grads = step(head)
        optimizer.update(head, grads)
        mx.eval(head.parameters(), optimizer.state)


def fresh_head_drafts(pair, history: list[int], n: int) -> list[int]:
    """What a head (EAGLE-3, MTP) that read `history`'s rows in one block proposes greedily."""
    from mlx_lm.models.cache import KVCache

    from mlxspec.decoding import capture

    model, head = pair.target.model, pair.draft.model
    model(mx.array([history[:-1]]))
    features = capture.taps_of(model).take()
    cache = KVCache()
    tokens, hidden = mx.array([history[1:]]), features
    out = []
    for i in range(n):
        logits, pre = head(tokens, hidden, cache, chained=i > 0)
        choice = mx.argmax(logits[0, -1])  # an MTP head's ids are the target's already
        out.append((choice if head.draft_to_target is None else head.draft_to_target[choice]).item())
        tokens, hidden = mx.array([[out[-1]]]), pre[:, -1:]
    return out


def check_ctrl_c_mid_round(pair, prompt: list[int], *, gamma: int, max_tokens: int = 24) -> None:
    """Ctrl-C at several points of a drafting stream, each followed by the same prompt on
    the same session: the output is standard decoding's every time."""
    import mlxspec
    from mlxspec.generation import Session
    from tests.conftest import ctrl_c_at

    session = Session(pair)
    expected = mlxspec.generate(pair, prompt, max_tokens=max_tokens, gamma=0).tokens
    for at in (40, 200, 700, 1500):
        with ctrl_c_at(at):
            try:
                for _ in mlxspec.stream(pair, prompt, session=session, max_tokens=max_tokens, gamma=gamma):
                    pass
            except KeyboardInterrupt:
                pass
        got = mlxspec.generate(pair, prompt, max_tokens=max_tokens, gamma=gamma, session=session).tokens
        assert got == expected, at
