"""Training an EAGLE-3 head with training-time test (Li et al., arXiv 2503.01840, section 3.2).

The head is trained as the engine drafts with it (drafters/eagle3.py). Row j reads the
embedding of token j+1 and fc(target features at j) and predicts token j+2. For chains of
`steps` drafts started at every row at once, step s of the chain started at row i reads the
embedding of x_{i+s} (from the data) and the pre-norm output of step s-1 at rope position
i+s-1, and attends to step 1's keys at rows <= i plus its own chain's keys of steps 2..s:
the EAGLE-3 mask, as a causal block over step 1 and one diagonal per later step. Its loss is
the soft cross-entropy against the target's distribution at position i+s, renormalised
over the draft vocabulary, weighted 0.8^(s-1), on answer (or text) positions only, and
masked where the target puts less than a tenth of its mass inside the draft vocabulary.

Held out, two figures per run: greedy agreement along chains (step k counted only where
steps before it agreed and the data went on as the target's argmax, as a greedy verify
would), and at step 1 the expected acceptance sum(min(p, q)) at temperature 1 over the
target's top ids.

The loop (`train`: the budget, checkpoints, Ctrl-C, held-out figures as it goes) runs any
`Objective`: this module's EAGLE-3 one, or a DFlash block drafter's (training/dflash.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..decoding.capture import model_family
from ..drafters.eagle3_head import Eagle3Head, config_from_target, target_embedding
from ..errors import TrainingError
from .answers import CONTEXT
from .checkpoint import State, checkpoint_folder, save_checkpoint
from .store import Example

MAX_WINDOW = 448
BATCH_ROWS = 2048
MIN_MASS = 0.1
STEP_DECAY = 0.8
CHECKPOINT_SECONDS = 180.0
EVAL_EXAMPLES = 96


# ---------------------------------------------------------------- the head, initialised


def target_output_rows(model) -> mx.array:
    """The target's output layer (vocab, hidden): its lm_head, or the tied embedding."""
    inner = getattr(model, "language_model", model)
    module = getattr(inner, "lm_head", None) or inner.model.embed_tokens
    if "scales" in module:
        return mx.dequantize(module.weight, module.scales, module.get("biases"), module.group_size, module.bits)
    return module.weight


def target_final_norm(model) -> mx.array:
    inner = getattr(model, "language_model", model)
    weight = inner.model.norm.weight
    return weight + 1.0 if model_family(model).startswith("gemma") else weight  # Gemma's norm scales by 1 + w


def new_head(
    model,
    target_config: dict,
    *,
    vocabulary: np.ndarray,
    aux_layer_ids,
    seed: int,
    norm_before_residual: bool = False,
) -> Eagle3Head:
    """A head for `model` whose lm_head rows and norm start as the target's own output layer
    and final norm (restricted to `vocabulary`); fc and the layer random, its output
    projections small so the residual starts near the fused features. With
    `norm_before_residual` (speculators' and vLLM's option) the layer's residual stream
    starts from the normed fused features, so its attention and MLP count from the first
    step whatever the features' scale."""
    mx.random.seed(seed)
    config = config_from_target(
        target_config,
        draft_vocab_size=len(vocabulary),
        aux_layer_ids=tuple(aux_layer_ids),
        norm_before_residual=norm_before_residual,
    )
    head = Eagle3Head(config)
    head.share_embedding(target_embedding(model))
    rows = target_output_rows(model)[mx.array(vocabulary)].astype(mx.float32)
    head.lm_head.weight = rows
    head.norm.weight = target_final_norm(model).astype(mx.float32)
    attn, mlp = head.midlayer.self_attn, head.midlayer.mlp
    attn.o_proj.weight = attn.o_proj.weight * 0.1
    mlp.down_proj.weight = mlp.down_proj.weight * 0.1
    object.__setattr__(head, "draft_to_target", mx.array(vocabulary.astype(np.uint32)))
    mx.eval(head.parameters())
    return head


# ---------------------------------------------------------------- features, standardised


def feature_scale(examples: list, *, rows: int = 8192, seed: int = 0) -> np.ndarray:
    """Each feature column's RMS over a sample of positions (the first of each sequence left
    out: its massive activations are no guide), (F,) float32.

    The head is trained on features divided by it and fc is multiplied back at the end
    (`fold_feature_scale`), so the published head reads the target's raw features. Why:
    Adam moves every weight by about the learning rate a step, so a column whose values run
    to 1e4 (Gemma 3 270M carries such outliers in every position, and its layers' RMS run
    40, 206, 817 at layers 2, 9, 15) would swing fc's output by ~10 a step; standardised,
    every column learns at the same pace (held-out α 0.07 after 20 minutes without)."""
    rng = np.random.default_rng(seed)
    picked = []
    for index in rng.permutation(len(examples)):
        features = examples[index].features[1:]
        if len(features):
            picked.append(features[rng.permutation(len(features))[:256]].astype(np.float32))
        if sum(len(p) for p in picked) >= rows:
            break
    if not picked:
        return np.ones(examples[0].features.shape[1] if examples else 1, np.float32)
    sample = np.concatenate(picked)
    return np.maximum(np.sqrt((sample.astype(np.float64) ** 2).mean(0)), 1e-3).astype(np.float32)


def standardize(examples: list, scale: np.ndarray) -> None:
    """Features divided by their columns' scale, in place, kept in their own dtype (the
    shards' float16: columns of RMS 1 sit far inside its range, and 1.5 M positions of
    SmolLM2's features are 5 GB so, 10 GB in float32), float32 where that would overflow."""
    for example in examples:
        scaled = example.features.astype(np.float32) / scale
        kept = scaled.astype(example.features.dtype)
        example.features = kept if np.isfinite(kept).all() else scaled


def fold_feature_scale(head: Eagle3Head, scale: np.ndarray) -> None:
    """fc for raw features from fc trained on standardised ones: W x = W' (x / scale)."""
    head.fc.weight = head.fc.weight / mx.array(scale)[None, :]
    mx.eval(head.fc.weight)


INITIAL_LOGIT_STD = 2.0
MAX_INITIAL_SPREAD = 8.0


def calibrate_output(head: Eagle3Head, examples: list, draft_index: np.ndarray, *, sample: int = 8) -> float:
    """Scale the head's final norm so that its first logits spread by INITIAL_LOGIT_STD over
    real features, where they spread by more than MAX_INITIAL_SPREAD. The target's own final
    norm is a good direction but can be a poor scale for a head whose output starts random:
    Gemma 3's reaches 301 (mean 26), and the head's first logits spread by tens, a
    cross-entropy of ~19 nats that Adam did not climb out of in 65 steps (held-out α 0.05).
    A sound scale is left alone (SmolLM2's first logits spread by 4.5). Returns the factor
    applied (at most 1: never sharpened)."""
    chosen = examples[: max(1, sample)]
    batch = make_batch(chosen, [label(e, draft_index) for e in chosen], 1)
    return rescale_output(head.norm, unroll(head, batch["tokens"], batch["features"], 1)[0])


def rescale_output(norm, logits: mx.array) -> float:
    """Scale a drafter's final `norm` so that `logits` (its first, over real features) would
    spread by INITIAL_LOGIT_STD, where they spread by more than MAX_INITIAL_SPREAD; the
    factor applied (at most 1)."""
    spread = mx.sqrt(mx.mean(mx.var(logits.astype(mx.float32), axis=-1))).item()
    factor = 1.0 if spread <= MAX_INITIAL_SPREAD else INITIAL_LOGIT_STD / spread
    norm.weight = norm.weight * factor
    mx.eval(norm.weight)
    return factor


# ---------------------------------------------------------------- the unrolled forward


def _attend(q, k1, v1, chain: list, scale: float) -> mx.array:
    """q (B, h, W, d); k1, v1 (B, kv, W, d) step 1's keys (causal); chain: the same chain's
    (k, v) of steps 2..s, one diagonal each. -> (B, W, h·d)."""
    b, heads, width, _ = q.shape
    rep = heads // k1.shape[1]

    def widen(t):
        return mx.repeat(t, rep, axis=1) if rep > 1 else t

    q = q * scale
    causal = mx.triu(mx.full((width, width), -mx.inf, dtype=q.dtype), k=1)
    scores = [q @ widen(k1).swapaxes(-1, -2) + causal]
    scores += [(q * widen(k)).sum(-1, keepdims=True) for k, _ in chain]
    weights = mx.softmax(mx.concatenate(scores, axis=-1), axis=-1, precise=True)
    out = weights[..., :width] @ widen(v1)
    for t, (_, v) in enumerate(chain):
        out = out + weights[..., width + t : width + t + 1] * widen(v)
    return out.transpose(0, 2, 1, 3).reshape(b, width, -1)


def unroll(head: Eagle3Head, tokens: mx.array, features: mx.array, steps: int) -> list[mx.array]:
    """tokens (B, W + steps): x_a .. ; features (B, W, F): the target's at a .. a+W-1.
    -> per step s, logits (B, W, draft vocab): row r predicts position a+r+s+1."""
    attn = head.midlayer.self_attn
    width = features.shape[1]
    hidden = head.fuse(features)
    first, chain, logits = None, [], []
    for s in range(1, steps + 1):
        x, residual = head.layer_input(tokens[:, s : s + width], hidden)
        q, k, v = attn.project(x, s - 1)
        if first is None:
            first = (k, v)
        else:
            chain.append((k, v))
        attended = _attend(q, *first, chain, attn.scale)
        hidden = head.layer_output(residual, attn.o_proj(attended))
        logits.append(head.lm_head(head.norm(hidden)))
    return logits


def loss_fn(head, batch: dict, steps: int) -> mx.array:
    width = batch["features"].shape[1]
    total = mx.array(0.0)
    for s, logits in enumerate(unroll(head, batch["tokens"], batch["features"], steps), 1):
        index, probs, mask = (batch[k][:, s : s + width] for k in ("label_ids", "label_probs", "label_mask"))
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        ce = -(probs * mx.take_along_axis(logp, index, axis=-1)).sum(-1)
        total = total + STEP_DECAY ** (s - 1) * (ce * mask).sum() / mx.maximum(mask.sum(), 1)
    return total


# ---------------------------------------------------------------- batches


@dataclass
class Labels:
    """An example's targets in draft ids: per position the top ids (K,) mapped into the
    draft vocabulary, their probabilities renormalised there, and whether it is trained on."""

    ids: np.ndarray
    probs: np.ndarray
    mask: np.ndarray
    inside: np.ndarray  # (L, K): the top id is in the draft vocabulary


def draft_index(vocabulary, vocab_size: int) -> np.ndarray:
    """Each target id's row in a draft vocabulary (`vocabulary`: its target ids, in row
    order), -1 for an id outside it."""
    index = np.full(vocab_size, -1, np.int64)
    index[np.asarray(vocabulary, dtype=np.int64)] = np.arange(len(vocabulary))
    return index


def label(example: Example, draft_index: np.ndarray) -> Labels:
    index = draft_index[example.top_ids]
    probs = np.where(index >= 0, example.top_probs.astype(np.float32), 0.0)
    mass = probs.sum(-1)
    mask = (mass >= MIN_MASS) & (np.arange(len(example.ids)) >= example.train_from)
    return Labels(np.maximum(index, 0).astype(np.int32), probs / np.maximum(mass, 1e-9)[:, None], mask, index >= 0)


def window(example: Example) -> tuple[int, int]:
    start = max(0, example.train_from - CONTEXT)
    return start, min(len(example.ids), start + MAX_WINDOW)


def make_batch(examples: list[Example], labels: list[Labels], steps: int) -> dict:
    spans = [window(e) for e in examples]
    width = max(b - a for a, b in spans)
    n, f, k = len(examples), examples[0].features.shape[1], examples[0].top_ids.shape[1]
    tokens = np.zeros((n, width + steps + 1), np.int32)
    features = np.zeros((n, width, f), np.float32)
    label_ids = np.zeros((n, width + steps + 1, k), np.int32)
    label_probs = np.zeros((n, width + steps + 1, k), np.float32)
    label_mask = np.zeros((n, width + steps + 1), np.float32)
    target_argmax = np.full((n, width + steps + 1), -1, np.int64)
    top_probs = np.zeros((n, width + steps + 1, k), np.float32)
    for row, (e, lab, (a, b)) in enumerate(zip(examples, labels, spans)):
        tokens[row, : b - a] = e.ids[a:b]
        features[row, : b - a] = e.features[a:b]
        label_ids[row, : b - a] = lab.ids[a:b]
        label_probs[row, : b - a] = lab.probs[a:b]
        label_mask[row, : b - a] = lab.mask[a:b]
        target_argmax[row, : b - a] = np.where(np.arange(a, b) >= e.train_from, e.top_ids[a:b, 0], -1)
        top_probs[row, : b - a] = np.where(lab.inside[a:b], e.top_probs[a:b], 0.0)
    # position a+r reads the target's distribution P at a+r; row r of step s predicts the
    # token after position a+r+s, so its label is P at a+r+s: column s+r of these arrays
    return {
        "tokens": mx.array(tokens),
        "features": mx.array(features),
        "label_ids": mx.array(label_ids),
        "label_probs": mx.array(label_probs),
        "label_mask": mx.array(label_mask),
        "target_argmax": target_argmax,
        "tokens_np": tokens,
        "raw_probs": top_probs,
        "label_ids_np": label_ids,
    }


def plan_batches(examples: list[Example], *, seed: int, rows: int = BATCH_ROWS) -> list[list[int]]:
    """An epoch: examples shuffled, then packed, 64 at a time sorted by length, into batches
    of about `rows` rows."""
    order = np.random.default_rng(seed).permutation(len(examples)).tolist()
    batches = []
    for start in range(0, len(order), 64):
        group = sorted(order[start : start + 64], key=lambda i: -np.subtract(*window(examples[i])[::-1]))
        current, width = [], 0
        for i in group:
            a, b = window(examples[i])
            width = max(width, b - a)
            if current and width * (len(current) + 1) > rows:
                batches.append(current)
                current, width = [], b - a
            current.append(i)
        if current:
            batches.append(current)
    return [batches[i] for i in np.random.default_rng(seed + 1).permutation(len(batches))]


# ---------------------------------------------------------------- held-out acceptance


def evaluate(head: Eagle3Head, examples: list[Example], labels: list[Labels], steps: int) -> dict:
    """Greedy agreement per draft position along chains (conditional: step k over the chains
    whose steps before k agreed and whose data went on as the target's argmax), and the
    expected step-1 acceptance sum(min(p, q)) at temperature 1."""
    reached = np.zeros(steps)
    agreed = np.zeros(steps)
    overlap, overlap_n = 0.0, 0
    draft_to_target = np.array(head.draft_to_target).astype(np.int64)
    for start in range(0, len(examples), 8):
        chosen = list(range(start, min(start + 8, len(examples))))
        batch = make_batch([examples[i] for i in chosen], [labels[i] for i in chosen], steps)
        width = batch["features"].shape[1]
        outs = unroll(head, batch["tokens"], batch["features"], steps)
        drafted = [mx.argmax(o, axis=-1) for o in outs]
        q1 = mx.softmax(outs[0], axis=-1)
        q_at = mx.take_along_axis(q1, batch["label_ids"][:, 1 : 1 + width], axis=-1)
        mx.eval(drafted, q_at)
        argmax, tokens = batch["target_argmax"], batch["tokens_np"]
        alive = np.ones(argmax[:, :width].shape, bool)
        for s in range(1, steps + 1):
            want = argmax[:, s : s + width]
            alive = alive & (want >= 0)
            hit = draft_to_target[np.array(drafted[s - 1])] == want
            reached[s - 1] += alive.sum()
            agreed[s - 1] += (alive & hit).sum()
            # the next step reads x_{i+s+1}: it is a greedy chain only where that is the argmax
            alive = alive & hit & (tokens[:, s + 1 : s + 1 + width] == want)
        p = batch["raw_probs"][:, 1 : 1 + width]
        valid = argmax[:, 1 : 1 + width] >= 0
        both = np.minimum(p, np.array(q_at)).sum(-1)
        overlap += float(both[valid].sum())
        overlap_n += int(valid.sum())
    alpha = [float(a / r) if r else 0.0 for a, r in zip(agreed, reached)]
    return {"alpha": alpha, "expected_acceptance": overlap / max(overlap_n, 1), "positions": int(reached[0])}


# ---------------------------------------------------------------- what train() trains


class Objective:
    """What `train` trains a drafter for: how an example is labelled, a batch made, the loss
    and the held-out figures ({"alpha": per draft position, "expected_acceptance",
    "positions"}). Anything random in a batch is drawn from `key` (seed, epoch, batch), so
    that a resumed run makes the batches an uninterrupted one would."""

    def labels(self, example: Example) -> Labels: ...
    def batch(self, examples: list[Example], labels: list[Labels], *, key: tuple[int, ...]) -> dict: ...
    def loss(self, model, batch: dict, fraction: float) -> mx.array: ...
    def positions(self, batch: dict, fraction: float) -> int: ...  # trained positions a step counts
    def evaluate(self, model, examples: list[Example], labels: list[Labels]) -> dict: ...
    def calibrate(self, model, examples: list[Example]) -> float: ...  # a fresh drafter's output scale


@dataclass
class Eagle3Objective(Objective):
    """Training-time test over `steps` draft steps (the module's docstring).

    For the first `single_step_share` of the budget only the first draft step is unrolled:
    a third of the work a batch, and position 1, which every accepted chain starts with,
    learns far faster per second that way (SmolLM2: held-out α 0.30 after 6 minutes on one
    core; three steps throughout took 18 to reach 0.29); the rest of the budget trains all
    `steps` as the engine drafts."""

    draft_index: np.ndarray
    steps: int
    single_step_share: float = 0.0

    def labels(self, example: Example) -> Labels:
        return label(example, self.draft_index)

    def batch(self, examples: list[Example], labels: list[Labels], *, key: tuple[int, ...]) -> dict:
        return make_batch(examples, labels, self.steps)

    def unrolled(self, fraction: float) -> int:
        return 1 if fraction < self.single_step_share else self.steps

    def loss(self, model, batch: dict, fraction: float) -> mx.array:
        return loss_fn(model, batch, self.unrolled(fraction))

    def positions(self, batch: dict, fraction: float) -> int:
        return int(np.array(batch["label_mask"]).sum()) * self.unrolled(fraction)

    def evaluate(self, model, examples: list[Example], labels: list[Labels]) -> dict:
        return evaluate(model, examples, labels, self.steps)

    def calibrate(self, model, examples: list[Example]) -> float:
        return calibrate_output(model, examples, self.draft_index)


# ---------------------------------------------------------------- the run


FINISH_SECONDS = 1.0  # kept for the last checkpoint and the finished head (a small head's take well under)
EVAL_EVERY = max(60.0, CHECKPOINT_SECONDS / 2)


@dataclass
class Budget:
    """How far training has gone: `seconds` is the training time the run will have had when
    this session stops (earlier sessions' included) and `tokens` the trained positions
    asked for; the schedule runs over whichever ends first."""

    seconds: float | None
    tokens: int | None

    def fraction(self, seconds: float, tokens: int) -> float:
        parts = []
        if self.seconds is not None:
            parts.append(seconds / self.seconds if self.seconds > 0 else 1.0)
        if self.tokens:
            parts.append(tokens / self.tokens)
        return min(max(parts), 1.0) if parts else 1.0


@dataclass
class Snapshot:
    """A step's head, optimizer state and State, as a checkpoint saves them."""

    head: dict
    optimizer: dict
    state: State

    @classmethod
    def of(cls, head: Eagle3Head, optimizer, state: State) -> Snapshot:
        # history is shared, not copied: it only grows, by figures read off this same head
        return cls(dict(tree_flatten(head.parameters())), dict(tree_flatten(optimizer.state)), replace(state))

    def save(self, folder: Path, *, bound: tuple[Path, ...] = ()) -> None:
        save_checkpoint(folder, self.head, self.optimizer, self.state, bound=bound)


def lr_at(fraction: float, step: int, peak: float, warmup: int = 100) -> float:
    warm = min(1.0, (step + 1) / max(warmup, 1))
    return peak * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(fraction, 1.0))))


def train(
    *,
    head,
    objective: Objective,
    train_set: list[Example],
    held_out: list[Example],
    folder: Path,
    state: State,
    seed: int,
    peak_lr: float,
    progress,
    until: float = math.inf,
    tokens: int | None = None,
    warmup: int = 100,
    batch_rows: int = BATCH_ROWS,
    bound: tuple[Path, ...] = (),
) -> State:
    """Train until `until` (perf_counter seconds, the session's deadline: time is kept before
    it for the final evaluation and writing the head) or `tokens` trained positions,
    checkpointing to folder/checkpoint (bound to the files in `bound`: the run's vocabulary
    and feature scale); returns the state. What is trained, on what and how is `objective`'s."""
    labels = [objective.labels(e) for e in train_set]
    held_labels = [objective.labels(e) for e in held_out]
    held = list(range(len(held_out)))[:: max(1, len(held_out) // EVAL_EXAMPLES)][:EVAL_EXAMPLES]
    held_examples, held_labels = [held_out[i] for i in held], [held_labels[i] for i in held]
    optimizer = optim.AdamW(learning_rate=peak_lr, weight_decay=0.0)
    checkpoint = folder / "checkpoint"
    saved = checkpoint_folder(checkpoint)
    if state.step > 0 and saved:  # resumed: the moments belong to the head read back with the state
        try:
            optimizer.state = tree_unflatten(list(mx.load(str(saved / "optimizer.safetensors")).items()))
        except (OSError, RuntimeError, ValueError) as e:
            raise TrainingError(f"{saved}: the optimizer's state does not read back ({e})") from None
    step_fn = nn.value_and_grad(head, lambda batch, fraction: objective.loss(head, batch, fraction))
    started = time.perf_counter()
    figures = objective.evaluate(head, held_examples, held_labels) if held_examples else None
    eval_seconds = time.perf_counter() - started
    if figures:
        if not state.history:
            state.history.append({"step": 0, "tokens": 0} | figures)
        progress.evaluated(figures)
    # the final evaluation reads every held-out example, at the pace this one read a share
    stop = until - eval_seconds * len(held_out) / max(1, len(held_examples)) - FINISH_SECONDS
    mark = last_checkpoint = last_eval = time.perf_counter()
    budget = Budget(seconds=None if stop == math.inf else state.seconds + max(0.0, stop - mark), tokens=tokens)
    # the last step taken whole (MLX arrays are immutable: references, not copies); Ctrl-C
    # anywhere in a step saves this, never a head half-updated
    done = Snapshot.of(head, optimizer, state)
    try:
        while time.perf_counter() < stop and budget.fraction(state.seconds, state.tokens) < 1.0:
            batches = plan_batches(train_set, seed=seed + state.epoch, rows=batch_rows)
            if state.batch >= len(batches):
                state.epoch, state.batch = state.epoch + 1, 0
                continue
            chosen = batches[state.batch]
            key = (seed, state.epoch, state.batch)
            batch = objective.batch([train_set[i] for i in chosen], [labels[i] for i in chosen], key=key)
            fraction = budget.fraction(state.seconds, state.tokens)
            optimizer.learning_rate = lr_at(fraction, state.step, peak_lr, warmup)
            loss, grads = step_fn(batch, fraction)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            optimizer.update(head, grads)
            mx.eval(loss, head.parameters(), optimizer.state)
            state.loss = float(loss)
            if not math.isfinite(state.loss):
                raise TrainingError(
                    f"training diverged at step {state.step + 1} (the loss is {state.loss}): "
                    f"start again with a smaller --lr than {peak_lr:g}"
                )
            state.step, state.batch = state.step + 1, state.batch + 1
            state.tokens += objective.positions(batch, fraction)
            now = time.perf_counter()
            state.seconds, mark = state.seconds + now - mark, now
            done = Snapshot.of(head, optimizer, state)
            progress.trained(state, budget.fraction(state.seconds, state.tokens))
            if held_examples and now - last_eval > EVAL_EVERY and now + eval_seconds < stop:
                figures = objective.evaluate(head, held_examples, held_labels)
                state.history.append({"step": state.step, "tokens": state.tokens} | figures)
                progress.evaluated(figures)
                last_eval = time.perf_counter()
            if now - last_checkpoint > CHECKPOINT_SECONDS:
                done.save(checkpoint, bound=bound)
                last_checkpoint = time.perf_counter()
    except KeyboardInterrupt:
        done.save(checkpoint, bound=bound)
        progress.note(f"interrupted at step {done.state.step}: checkpoint saved")
        raise
    done.save(checkpoint, bound=bound)
    return done.state
